"""A sweep's `quantize:` option: every finished run quantized at each scheme through `archspec quantize`'s own
function, once; the report holds each scheme's val-loss delta over seeds beside the trained loss; bad values exit 2."""

from __future__ import annotations

import json
import statistics

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from archspec.ablate.quantize import matching
from archspec.ablate.stats import mean_interval
from archspec.ablate.sweep import load_sweep
from archspec.cli import main
from archspec.errors import UserError
from archspec.quant.schemes import SCHEMES
from archspec.registry import Registry

pytest.importorskip("torchao")


TINY = {"name": "tiny", "model": {"vocab_size": 300, "context_length": 16, "d_model": 32, "n_layers": 1,
                                  "attention": {"n_heads": 2}}}


def write_sweep(workdir, base_spec, **extra):
    sweep = {"name": "qmini", "base": base_spec, "seeds": [0, 1], "budget": {"steps": 3},
             "grid": {"model.attention.n_kv_heads": [2, 1]}, "quantize": ["int8", "int4"], **extra}
    path = workdir / "qmini.yaml"
    path.write_text(yaml.safe_dump(sweep))
    return path


def test_sweep_quantizes_each_run_once_and_reports_the_deltas(workdir, base_spec, capsys):
    path = write_sweep(workdir, base_spec, quantize_group_size=16)
    url = f"sqlite:///{workdir / 'reg.db'}"
    assert main(["ablate", str(path), "--registry", url, "--json", "--no-compile"]) == 0
    out = capsys.readouterr()
    report = json.loads(out.out)
    assert "8 quantized (int8, int4), 0 already quantized" in out.err

    registry = Registry(url)
    runs = registry.runs(where="sweep = 'qmini'")
    assert len(runs) == 4 and {r.status for r in runs} == {"FINISHED"}
    deltas: dict[tuple[int, str], list[float]] = {}
    for r in runs:
        evaluations = registry.evaluations(r.id)
        assert sorted(e["task"] for e in evaluations) == ["quant.int4", "quant.int8"]
        for e in evaluations:
            scheme = e["task"].removeprefix("quant.")
            assert e["params"]["group_size"] == (16 if scheme == "int4" else None)
            m = e["metrics"]
            # the evaluation is `archspec quantize`'s: loss before is the run's own final val loss
            assert m["val_loss_before"] == pytest.approx(r.summary["val_loss"], rel=1e-5)
            assert m["val_loss_delta"] == pytest.approx(m["val_loss_after"] - m["val_loss_before"])
            deltas.setdefault((r.memberships["qmini"].variant, scheme), []).append(m["val_loss_delta"])
    # filters reach them (the registry's evaluations, as `archspec quantize` recorded them)
    assert len(registry.runs(where="sweep = 'qmini' AND quant.int4.val_loss_delta > -100")) == 4

    rows = {row["variant"].split()[0]: row for row in report["rows"]}
    numbers = {v["index"]: v for v in report["variants"]}
    for (index, scheme), values in deltas.items():
        interval = mean_interval(values)
        q = numbers[index]["quant"][scheme]
        assert q["n"] == 2
        assert q["val_loss_delta"]["estimate"] == pytest.approx(statistics.fmean(values))
        assert (q["val_loss_delta"]["low"], q["val_loss_delta"]["high"]) == pytest.approx((interval.low, interval.high))
        cell = rows[f"v{index}"][f"{scheme} Δ val loss [95% CI]"]
        assert cell.startswith(f"{statistics.fmean(values):+.4f} {interval.text()}")
        trained = mean_interval(numbers[index]["final_val_losses"])
        assert rows[f"v{index}"]["trained 95% CI"] == f"{trained.estimate:.4f} [{trained.low:.4f}, {trained.high:.4f}]"
    html = (workdir / "reports" / "qmini" / "qmini.html").read_text()
    assert "int4 Δ val loss [95% CI]" in html and "int4, int8 (archspec quantize, weight-only)" in html

    # rerunning trains nothing and quantizes nothing new
    assert main(["ablate", str(path), "--registry", url, "--json", "--no-compile"]) == 0
    again = capsys.readouterr()
    assert "0 trained, 4 already finished" in again.err
    assert "0 quantized (int8, int4), 8 already quantized" in again.err
    assert sum(len(registry.evaluations(r.id)) for r in runs) == 8
    assert json.loads(again.out)["variants"] == report["variants"]
    # `archspec report` by name (no sweep file) finds the same evaluations
    assert main(["report", "qmini", "--registry", url, "--json", "--out", str(workdir / "again")]) == 0
    assert json.loads(capsys.readouterr().out)["variants"] == report["variants"]


