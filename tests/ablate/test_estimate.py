"""`ablate --dry-run` time estimates: from the throughput the registry measured, else from the stated assumption."""

from __future__ import annotations

import statistics
from dataclasses import replace

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from archspec.ablate import estimate as estimate_module
from archspec.ablate.estimate import (
    ASSUMED_MFU,
    MIN_LOO,
    Measured,
    Work,
    accuracy,
    accuracy_text,
    caption,
    cost_model,
    estimate,
    measured_runs,
    sweep_start,
)
from archspec.cli import main
from archspec.registry import Registry
from tests.registry.helpers import make_info, make_spec, record_run


def measured(flops: float, tok_s: float, model_hash: str = "h", batch=(8, 128)) -> Measured:
    return Measured(model_hash, "m", batch, flops, tok_s, True)


def work(flops: float, steps: int = 100, tokens_per_step: int = 1024) -> Work:
    return Work(steps, tokens_per_step, flops, flops / 3, evals=0, eval_batches=0, eval_tokens=0)


def test_estimate_sources_in_order():
    # three models on one line: 10 ms of overhead per step plus FLOPs at 50 GFLOP/s (1024 tokens a step)
    line = [measured(f, 1024 / (10e-3 + 1024 * f / 50e9), model_hash=str(f)) for f in (1e5, 1e6, 4e6)]
    m = cost_model(line, peak=None)
    assert m.step_overhead == pytest.approx(10e-3, rel=1e-6) and 1 / m.inv_rate == pytest.approx(50e9, rel=1e-6)
    between = estimate("other", (8, 128), work(2e6), line, peak=1e12)
    assert between.seconds == pytest.approx(100 * (10e-3 + 1024 * 2e6 / 50e9)) and between.basis == "fit to 3 measured models"
    # the same model at the same batch: its own median rate
    same = estimate("1000000.0", (8, 128), work(1e6), line + [measured(1e6, 1000.0, "1000000.0")], peak=1e12)
    assert same.basis.startswith("same model (2 runs)")
    assert same.train_s == pytest.approx(100 * statistics.median([1024 / 1000.0, 10e-3 + 1024 * 1e6 / 50e9]))
    # one measured model: its achieved FLOP/s (or the assumption, when faster) and the overhead left over
    (one,) = line[1:2]
    m1 = cost_model([one], peak=1e9)  # 20% of 1 GFLOP/s is slower than what it achieved
    assert 1 / m1.inv_rate == pytest.approx(one.flops_per_s) and m1.step_overhead == pytest.approx(0.0, abs=1e-12)
    m2 = cost_model([one], peak=1e12)
    assert 1 / m2.inv_rate == pytest.approx(1e12 * ASSUMED_MFU)
    assert m2.step_overhead == pytest.approx(one.step_s - 1024 * 1e6 / 2e11)
    # nothing measured: the stated assumption
    assumed = estimate("x", (8, 128), work(2e6), [], peak=1e12)
    assert assumed.seconds == pytest.approx(2e6 * 102_400 / (1e12 * ASSUMED_MFU)) and assumed.basis == "assumed 20% MFU"


def _record(reg, spec, tok_s, device="cpu", precision="float32", seed=0):
    info = make_info(spec, seed=seed, tags={"device": device, "precision": precision, "world_size": "1"})
    record_run(reg, info, {"val_loss": [(1, 3.0)]}, summary={"val_loss": 3.0, "tokens_per_s": tok_s})


