"""Spec/run builders shared by the registry tests and by the writer processes they start."""

from __future__ import annotations

from typing import Any

from archspec.accounting import account
from archspec.spec import canonical_dict, load_spec_dict, model_hash
from archspec.train.logger import RunInfo, SweepMembership


def make_spec(name: str = "tiny", **model: Any):
    """A small valid spec; keyword arguments override `model.*` (nested dicts allowed)."""
    base: dict[str, Any] = {"vocab_size": 256, "context_length": 64, "d_model": 64, "n_layers": 2,
                            "attention": {"n_heads": 4}}
    for k, v in model.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            base[k] = {**base[k], **v}
        else:
            base[k] = v
    return load_spec_dict({"name": name, "model": base})


def accounting(spec) -> dict[str, Any]:
    """The real accounting, as the training loop records it (a pure function of the spec: microseconds)."""
    return account(spec, seq_len=spec.train.seq_len).to_dict()


def make_info(spec=None, seed: int = 0, sweep: str | None = None, data_hash: str = "data-v1",
              tags: dict[str, str] | None = None, **recipe_overrides: Any) -> RunInfo:
    spec = spec if spec is not None else make_spec()
    data = canonical_dict(spec)
    recipe = {**data["train"], **recipe_overrides}
    return RunInfo(
        spec_name=spec.name, model_hash=model_hash(spec), spec_json=data, generated_hash="g" * 64,
        accounting=accounting(spec), data_hash=data_hash, seed=seed, recipe=recipe, code_version="test",
        sweep=SweepMembership(sweep, 0, "base") if sweep is not None else None, host="testhost", tags=dict(tags or {}),
    )


def create_registry(url: str) -> None:
    """Create the registry's schema (what the first write, or `archspec registry upgrade`, does)."""
    from archspec.registry import Registry

    with Registry(url) as reg:
        reg.upgrade()


INJECTION = "'; DROP TABLE runs; --"


def record_run(reg, info: RunInfo, metrics: dict[str, list[tuple[int, float]]] | None = None,
               status: str | None = "FINISHED", summary: dict[str, float] | None = None,
               heartbeat_timeout_s: float = 3600.0) -> str:
    """Write a run through the Registry's writer API (what RegistryLogger does, without its buffering)."""
    attempt = reg.start_run(info, heartbeat_timeout_s=heartbeat_timeout_s)
    points = [(step, key, value, 0.0) for key, pts in (metrics or {}).items() for step, value in pts]
    reg.write_metrics(info.run_id, attempt, points)
    if summary:
        reg.set_summary(info.run_id, summary)
    if status is not None and status != "RUNNING":
        reg.finish_run(info.run_id, attempt, status, "boom" if status == "FAILED" else None)
    return info.run_id


def populate(reg) -> dict[str, str]:
    """Four runs over three specs, chosen so that each grammar feature separates them:

    llama (rmsnorm, d_model 64, 2 layers):   seed 0 val_loss 3.0 FINISHED;  seed 1 val_loss 3.5 (min 3.1) FAILED
    gpt   (layernorm, d_model 512, 8 layers): seed 0 val_loss 2.9 FINISHED, sweep = an injection string
    wide  (rmsnorm, d_model 128, 8 layers):   seed 0 no metrics, RUNNING
    """
    llama = make_spec("llama")
    gpt = make_spec("gpt", d_model=512, n_layers=8, attention={"n_heads": 8}, norm={"kind": "layernorm"})
    wide = make_spec("wide", d_model=128, n_layers=8)
    ids = {
        "llama0": record_run(reg, make_info(llama, seed=0, sweep="s1", tags={"note": "baseline"}),
                             {"val_loss": [(0, 4.0), (100, 3.0)], "train_loss": [(100, 2.5)]},
                             summary={"tok_s": 1000.0}),
        "llama1": record_run(reg, make_info(llama, seed=1, sweep="s1"),
                             {"val_loss": [(0, 4.0), (50, 3.1), (100, 3.5)]}, status="FAILED"),
        "gpt0": record_run(reg, make_info(gpt, seed=0, sweep=INJECTION, tags={"note": INJECTION}),
                           {"val_loss": [(0, 4.2), (100, 2.9)]}, summary={"tok_s": 500.0}),
        "wide0": record_run(reg, make_info(wide, seed=0), None, status="RUNNING"),
    }
    return ids


def writer_tags(pid: int) -> dict[str, str]:
    """The writer-identity tags (archspec.registry.values.WRITER_IDENTITY) a process `pid` of this host would record;
    read while it still exists (a zombie will do)."""
    from archspec.registry.values import _namespace_and_boot, _proc_start

    ns, boot = _namespace_and_boot()
    return {"pid": str(pid), "pid_namespace": ns or "", "boot_id": boot or "", "pid_start": _proc_start(pid) or ""}
