"""`archspec runs ...` and `archspec specs ...` through the real entry point (exit codes, formats, messages)."""

from __future__ import annotations

import csv
import io
import json

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine, text

from archspec.cli import main
from archspec.cli.registry import runs_cmd, specs_cmd
from archspec.registry.migrate import VERSION_TABLE

from .helpers import INJECTION, accounting, make_spec, populate


@pytest.fixture
def data(registry, registry_url):
    return registry_url, populate(registry)


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_runs_list_table(data, capsys):
    url, ids = data
    where = "params.model.norm.kind = 'rmsnorm' and metrics.val_loss < 3.2"
    code, out, err = run_cli(capsys, "runs", "list", "--registry", url, "--where", where, "--sort", "metrics.val_loss")
    assert code == 0, err
    assert ids["llama0"] in out and ids["llama1"] not in out and ids["gpt0"] not in out
    header = out.splitlines()[0]
    for column in ("id", "name", "status", "params.active", "params.model.norm.kind", "metrics.val_loss"):
        assert column in header
    assert "FINISHED" in out and "1 run" in out


def test_runs_list_json_and_csv(data, capsys):
    url, ids = data
    code, out, _ = run_cli(capsys, "runs", "list", "--registry", url, "--format", "json", "--sort", "-metrics.val_loss")
    rows = json.loads(out)
    assert code == 0 and [r["id"] for r in rows] == [ids[k] for k in ("llama1", "llama0", "gpt0", "wide0")]
    assert rows[0]["params.total"] > 0 and rows[0]["metrics.val_loss"] == 3.5 and rows[0]["metrics.best.val_loss"] == 3.1
    assert rows[0]["flops.forward"] > 0 and rows[0]["params.model.d_model"] == 64
    code, out, _ = run_cli(capsys, "runs", "list", "--registry", url, "--format", "csv",
                           "--where", "status = 'FINISHED'", "--columns", "params.model.d_model")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and {r["id"] for r in rows} == {ids["llama0"], ids["gpt0"]}
    assert {r["params.model.d_model"] for r in rows} == {"64", "512"} and all(r["params.total"] for r in rows)
    assert all(r["params.model.norm.kind"] for r in rows)  # params.* columns without --columns


def test_export_columns_are_filter_fields(data, capsys):
    """Every field of a JSON/CSV export is a name `--where` accepts, and filtering on it finds that run."""
    url, ids = data
    for fmt in ("json", "csv"):
        code, out, _ = run_cli(capsys, "runs", "export", "--registry", url, "--format", fmt)
        rows = json.loads(out) if fmt == "json" else list(csv.DictReader(io.StringIO(out)))
        assert code == 0 and len(rows) == 4
        keys = {k for r in rows for k in r}
        assert {"params.total", "flops.forward", "kv_cache_bytes", "metrics.val_loss", "summary.tok_s"} <= keys
        for key in sorted(keys - {"stale"}):  # stale: computed when read (heartbeat age), the one non-filter field
            code, out, err = run_cli(capsys, "runs", "list", "--registry", url, "--format", "json",
                                     "--where", f"{key} is not null")
            assert code == 0, f"{key}: {err}"
            with_key = {r["id"] for r in rows if r.get(key) not in (None, "")}
            assert {r["id"] for r in json.loads(out)} >= with_key, key


def test_runs_list_group_option_and_environment(data, capsys, monkeypatch):
    url, ids = data
    code, out, _ = run_cli(capsys, "runs", "--registry", url, "list", "--format", "json", "--limit", "1")
    assert code == 0 and len(json.loads(out)) == 1
    monkeypatch.setenv("ARCHSPEC_REGISTRY", url)
    code, out, _ = run_cli(capsys, "runs", "list", "--format", "json")
    assert code == 0 and len(json.loads(out)) == 4


def test_empty_registry(registry_url, capsys):
    code, out, _ = run_cli(capsys, "runs", "list", "--registry", registry_url)
    assert code == 0 and "no runs" in out
    code, out, _ = run_cli(capsys, "runs", "list", "--registry", registry_url, "--format", "json")
    assert json.loads(out) == []


@pytest.mark.parametrize("args, fragment", [
    (["--where", "metrics.val_loss <"], "column 19"),
    (["--where", "nope = 1"], "unknown field 'nope'"),
    (["--sort", "metrics.val_loss sideways"], "invalid sort at column 18"),
    (["--columns", "bogus"], "--columns: unknown field 'bogus'"),
])
def test_bad_input_exits_2_with_a_message(data, capsys, args, fragment):
    url, _ = data
    code, out, err = run_cli(capsys, "runs", "list", "--registry", url, *args)
    assert code == 2 and fragment in err and "Traceback" not in err and out == ""