def test_a_sweep_without_quantize_has_no_quant_columns(workdir, base_spec, capsys):
    path = write_sweep(workdir, base_spec, seeds=[0], quantize=None, grid={})
    url = f"sqlite:///{workdir / 'reg.db'}"
    assert main(["ablate", str(path), "--registry", url, "--json", "--no-compile"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert not any("Δ val loss" in c or c == "trained 95% CI" for c in report["rows"][0])
    assert report["variants"][0]["quant"] == {}
    assert Registry(url).evaluations(report["variants"][0]["runs"][0]["run_id"]) == []


@pytest.mark.parametrize("extra, message", [
    ({"quantize": ["int8", "int3"]}, "quantize[1]: unknown scheme 'int3'; expected int8 or int4"),
    ({"quantize": ["int8", "int8"]}, "quantize: repeated scheme"),
    ({"quantize": []}, "quantize"),
    ({"quantize": ["int8"], "quantize_group_size": 32}, "quantize_group_size: applies to int4"),
    ({"quantize": ["int4"], "quantize_group_size": 31}, "quantize_group_size: must be even"),
    ({"quantize": ["int4"], "quantize_group_size": 0}, "quantize_group_size"),
])
def test_bad_quantize_values_exit_2_with_the_path(workdir, base_spec, capsys, extra, message):
    path = write_sweep(workdir, base_spec, **extra)
    assert main(["ablate", str(path), "--registry", f"sqlite:///{workdir / 'reg.db'}"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (workdir / "reg.db").exists() or Registry(f"sqlite:///{workdir / 'reg.db'}").runs() == []


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(alphabet="int0123456789ab", min_size=1, max_size=5), min_size=1, max_size=2, unique=True))
def test_every_unknown_scheme_is_named_at_its_index(schemes):
    data = {"name": "q", "base": TINY, "quantize": schemes}
    bad = [(i, s) for i, s in enumerate(schemes) if s not in SCHEMES]
    if not bad:
        assert load_sweep(data=data).file.quantize == schemes
        return
    with pytest.raises(UserError) as e:
        load_sweep(data=data)
    text = e.value.render()
    for i, s in bad:
        assert f"quantize[{i}]: unknown scheme {s!r}; expected int8 or int4" in text


def _evaluation(task, group_size, embeddings=False, delta=0.1):
    return {"task": task, "params": {"group_size": group_size, "embeddings": embeddings},
            "metrics": {"val_loss_delta": delta}}


@given(st.lists(st.tuples(st.sampled_from(["quant.int8", "quant.int4", "probe"]),
                          st.sampled_from([None, 16, 32]), st.booleans()), max_size=6),
       st.sampled_from(SCHEMES), st.sampled_from([None, 16, 32]))
def test_matching_is_the_latest_evaluation_of_the_scheme_at_the_group_size(records, scheme, group_size):
    evaluations = [_evaluation(t, g, emb, delta=float(i)) for i, (t, g, emb) in enumerate(records)]
    found = matching(evaluations, scheme, group_size)
    want = group_size if scheme == "int4" else None
    fits = [e for e in evaluations if e["task"] == f"quant.{scheme}" and not e["params"]["embeddings"]
            and (want is None or e["params"]["group_size"] == want)]
    assert found == (fits[-1] if fits else None)
