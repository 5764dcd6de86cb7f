"""Pipeline parallelism through the shared loop (issue 30): CPU gloo jobs whose losses equal one process's on the same
global batch — pp=2 under each schedule, dp×pp = 2×2 (FSDP), tp×pp = 2×2 — and a 2×2 checkpoint that resumes under
1×4 and 4×1 on the same curve, the global batch held constant.

The model: GQA attention, an MoE layer (layer 1) and a sliding-window layer (layer 2), four layers, fp32. Tolerance:
rel 1e-4 over five AdamW steps. The first step's loss is exact (each micro-batch's cross-entropy mean, averaged over
equal micro-batches, is the batch's); after it the MoE router losses differ slightly, as they are computed over each
pipeline micro-batch (as under grad_accum), not over the whole batch (measured: rel 3e-6 at step 2), and a split matmul
or sharded gradient sums in another order."""

from __future__ import annotations

import json
import re
import os
import subprocess
from pathlib import Path

import pytest

from archspec.testing.torchrun import torchrun_command
from archspec.errors import UserError
from archspec.spec import load_spec_dict
from archspec.train.loop import train

from .conftest import tiny_spec_dict
from .test_mesh_parallel import WORKER

# the mesh tests' worker, and a resume: argv[5] the run directory to continue (train(resume=...))
RESUME_WORKER = WORKER.replace("sys.argv[1:]", "sys.argv[1:5]").replace('r = train(spec, device="cpu", cache=cache, run_dir=f"{out}/run")',
                               'resume = sys.argv[5] if len(sys.argv) > 5 else None\n'
                               '    r = train(spec, device="cpu", cache=cache, run_dir=resume or f"{out}/run", '
                               'resume=resume)')
assert RESUME_WORKER != WORKER


def _torchrun(out: Path, spec: dict, cache: Path, n: int, stop_after: str = "-", resume: str | None = None) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    (out / "spec.json").write_text(json.dumps(spec))
    (out / "worker.py").write_text(RESUME_WORKER)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        torchrun_command(n, out / "worker.py", out / "spec.json", cache, out, stop_after, *([resume] if resume else [])),
        capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((out / "result.json").read_text())

MODEL = {"d_model": 32, "n_layers": 4, "attention": {"n_heads": 4, "n_kv_heads": 2},
         "ffn": {"kind": "glu", "hidden_dim": 64},
         "layers": {"moe": {"select": [1], "ffn": {"kind": "moe", "n_experts": 4, "top_k": 2,
                                                  "expert": {"kind": "glu", "hidden_dim": 32}}},
                    "window": {"select": [2], "attention": {"sparsity": {"kind": "sliding_window", "window": 8}}}}}
STEPS = {"steps": 5, "eval_interval": 5, "warmup_steps": 1, "checkpoint_interval": 3}


def _spec(corpus_dir, **train_fields) -> dict:
    data = tiny_spec_dict(corpus_dir, **{**STEPS, **train_fields})
    data["model"].update(MODEL)
    return data


@pytest.fixture(scope="module")
def single(corpus_dir, cache, tmp_path_factory):
    """One process, global batch 8: the curve every layout must reproduce."""
    out = tmp_path_factory.mktemp("single-pp")
    return train(load_spec_dict(_spec(corpus_dir, batch_size=8)), device="cpu", cache=cache, run_dir=out / "run")


@pytest.mark.parametrize("parallel,message", [
    ({"pp": 8}, r"^model\.|train\.parallel\.pp: 8 pipeline stages"),  # more stages than layers
    ({"pp": 2, "schedule": "interleaved_1f1b", "microbatches": 1}, r"train\.parallel\.microbatches"),
    ({"pp": 2, "microbatches": 3}, r"train\.parallel\.microbatches: must divide train\.batch_size"),
    ({"pp": 2, "schedule": "1f1b", "microbatches": 1}, r"train\.parallel\.microbatches: 1f1b needs at least"),
    ({"pp": 1, "microbatches": 2}, r"train\.parallel\.microbatches: only means something"),
])
def test_pipeline_recipes_the_schedules_cannot_run_are_refused_at_load(corpus_dir, parallel, message):
    with pytest.raises(UserError) as e:
        load_spec_dict(_spec(corpus_dir, batch_size=8, parallel={"kind": "ddp", **parallel}))
    assert any(re.search(message, line) for line in [str(e.value), *e.value.problems])


@pytest.mark.slow
@pytest.mark.parametrize("name,parallel,procs,batch", [
    ("pp2-gpipe", {"kind": "ddp", "pp": 2, "schedule": "gpipe"}, 2, 8),
    ("pp2-1f1b", {"kind": "ddp", "pp": 2, "schedule": "1f1b", "microbatches": 4}, 2, 8),
    ("pp2-interleaved", {"kind": "ddp", "pp": 2, "schedule": "interleaved_1f1b"}, 2, 8),  # 4 stages on 2 processes
    ("dp2xpp2", {"kind": "fsdp", "pp": 2}, 4, 4),  # two FSDP replicas of 4 sequences, each in two stages
    ("tp2xpp2", {"kind": "ddp", "tp": 2, "pp": 2}, 4, 8),  # one replica, each stage split in two
])
def test_pipeline_layouts_train_the_single_process_curve(single, corpus_dir, cache, tmp_path, name, parallel, procs,
                                                         batch):
    got = _torchrun(tmp_path / name, _spec(corpus_dir, batch_size=batch, parallel=parallel), cache, procs)
    assert got["status"] == "FINISHED"
    assert got["losses"][0] == pytest.approx(single.losses[0], rel=1e-6)
    assert got["losses"] == pytest.approx(single.losses, rel=1e-4)
    assert [v for _, v in got["evals"]] == pytest.approx([v for _, v in single.evals], rel=1e-4)
    assert got["tokens"] == single.metrics["tokens"]
    assert got["run_id"] == single.run_id  # the same global batch: the same experiment, however it is laid out


@pytest.mark.slow
def test_a_2x2_checkpoint_resumes_under_1x4_and_4x1_with_the_same_curve(single, corpus_dir, cache, tmp_path):
    """dp 2 × pp 2 (batch 4 a replica) stops after 3 steps; its sharded checkpoint resumes as pp 4 on one replica of 8
    and as dp 4 of 2 — the global batch held at 8, so the same run continues."""
    first = _torchrun(tmp_path / "2x2", _spec(corpus_dir, batch_size=4, parallel={"kind": "fsdp", "pp": 2}), cache, 4,
                      stop_after="3")
    assert first["losses"] == pytest.approx(single.losses[:3], rel=1e-4)
    import shutil

    for name, parallel, batch in (("1x4", {"kind": "ddp", "pp": 4}, 8), ("4x1", {"kind": "fsdp"}, 2)):
        run = tmp_path / name / "run"
        shutil.copytree(tmp_path / "2x2" / "run", run)
        got = _torchrun(tmp_path / name, _spec(corpus_dir, batch_size=batch, parallel=parallel), cache, 4,
                        resume=str(run))
        assert got["status"] == "FINISHED" and got["run_id"] == single.run_id
        assert got["losses"] == pytest.approx(single.losses[3:], rel=1e-4)