def test_filter_error_shows_the_caret(data, capsys):
    url, _ = data
    code, _, err = run_cli(capsys, "runs", "list", "--registry", url, "--where", "seed = 1 and and")
    lines = err.splitlines()
    assert code == 2 and lines[0].startswith("error: invalid filter at column 14")
    assert lines[1] == "  seed = 1 and and" and lines[2] == "  " + " " * 13 + "^"


@pytest.mark.parametrize("url", ["not-a-url", "nosuchdb://x"])
def test_bad_registry_url_exits_2(capsys, url):
    code, _, err = run_cli(capsys, "runs", "list", "--registry", url)
    assert code == 2 and "registry" in err and "Traceback" not in err


def test_click_usage_errors_exit_2(data, capsys):
    url, _ = data
    assert run_cli(capsys, "runs", "list", "--registry", url, "--limit", "-1")[0] == 2
    assert run_cli(capsys, "runs", "list", "--registry", url, "--format", "xml")[0] == 2


def test_runs_show(data, capsys):
    url, ids = data
    code, out, err = run_cli(capsys, "runs", "show", ids["llama1"][:8], "--registry", url)
    assert code == 0, err
    for fragment in (ids["llama1"], "FAILED", "boom", "accounting", "params.total", "norm:", "kind: rmsnorm",
                     "metrics", "val_loss", "3.5", "3.1"):
        assert fragment in out
    # --history KEY prints that history and nothing else: step and value per line, after a one-line heading.
    code, out, err = run_cli(capsys, "runs", "show", ids["llama1"][:8], "--registry", url, "--history", "val_loss")
    assert code == 0, err
    lines = out.strip().splitlines()
    assert lines[0] == f"val_loss of run {ids['llama1']}" and "boom" not in out and "accounting" not in out
    assert [line.split() for line in lines[2:]] == [["0", "4"], ["50", "3.1"], ["100", "3.5"]]
    code, out, _ = run_cli(capsys, "runs", "show", ids["llama1"], "--registry", url, "--history", "val_loss",
                           "--format", "json")
    assert json.loads(out) == {"run": ids["llama1"], "key": "val_loss",
                               "history": [[0, 4.0, 0.0], [50, 3.1, 0.0], [100, 3.5, 0.0]]}
    code, out, _ = run_cli(capsys, "runs", "show", ids["llama0"], "--registry", url, "--format", "json")
    data_ = json.loads(out)
    assert code == 0 and data_["history"]["val_loss"][1][:2] == [100, 3.0] and data_["summary"] == {"tok_s": 1000.0}
    assert data_["params"]["model.norm.kind"] == "rmsnorm" and data_["spec"]["name"] == "llama"


def test_runs_show_unknown_run_or_metric_exits_2(data, capsys):
    url, ids = data
    code, _, err = run_cli(capsys, "runs", "show", "deadbeefdeadbeef", "--registry", url)
    assert code == 2 and "no run 'deadbeefdeadbeef'" in err
    code, _, err = run_cli(capsys, "runs", "show", ids["llama0"], "--registry", url, "--history", "nope")
    assert code == 2 and "has no metric 'nope'" in err


def test_runs_compare(data, capsys):
    url, ids = data
    code, out, err = run_cli(capsys, "runs", "compare", ids["llama0"], ids["gpt0"], "--registry", url)
    assert code == 0, err
    assert "model.norm.kind" in out and "layernorm" in out and "model.d_model" in out
    assert "model.vocab_size" not in out  # the same in both: only shown with --all
    code, out, _ = run_cli(capsys, "runs", "compare", ids["llama0"], ids["llama1"], "--registry", url,
                           "--format", "json")
    cmp = json.loads(out)
    assert code == 0 and cmp["params"] == {} and cmp["seed"] == [0, 1]  # one spec, two seeds
    assert cmp["metrics"]["val_loss"] == [3.0, 3.5] and cmp["best"]["val_loss"] == [3.0, 3.1]
    code, out, _ = run_cli(capsys, "runs", "compare", ids["llama0"], ids["llama1"], "--registry", url, "--all")
    assert code == 0 and "model.vocab_size" in out
    assert run_cli(capsys, "runs", "compare", ids["llama0"], "--registry", url)[0] == 2


def test_runs_export(data, capsys, tmp_path):
    url, ids = data
    code, out, _ = run_cli(capsys, "runs", "export", "--registry", url, "--metrics", "--where", "name = 'llama'")
    exported = json.loads(out)
    assert code == 0 and len(exported) == 2
    assert {tuple(p[:2]) for p in exported[0]["history"]["val_loss"]} >= {(0, 4.0)}
    target = tmp_path / "points.csv"
    code, _, err = run_cli(capsys, "runs", "export", "--registry", url, "--metrics", "--format", "csv",
                           "-o", str(target))
    rows = list(csv.DictReader(target.open()))
    assert code == 0 and "exported 4 runs" in err and len(rows) == 2 + 1 + 3 + 2  # every stored point
    quoted = "'" + INJECTION.replace("'", "''") + "'"
    code, out, _ = run_cli(capsys, "runs", "export", "--registry", url, "--format", "jsonl",
                           "--where", f"sweep = {quoted}")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 1 and json.loads(lines[0])["id"] == ids["gpt0"]


