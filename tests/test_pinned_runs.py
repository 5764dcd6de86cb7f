"""No behaviour changes (issue 24): a fixed set of tiny runs (a dense and an MoE `train`, a two-variant `ablate`)
leave the registry rows and run keys pinned in tests/fixtures/pinned_runs/rows.json. Tables and columns added after
the pin are outside it; a change that means to alter a pinned value (new generated code) regenerates the pin with
`python tests/fixtures/pinned_runs/pin.py` and says why in its commit."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

PIN = Path(__file__).resolve().parent / "fixtures" / "pinned_runs"
_spec = importlib.util.spec_from_file_location("pinned_runs_pin", PIN / "pin.py")
pin = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pin)


def _same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-6)
    return a == b


def test_the_pinned_runs_leave_the_pinned_rows(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ARCHSPEC_HOME", str(tmp_path))
    expected = json.loads((PIN / "rows.json").read_text(encoding="utf-8"))
    got = json.loads(json.dumps(pin.train_all(tmp_path), default=str))
    # What the pin holds must be there, equal; tables and columns added since (a later feature's) are outside it.
    assert set(expected) <= set(got), f"pinned tables gone: {set(expected) - set(got)}"
    for table, rows in expected.items():
        assert len(got[table]) == len(rows), (table, len(got[table]), len(rows))
        pinned = rows[0].keys() if rows else set()
        have_rows = sorted(got[table], key=lambda r: pin.sort_key({k: r[k] for k in pinned if k in r}))
        for want, have in zip(rows, have_rows):
            assert want.keys() <= have.keys(), (table, want.keys() - have.keys())
            bad = {k: (want[k], have[k]) for k in want if not _same(want[k], have[k])}
            assert not bad, f"{table}: {bad} in {pin.sort_key(want)[:200]}"
