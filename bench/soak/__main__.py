"""``python -m bench.soak``: the command line (bench/soak/cli.py)."""

from bench.soak.cli import main

if __name__ == "__main__":
    main()
