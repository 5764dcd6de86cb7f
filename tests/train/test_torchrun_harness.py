"""The multi-process tests' launcher (archspec.testing.torchrun): the worker gets its arguments, a group it leaves
alive is destroyed for it and the process exits 0; a worker that fails still fails the launch, with its traceback."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from archspec.testing.torchrun import torchrun_command

KEEPS_ITS_GROUP = textwrap.dedent("""
    import json, sys
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.ones(2) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    held = dist.new_group([0, 1])  # never destroyed by the worker
    json.dump({"argv": sys.argv[1:], "sum": t.tolist(), "name": __name__},
              open(f"{sys.argv[1]}/rank{dist.get_rank()}.json", "w"))
""")


@pytest.mark.slow
def test_a_worker_gets_its_arguments_and_a_group_it_leaves_alive_does_not_fail_the_launch(tmp_path):
    (tmp_path / "worker.py").write_text(KEEPS_ITS_GROUP)
    proc = subprocess.run(torchrun_command(2, tmp_path / "worker.py", tmp_path, "x y"), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in range(2):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got == {"argv": [str(tmp_path), "x y"], "sum": [3.0, 3.0], "name": "__main__"}


@pytest.mark.parametrize("ending, code, marker", [("raise ValueError('worker broke')", 1, "ValueError: worker broke"),
                                                  ("sys.exit(3)", 3, None), ("sys.exit('told to stop')", 1, "told to stop"),
                                                  ("raise KeyboardInterrupt", 130, "KeyboardInterrupt")])
def test_a_worker_that_fails_fails_the_launch(tmp_path, ending, code, marker):
    (tmp_path / "worker.py").write_text(f"import sys\nprint('started', flush=True)\n{ending}\n")
    # what torchrun starts in each process, started here directly (torchrun passes a child's failure on, above)
    command = torchrun_command(1, tmp_path / "worker.py")
    proc = subprocess.run([sys.executable, *command[command.index("-m", 4):]], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == code and "started" in proc.stdout
    if marker:
        assert marker in proc.stderr


def test_what_a_worker_wrote_is_flushed_and_a_module_beside_it_imports(tmp_path):
    """A file the worker left open in a reference cycle keeps its text (os._exit writes no buffer; the collection
    could drop it), and the worker's own folder is on sys.path, as under `python worker.py`."""
    (tmp_path / "beside.py").write_text("X = 7\n")
    (tmp_path / "worker.py").write_text("import sys, beside\nf = open(sys.argv[1], 'w'); f.write(str(beside.X))\n"
                                        "def keep(): return f\n")
    command = torchrun_command(1, tmp_path / "worker.py", tmp_path / "out.txt")
    proc = subprocess.run([sys.executable, *command[command.index("-m", 4):]], capture_output=True, text=True,
                          timeout=120, cwd="/")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out.txt").read_text() == "7"
