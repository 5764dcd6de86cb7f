"""Start-up time of the `archspec` command (issue 33): whole processes, timed from outside, before/after side by side.

    .venv/bin/python bench/bench_startup.py                              # this tree only
    .venv/bin/python bench/bench_startup.py --base /tmp/startup-base -n 15   # against another checkout (A/B)

Each command runs as `python -m archspec ...` with PYTHONPATH set to the checkout under test, as a new process (the
interpreter's start-up, every import and the command itself counted). With --base the two checkouts alternate
(A B A B ...), so that load from other work on a shared machine falls on both alike. Prints, per command and checkout,
the min and median wall time and the median CPU time (user + system of the child, from the OS), whether torch was
imported (`-X importtime` of one extra run), and the median ratio after/before taken pair by pair.

Commands: `--version`, `--help`, `runs list` on a registry file that does not exist yet (nothing recorded: the
registry is not created by a read), and `runs list` on an empty registry migrated to head (`registry upgrade`).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def run_once(tree: Path, args: list[str], extra: list[str] | None = None) -> tuple[float, float, int, str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, *(extra or []), "-m", "archspec", *args], cwd=tree, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE if extra else subprocess.DEVNULL)
    err = proc.stderr.read().decode() if extra else ""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_utime + usage.ru_stime, proc.returncode, err


def imports_torch(tree: Path, args: list[str]) -> bool:
    err = run_once(tree, args, ["-X", "importtime"])[3]
    return any(line.split("|")[-1].strip() == "torch" for line in err.splitlines() if line.startswith("import time:"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=10, help="runs per command and checkout (after one warm-up each)")
    ap.add_argument("--base", type=Path, help="a second checkout to compare against (e.g. a git worktree of the base)")
    opts = ap.parse_args()
    trees = {"after": HERE, **({"before": opts.base.resolve()} if opts.base else {})}

    with tempfile.TemporaryDirectory() as tmp:
        missing = f"sqlite:///{tmp}/empty.db"
        migrated = {name: f"sqlite:///{tmp}/migrated-{name}.db" for name in trees}  # each tree's own head
        for name, tree in trees.items():
            rc = run_once(tree, ["registry", "upgrade", "--registry", migrated[name]])[2]
            assert rc == 0, f"registry upgrade exited {rc} in {tree}"
        commands = {
            "archspec --version": ["--version"],
            "archspec --help": ["--help"],
            "archspec runs list (no registry file yet)": ["runs", "list", "--registry", missing],
            "archspec runs list (empty registry at head)": ["runs", "list", "--registry", "{migrated}"],
        }
        print(f"# {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
              f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, load {os.getloadavg()[0]:.1f}, n={opts.n}")
        print("# trees: " + ", ".join(f"{k}={v}" for k, v in trees.items()))
        header = f"{'command':46} {'tree':7} {'wall min':>9} {'wall med':>9} {'cpu med':>8}  torch"
        print(header)
        for label, args in commands.items():
            walls: dict[str, list[float]] = {k: [] for k in trees}
            cpus: dict[str, list[float]] = {k: [] for k in trees}
            argv = {name: [migrated[name] if a == "{migrated}" else a for a in args] for name in trees}
            for name, tree in trees.items():
                run_once(tree, argv[name])  # warm-up: page cache, .pyc files
            for _ in range(opts.n):
                for name, tree in trees.items():
                    wall, cpu, code, _ = run_once(tree, argv[name])
                    assert code == 0, f"{label} exited {code} in {tree}"
                    walls[name].append(wall)
                    cpus[name].append(cpu)
            for name, tree in trees.items():
                print(f"{label:46} {name:7} {min(walls[name]):9.3f} {statistics.median(walls[name]):9.3f} "
                      f"{statistics.median(cpus[name]):8.3f}  {'yes' if imports_torch(tree, argv[name]) else 'no'}")
            if "before" in trees:
                ratio = statistics.median(a / b for a, b in zip(walls["after"], walls["before"]))
                print(f"{'':46} {'ratio':7} {'':9} {ratio:9.2f}  (after/before, median of pairs)")


if __name__ == "__main__":
    main()
