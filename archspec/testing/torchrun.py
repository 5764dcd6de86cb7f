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
import io
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
    sys.path.insert(0, str(Path(sys.argv[0]).resolve().parent))  # as `python worker.py` would: modules beside it
    code = 0
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as e:  # the worker's own exit status, as Python reads it
        if e.code is None or isinstance(e.code, int):
            code = (e.code or 0) & 0xFF if -(2**31) <= (e.code or 0) < 2**31 else 1  # as Python: too large is 1
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        code = 130
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        _flush_open_files()  # before the collection: a file in a cycle may lose its buffer when collected
        if code == 0:
            gc.collect()
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                dist.destroy_process_group()
    except BaseException:
        traceback.print_exc()
        code = code or 1
    _flush_open_files()
    os._exit(code)


def _flush_open_files() -> None:
    """Flush every open file object (stdout and stderr included): os._exit writes no buffer."""
    for obj in gc.get_objects():
        if issubclass(type(obj), io.IOBase):  # type(), not isinstance: no proxy's __class__ is asked
            try:
                if not obj.closed:
                    obj.flush()
            except Exception:  # noqa: BLE001 - a file that cannot flush now could not have later either
                pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass


if __name__ == "__main__":
    main()
