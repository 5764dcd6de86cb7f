"""The UI as a researcher reads it: a sweep's curves grouped by variant (mean and 95% band over seeds, by the report's
interval function) with the verdict beside them; a run's own tags first, archspec's folded; compare with summaries."""

from __future__ import annotations

import pytest

pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

from archspec.ablate.stats import mean_interval  # noqa: E402
from archspec.registry import Registry  # noqa: E402
from archspec.train.logger import SweepMembership  # noqa: E402
from archspec.ui.app import create_app  # noqa: E402

from .helpers import make_info, make_spec, record_run, writer_tags  # noqa: E402

CURVES = {  # variant → seed → [(step, val_loss)]
    0: {0: [(10, 4.0), (20, 3.0)], 1: [(10, 4.2), (20, 3.1)], 2: [(10, 4.1), (20, 3.2)]},
    1: {0: [(10, 3.9), (20, 2.8)], 1: [(10, 4.0), (20, 2.9)]},
}


@pytest.fixture
def client(tmp_path):
    url = f"sqlite:///{tmp_path / 'ui.db'}"
    ids = {}
    with Registry(url) as reg:
        for variant, seeds in CURVES.items():
            spec = make_spec(f"sw-v{variant}", d_model=32 * (variant + 1))
            for seed, points in seeds.items():
                info = make_info(spec, seed=seed, tags={"owner": "ada", **writer_tags(123)})
                info = type(info)(**{**info.__dict__, "sweep": SweepMembership("sw", variant, f"d_model={32 * (variant + 1)}",
                                                                               "h", 0)})
                ids[(variant, seed)] = record_run(reg, info, {"val_loss": points},
                                                  summary={"val_loss": points[-1][1], "tokens_per_s": 100.0})
    return TestClient(create_app(url), base_url="http://127.0.0.1"), ids  # a host the app serves


def test_sweep_curves_are_variant_means_with_the_reports_interval(client):
    client, _ = client
    data = client.get("/api/sweeps/sw", params={"curves": ["val_loss", "nothing"]}).json()
    groups = {g["variant"]: g for g in data["groups"]["val_loss"]}
    for variant, seeds in CURVES.items():
        g = groups[variant]
        assert g["step"] == [10, 20] and g["n"] == [len(seeds)] * 2
        for j, step in enumerate(g["step"]):
            values = [dict(points)[step] for points in seeds.values()]
            want = mean_interval(values)
            assert g["mean"][j] == pytest.approx(want.estimate)
            assert (g["low"][j], g["high"][j]) == (pytest.approx(want.low), pytest.approx(want.high))
            assert g["low"][j] < g["mean"][j] < g["high"][j]
    assert groups[0]["verdict"] == "baseline" and groups[1]["verdict"] in ("better", "worse", "inconclusive")
    assert all(not g["step"] for g in data["groups"]["nothing"])
    page = client.get("/sweeps/sw").text
    assert 'id="sweep-chart-controls"' in page and "one panel each" in page


def test_user_tags_first_internal_tags_folded(client):
    client, ids = client
    page = client.get(f"/runs/{ids[(0, 0)]}").text
    owner, details = page.index("tag owner"), page.index('<details id="system-tags">')
    assert owner < details and page.index("boot_id") > details and page.index("pid_namespace") > details
    data = client.get(f"/api/runs/{ids[(0, 0)]}").json()
    assert data["tags"]["owner"] == "ada"  # the JSON keeps every tag


def test_compare_includes_summary_metrics(client):
    client, ids = client
    page = client.get("/compare", params={"ids": f"{ids[(0, 0)]},{ids[(1, 0)]}"}).text
    assert '<tr class="differs"><th>summary.val_loss</th>' in page and "<th>summary.tokens_per_s</th>" in page
