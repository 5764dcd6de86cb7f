"""Trackers a run is also sent to, besides the registry: TensorBoard, Weights & Biases, MLflow.

`SinkLogger` is a `RunLogger` that forwards every call to the registry's logger first and then to each sink, so
each sink receives what the registry got: the params (the flattened spec with `train.*` the recipe actually used,
`archspec.registry.values.run_params`), every metric point (each step's and each evaluation's) and the summary.

The registry stays the record. A sink that fails (a missing login, a full disk, a server gone) never fails or
changes the run: it is reported once, as a `warning:` line on stderr, and the run goes on without it. A sink whose
package is not installed is refused before anything is recorded (exit 2, naming the extra to install).

Which sinks: `archspec train/ablate --log-to tensorboard,wandb,mlflow`, else the recipe's `train.log_to`. Where they
write: each tracker's own environment variables (`WANDB_MODE`, `WANDB_DIR`, `WANDB_PROJECT`, `MLFLOW_TRACKING_URI`,
`MLFLOW_EXPERIMENT_NAME`), and `ARCHSPEC_TENSORBOARD_DIR`; by default under archspec's state root (`archspec.paths`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
import warnings
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence, get_args

from archspec.errors import Caution, UserError, printable
from archspec.spec.train import LogSink
from archspec.train.logger import FAILED, FINISHED, RunInfo, RunLogger

SINK_NAMES: tuple[str, ...] = get_args(LogSink)
# The module that must be importable for each sink, and the extra that installs it.
_MODULES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
TENSORBOARD_ENV = "ARCHSPEC_TENSORBOARD_DIR"


def parse_log_to(text: str | None) -> tuple[str, ...] | None:
    """`--log-to` → sink names in order, without repeats (None: not given, the recipe decides; `none`: no sinks)."""
    if text is None:
        return None
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    if names in ([], ["none"]):
        return ()
    unknown = [n for n in names if n not in SINK_NAMES]
    if unknown:
        raise UserError(f"--log-to: unknown sink {printable(unknown[0], 40)!r}; expected a comma-separated list of "
                        f"{', '.join(SINK_NAMES)} (or none)")
    return tuple(dict.fromkeys(names))


def resolve_sinks(log_to: Sequence[str] | None, recipes: Iterable[Any] = ()) -> tuple[str, ...]:
    """The sinks a command uses: `log_to` (from `--log-to`) when given, else every recipe's `log_to`; each one's
    package checked now, before anything trains (`check_installed`)."""
    if log_to is None:
        log_to = [n for r in recipes for n in (getattr(r, "log_to", None) or ())]
    names = tuple(dict.fromkeys(log_to))
    check_installed(names)
    return names


def check_installed(names: Iterable[str]) -> None:
    """A UserError (exit 2) naming the extra to install when a sink's package is missing."""
    missing = [n for n in names if importlib.util.find_spec(_MODULES[n]) is None]
    if missing:
        extras = ",".join(missing)
        raise UserError(f"logging to {', '.join(missing)} needs its package: pip install 'archspec[{extras}]'")


def with_sinks(inner: RunLogger, log_to: Sequence[str] | None = None) -> RunLogger:
    """`inner` (the registry's logger) fanned out to the sinks `log_to`, else to those the run's recipe names."""
    return SinkLogger(inner, log_to)


def registry_with_sinks(registry_url: str | None, log_to: Sequence[str] | None = None) -> RunLogger:
    """A sweep's logger for one run: the registry at `registry_url`, fanned out (`with_sinks`)."""
    from archspec.registry import RegistryLogger

    return with_sinks(RegistryLogger(registry_url), log_to)


