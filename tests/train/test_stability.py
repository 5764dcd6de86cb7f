"""Stability metrics (issue 34): per-layer activation RMS, max attention logit, gradient and update norms at each
evaluation, loss spikes; recorded as registry metrics, the model-wide ones in the summary."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from archspec.registry import Registry, RegistryLogger
from archspec.train.loop import Trainer
from archspec.train.metrics import SPIKE_WINDOW, SpikeCounter, max_visible_logit


@settings(max_examples=25, deadline=None)
@given(b=st.integers(1, 2), kv=st.integers(1, 3), group=st.integers(1, 3), t=st.integers(1, 9), d=st.integers(1, 6),
       seed=st.integers(0, 10_000), how=st.sampled_from(["causal", "bool", "float", "none"]))
def test_max_visible_logit_is_the_largest_visible_score(b, kv, group, t, d, seed, how):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(b, kv * group, t, d, generator=g), torch.randn(b, kv, t, d, generator=g)
    full = q @ k.repeat_interleave(group, dim=1).transpose(-1, -2) / math.sqrt(d)  # every query head's keys
    allowed = torch.rand(t, t, generator=g) < 0.6
    allowed[:, 0] = True  # every query sees one key at least
    if how == "causal":
        got, allowed = max_visible_logit(q, k, is_causal=True), torch.ones(t, t, dtype=torch.bool).tril()
    elif how == "bool":
        got = max_visible_logit(q, k, allowed)
    elif how == "float":
        got = max_visible_logit(q, k, torch.zeros(t, t).masked_fill(~allowed, -torch.inf))
    else:
        got, allowed = max_visible_logit(q, k), torch.ones(t, t, dtype=torch.bool)
    assert torch.allclose(got, full.masked_fill(~allowed, -torch.inf).max(), atol=1e-5)
    assert torch.allclose(max_visible_logit(q, k, scale=2.0), (full * math.sqrt(d) * 2.0).max(), atol=1e-4)


def test_spike_rule():
    counter = SpikeCounter()
    noisy = [3.0 + 0.01 * ((i * 7) % 5 - 2) for i in range(SPIKE_WINDOW)]
    assert not any(counter.add(x) for x in noisy)
    assert counter.add(4.0)  # far outside the window's spread and 33% above its mean
    assert not counter.add(3.01)
    assert counter.count == 1
    falling = SpikeCounter()
    assert not any(falling.add(5.0 - 0.01 * i) for i in range(200))  # a descending curve has none
    early = SpikeCounter()
    assert not any(early.add(x) for x in [1.0] * (SPIKE_WINDOW - 1) + [9.0])  # too few steps before it to judge


def test_loop_records_per_layer_stability_at_evaluations(make_spec, tmp_path, cache):
    spec = make_spec(stability=True)
    registry = Registry(f"sqlite:///{tmp_path}/r.db")
    trainer = Trainer(spec, run_dir=tmp_path / "run", cache=cache, logger=RegistryLogger(registry.url))
    result = trainer.run()
    n = spec.model.n_layers
    row = registry.get_run(result.run_id)
    for i in range(n):
        for name in ("act_rms", "max_logit", "grad_norm", "update_norm"):
            history = registry.metric_history(result.run_id, f"stability.layer{i}.{name}")
            assert [p.step for p in history] == [s for s, _ in result.evals], name  # at every evaluation
            assert all(math.isfinite(p.value) for p in history)
    for key in ("stability.act_rms", "stability.max_logit", "stability.grad_norm", "stability.update_norm",
                "stability.loss_spikes"):
        assert key in row.summary, key
    assert not any(k.startswith("stability.layer") for k in row.summary)  # per-layer figures stay per evaluation
    assert row.summary["stability.max_logit"] == max(
        row.metrics[f"stability.layer{i}.max_logit"] for i in range(n))

    # the last evaluation's figures are the final model's, recomputed here by hand on the first validation batch:
    # each block's output RMS from a hook, each attention call's q and k captured and scored over the causal keys
    model = trainer.model.eval()
    inputs, targets = trainer.data.val_batches[0]
    rms, calls = {}, []
    hooks = [b.register_forward_hook(lambda m, a, out, i=i: rms.__setitem__(i, out.pow(2).mean().sqrt().item()))
             for i, b in enumerate(model.blocks)]
    real = torch.nn.functional.scaled_dot_product_attention

    def capture(q, k, v, *args, **kwargs):
        calls.append((q, k))
        return real(q, k, v, *args, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = capture
    try:
        with torch.no_grad():
            model(inputs, targets)
    finally:
        torch.nn.functional.scaled_dot_product_attention = real
        for h in hooks:
            h.remove()
    assert len(calls) == n
    for i, (q, k) in enumerate(calls):
        s = q @ k.repeat_interleave(q.size(1) // k.size(1), 1).transpose(-1, -2) / math.sqrt(q.size(-1))
        best = s.masked_fill(~torch.ones(s.size(-1), s.size(-1), dtype=torch.bool).tril(), -torch.inf).max()
        assert row.metrics[f"stability.layer{i}.act_rms"] == pytest.approx(rms[i], rel=1e-5)
        assert row.metrics[f"stability.layer{i}.max_logit"] == pytest.approx(float(best), rel=1e-5)
    assert torch.nn.functional.scaled_dot_product_attention is real  # the probe left torch as it found it


def test_update_norm_is_what_the_step_changed(make_spec, tmp_path, cache):
    """The norms the probe records around the step before an evaluation equal the parameters' own change."""
    trainer = Trainer(make_spec(steps=4, eval_interval=4, stability=True), run_dir=tmp_path / "run", cache=cache)
    for _ in range(3):
        trainer.train_step()
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train_step()  # step 4 is evaluated: probed
    norms = trainer.stability.norms
    for i, block in enumerate(trainer.model.blocks):
        delta = torch.cat([(p.detach() - before[f"blocks.{i}.{n}"]).reshape(-1) for n, p in block.named_parameters()])
        assert norms[f"stability.layer{i}.update_norm"] == pytest.approx(delta.norm().item(), rel=1e-4)
        assert norms[f"stability.layer{i}.grad_norm"] > 0


