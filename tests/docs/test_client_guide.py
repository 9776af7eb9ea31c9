"""docs/client.md promises runnable examples: its Python scripts run against a real server
serving the example shop with a worker, and print what the guide says they print."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.test_server import free_port, server_env, server_process

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "client.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", GUIDE.read_text(), flags=re.S)


def test_the_scripts_print_what_the_guide_says(tmp_path: Path) -> None:
    script, async_script, direct_script = blocks("python")
    printed = blocks("text")[1]
    port = free_port()
    env = server_env(f"sqlite:///{tmp_path}/v.db", port)
    with server_process(tmp_path, env, port, ["--worker"]) as server:
        server.wait_healthy()
        outputs = []
        for n, code in enumerate((script, async_script, direct_script)):
            path = tmp_path / f"script{n}.py"
            path.write_text(code)
            ran = subprocess.run([sys.executable, str(path)],
                                 env={**env, "VERACITY_URL": server.url},
                                 capture_output=True, text=True, timeout=120, check=False)
            assert ran.returncode == 0, ran.stderr
            outputs.append(ran.stdout)
    assert outputs[0] == printed
    assert outputs[1].splitlines() == ["queued mail to grace@example.com: Hello",
                                       "completed", "paused", "completed"]
    assert outputs[2].splitlines() == ["queued mail to linus@example.com: Hi", "completed"]
