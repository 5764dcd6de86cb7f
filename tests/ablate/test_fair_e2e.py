"""Issue 34 end to end on tiny sweeps: stability metrics in the report, matched budgets trained."""

from __future__ import annotations

import json

import yaml

from archspec.cli import main
from archspec.registry import Registry


def write(workdir, base_spec, **extra):
    sweep = {"name": "fair", "base": base_spec, "seeds": [0], "budget": {"steps": 3},
             "grid": {"model.attention.n_kv_heads": [2, 1]}, **extra}
    path = workdir / "fair.yaml"
    path.write_text(yaml.safe_dump(sweep))
    return path


def test_matched_sweep_with_stability_reports_both(workdir, base_spec, capsys):
    path = write(workdir, base_spec, match="params", solve="model.ffn.hidden_dim", stability=True, multiple_of=2)
    url = f"sqlite:///{workdir / 'reg.db'}"
    assert main(["ablate", str(path), "--registry", url, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    base, other = report["variants"]
    assert other["matched"]["key"] == "model.ffn.hidden_dim" and abs(other["matched"]["residual"]) <= 0.02
    assert abs(other["params_total"] - base["params_total"]) <= 0.02 * base["params_total"]
    assert "stability.max_logit" in base["stability"] and "stability.loss_spikes" in base["stability"]
    row = report["rows"][1]
    assert row["matched"].startswith("hidden_dim=") and row["stability"].startswith("logit ")
    html = (workdir / "reports" / "fair" / "fair.html").read_text()
    assert "<h2>Stability</h2>" in html and (workdir / "reports" / "fair" / "fair-stability.png").exists()
    runs = Registry(url).runs(where="sweep = 'fair'")
    assert all(r.recipe.get("stability") is True for r in runs)
    # registry metrics: filters over the per-layer history and the summary
    assert len(Registry(url).runs(where="metrics.max.stability.layer0.max_logit > -1000")) == 2
    assert len(Registry(url).runs(where="summary.stability.loss_spikes >= 0")) == 2
