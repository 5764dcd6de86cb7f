"""Multi-process tests: run a worker script under torchrun and leave every process without interpreter finalization.

    proc = subprocess.run(torchrun_command(2, tmp_path / "worker.py", spec_json, out), capture_output=True, ...)

Each process runs `python -m archspec.testing.torchrun worker.py ARGS...`: the worker runs as `__main__` with
`sys.argv == [worker.py, *ARGS]`; when it returns, what it still holds is collected, a process group it left is
destroyed, stdout and stderr are flushed and the process exits 0 at once (`os._exit`). A worker that raises exits 1
with its traceback, as Python would.

Why: a gloo process group still referenced at interpreter exit (a DTensor's mesh, a DDP reducer, a functional
collective's work) is destroyed during finalization, when its worker threads can no longer take the GIL, and the
process aborts now and then (`terminate called without an active exception`, SIGABRT) after the test's results were
written. The training loop releases its own group before returning (`archspec.train.loop.train`); a test worker
holds models, meshes and reference copies to compare, so the exit is made here, once, for every worker.
"""

from __future__ import annotations

import gc
import os
import runpy
import sys
import traceback
from pathlib import Path


def torchrun_command(n: int, script: str | Path, *args: str | Path) -> list[str]:
    """The command that runs `script ARGS...` in `n` processes (torchrun --standalone) through this module."""
    return [sys.executable, "-W", "ignore::FutureWarning", "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(n), "-m", __name__, str(script), *map(str, args)]


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m archspec.testing.torchrun WORKER.py [ARGS...]")
    sys.argv = sys.argv[1:]
    code = 0
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as e:  # the worker's own exit status
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int | None):
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    if code == 0:
        gc.collect()
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