class SinkLogger:
    """The registry's logger, then each sink. The loop's other questions (`repeat_for`, `recorded_status`) are the
    registry's: everything not defined here passes through to it."""

    def __init__(self, inner: RunLogger, log_to: Sequence[str] | None = None):
        self.inner = inner
        self.log_to = None if log_to is None else tuple(log_to)
        self.sinks: list[Sink] = []
        self._step = 0
        self._ended = False

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    # ── RunLogger ────────────────────────────────────────────────────────────────────────────────────────────────

    def start(self, info: RunInfo) -> str:
        names = self.log_to if self.log_to is not None else tuple(dict.fromkeys(info.recipe.get("log_to") or ()))
        check_installed(names)  # before the registry records the run
        run_id = self.inner.start(info) or info.run_id
        from archspec.registry.values import run_params

        params = run_params(info.spec_json, info.recipe)
        for name in names:
            sink = SINKS[name]()
            if self._call(sink, "start", info, run_id, params):
                self.sinks.append(sink)
        return run_id

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self.inner.log_metrics(step, metrics)  # raises on a bad value before any sink sees it
        points = {str(k): float(v) for k, v in metrics.items()}
        self._step = max(self._step, int(step))
        self._each("log_metrics", int(step), points)

    def heartbeat(self) -> None:
        self.inner.heartbeat()
        self._each("flush")

    def flush(self) -> None:
        """The registry's buffered points written (before a checkpoint claims the step), and the sinks' too."""
        flush = getattr(self.inner, "flush", None)
        if callable(flush):
            flush()
        self._each("flush")

    def log_artifact(self, kind: str, path: str) -> None:
        self.inner.log_artifact(kind, path)
        self._each("log_artifact", str(kind), str(path))

    def set_summary(self, metrics: Mapping[str, float]) -> None:
        self.inner.set_summary(metrics)
        self._each("set_summary", self._step, {str(k): float(v) for k, v in metrics.items()})

    def end(self, status: str, error: str | None = None) -> None:
        try:
            self.inner.end(status, error)
        except Exception as e:  # the record is incomplete: the loop ends the run FAILED, and so do the sinks
            self._end_sinks(FAILED, f"{error or status}; the run's record is incomplete: {e}")
            raise
        self._end_sinks(status, error)

    # ── the sinks, each failure said once ────────────────────────────────────────────────────────────────────────

    def _end_sinks(self, status: str, error: str | None) -> None:
        if not self._ended:
            self._ended = True
            self._each("end", status, error)

    def _each(self, method: str, *args: Any) -> None:
        for sink in list(self.sinks):
            if not self._call(sink, method, *args):
                self.sinks.remove(sink)

    def _call(self, sink: "Sink", method: str, *args: Any) -> bool:
        """True when the sink took the call; on any failure it is closed, dropped and reported once."""
        try:
            getattr(sink, method)(*args)
            return True
        except Exception as e:
            reason = printable(" ".join(f"{type(e).__name__}: {e}".split()), 300)
            warnings.warn(Caution(f"{sink.name}: {method} failed ({reason}); the run goes on without {sink.name} "
                                  f"(the registry has every metric)"), stacklevel=2)
            try:
                sink.abandon()
            except Exception:
                pass
            return False


# ── one class per sink ───────────────────────────────────────────────────────────────────────────────────────────


def _state_root() -> Path:
    from archspec.paths import state_root

    return state_root()[0]


def tensorboard_logdir(spec_name: str, run_id: str) -> Path:
    """Where the TensorBoard sink writes a run's event files: `$ARCHSPEC_TENSORBOARD_DIR/<spec>-<run id>` (default
    `<state root>/tensorboard/...`). `archspec runs delete` removes it with the run."""
    root = Path(os.environ.get(TENSORBOARD_ENV) or _state_root() / "tensorboard")
    return root / f"{spec_name}-{run_id}"


def _text(value: Any) -> str:
    """A param's value as text (MLflow params, TensorBoard hparams of a list): strings as they are, the rest as
    JSON (`true`, `32`, `["a", "b"]`, `null`)."""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


class Sink:
    """What SinkLogger calls. `abandon` closes the sink after a failure (best effort, never raises)."""

    name = ""

    def start(self, info: RunInfo, run_id: str, params: Mapping[str, Any]) -> None: ...

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def flush(self) -> None: ...

    def log_artifact(self, kind: str, path: str) -> None: ...

    def set_summary(self, last_step: int, summary: Mapping[str, float]) -> None: ...

    def end(self, status: str, error: str | None) -> None: ...

    def abandon(self) -> None: ...