def test_specs_list(registry, registry_url, capsys):
    small, big = make_spec("small"), make_spec("big", d_model=1024, n_layers=24, attention={"n_heads": 16})
    for spec in (small, big):
        registry.record_spec(spec, "g" * 64, accounting(spec))
    code, out, err = run_cli(capsys, "specs", "list", "--registry", registry_url, "--where", "params.active < 20e6")
    assert code == 0, err
    assert "small" in out and "big" not in out and "params.active" in out.splitlines()[0]
    code, out, _ = run_cli(capsys, "specs", "list", "--registry", registry_url, "--format", "json", "--sort",
                           "-params.total")
    assert [s["name"] for s in json.loads(out)] == ["big", "small"]
    code, _, err = run_cli(capsys, "specs", "list", "--registry", registry_url, "--where", "metrics.loss < 1")
    assert code == 2 and "not available for specs" in err


def test_newer_schema_exits_2(registry_url, registry, capsys):
    engine = create_engine(registry_url)
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = '9999'"))
    engine.dispose()
    code, _, err = run_cli(capsys, "runs", "list", "--registry", registry_url)
    assert code == 2 and "9999" in err and "newer archspec" in err


def test_click_objects_work_standalone(data):
    url, _ = data
    result = CliRunner().invoke(runs_cmd, ["list", "--registry", url, "--format", "json"])
    assert result.exit_code == 0 and len(json.loads(result.output)) == 4
    result = CliRunner().invoke(specs_cmd, ["list", "--registry", url])
    assert result.exit_code == 0 and "llama" in result.output


def test_table_shows_the_first_50_and_says_more_match(registry, registry_url, capsys):
    from .helpers import make_info, record_run

    spec = make_spec("many")
    for seed in range(52):
        record_run(registry, make_info(spec, seed=seed))
    code, out, _ = run_cli(capsys, "runs", "list", "--registry", registry_url)
    assert code == 0 and "first 50 runs; more match" in out
    assert len([line for line in out.splitlines() if " many " in line]) == 50
    code, out, _ = run_cli(capsys, "runs", "list", "--registry", registry_url, "--limit", "0")
    assert code == 0 and "52 runs" in out
    code, out, _ = run_cli(capsys, "runs", "list", "--registry", registry_url, "--format", "json")
    assert len(json.loads(out)) == 52  # machine formats get everything


def test_json_output_is_strict_json_with_nan_as_null(registry, registry_url, capsys):
    from .helpers import make_info, record_run

    info = make_info()
    record_run(registry, info, {"loss": [(0, 1.0), (1, float("nan"))]})

    def strict(text: str):
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))

    code, out, _ = run_cli(capsys, "runs", "list", "--registry", registry_url, "--format", "json")
    assert code == 0 and strict(out)[0]["metrics.loss"] is None and strict(out)[0]["metrics.best.loss"] == 1.0
    code, out, _ = run_cli(capsys, "runs", "export", "--registry", registry_url, "--metrics")
    assert code == 0 and strict(out)[0]["history"]["loss"][1][1] is None
    code, out, _ = run_cli(capsys, "runs", "show", info.run_id, "--registry", registry_url, "--format", "json")
    assert code == 0 and strict(out)["history"]["loss"][1][1] is None


@pytest.mark.parametrize("columns", [60, 100, 400])
def test_tables_fit_the_width_and_never_cut_run_ids(data, capsys, monkeypatch, columns):
    url, ids = data
    monkeypatch.setenv("COLUMNS", str(columns))
    code, out, err = run_cli(capsys, "runs", "list", "--registry", url, "--columns",
                             "params.model.d_model,params.model.n_layers,flops.forward,kv_cache_bytes,summary.tok_s")
    assert code == 0, err
    lines = out.rstrip("\n").splitlines()
    assert all(len(line) <= columns for line in lines)
    for run_id in ids.values():
        assert run_id in out  # whole, never "073f36e7…"
    assert "…" not in out
    if columns < 200:
        assert "left out to fit" in " ".join(out.split())
    else:
        assert "left out" not in out and "summary.tok_s" in out


def test_numbers_have_one_format():
    from archspec.console import number

    assert [number(v) for v in (51100.0, 10000, 795800.0, 3.2071, 0.04123, 3e-05, 12, 2.0, float("nan"))] == [
        "51.10k", "10.00k", "795.80k", "3.207", "0.04123", "3.000e-05", "12", "2", "nan"]
