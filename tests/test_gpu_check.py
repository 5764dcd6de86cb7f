"""bench/gpu_check.py, the one prepared GPU script, at its --smoke size on the CPU: every section runs and lands in
the one JSON, so the script a GPU session is given cannot rot between GPU sessions. Its figures mean nothing here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # a dozen processes: sweeps packed and alone, compile_modes, bench_moe, a SIGTERM'd train
def test_the_smoke_size_runs_every_section_into_one_json(tmp_path):
    out = tmp_path / "gpu_check.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--smoke", "--json", str(out)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    sections = report["sections"]
    assert list(sections) == ["packed", "llama_compile", "moe_eager", "sigterm", "gpt2_vs_nanogpt", "moe_compiled"]
    assert not [name for name, s in sections.items() if "error" in s], sections
    packed = sections["packed"]
    for side, runs in (("one", 1), ("packed", 2)):  # each job its own registry row, all FINISHED, a rate each
        assert packed[side]["runs"] == runs and packed[side]["statuses"] == ["FINISHED"]
        assert all(rate > 0 for rate in packed[side]["tokens_per_s_each"])
    assert "1 device(s): up to 2 job(s) at once" in packed["packed"]["note"]
    assert packed["speedup_steady"] > 0 and packed["speedup_wall"] > 0
    assert sections["llama_compile"]["modes"]["none"]["tokens_per_s"] > 0
    assert sections["moe_eager"]["generated_vs_dense"] > 0
    stop = sections["sigterm"]
    assert stop["status"] == "KILLED" and stop["exit_code"] == 143 and stop["stop_s"] >= 0
    # a smoke run judges no target: its sizes are not the issue's
    assert report["verdicts"] and all(v["met"] is None for v in report["verdicts"].values())