def test_dry_run_uses_measured_runs_of_the_same_device_kind(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    url = f"sqlite:///{tmp_path / 'reg.db'}"
    reg = Registry(url)
    small, big = make_spec("small", d_model=32), make_spec("big", d_model=96)
    _record(reg, small, 20_000.0)
    _record(reg, big, 8_000.0)
    _record(reg, big, 1e9, device="cuda:0", precision="bfloat16", seed=1)  # another device kind: not used on CPU
    assert len(measured_runs(reg, "cpu", "auto")) == 2 and len(measured_runs(reg, "cuda", "auto")) == 1

    sweep = {"name": "est", "base": {"name": "b", "model": make_spec("b").model.model_dump(mode="json"),
                                     "train": {"steps": 10, "warmup_steps": 2, "batch_size": 2, "seq_len": 16}},
             "seeds": [0], "grid": {"model.d_model": [32, 64]}}
    path = tmp_path / "est.yaml"
    path.write_text(yaml.safe_dump(sweep))
    assert main(["ablate", str(path), "--registry", url, "--dry-run", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "times from 2 finished cpu run(s) on other hosts" in out
    assert "fit to 2 measured models" in out  # the batch differs from the recorded runs': no same-model rate

    missing = tmp_path / "none.db"
    assert main(["ablate", str(path), "--registry", f"sqlite:///{missing}", "--dry-run", "--device", "cpu"]) == 0
    assert "no finished cpu run in the registry to measure from: times assume 20%" in capsys.readouterr().out
    assert not missing.exists()  # a dry run reads the registry, never creates it


def test_each_run_pays_the_cheapest_setup_measured():
    """A run's data, module and model are made before it is recorded (outside started → ended): the estimate adds the
    cheapest setup its measured runs paid (a dearer one also paid once-only costs, such as a first tokenising)."""
    base = measured(1e6, 1024 / 0.02)
    timed = [replace(base, wall_s=100 * 0.02 + 1.0, steps=100, setup_s=s) for s in (9.0, 2.5)]
    untimed_setup = cost_model([replace(t, setup_s=None) for t in timed], peak=None)
    with_setup = cost_model(timed, peak=None)
    assert with_setup.run_overhead == pytest.approx(untimed_setup.run_overhead + 2.5)
    assert (estimate("x", (8, 128), work(1e6), timed, peak=None).fixed_s
            == pytest.approx(estimate("x", (8, 128), work(1e6), [replace(t, setup_s=None) for t in timed],
                                      peak=None).fixed_s + 2.5))


# ── learned from the registry's runs, with their error (issue 49) ─────────────────────────────────────────────────

TOKENS = 8 * 128  # tokens a step at batch (8, 128)


def _run(step_s: float, *, steps: int = 60, flops: float = 2.2e6, eval_batches: int = 8, eval_flops: float = 5e10,
         eval_s: float = 0.0, overhead: float = 0.0, gap: float | None = None, start: float | None = None,
         model_hash: str = "h", started: float = 0.0) -> Measured:
    """A run as the registry records it: its record (started → ended) holds its steps, its evaluations (`eval_s`) and
    `overhead`; `gap` lies before its record, in its process."""
    return Measured(model_hash, "m", (8, 128), flops, TOKENS / step_s, True, wall_s=steps * step_s + eval_s + overhead,
                    steps=steps, eval_batches=eval_batches, eval_flops=eval_flops, setup_s=(gap or 0.0) + 0.3,
                    gap_s=gap, start_s=start, started=started)


@settings(max_examples=60, deadline=None)
@given(step_s=st.floats(0.005, 0.5), overhead=st.floats(0.05, 20.0), gap=st.floats(0.0, 2.0),
       eval_share=st.floats(0.0, 2.0), n=st.integers(2, 8), peak=st.sampled_from([None, 1e9, 1e11, 1e13]))
def test_one_model_size_keeps_its_overheads(step_s, overhead, gap, eval_share, n, peak):
    """The lead's case: every measured run has the same FLOPs a step and the same evaluations (an FFN ablation at equal
    FLOPs), so a per-step overhead cannot be told from a FLOP rate nor a per-batch cost from a per-run one. What the
    runs spent besides their steps is still measured: a run of the same shape is predicted as it ran, its fixed part
    is never 0 when the runs had one, and the error over such runs is 0."""
    flops = 2.2e6
    eval_flops = 65_536 * flops / 3
    # evaluation at the training rate per FLOP (a forward pass), `eval_share` of it on top as per-batch cost
    eval_s = eval_flops * step_s / (TOKENS * flops) * (1 + eval_share)
    runs = [_run(step_s, flops=flops, eval_flops=eval_flops, eval_s=eval_s, overhead=overhead, gap=gap if i else None,
                 model_hash=f"v{i % 2}", started=float(i)) for i in range(n)]
    model = cost_model(runs, peak)
    assert model.pooled is not None
    actual = runs[1].run_s
    work_like = Work(60, TOKENS, flops, flops / 3, evals=1, eval_batches=8, eval_tokens=65_536)
    got = estimate("other", (8, 128), work_like, runs, peak)
    assert got.seconds == pytest.approx(actual, rel=1e-6)
    assert got.fixed_s >= gap - 1e-9  # between runs at least
    if peak is None:  # the measured rate is the rate: what is left is the overhead, all of it
        assert model.run_overhead == pytest.approx(overhead + eval_s - eval_flops * step_s / (TOKENS * flops) + gap,
                                                   rel=1e-6)
        assert model.run_overhead > 0
    if n > MIN_LOO:
        found = accuracy(runs, peak)
        assert found is not None and found.median_abs == pytest.approx(0.0, abs=1e-6)


def test_the_lead_case_is_not_collapsed():
    """ffn.yaml at --steps 60, 4 runs of one size (33k tok/s, 4 evaluations of 16k tokens), as a quiet machine
    recorded them: ~2.4 s a record, 0.04 s between runs, 5.2 s from process start to the first run. Before issue 49
    the estimate read 0.0 s per run and left the start out: 10 s for a sweep that took 17.5 s."""
    flops = 2.214e6
    eval_flops = 4 * 16_384 * flops / 3
    step = TOKENS / 33_400
    runs = [_run(step, flops=flops, eval_flops=eval_flops, eval_s=0.62, overhead=0.05, gap=None if i == 0 else 0.04,
                 start=5.2 if i == 0 else None, model_hash=f"v{i // 2}", started=float(i)) for i in range(4)]
    model = cost_model(runs, peak=3.7e11)
    assert model.run_overhead > 0.04 and model.between_s == pytest.approx(0.04)
    assert sweep_start(runs, 3.7e11) == pytest.approx(5.2 - 0.04)
    text = caption(runs, 3.7e11, "cpu")
    assert "one model size: overhead and FLOP rate not separable" in text and "0.0 ms per step" not in text
    assert "the sweep's start 5.2 s (median of 1 process(es)" in text
    assert "past runs predicted within ±0%" in text


def test_error_statement_over_known_runs():
    """Three runs of one model, each predicted from the other two by hand: step time the others' median (two: their
    mean), the same 1 s in its record and 0.5 s before it. Actual 2.5, 3.5, 4.5 s; predicted 4.0, 3.5, 3.0 s."""
    runs = [_run(t, steps=100, eval_batches=0, eval_flops=0.0, overhead=1.0, gap=0.5, started=i)
            for i, t in enumerate((0.01, 0.02, 0.03))]
    assert [m.run_s for m in runs] == pytest.approx([2.5, 3.5, 4.5])
    found = accuracy(runs, peak=None)
    errors = [(4.0 - 2.5) / 2.5, (3.5 - 3.5) / 3.5, (3.0 - 4.5) / 4.5]  # +60%, 0, -33%
    assert found.runs == 3
    assert found.median_abs == pytest.approx(sorted(abs(e) for e in errors)[1])
    assert found.worst == pytest.approx(0.6) and found.bias == pytest.approx(0.0, abs=1e-12)
    assert accuracy_text(runs, None) == ("past runs predicted within ±33% (median abs. error, 3 runs, leave-one-out; "
                                         "worst 60%, no lean either way)")
    assert accuracy_text(runs[:2], None) == "no error yet: fewer than 3 timed runs (2)"
    # a run with no record of its time (no wall time) is not counted; nor is one whose time before its record is unknown
    untimed = [runs[0], runs[1], replace(runs[2], wall_s=None), replace(runs[2], gap_s=None, setup_s=None)]
    assert accuracy(untimed, None) is None and "fewer than 3 timed runs (2)" in accuracy_text(untimed, None)


@settings(max_examples=40, deadline=None)
@given(a=st.floats(0.001, 0.05), rate=st.floats(1e8, 1e11), b=st.floats(0.0, 0.01), c=st.floats(0.0, 10.0),
       gap=st.floats(0.0, 1.0), sizes=st.lists(st.floats(1e5, 1e8), min_size=3, max_size=6, unique=True))
def test_runs_that_follow_the_model_are_predicted_exactly(a, rate, b, c, gap, sizes):
    """Runs generated from a cost model the fit can represent (sizes spread apart, evaluations that differ) are each
    predicted from the others with no error; the fitted costs are the generating ones."""
    sizes = sorted(sizes)
    if sizes[-1] < 4 * sizes[0]:  # too alike to separate a from R: the other test's case
        sizes = [sizes[0] * 10 ** i for i in range(len(sizes))]
    runs = []
    for i, f in enumerate(sizes):
        flops = f / TOKENS
        batches = 4 * (i + 1)
        eval_flops = 1e3 * f * (i % 2 + 1)
        runs.append(_run(a + f / rate, flops=flops, eval_batches=batches, eval_flops=eval_flops,
                         eval_s=batches * b + eval_flops / rate, overhead=c, gap=gap, model_hash=str(i), started=i))
    model = cost_model(runs, peak=None)
    assert model.step_overhead == pytest.approx(a, rel=1e-3, abs=1e-6)
    assert model.run_overhead == pytest.approx(c + gap, rel=1e-3, abs=1e-4)
    found = accuracy(runs, peak=None)
    assert found.runs == len(runs) and found.median_abs == pytest.approx(0.0, abs=1e-3)


def test_gaps_and_the_start_come_from_the_writer_tags(tmp_path, monkeypatch):
    """Two runs written by one process (same boot, pid, process start): the second's gap is what lay between the two
    records; the first's start is its record less its process's start (pid_start ticks after this boot began)."""
    import os

    monkeypatch.setattr(estimate_module.socket, "gethostname", lambda: "testhost")  # the helpers' recorded host
    reg = Registry(f"sqlite:///{tmp_path / 'reg.db'}")
    writer = {"device": "cpu", "precision": "float32", "world_size": "1", "boot_id": "b1", "pid": "42",
              "pid_start": "500"}
    spec = make_spec("small", d_model=32)
    for seed in (0, 1):
        record_run(reg, make_info(spec, seed=seed, tags=writer), {"val_loss": [(1, 3.0)]},
                   summary={"val_loss": 3.0, "tokens_per_s": 1000.0, "time_to_first_step_s": 0.5})
    rows = sorted(reg.runs(), key=lambda r: r.started)
    first = rows[0].started.timestamp()
    began = first - 7.0 - 500 / os.sysconf("SC_CLK_TCK")  # this boot began so that the process started 7 s before
    found = {m.started: m for m in measured_runs(reg, "cpu", "auto", clock=("b1", began))}
    one, two = found[first], found[rows[1].started.timestamp()]
    assert one.start_s == pytest.approx(7.0, abs=1e-5) and one.gap_s is None
    assert two.start_s is None and two.gap_s == pytest.approx((rows[1].started - rows[0].ended).total_seconds(), abs=1e-5)
    # another boot: its processes cannot be placed in time, so no start; the gaps still hold
    other = measured_runs(reg, "cpu", "auto", clock=("b2", began))
    assert all(m.start_s is None for m in other) and sum(m.gap_s is not None for m in other) == 1


def test_the_dry_run_total_counts_the_sweeps_start_once_when_this_boot_measured_it(tmp_path, capsys, monkeypatch):
    """The sweep's start (process start → its first run's record, from the writer tags) is added once to the total and
    named; with no process of this boot (another boot id) the caption says it is not counted."""
    import os
    import re

    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.setattr(estimate_module.socket, "gethostname", lambda: "testhost")
    url = f"sqlite:///{tmp_path / 'reg.db'}"
    reg = Registry(url)
    writer = {"device": "cpu", "precision": "float32", "world_size": "1", "boot_id": "b1", "pid": "7",
              "pid_start": "100"}
    for seed in (0, 1, 2):
        record_run(reg, make_info(make_spec("small", d_model=32), seed=seed, tags=writer), {"val_loss": [(1, 3.0)]},
                   summary={"val_loss": 3.0, "tokens_per_s": 20_000.0, "time_to_first_step_s": 0.1})
    first = min(r.started for r in reg.runs()).timestamp()
    sweep = {"name": "est", "base": {"name": "b", "model": make_spec("b").model.model_dump(mode="json"),
                                     "train": {"steps": 10, "warmup_steps": 2, "batch_size": 2, "seq_len": 16}},
             "seeds": [0, 1], "grid": {"model.d_model": [32, 64]}}
    path = tmp_path / "est.yaml"
    path.write_text(yaml.safe_dump(sweep))

    def total(boot: str) -> tuple[float, str]:
        # this boot began so that the writer process started 30 s before its first run's record
        monkeypatch.setattr(estimate_module, "boot_clock", lambda: (boot, first - 30.0 - 100 / os.sysconf("SC_CLK_TCK")))
        assert main(["ablate", str(path), "--registry", url, "--dry-run", "--device", "cpu"]) == 0
        out = " ".join(capsys.readouterr().out.split())
        return float(re.search(r"estimated total (\d+) s", out).group(1)), out

    with_start, said = total("b1")
    without, unsaid = total("b2")
    assert "s the sweep's start)" in said
    assert re.search(r"the sweep's start (2[89]\.\d|30\.0) s \(median of 1 process\(es\) of this boot", said)
    assert "the sweep's start and the report at the end not counted (no process of this boot timed)" in unsaid
    assert with_start - without == pytest.approx(30.0, abs=2.5)  # once, not per run (4 runs), less one gap, rounded
    assert "leave-one-out" in said  # three timed runs: an error is shown


def test_a_dry_run_keeps_no_ceiling_it_measured(tmp_path, capsys, monkeypatch):
    """A dry run only reads: with no matmul ceiling cached it measures one for its estimate and writes nothing (a
    ceiling measured on a busy machine would otherwise become every later run's MFU denominator)."""
    import yaml

    from archspec.cli import main
    cache = tmp_path / "fresh-cache"
    monkeypatch.setenv("ARCHSPEC_CACHE", str(cache))
    sweep = {"name": "est", "base": {"name": "b", "model": make_spec("b").model.model_dump(mode="json"),
                                     "train": {"steps": 10, "warmup_steps": 2, "batch_size": 2, "seq_len": 16}},
             "seeds": [0], "grid": {"model.d_model": [32, 64]}}
    path = tmp_path / "est.yaml"
    path.write_text(yaml.safe_dump(sweep))
    assert main(["ablate", str(path), "--registry", f"sqlite:///{tmp_path / 'none.db'}", "--dry-run",
                 "--device", "cpu"]) == 0
    assert "times assume 20%" in capsys.readouterr().out
    assert not cache.exists() or not any(cache.rglob("*"))
