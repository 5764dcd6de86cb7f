"""What a run says about itself: its start lines, its registry record (`run_info`), its summary and its closing line.
Each reads a Trainer (archspec.train.loop) and changes nothing.
"""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path
from typing import Any

import torch
from rich.markup import escape

import archspec
from archspec.errors import printable
from archspec.registry.values import writer_identity
from archspec.spec import canonical_dict
from archspec.train.logger import FINISHED, RunInfo
from archspec.train.metrics import KindStats, StabilityProbe, average_rate_label


def shown(value: Any) -> str:
    """Text from the spec or the file system on a progress line: control characters escaped, rich markup inert."""
    return escape(printable(str(value)))


def code_version() -> str:
    version = archspec.__version__
    try:
        rev = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12"], capture_output=True,
                             text=True, timeout=5, cwd=Path(archspec.__file__).parent).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rev = ""
    return f"{version}+g{rev}" if rev else version


def announce(t) -> None:
    """The run's start lines."""
    acc, d, log = t.build.accounting, t.data.describe(), t.progress.log
    log(f"run [bold]{t.run_id}[/] · {t.spec.name} · {acc.total:,} params · {t.device} {t.precision.describe()} × "
        f"{t.world.size}" + ("" if t.layout.trivial else f" ({t.layout.describe()})") + f" · dir {shown(t.run_dir)}")
    log(f"data: {shown(d['corpus'])} · {d['tokenizer']} tokenizer · {d['train_tokens']:,} train / "
        f"{d['val_tokens']:,} val tokens (evaluated on {t.eval_tokens:,}, every {t.recipe.eval_every} steps: "
        f"{eval_share(t):.0%} of the run's FLOPs)")
    if t.precision.amp_dtype == torch.bfloat16 and t.device.type == "cpu":
        log("[yellow]bf16 autocast on CPU: most CPUs have no native bf16 and run it far slower than fp32; "
            "train.precision=auto picks fp32 here[/]")
    if t.device.type == "cpu" and (note := contention_note(torch.get_num_threads())):
        log(f"[yellow]{note}[/]")
    log(f"compile: {t.par.compile_mode} ({shown(t.compile_reason)})")
    if t.par.compile_mode == "per_block":
        classes = len({type(b) for b in t.model.blocks})  # one graph per distinct block class, not per layer
        log(f"compiled {len(t.model.blocks)} blocks ({classes} block class{'es' if classes > 1 else ''}) in "
            f"{t.compile_s:.1f} s")
    elif t.par.compiled:
        log(f"compiled the whole model{' (CUDA graphs)' if t.par.compile_mode == 'cudagraphs' else ''} in "
            f"{t.compile_s:.1f} s")
    if t.par.steps:  # what parallelize applied, in its order (an eager run on one process: nothing)
        log(t.par.describe())
    if t.step:
        log(f"resumed from step {t.step}")
    plan = t.memory_plan
    log(f"memory plan: {plan.total / 2**30:.2f} GiB per device at the peak of a step"
        + (f" of {plan.available / 2**30:.1f} GiB available" if plan.available else ""))


def contention_note(threads: int) -> str | None:
    """What to say when this CPU is already busier than its cores and torch would run several threads: threads that
    wait on one another spin, and a small model then trains many times slower (seen: 20× at load 18 on 2 cores)."""
    cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):  # no load average on this platform
        return None
    if threads <= 1 or load < 1.5 * cores:
        return None
    return (f"load average {load:.1f} on {cores} cores: torch's {threads} threads compete with other work and can "
            f"run many times slower; OMP_NUM_THREADS=1 may train faster, and this run's tok/s will not compare "
            f"with a quiet machine's")


def eval_share(t) -> float:
    """The part of the run's FLOPs its evaluations take (forward only, at the accounting's FLOPs per token)."""
    acc, steps, every = t.build.accounting, t.recipe.steps, t.recipe.eval_every
    evals = steps // every + (1 if steps % every else 0)  # evaluates_at's steps, counted
    evaluation = evals * t.eval_tokens * acc.flops_forward
    total = evaluation + steps * t.tokens_per_step * acc.flops_train
    return evaluation / total if total else 0.0


def run_info(t) -> RunInfo:
    """The run's registry record."""
    d, b = t.data.describe(), t.build
    parallel = "fsdp" if t.par.fsdp else ("ddp" if t.world.distributed else "none")
    return RunInfo(
        spec_name=t.spec.name, model_hash=b.model_hash, spec_json=canonical_dict(t.spec),
        generated_hash=t.generated.source_hash,
        accounting={**b.accounting.to_dict(), "seq_len": t.recipe.seq_len},
        spec_accounting={**b.spec_accounting.to_dict(), "seq_len": t.spec.model.context_length},
        data_hash=t.data.data_hash, seed=t.recipe.seed, recipe=b.recipe,
        code_version=code_version(), host=socket.gethostname(),
        tags={"device": str(t.device), "precision": t.precision.tag(),
              "world_size": str(t.world.size), "compile": t.par.compile_mode,
              "parallel": parallel + ("" if t.layout.trivial else f" {t.layout.describe()}"),
              "activation_checkpointing": f"{len(t.par.checkpointed)}/{len(t.model.blocks)} blocks",
              "corpus": d["corpus"], "corpus_hash": d["corpus_hash"], "tokenizer": d["tokenizer"],
              "train_tokens": str(d["train_tokens"]), "val_tokens": str(d["val_tokens"]),
              "resumed_from_step": str(t.step),
              **({"repeat_of": t.experiment_id} if t.run_id != t.experiment_id else {}),
              **writer_identity()},  # with `host`: lets a later resume on this host see the writer is gone
        repeat=t.repeat, key=b.experiment_id,
    )


def summary(t, losses: list[float], peak_mem_bytes: int) -> dict[str, float]:
    out: dict[str, float] = {"steps": t.step, "tokens": t.step * t.tokens_per_step, "compile_s": t.compile_s,
                             "peak_mem_bytes": peak_mem_bytes, "planned_mem_bytes": t.memory_plan.total,
                             "params": t.build.spec_accounting.total}
    if losses:
        out["train_loss"] = losses[-1]
    if t.last_eval:
        out["eval_tokens"] = t.eval_tokens
    kind_stats = KindStats(t.spec)
    out.update({k: v for k, v in t.last_eval.items() if kind_stats.in_summary(k) and StabilityProbe.in_summary(k)})
    out.update(t.metrics.throughput())
    if t.load_samples:  # how busy the machine was: tok/s of runs measured under other loads do not compare
        out["load_average"] = sum(t.load_samples) / len(t.load_samples)
    return out


def sample_load(samples: list[float]) -> None:
    """The machine's 1-minute load average now (archspec.ablate.report compares runs' throughput only when their
    loads were alike)."""
    try:
        samples.append(os.getloadavg()[0])
    except (OSError, AttributeError):  # no load average on this platform
        pass


def closing_line(t, m: dict[str, float]) -> str:
    parts = [f"[green]{FINISHED}[/] {t.step} steps"]
    if "val_loss" in m:
        parts.append(f"val loss {m['val_loss']:.4f}")
    if "tokens_per_s" in m:
        steady = t.metrics.steady_steps()
        parts.append(f"{m['tokens_per_s']:,.0f} {average_rate_label(t.step - steady + 1, t.step)} · "
                     f"{t.metrics.mfu_text(m)}")
    parts.append(f"checkpoint {shown(t.checkpoint_path)}")
    line = " · ".join(parts)
    flag = t.metrics.flag(m)
    return line + (f"\n[yellow]warning:[/] {flag}" if flag else "")
