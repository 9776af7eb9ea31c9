"""The seeded fault soak (``make soak``, ``python -m bench.soak --seed N --minutes M``).

A mixed workload (bench/soak/workload.py, workflows in bench/soak/app.py) runs against real
processes (bench/soak/rig.py) while a schedule of faults drawn from the seed
(bench/soak/schedule.py) kills, stops and disconnects them, restarts the database and makes
the fake n8n misbehave; then the soak drains (bench/soak/run.py says what that means) and
the checker (bench/soak/checker.py) lists every violation of docs/states.md's guarantees it
can see. bench/README.md has the figures of a run.
"""
