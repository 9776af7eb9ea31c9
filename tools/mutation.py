"""``make mutation``: mutation testing of the modules named in pyproject.toml
([tool.veracity.mutation]), each against the tests that exercise it (see docs/testing.md).

Cosmic Ray makes the mutants: it rewrites one spot of a module on disk, runs the module's
test command, and puts the code back. Everything happens in a copy of the tree under
.mutation/work (its src/ first on PYTHONPATH, so that processes the tests start run the
mutant too): the checkout itself is never rewritten. Only mutants inside the functions a
module entry names are run (a whole file when it names none); the others are skipped.

    python tools/mutation.py                 every module
    python tools/mutation.py core.states ... the named ones
    python tools/mutation.py --list          the module names, files and tests
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / ".mutation"  # sessions and report; --out moves it (two runs side by side)
WORK = OUT / "work"
COPIED = ("src", "tests", "docs", "README.md", "pyproject.toml")


@dataclass(frozen=True)
class Module:
    name: str
    path: str
    tests: list[str]
    functions: list[str]
    timeout: float


def load_modules() -> tuple[list[Module], list[str]]:
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["veracity"]["mutation"]
    modules = [
        Module(m["name"], m["path"], list(m["tests"]), list(m.get("functions", [])),
               float(m.get("timeout", conf.get("timeout", 300))))
        for m in conf["modules"]
    ]
    names = [m.name for m in modules]
    if len(set(names)) != len(names):
        raise SystemExit("pyproject.toml: two mutation modules have the same name")
    return modules, list(conf.get("exclude-operators", []))


def function_lines(source: str, wanted: list[str], path: str) -> list[tuple[int, int]]:
    """The line ranges of the named functions ("Class.method" or "function")."""
    found: dict[str, tuple[int, int]] = {}

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                found[f"{prefix}{node.name}"] = (start, node.end_lineno or node.lineno)

    visit(ast.parse(source).body, "")
    missing = [w for w in wanted if w not in found]
    if missing:
        raise SystemExit(f"pyproject.toml: {path} has no function {', '.join(missing)}")
    return [found[w] for w in wanted]


def copy_tree(tree: Path) -> None:
    """A fresh copy of the sources and tests, without byte code (a mutant must be compiled
    from its own source, never from a cached .pyc of the original)."""
    if WORK.exists():
        shutil.rmtree(WORK)
    WORK.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in COPIED:
        source = tree / name
        if source.is_dir():
            shutil.copytree(source, WORK / name, ignore=ignore)
        elif source.exists():
            shutil.copy2(source, WORK / name)


def test_command(module: Module) -> str:
    return shlex.join([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                       "-p", "no:randomly", *module.tests])


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(WORK / "src"), str(WORK)])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def cosmic_ray(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "cosmic_ray.cli", *args], cwd=WORK,
                   env=environment(), check=True, stdout=subprocess.DEVNULL)


@dataclass
class Outcome:
    killed: int = 0
    survived: int = 0
    timeouts: int = 0
    errors: int = 0
    skipped: int = 0
    seconds: float = 0.0

    @property
    def score(self) -> float:
        tested = self.killed + self.survived
        return 100.0 * self.killed / tested if tested else 100.0


def run_module(module: Module, excluded_ops: list[str], report: list[str],
               dry_run: bool = False) -> Outcome:
    config = OUT / f"{module.name}.toml"
    session = OUT / f"{module.name}.sqlite"
    config.write_text(
        "[cosmic-ray]\n"
        f"module-path = {json.dumps(module.path)}\n"
        f"timeout = {module.timeout}\n"
        "excluded-modules = []\n"
        f"test-command = {json.dumps(test_command(module))}\n"
        "[cosmic-ray.distributor]\n"
        'name = "local"\n'
    )
    started = time.monotonic()
    # the unmutated code must pass its tests, or no mutant result means anything
    baseline = subprocess.run(shlex.split(test_command(module)), cwd=WORK, env=environment(),
                              capture_output=True, text=True)
    if baseline.returncode != 0:
        raise SystemExit(f"{module.name}: the tests fail without any mutant:\n"
                         f"{baseline.stdout[-3000:]}{baseline.stderr[-2000:]}")
    if session.exists():
        session.unlink()
    cosmic_ray("init", str(config), str(session))

    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome, WorkResult

    source = (WORK / module.path).read_text()
    ranges = function_lines(source, module.functions, module.path) if module.functions else []
    excluded = [re.compile(p) for p in excluded_ops]
    with use_db(str(session), WorkDB.Mode.open) as db:
        for item in db.work_items:
            mutation = item.mutations[0]
            line = mutation.start_pos[0]
            out_of_scope = bool(ranges) and not any(a <= line <= b for a, b in ranges)
            if out_of_scope or any(p.search(mutation.operator_name) for p in excluded):
                db.set_result(item.job_id, WorkResult(worker_outcome=WorkerOutcome.SKIPPED))
        if dry_run:
            print(f"    {len(db.pending_work_items)} mutants to run", flush=True)
            return Outcome()
    cosmic_ray("exec", str(config), str(session))

    outcome = Outcome(seconds=time.monotonic() - started)
    lines = source.splitlines()
    with use_db(str(session), WorkDB.Mode.open) as db:
        for item, result in db.completed_work_items:
            mutation = item.mutations[0]
            where = f"{module.path}:{mutation.start_pos[0]} {mutation.operator_name}"
            if result.worker_outcome == WorkerOutcome.SKIPPED:
                outcome.skipped += 1
            elif result.worker_outcome != WorkerOutcome.NORMAL:
                outcome.errors += 1
                report.append(f"ERROR {where}\n{result.output}")
            elif result.test_outcome == TestOutcome.SURVIVED:
                outcome.survived += 1
                report.append(f"SURVIVED {where}: {lines[mutation.start_pos[0] - 1].strip()}\n"
                              f"{result.diff}")
            elif result.output == "timeout":
                outcome.timeouts += 1
                outcome.killed += 1
            else:
                outcome.killed += 1
                failed = re.findall(r"^FAILED (\S+)", result.output or "", re.M)
                if failed:
                    by = failed[0]
                elif "SyntaxError" in (result.output or ""):
                    by = "(the mutant does not compile)"
                else:
                    by = "(no FAILED line: see the session's output)"
                report.append(f"killed {where} by {by}")
    return outcome


def main(argv: list[str] | None = None) -> None:
    global OUT, WORK
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help="module names from pyproject.toml")
    parser.add_argument("--list", action="store_true", help="list the modules and stop")
    parser.add_argument("--out", type=Path, default=OUT,
                        help="folder for the copy, the sessions and report.txt")
    parser.add_argument("--tree", type=Path, default=ROOT,
                        help="take src/ and tests/ from this tree (e.g. an older commit's "
                             "`git archive`), the configuration from this checkout")
    parser.add_argument("--count", action="store_true",
                        help="only count each module's mutants (runs no mutant)")
    args = parser.parse_args(argv)
    OUT = args.out.resolve()
    WORK = OUT / "work"
    modules, excluded_ops = load_modules()
    if args.list:
        for m in modules:
            scope = ", ".join(m.functions) or "whole file"
            print(f"{m.name}: {m.path} [{scope}]\n    tests: {' '.join(m.tests)}")
        return
    unknown = set(args.modules) - {m.name for m in modules}
    if unknown:
        raise SystemExit(f"unknown module(s): {', '.join(sorted(unknown))} (see --list)")
    chosen = [m for m in modules if not args.modules or m.name in args.modules]
    OUT.mkdir(parents=True, exist_ok=True)
    copy_tree(args.tree.resolve())
    report: list[str] = []
    rows: list[str] = []
    total = Outcome()
    for module in chosen:
        print(f"{module.name}: mutating {module.path} ...", flush=True)
        o = run_module(module, excluded_ops, report, dry_run=args.count)
        if args.count:
            continue
        row = (f"{module.name:28} killed {o.killed:4} (timeouts {o.timeouts})  survived "
               f"{o.survived:3}  errors {o.errors}  score {o.score:5.1f}%  {o.seconds:6.0f} s")
        print(row, flush=True)
        rows.append(row)
        for field in ("killed", "survived", "timeouts", "errors", "skipped", "seconds"):
            setattr(total, field, getattr(total, field) + getattr(o, field))
        # written after every module, so that a long run can be read while it goes on
        (OUT / "report.txt").write_text("\n".join(rows) + "\n\n" + "\n".join(report) + "\n")
    rows.append(f"{'all':28} killed {total.killed:4} (timeouts {total.timeouts})  survived "
                f"{total.survived:3}  errors {total.errors}  score {total.score:5.1f}%  "
                f"{total.seconds:6.0f} s")
    if args.count:
        return
    (OUT / "report.txt").write_text("\n".join(rows) + "\n\n" + "\n".join(report) + "\n")
    print("\n".join(rows[-1:]))
    print(f"survivors with their diffs, and what killed the others: {OUT / 'report.txt'}")
    if total.errors:
        sys.exit(1)


if __name__ == "__main__":
    main()
