"""A RunLogger that writes the run directory: `run.json` (info, status, summary, artifacts) and `metrics.jsonl`.

For runs recorded without a database (scripts, tests, the DDP test): it needs nothing but the file system.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Mapping

from archspec.errors import redact
from archspec.cache import atomic_write_text
from archspec.train.logger import RUNNING, RunInfo

def default_run_dir(spec_name: str, run_id: str) -> Path:
    """Where a run's generated module, checkpoint and (without a registry) records go unless told otherwise:
    `<state root>/runs/<name>-<run id>` (archspec.paths), an absolute path."""
    from archspec.paths import announce, runs_dir

    runs = runs_dir()
    announce(runs)
    return runs / f"{spec_name}-{run_id}"


class RunDirLogger:
    """`run_dir=None`: the run's default directory, known once the run starts."""

    def __init__(self, run_dir: str | Path | None = None):
        self.run_dir = Path(run_dir) if run_dir else None
        self.record: dict[str, Any] = {}
        self._pending: list[dict[str, Any]] = []

    def _write(self) -> None:
        # A run directory is shared with its checkpoint: nothing in its record may carry a password (redact).
        atomic_write_text(self.run_dir / "run.json",
                          redact(json.dumps(self.record, indent=2, sort_keys=True, default=str)))

    def flush(self) -> None:
        if self._pending:
            with open(self.run_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
                f.writelines(json.dumps(p, sort_keys=True) + "\n" for p in self._pending)
            self._pending.clear()

    def start(self, info: RunInfo) -> str:
        self.run_dir = self.run_dir or default_run_dir(info.spec_name, info.run_id)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        now = time.time()
        self.record = {"run_id": info.run_id, "status": RUNNING, "start_time": now, "heartbeat": now,
                       "info": dataclasses.asdict(info), "summary": {}, "artifacts": [], "error": None}
        self._write()
        return info.run_id

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        now = time.time()
        self._pending.extend({"step": step, "key": k, "value": float(v), "time": now} for k, v in metrics.items())

    def heartbeat(self) -> None:
        self.flush()
        self.record["heartbeat"] = time.time()
        self._write()

    def log_artifact(self, kind: str, path: str) -> None:
        self.record["artifacts"].append({"kind": kind, "path": str(path)})
        self._write()

    def set_summary(self, metrics: Mapping[str, float]) -> None:
        self.record["summary"].update({k: float(v) for k, v in metrics.items()})

    def end(self, status: str, error: str | None = None) -> None:
        self.flush()
        self.record.update(status=status, error=error, end_time=time.time())
        self._write()

