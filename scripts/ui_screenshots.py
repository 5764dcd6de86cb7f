"""Refresh the screenshots of `archspec ui` in docs/ui/: a small real sweep (two norms × two seeds of a tiny model, a
few seconds on CPU) in a scratch registry, the app served on a free port, headless Chromium photographing the runs,
run, compare and sweep pages.

    .venv/bin/python scripts/ui_screenshots.py          # needs Debian's chromium (apt-get install chromium)
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "ui"


def main() -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("no chromium: apt-get install chromium")
    archspec = [sys.executable, "-m", "archspec.entry"]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        url = f"sqlite:///{work}/registry.db"
        # the runs and caches in the scratch folder: a script that photographs the UI creates nothing in the user's
        # own archspec directories (~/.local/share/archspec, ~/.cache/archspec)
        env = {**os.environ, "ARCHSPEC_HOME": str(work / "home"), "ARCHSPEC_CACHE": str(work / "cache")}
        corpus = work / "corpus.txt"
        corpus.write_text((Path(json.__file__).parent / "decoder.py").read_text() * 4)
        (work / "base.yaml").write_text(
            "name: demo\nmodel: {vocab_size: 320, context_length: 64, d_model: 64, n_layers: 2, attention: "
            "{n_heads: 4}}\ntrain: {batch_size: 8, seq_len: 64, warmup_steps: 5, eval_interval: 10, eval_tokens: 2048, "
            f"data: {{corpus: {{kind: files, paths: ['{corpus}']}}}}}}\n")
        (work / "sweep.yaml").write_text("name: norm-demo\nbase: base.yaml\nseeds: [0, 1]\nbudget: {steps: 60}\n"
                                         "grid:\n  model.norm:\n    - {kind: layernorm}\n    - {kind: rmsnorm}\n")
        subprocess.run([*archspec, "ablate", "sweep.yaml", "--registry", url, "--no-compile"], cwd=work, check=True,
                       capture_output=True, env=env)
        runs = json.loads(subprocess.run([*archspec, "runs", "list", "--registry", url, "--format", "json"],
                                         cwd=work, check=True, capture_output=True, text=True, env=env).stdout)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = subprocess.Popen([*archspec, "ui", "--registry", url, "--port", str(port)], cwd=work, env=env)
        try:
            for _ in range(300):  # until it listens
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    time.sleep(0.1)
            base = f"http://127.0.0.1:{port}"
            a, b = runs[0]["id"], runs[-1]["id"]
            OUT.mkdir(parents=True, exist_ok=True)
            for name, path in [("runs", "/"), ("run", f"/runs/{a}"), ("compare", f"/compare?ids={a},{b}"),
                               ("sweep", "/sweeps/norm-demo")]:
                subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                                "--window-size=1400,1000", "--virtual-time-budget=6000",
                                f"--screenshot={OUT / (name + '.png')}", base + path], check=True,
                               capture_output=True, timeout=120)
                print(OUT / (name + ".png"))
        finally:
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