class TensorBoardSink(Sink):
    """Event files in `$ARCHSPEC_TENSORBOARD_DIR/<spec>-<run id>` (default `<state root>/tensorboard/...`): each
    metric a scalar summary (what TensorBoard's scalar dashboard and EventAccumulator.Scalars() read; float32 there:
    the registry keeps the exact value), the summary as `summary/<key>` scalars at the last step, the params as the
    HPARAMS tab's and as a `params` text of JSON, artifacts and the final status as texts."""

    name = "tensorboard"

    def __init__(self) -> None:
        self.writer = None

    def start(self, info: RunInfo, run_id: str, params: Mapping[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        self.logdir = tensorboard_logdir(info.spec_name, run_id)
        self.writer = SummaryWriter(str(self.logdir))
        plain = {k: v if isinstance(v, (bool, int, float, str)) else _text(v) for k, v in params.items()}
        for event in hparams(plain, {"val_loss": 0.0}):  # the HPARAMS tab; val_loss is a column there
            self.writer.file_writer.add_summary(event)
        self.writer.add_text("params", json.dumps(dict(params), sort_keys=True, default=str), 0)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)  # a scalar summary: TensorBoard's Scalars() reads it

    def flush(self) -> None:
        self.writer.flush()

    def log_artifact(self, kind: str, path: str) -> None:
        self.writer.add_text(f"artifact/{kind}", path, 0)

    def set_summary(self, last_step: int, summary: Mapping[str, float]) -> None:
        for key, value in summary.items():
            self.writer.add_scalar(f"summary/{key}", value, last_step)

    def end(self, status: str, error: str | None) -> None:
        self.writer.add_text("status", status + (f": {error}" if error else ""), 0)
        self.writer.close()

    def abandon(self) -> None:
        if self.writer is not None:
            self.writer.close()


class WandbSink(Sink):
    """A W&B run named by the run id (project `$WANDB_PROJECT`, default `archspec`; grouped by sweep, tagged with
    the spec's name), under `$WANDB_DIR` (default the state root). `WANDB_MODE=offline` needs no network or login.
    Params are its config, metrics its history at the loop's steps, the summary its summary; a run that did not
    finish exits 1."""

    name = "wandb"

    def __init__(self) -> None:
        self.run = None
        self._pending: int | None = None

    def start(self, info: RunInfo, run_id: str, params: Mapping[str, Any]) -> None:
        import wandb

        directory = Path(os.environ.get("WANDB_DIR") or _state_root())
        directory.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or "archspec", name=run_id, dir=str(directory),
            group=info.sweep.sweep if info.sweep else None, tags=[info.spec_name[:64]] if info.spec_name else None,
            config=dict(params), reinit="create_new",
            # no console capture (stdout stays the command's: --json), nothing printed
            settings=wandb.Settings(console="off", silent=True))

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log(dict(metrics), step=step)  # the loop logs a step's metrics, then its evaluation, at one step
        self._pending = step

    def set_summary(self, last_step: int, summary: Mapping[str, float]) -> None:
        if self._pending is not None:  # commit the last step first: its values must not overwrite the summary
            self.run.log({}, step=self._pending, commit=True)
            self._pending = None
        self.run.summary.update(dict(summary))

    def end(self, status: str, error: str | None) -> None:
        run, self.run = self.run, None
        run.finish(exit_code=0 if status == FINISHED else 1)

    def abandon(self) -> None:
        if self.run is not None:
            run, self.run = self.run, None
            run.finish(exit_code=1)


class MLflowSink(Sink):
    """An MLflow run named by the run id in `$MLFLOW_TRACKING_URI` (default `sqlite:///<state root>/mlflow.db`),
    experiment `$MLFLOW_EXPERIMENT_NAME`, else the sweep's name, else `archspec`. Params as text (`_text`),
    metrics written in batches at each heartbeat, the summary as `summary/<key>` metrics at the last step, artifacts
    as `archspec.artifact.<kind>` tags, the status as the run's (MLflow has archspec's names)."""

    name = "mlflow"
    BATCH = 1000  # MLflow's limit of metrics per log_batch
    PARAMS = 100  # and of params

    def __init__(self) -> None:
        self.client = None
        self.run_id = ""
        self._points: list[Any] = []

    def start(self, info: RunInfo, run_id: str, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{_state_root() / 'mlflow.db'}"
        self.client = MlflowClient(tracking_uri=uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or (info.sweep.sweep if info.sweep else "archspec")
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
        tags = {"archspec.run_id": run_id, "archspec.spec": info.spec_name, "archspec.model_hash": info.model_hash}
        if info.sweep:
            tags.update({"archspec.sweep": info.sweep.sweep, "archspec.variant": str(info.sweep.variant)})
        self.run_id = self.client.create_run(experiment_id, run_name=run_id, tags=tags).info.run_id
        items = [Param(k, _text(v)) for k, v in params.items()]
        for i in range(0, len(items), self.PARAMS):
            self.client.log_batch(self.run_id, params=items[i:i + self.PARAMS])

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._points.extend(Metric(k, v, now, step) for k, v in metrics.items())
        if len(self._points) >= self.BATCH:
            self.flush()

    def flush(self) -> None:
        while self._points:
            batch = self._points[:self.BATCH]
            self.client.log_batch(self.run_id, metrics=batch)
            del self._points[:len(batch)]

    def log_artifact(self, kind: str, path: str) -> None:
        self.client.set_tag(self.run_id, f"archspec.artifact.{kind}", path)

    def set_summary(self, last_step: int, summary: Mapping[str, float]) -> None:
        self.log_metrics(last_step, {f"summary/{k}": v for k, v in summary.items()})
        self.flush()

    def end(self, status: str, error: str | None) -> None:
        self.flush()
        if error:
            self.client.set_tag(self.run_id, "archspec.error", error[:5000])
        self.client.set_terminated(self.run_id, status)

    def abandon(self) -> None:
        if self.client is not None and self.run_id:
            self.client.set_terminated(self.run_id, FAILED)


SINKS: dict[str, type[Sink]] = {"tensorboard": TensorBoardSink, "wandb": WandbSink, "mlflow": MLflowSink}
assert tuple(SINKS) == SINK_NAMES, "every LogSink name needs its class here"