def test_off_unless_asked_and_not_identity(make_spec, tmp_path, cache):
    """train.stability is observation: the run id is the same either way, and without it no stability row exists."""
    plain = Trainer(make_spec(steps=2, eval_interval=2), run_dir=tmp_path / "a", cache=cache)
    probed = Trainer(make_spec(steps=2, eval_interval=2, stability=True), run_dir=tmp_path / "b", cache=cache)
    assert plain.run_id == probed.run_id and plain.stability is None
    plain.train_step(), plain.train_step()
    assert not any(k.startswith("stability.") for k in plain.evaluate())


def test_sweep_stability_field_sets_every_variant():
    from archspec.ablate.sweep import load_sweep

    base = {"name": "b", "model": {"vocab_size": 300, "context_length": 32, "d_model": 32, "n_layers": 1,
                                   "attention": {"n_heads": 4}}, "train": {"steps": 4, "warmup_steps": 1}}
    on = load_sweep(data={"name": "s", "base": base, "grid": {"model.n_layers": [1, 2]}, "stability": True})
    off = load_sweep(data={"name": "s", "base": base, "grid": {"model.n_layers": [1, 2]}})
    assert all(v.spec.train.stability for v in on.variants) and not any(v.spec.train.stability for v in off.variants)


def _probed(spec, tmp_path, T: int):
    """The spec's model run once on random tokens under a StabilityProbe, with every call to the attention-logit
    observers (the one list of archspec.runtime.scores, which sparse re-exports) captured: (metrics, calls), each call
    (q, k, visible, scale)."""
    from archspec.codegen import generate
    from archspec.runtime import scores
    from archspec.train.metrics import StabilityProbe

    model = generate(spec, out_dir=tmp_path).Model().eval()
    seen = []
    scores.logit_observers.append(lambda q, k, visible, scale=None: seen.append((q, k, visible, scale)))
    probe = StabilityProbe(model)
    try:
        with torch.no_grad(), probe.recording():
            model(torch.randint(0, spec.model.vocab_size, (2, T), generator=torch.Generator().manual_seed(0)))
    finally:
        scores.logit_observers.clear()

    class OneProcess:
        def mean(self, t):
            return t

    return probe.eval_metrics(OneProcess()), seen


def test_sparse_patterns_are_scored_over_their_own_keys(tmp_path):
    """A sliding-window model attends through archspec.runtime.sparse: its layers get a max logit over the window."""
    from archspec.runtime import scores, sparse
    from archspec.spec import load_spec

    assert sparse.logit_observers is scores.logit_observers
    spec = load_spec("specs/mistral-like-tiny.yaml")
    got, seen = _probed(spec, tmp_path, 48)
    assert len(seen) == spec.model.n_layers
    for i, (q, k, visible, _) in enumerate(seen):
        assert not visible.all()  # a window: some causal keys are out of it
        s = q @ k.repeat_interleave(q.size(1) // k.size(1), 1).transpose(-1, -2) / math.sqrt(q.size(-1))
        assert got[f"stability.layer{i}.max_logit"] == pytest.approx(float(s.masked_fill(~visible, -torch.inf).max()),
                                                                     rel=1e-5)


@pytest.mark.parametrize("override", ["model.attention.softcap=0.05", "model.attention.positional={kind: alibi}"])
def test_capped_or_biased_dense_layers_are_scored_before_the_cap(tmp_path, override):
    """A layer that caps or biases its scores leaves SDPA for score_mod_attention: its max logit is still recorded,
    the raw q·k · scale (before the cap: a cap of 0.05 would bound every capped score by 0.05)."""
    from archspec.spec import load_spec

    spec = load_spec("specs/llama-like-tiny.yaml", [override, "model.attention.scale=2.0"])
    got, seen = _probed(spec, tmp_path, 32)
    assert len(seen) == spec.model.n_layers
    for i, (q, k, visible, scale) in enumerate(seen):
        assert scale == 2.0
        s = q @ k.repeat_interleave(q.size(1) // k.size(1), 1).transpose(-1, -2) * scale
        best = float(s.masked_fill(~visible, -torch.inf).max())
        assert got[f"stability.layer{i}.max_logit"] == pytest.approx(best, rel=1e-5)
    if "softcap" in override:
        assert max(got[f"stability.layer{i}.max_logit"] for i in range(spec.model.n_layers)) > 0.05
