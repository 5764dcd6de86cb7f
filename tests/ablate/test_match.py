"""Matched budgets (archspec.ablate.match): the solved width is valid and its count is the nearest valid one; sweeps
with `match`/`solve`; `archspec build --match`."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from archspec.ablate.match import count, parse_match, solve_width
from archspec.ablate.sweep import load_sweep
from archspec.cli import main
from archspec.errors import UserError
from archspec.spec import parse_spec, set_dotted
from archspec.testing.strategies import spec_dicts

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "specs" / "llama-like-tiny.yaml"
BASE = {"name": "b", "model": {"vocab_size": 300, "context_length": 32, "d_model": 32, "n_layers": 2,
                               "attention": {"n_heads": 4}, "ffn": {"kind": "glu", "hidden_dim": 64}},
        "train": {"batch_size": 2, "seq_len": 16, "steps": 7, "warmup_steps": 2}}


def brute_force(data, key, measure, lo, hi, multiple_of):
    """Every valid multiple of `multiple_of` in [lo, hi] with its count."""
    out = {}
    for w in range(-(-lo // multiple_of) * multiple_of, hi + 1, multiple_of):
        trial = copy.deepcopy(data)
        set_dotted(trial, key, w, "test")
        try:
            out[w] = count(parse_spec(trial), measure)
        except (ValidationError, ValueError):
            continue
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=spec_dicts(max_d_model=48, max_layers=2, max_hidden=64), key=st.sampled_from(
    ["model.ffn.hidden_dim", "model.d_model", "model.n_layers"]), measure=st.sampled_from(["params", "flops",
                                                                                            "kv_bytes"]),
    multiple_of=st.sampled_from([1, 4, 8]), hi=st.integers(8, 96), where=st.floats(-0.5, 1.5))
def test_solved_count_is_the_nearest_valid_one(data, key, measure, multiple_of, hi, where):
    valid = brute_force(data, key, measure, 1, hi, multiple_of)
    counts = sorted(valid.values())
    target = max(1, round(counts[0] + where * (counts[-1] - counts[0]))) if counts else 1000
    if not valid:
        with pytest.raises(UserError, match="no valid value"):
            solve_width(data, key, measure, target, tolerance=float("inf"), multiple_of=multiple_of, bounds=(1, hi))
        return
    ws = sorted(valid)
    assume(all(valid[a] <= valid[b] for a, b in zip(ws, ws[1:])))  # the solver's premise (checked separately below)
    solution = solve_width(data, key, measure, target, tolerance=float("inf"), multiple_of=multiple_of, bounds=(1, hi))
    assert solution.value % multiple_of == 0 and 1 <= solution.value <= hi
    spec = parse_spec(solution.data)  # the solved spec is valid, and is the one returned
    assert count(spec, measure) == solution.count == valid[solution.value]
    assert abs(solution.count - target) == min(abs(c - target) for c in valid.values())


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=spec_dicts(max_d_model=48, max_layers=2, max_hidden=64),
       key=st.sampled_from(["model.ffn.hidden_dim", "model.d_model", "model.n_layers"]),
       measure=st.sampled_from(["params", "flops", "kv_bytes"]))
def test_counts_never_decrease_with_the_width(data, key, measure):
    """The premise of the search: a wider valid width never has a smaller count."""
    valid = brute_force(data, key, measure, 1, 64, 1)
    ws = sorted(valid)
    assert all(valid[a] <= valid[b] for a, b in zip(ws, ws[1:])), {w: valid[w] for w in ws}


def test_sparse_valid_values_are_searched_not_rounded():
    """d_model must be divisible by n_heads (and head_dim follows it): with 12 heads only multiples of 24 (lcm with
    8) are valid, and the solver finds the nearest of those, not a rounded width the rules refuse."""
    data = copy.deepcopy(BASE)
    data["model"]["attention"] = {"n_heads": 12}
    data["model"]["d_model"] = 48
    target = count(parse_spec(data), "params") * 2
    solution = solve_width(data, "model.d_model", "params", target, tolerance=0.5)
    assert solution.value % 24 == 0
    valid = brute_force(data, "model.d_model", "params", 8, 512, 8)
    assert abs(solution.count - target) == min(abs(c - target) for c in valid.values())


def test_out_of_tolerance_names_the_best_and_its_residual():
    with pytest.raises(UserError) as e:
        solve_width(BASE, "model.ffn.hidden_dim", "params", 10, what="variant 3")
    text = e.value.render()
    assert text.startswith("variant 3: ") and "the best is 8 at" in text and "residual +" in text
    with pytest.raises(UserError, match="does not change the KV-cache bytes"):
        solve_width(BASE, "model.ffn.hidden_dim", "kv_bytes", 10)


def test_parse_match():
    assert parse_match("params=400000") == ("params", 400000)
    assert parse_match("kv_bytes=1_024") == ("kv_bytes", 1024)
    for bad in ("params", "size=3", "flops=1.5", "params=0", "params=12M"):
        with pytest.raises(UserError):
            parse_match(bad)


def sweep(**kw):
    return load_sweep(data={"name": "s", "base": BASE, "seeds": [0], **kw})


def test_matched_sweep_solves_every_variant_within_tolerance():
    s = sweep(grid={"model.attention.n_kv_heads": [4, 1, 2], "model.norm.kind": ["layernorm", "rmsnorm"]},
              match="params", solve="model.ffn.hidden_dim", multiple_of=4)
    target = s.baseline.accounting.total
    assert s.baseline.solution.value == 64 and s.baseline.solution.residual == 0  # the baseline keeps its width
    for v in s.variants:
        assert abs(v.accounting.total - target) <= 0.02 * target
        assert v.spec.model.ffn.hidden_dim == v.solution.value and v.solution.value % 4 == 0
    assert len({v.spec.model.ffn.hidden_dim for v in s.variants}) > 1  # fewer KV heads: a wider FFN
    plain = sweep(grid={"model.attention.n_kv_heads": [4, 1, 2], "model.norm.kind": ["layernorm", "rmsnorm"]})
    assert all(v.solution is None for v in plain.variants)
    assert plain.sweep_hash != s.sweep_hash


def test_matched_sweep_flops_and_kv_bytes():
    s = sweep(grid={"model.n_layers": [2, 3]}, match="flops", solve="model.d_model", tolerance=0.1)
    a, b = s.variants
    assert b.spec.model.d_model < a.spec.model.d_model
    assert abs(b.accounting.flops_train - a.accounting.flops_train) <= 0.1 * a.accounting.flops_train
    kv = sweep(grid={"model.attention.n_kv_heads": [2, 4]}, match="kv_bytes", solve="model.attention.head_dim",
               tolerance=0.01, multiple_of=4)
    a, b = kv.variants
    assert a.accounting.kv_cache_bytes_per_token == b.accounting.kv_cache_bytes_per_token


@pytest.mark.parametrize("kw,message", [
    ({"match": "params"}, "match and solve: give both"),
    ({"solve": "model.ffn.hidden_dim"}, "match and solve: give both"),
    ({"match": "size", "solve": "model.ffn.hidden_dim"}, "match"),
    ({"match": "params", "solve": "model.attention.n_kv_heads"}, "also a grid/zip key"),
    ({"match": "params", "solve": "model.ffn.hidden_dim", "tolerance": 0}, "tolerance"),
])
def test_bad_match_fields(kw, message):
    with pytest.raises(UserError) as e:
        sweep(grid={"model.attention.n_kv_heads": [4, 1]}, **kw)
    assert message in e.value.render()


def test_unreachable_match_names_the_variant():
    with pytest.raises(UserError) as e:
        sweep(grid={"model.n_layers": [2, 1]}, match="kv_bytes", solve="model.ffn.hidden_dim")
    text = e.value.render()
    assert "variant 1 (model.n_layers=1)" in text and "residual" in text


def test_build_match_cli(tmp_path, capsys):
    rc = main(["build", str(TINY), "--match", "params=500000", "--solve", "model.ffn.hidden_dim", "--json",
               "--out", str(tmp_path), "--no-record"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    obj = json.loads(out.out)
    m = obj["matched"]
    assert m["key"] == "model.ffn.hidden_dim" and m["value"] % 8 == 0 and obj["params"]["total"] == m["count"]
    assert abs(m["residual"]) <= 0.02
    for args, message in [(["--match", "params=10", "--solve", "model.ffn.hidden_dim"], "residual"),
                          (["--match", "params=500000"], "give both"),
                          (["--match", "bytes=5", "--solve", "model.ffn.hidden_dim"], "MEASURE=N")]:
        rc = main(["build", str(TINY), "--out", str(tmp_path), "--no-record", *args])
        err = capsys.readouterr().err
        assert rc == 2 and message in err and "Traceback" not in err


def test_report_shows_the_solved_width_and_residual():
    from archspec.ablate.report import RunResult, VariantResult, table_rows, variant_numbers

    def v(index, matched):
        runs = [RunResult(f"r{index}{s}", s, "FINISHED", 2.0 + s / 100, None, [], 1) for s in range(2)]
        return VariantResult(index, f"v{index}", {}, 100, 100, 600, 512, runs, matched=matched)

    m0 = {"key": "model.ffn.hidden_dim", "value": 64, "measure": "params", "count": 1000, "target": 1000,
          "residual": 0.0}
    m1 = {**m0, "value": 88, "count": 1012, "residual": 0.012}
    rows = table_rows([v(0, m0), v(1, m1)], 0)
    assert rows[0]["matched"] == "hidden_dim=64 (target params)" and rows[1]["matched"] == "hidden_dim=88 (+1.20% params)"
    assert variant_numbers([v(0, m0), v(1, m1)], 0)[1]["matched"]["residual"] == 0.012
    assert "matched" not in table_rows([v(0, None), v(1, None)], 0)[0]  # an unmatched sweep has no such column


def test_sweep_schema_states_the_new_fields():
    import jsonschema

    from archspec.ablate.sweep import sweep_json_schema

    validator = jsonschema.Draft202012Validator(sweep_json_schema())
    ok = {"name": "s", "base": "x.yaml", "match": "params", "solve": "model.ffn.hidden_dim", "lr_sweep": [1e-3, 3e-3],
          "stability": True, "tolerance": 0.05, "multiple_of": 4}
    assert not list(validator.iter_errors(ok))
    for bad in ({"match": "params"}, {"solve": "model.ffn.hidden_dim"}, {"lr_sweep": [1e-3, 1e-3]}, {"lr_sweep": [1e-3]}, {"match": "size", "solve": "a.b"},
                {"tolerance": 0}):
        data = {"name": "s", "base": "x.yaml", **bad}
        assert list(validator.iter_errors(data)), bad
        with pytest.raises(UserError):
            load_sweep(data={**data, "base": BASE})
