"""DDP: two CPU processes (gloo, launched by torchrun) train like one process on the same global batch."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

import pytest

from archspec.testing.torchrun import torchrun_command
from archspec.train.loop import train

from .conftest import tiny_spec_dict

WORKER = textwrap.dedent("""
    import json, sys
    import torch
    from archspec.spec import load_spec_dict
    from archspec.train.loop import train
    from archspec.train.run_dir import RunDirLogger

    spec_json, cache, out = sys.argv[1:]
    rank = int(__import__("os").environ["RANK"])
    torch.set_num_threads(1)
    result = train(load_spec_dict(json.load(open(spec_json))), device="cpu", cache=cache, run_dir=f"{out}/run",
                   logger=RunDirLogger(f"{out}/log{rank}"))
    json.dump({"losses": result.losses, "evals": result.evals, "status": result.status,
               "tokens": result.metrics["tokens"]}, open(f"{out}/result{rank}.json", "w"))
""")


def test_two_gloo_processes_match_one_process_on_the_same_global_batch(corpus_dir, tmp_path, cache, make_spec):
    single = train(make_spec(batch_size=8), run_dir=tmp_path / "single", cache=cache)

    (tmp_path / "spec.json").write_text(json.dumps(tiny_spec_dict(corpus_dir, batch_size=4)))  # per process
    (tmp_path / "worker.py").write_text(WORKER)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        torchrun_command(2, tmp_path / "worker.py", tmp_path / "spec.json", cache, tmp_path),
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"result{r}.json").read_text()) for r in range(2)]

    assert ranks[0]["status"] == "FINISHED" and ranks[0]["tokens"] == single.metrics["tokens"]  # same global batch
    assert ranks[0]["losses"] == pytest.approx(single.losses, rel=1e-4)
    assert [v for _, v in ranks[0]["evals"]] == pytest.approx([v for _, v in single.evals], rel=1e-4)
    assert ranks[0]["losses"] == ranks[1]["losses"]  # every rank reports the all-reduced loss
    # only rank 0 logs and writes the checkpoint
    assert json.loads((tmp_path / "log0" / "run.json").read_text())["status"] == "FINISHED"
    assert not (tmp_path / "log1").exists()
    assert (tmp_path / "run" / "checkpoint.pt").exists()
