"""Per-rank memory of an MoE model under expert parallelism (ep=2) against plain data parallelism (ep=1), CPU gloo.

    python bench/moe_parallel.py [--experts 16] [--d-model 256] [--hidden 512] [--steps 3]

Two processes each time (torchrun), the same model and per-rank batch, 3 AdamW steps: reports per rank the bytes of
the weights, gradients and AdamW moments it holds (exact, from the tensors: an expert weight under ep counts its
local slice only) and the process's peak RSS (resource.getrusage; includes the interpreter and torch, so it is an
upper bound that moves with the tensors held). Expected: the experts' share divided by ep.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

WORKER = textwrap.dedent("""
    import json, resource, sys
    import torch
    import torch.distributed as dist
    from archspec.codegen import generate
    from archspec.spec import load_spec_dict
    from archspec.train.expert_parallel import clip_grad_norm_, parallelize_moe, shard_experts
    from archspec.train.mesh import JobMesh, Layout
    from torch.nn.parallel import DistributedDataParallel

    spec_json, steps, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    spec = load_spec_dict(json.load(open(spec_json)))
    torch.manual_seed(0)
    model = generate(spec, write=False).Model()
    mesh = JobMesh.build("cpu", Layout.of(spec.train.parallel, world))
    parallelize_moe(model, mesh)
    shard_experts(model, mesh, fsdp=False)
    wrapped = DistributedDataParallel(model, process_group=mesh.dp.get_group())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        idx = torch.randint(0, spec.model.vocab_size, (4, 65), generator=g)
        loss = wrapped(idx[:, :-1], idx[:, 1:])[1]
        (loss + sum(model.auxiliary_losses().values())).backward()
        clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=False)
    local = lambda t: t.to_local() if hasattr(t, "to_local") else t
    nbytes = lambda ts: sum(local(t).numel() * local(t).element_size() for t in ts)
    params = list(model.parameters())
    moments = [s[k] for s in opt.state.values() for k in ("exp_avg", "exp_avg_sq")]
    row = {"rank": rank, "weights": nbytes(params), "grads": nbytes([p.grad for p in params]),
           "adam": nbytes(moments), "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    json.dump(row, open(f"{out}/rank{rank}.json", "w"))
    dist.destroy_process_group()
""")


def run(spec: dict, steps: int, tmp: Path) -> list[dict]:
    (tmp / "spec.json").write_text(json.dumps(spec))
    (tmp / "worker.py").write_text(WORKER)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-W", "ignore", "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node", "2", str(tmp / "worker.py"), str(tmp / "spec.json"), str(steps), str(tmp)],
                   check=True, env=env, capture_output=True)
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(2)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    mib = 1 / 2**20
    print(f"MoE: {args.experts} experts of hidden {args.hidden}, d_model {args.d_model}, 2 layers; 2 gloo processes")
    print(f"{'layout':<8} {'rank':>4} {'weights MiB':>12} {'grads MiB':>10} {'AdamW MiB':>10} {'peak RSS MiB':>13}")
    for ep in (1, 2):
        spec = {"name": "moe-bench", "model": {
            "vocab_size": 512, "context_length": 64, "d_model": args.d_model, "n_layers": 2,
            "attention": {"n_heads": 4, "n_kv_heads": 2},
            "ffn": {"kind": "moe", "n_experts": args.experts, "top_k": 2,
                    "expert": {"kind": "glu", "hidden_dim": args.hidden}}},
            "train": {"parallel": {"kind": "ddp", "ep": ep}}}
        with tempfile.TemporaryDirectory() as tmp:
            for row in run(spec, args.steps, Path(tmp)):
                print(f"ep={ep:<5} {row['rank']:>4} {row['weights'] * mib:>12.2f} {row['grads'] * mib:>10.2f} "
                      f"{row['adam'] * mib:>10.2f} {row['peak_rss'] * mib:>13.1f}")


if __name__ == "__main__":
    main()
