"""Registry writes: specs, runs, metrics, summaries, artifacts, final statuses, and reaping dead runs.

Every method is one short write transaction (`RegistryEngine._write`); the first one of a `Registry` creates the
database or brings its schema to head.
"""

from __future__ import annotations

import json
import math
import os
import socket
from datetime import datetime, timedelta
from typing import Any, Callable, Mapping, Sequence

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from archspec.errors import UserError
from archspec.registry.artifact_paths import stored
from archspec.registry.engine import RegistryEngine, T, fmt_time
from archspec.registry.models import (
    Artifact,
    Evaluation,
    EvaluationMetric,
    Metric,
    MetricStats,
    RunAccounting,
    RunParam,
    RunNote,
    RunRecord,
    RunTag,
    SpecAccounting,
    SpecName,
    SpecParam,
    SpecRecord,
    SummaryMetric,
    SweepRun,
)
from archspec.registry.values import (accounting_fields, canonical_text, flatten, is_stale, run_params, typed_row,
                                     with_seq_len, WRITER_IDENTITY, writer_gone)
from archspec.train.logger import FAILED, FINISHED, KILLED, RUNNING, SCHEDULED, RunInfo, SweepMembership


def run_accounting(info: RunInfo) -> dict[str, Any]:
    """The run's accounting with the seq_len it is at (the recipe's, when the writer did not say)."""
    return with_seq_len(info.accounting, info.recipe.get("seq_len"))


class RunFinishedError(UserError):
    """The run already FINISHED; a sweep skips it (see Registry.run_status), a rerun must be asked for."""


def _writer_gone(conn: Connection, row) -> bool:
    """The run's writer ran on this host and its process no longer exists (see `values.writer_gone`)."""
    tags = dict(conn.execute(select(RunTag.key, RunTag.value).where(
        RunTag.run_id == row.id, RunTag.key.in_(WRITER_IDENTITY))).all())
    return writer_gone(row.host, tags)


# Tags the training loop writes itself (archspec.train.loop `run_info`): a restart replaces them, `archspec runs tag`
# may not set or remove them (a forged `pid` would make a live run look dead, or a dead one alive).
# `tests/train/test_writer_tags.py` checks this is exactly what `Trainer.run_info` writes.
WRITER_TAGS = ("device", "precision", "world_size", "compile", "parallel", "activation_checkpointing", "corpus",
               "corpus_hash", "tokenizer", "train_tokens", "val_tokens", "resumed_from_step", "repeat_of",
               *WRITER_IDENTITY)


class RunActiveError(UserError):
    """Another live process is running this run (its heartbeat is fresh)."""


class RegistryWriter(RegistryEngine):
    """The writing half of `Registry` (public, so that writers other than `RegistryLogger` can use it)."""

    # specs

    def record_spec(self, spec, generated_hash: str | None, accounting: Mapping[str, Any]) -> str:
        """Record a spec's model (an `archspec.spec.Spec`) under its name, with its accounting at context_length;
        idempotent. Returns the model hash, the row's key.

        One model under several names or recipes is one row; each name is listed once (`spec_names`). Recording it
        again refreshes its generated-source hash and accounting (they follow the code version that built it last).
        """
        from archspec.spec import model_dict, model_hash

        h = model_hash(spec)
        acct = with_seq_len(accounting, spec.model.context_length)
        self._write(lambda conn: self._upsert_spec(conn, h, model_dict(spec), spec.name, generated_hash, acct),
                    "record_spec")
        return h

    def _upsert_spec(
        self,
        conn: Connection,
        h: str,
        model: Mapping[str, Any],
        name: str,
        generated_hash: str | None,
        accounting: Mapping[str, Any] | None,
    ) -> None:
        """Insert the model's row (or refresh it) and its name. `accounting` None (a run start, which knows its own
        accounting, not the spec's) leaves the spec's figures alone."""
        now = self._now()
        row = conn.execute(
            select(SpecRecord.generated_hash, SpecRecord.accounting_json).where(SpecRecord.hash == h)
        ).first()
        if conn.execute(select(SpecName.name).where(SpecName.model_hash == h, SpecName.name == name)).first() is None:
            names = [{"spec_hash": h, "name": name, "created": now}]
        else:
            names = []
        acct_json = json.dumps(accounting, sort_keys=True) if accounting is not None else None
        if row is None:
            conn.execute(insert(SpecRecord).values(
                hash=h, name=name, canonical_json=canonical_text(model), generated_hash=generated_hash,
                accounting_json=acct_json or "{}", created=now,
            ))
            params = [{"spec_hash": h, "key": k, **typed_row(v)} for k, v in flatten({"model": model}).items()]
            if params:
                conn.execute(insert(SpecParam), params)
        elif row.generated_hash == (generated_hash or row.generated_hash) and acct_json in (None, row.accounting_json):
            accounting = None
        else:
            conn.execute(update(SpecRecord).where(SpecRecord.hash == h).values(
                generated_hash=generated_hash or row.generated_hash, accounting_json=acct_json or row.accounting_json))
            if accounting is not None:
                conn.execute(delete(SpecAccounting).where(SpecAccounting.model_hash == h))
        if names:
            conn.execute(insert(SpecName), names)
        if accounting is not None:
            acct = [{"spec_hash": h, "key": k, "value": float(v)} for k, v in accounting_fields(accounting).items()]
            if acct:
                conn.execute(insert(SpecAccounting), acct)

    def _upsert_run_spec(self, conn: Connection, info: RunInfo) -> None:
        acct = info.spec_accounting
        if acct is not None:
            acct = with_seq_len(acct, info.spec_json.get("model", {}).get("context_length"))
        self._upsert_spec(conn, info.model_hash, info.spec_json.get("model", {}), info.spec_name, info.generated_hash,
                          acct)

    def add_to_sweep(self, run_id: str, membership: SweepMembership) -> None:
        """Make a recorded run a member of a sweep (a run can belong to many): a sweep whose run exists already
        trains nothing and finds it through this."""
        self._write(lambda conn: self._upsert_membership(conn, run_id, membership), "add_to_sweep")

    def _upsert_membership(self, conn: Connection, run_id: str, m: SweepMembership) -> None:
        values = {"variant": int(m.variant), "label": m.label, "sweep_hash": m.sweep_hash, "baseline": int(m.baseline)}
        res = conn.execute(update(SweepRun).where(SweepRun.sweep == m.sweep, SweepRun.run_id == run_id).values(**values))
        if not res.rowcount:
            conn.execute(insert(SweepRun).values(sweep=m.sweep, run_id=run_id, created=self._now(), **values))

    # runs: writing (used by RegistryLogger; public so that other writers can use them too)

    def schedule_run(self, info: RunInfo) -> str:
        """Record a run as SCHEDULED (a sweep's plan) unless it already exists; returns its id."""

        def tx(conn: Connection) -> str:
            self._upsert_run_spec(conn, info)
            if conn.execute(select(RunRecord.id).where(RunRecord.id == info.run_id)).first() is None:
                self._insert_run(conn, info, SCHEDULED, heartbeat_timeout_s=0.0)
            elif info.sweep is not None:
                self._upsert_membership(conn, info.run_id, info.sweep)
            return info.run_id

        return self._write_once_more_on_conflict(tx, "schedule_run")

    def _write_once_more_on_conflict(self, fn: Callable[[Connection], T], what: str) -> T:
        # Two processes inserting the same spec or run at once: the loser's transaction fails on the primary key;
        # run it again and it finds the row.
        try:
            return self._write(fn, what)
        except IntegrityError:
            return self._write(fn, what)

    def _insert_run(self, conn: Connection, info: RunInfo, status: str, heartbeat_timeout_s: float) -> None:
        now = self._now()
        running = status == RUNNING
        conn.execute(insert(RunRecord).values(
            id=info.run_id, model_hash=info.model_hash, name=info.spec_name, data_hash=info.data_hash,
            seed=int(info.seed), recipe_json=json.dumps(info.recipe, sort_keys=True, default=str),
            code_version=info.code_version or "", status=status, host=info.host or "",
            accounting_json=json.dumps(run_accounting(info), sort_keys=True),
            error=None, created=now, started=now if running else None, ended=None,
            heartbeat=now if running else None, heartbeat_timeout_s=heartbeat_timeout_s, attempt=1,
        ))
        self._write_params_and_tags(conn, info)

    def _write_params_and_tags(self, conn: Connection, info: RunInfo) -> None:
        acct = [{"run_id": info.run_id, "key": k, "value": float(v)}
                for k, v in accounting_fields(run_accounting(info)).items()]
        if acct:
            conn.execute(insert(RunAccounting), acct)
        if info.sweep is not None:
            self._upsert_membership(conn, info.run_id, info.sweep)
        params = [{"run_id": info.run_id, "key": k, **typed_row(v)}
                  for k, v in run_params(info.spec_json, info.recipe).items()]
        if params:
            conn.execute(insert(RunParam), params)
        tags = [{"run_id": info.run_id, "key": k, "value": str(v)} for k, v in (info.tags or {}).items()]
        if tags:
            conn.execute(insert(RunTag), tags)

    def start_run(self, info: RunInfo, *, heartbeat_timeout_s: float, rerun_finished: bool = False,
                  take_over: bool = False) -> int:
        """Mark a run RUNNING (creating it, or restarting a SCHEDULED/FAILED/KILLED one); returns its attempt number.

        A restart is a new attempt (`attempt` + 1) that keeps the earlier attempts' metric history until it writes
        its own: its first `write_metrics(..., replace_from_step=...)` deletes every point at or after its first
        step. A restart from scratch (step 0) so replaces the whole history, and a run resumed from a checkpoint at
        step k keeps steps < k. The summary is cleared (it belongs to an attempt that ended); artifacts stay (their
        files, checkpoints above all, still exist). A FINISHED run raises `RunFinishedError` unless
        `rerun_finished`; a RUNNING run whose heartbeat is fresh raises `RunActiveError`, unless its writer is known
        to be gone: it ran on this host and its process no longer exists (checked by pid), or the caller says so
        (`take_over`, e.g. after `kill -9` on another machine). The old writer, if it lives after all, finds its
        attempt superseded at its next write and stops recording.
        """

        self.reap()  # a write place: dead runs are marked KILLED here, never by a read

        def tx(conn: Connection) -> int:
            self._upsert_run_spec(conn, info)
            q = select(RunRecord).where(RunRecord.id == info.run_id)
            if conn.dialect.name == "postgresql":
                q = q.with_for_update()
            row = conn.execute(q).first()
            if row is None:
                self._insert_run(conn, info, RUNNING, heartbeat_timeout_s)
                return 1
            now = self._now()
            if row.status == FINISHED and not rerun_finished:
                raise RunFinishedError(
                    f"run {row.id} ({row.name}, seed {row.seed}) already FINISHED at {fmt_time(row.ended)}; "
                    "Registry.run_status() tells a sweep to skip it"
                )
            if row.status == RUNNING and not self._is_stale(row, now) and not take_over \
                    and not _writer_gone(conn, row):
                age = (now - row.heartbeat).total_seconds() if row.heartbeat else float("nan")
                raise RunActiveError(
                    f"run {row.id} ({row.name}) is already RUNNING on {row.host or 'an unknown host'} "
                    f"(last heartbeat {age:.0f}s ago); if that process is dead (killed on another machine), "
                    "`archspec train ... --take-over` starts it anyway"
                )
            for table in (SummaryMetric, RunParam, RunAccounting):
                conn.execute(delete(table).where(table.run_id == info.run_id))
            # The writer's tags are the new attempt's; the user's own (`archspec runs tag`) stay, like its notes.
            writer_keys = set(WRITER_TAGS) | set(info.tags or {})
            conn.execute(delete(RunTag).where(RunTag.run_id == info.run_id, RunTag.key.in_(sorted(writer_keys))))
            attempt = row.attempt if (row.status == SCHEDULED and row.started is None) else row.attempt + 1
            conn.execute(update(RunRecord).where(RunRecord.id == info.run_id).values(
                status=RUNNING, attempt=attempt, started=now, ended=None, heartbeat=now, error=None,
                heartbeat_timeout_s=heartbeat_timeout_s, host=info.host or "", code_version=info.code_version or "",
                recipe_json=json.dumps(info.recipe, sort_keys=True, default=str),
                accounting_json=json.dumps(run_accounting(info), sort_keys=True),
                model_hash=info.model_hash, name=info.spec_name,
            ))
            self._write_params_and_tags(conn, info)
            return attempt

        return self._write_once_more_on_conflict(tx, "start_run")

    def _alive(self, conn: Connection, run_id: str, attempt: int, now: datetime) -> bool:
        """Heartbeat inside a write: True while this attempt still owns the run.

        A run a reader marked KILLED for a missed heartbeat comes back to RUNNING when its writer turns out to be
        alive after all; a run that a newer attempt took over does not (rowcount 0).
        """
        res = conn.execute(
            update(RunRecord)
            .where(RunRecord.id == run_id, RunRecord.attempt == attempt, RunRecord.status.in_((RUNNING, KILLED)))
            .values(heartbeat=now, status=RUNNING, ended=None, error=None)
        )
        return res.rowcount == 1

    def beat(self, run_id: str, attempt: int) -> bool:
        return self._write(lambda conn: self._alive(conn, run_id, attempt, self._now()), "heartbeat")

    def write_metrics(self, run_id: str, attempt: int, points: Sequence[tuple[int, str, float, float]],
                      replace_from_step: int | None = None) -> bool:
        """Append metric points (step, key, value, unix time) and update metric_stats, in one transaction that also
        beats the heartbeat. Returns False (and writes nothing) when a newer attempt owns the run.

        `replace_from_step`: first delete the run's points at or after this step (a restarted attempt's first write,
        see `start_run`) and recompute metric_stats from what remains."""

        def tx(conn: Connection) -> bool:
            if not self._alive(conn, run_id, attempt, self._now()):
                return False
            if replace_from_step is not None:
                self._truncate_history(conn, run_id, replace_from_step)
            if not points:
                return True
            conn.execute(insert(Metric), [
                {"run_id": run_id, "key": k, "step": s, "value": (None if math.isnan(v) else v), "time": t}
                for s, k, v, t in points
            ])
            self._update_stats(conn, run_id, points)
            return True

        return self._write(tx, "write_metrics")

    def _truncate_history(self, conn: Connection, run_id: str, from_step: int) -> None:
        res = conn.execute(delete(Metric).where(Metric.run_id == run_id, Metric.step >= from_step))
        if not res.rowcount:
            return
        conn.execute(delete(MetricStats).where(MetricStats.run_id == run_id))
        agg = conn.execute(
            select(Metric.key, func.count(), func.min(Metric.value), func.max(Metric.value), func.max(Metric.step))
            .where(Metric.run_id == run_id).group_by(Metric.key)
        ).all()
        rows = []
        for key, count, lo, hi, last_step in agg:
            last = conn.execute(
                select(Metric.value).where(Metric.run_id == run_id, Metric.key == key, Metric.step == last_step)
                .order_by(Metric.id.desc()).limit(1)
            ).scalar()
            rows.append({"run_id": run_id, "key": key, "last_step": last_step, "last_value": last,
                         "min_value": lo, "max_value": hi, "count": count})
        if rows:
            conn.execute(insert(MetricStats), rows)

    def _update_stats(self, conn: Connection, run_id: str, points: Sequence[tuple[int, str, float, float]]) -> None:
        new: dict[str, dict[str, Any]] = {}
        for step, key, value, _ in points:  # points arrive in logging order: the last one of a step wins
            st = new.setdefault(key, {"last_step": step, "last_value": value, "min": None, "max": None, "count": 0})
            if step >= st["last_step"]:
                st["last_step"], st["last_value"] = step, value
            st["count"] += 1
            if not math.isnan(value):
                st["min"] = value if st["min"] is None else min(st["min"], value)
                st["max"] = value if st["max"] is None else max(st["max"], value)
        old = {
            r.key: r for r in conn.execute(
                select(MetricStats).where(MetricStats.run_id == run_id, MetricStats.key.in_(list(new)))
            )
        }
        inserts = []
        for key, st in new.items():
            last_value = None if math.isnan(st["last_value"]) else st["last_value"]
            prev = old.get(key)
            if prev is None:
                inserts.append({"run_id": run_id, "key": key, "last_step": st["last_step"], "last_value": last_value,
                                "min_value": st["min"], "max_value": st["max"], "count": st["count"]})
                continue
            values: dict[str, Any] = {"count": prev.count + st["count"]}
            if st["last_step"] >= prev.last_step:
                values.update(last_step=st["last_step"], last_value=last_value)
            lo = [v for v in (prev.min_value, st["min"]) if v is not None]
            hi = [v for v in (prev.max_value, st["max"]) if v is not None]
            values.update(min_value=min(lo) if lo else None, max_value=max(hi) if hi else None)
            conn.execute(
                update(MetricStats).where(MetricStats.run_id == run_id, MetricStats.key == key).values(**values)
            )
        if inserts:
            conn.execute(insert(MetricStats), inserts)

    def set_summary(self, run_id: str, metrics: Mapping[str, float]) -> None:
        def tx(conn: Connection) -> None:
            keys = list(metrics)
            conn.execute(delete(SummaryMetric).where(SummaryMetric.run_id == run_id, SummaryMetric.key.in_(keys)))
            if keys:
                conn.execute(insert(SummaryMetric), [
                    {"run_id": run_id, "key": k, "value": None if math.isnan(v) else v}
                    for k, v in ((k, float(v)) for k, v in metrics.items())
                ])

        self._write(tx, "set_summary")

    def add_artifact(self, run_id: str, kind: str, path: str) -> None:
        """Record a file once per (run, kind, path): a resumed run re-announces its module and checkpoint. The path
        is stored absolute, so that it resolves from any directory (the run's host says which machine holds it), or
        relative to the declared artifact root when under it (archspec.registry.artifact_paths)."""
        path = stored(path)

        def tx(conn: Connection) -> None:
            known = conn.execute(select(Artifact.id).where(
                Artifact.run_id == run_id, Artifact.kind == kind, Artifact.path == str(path))).first()
            if known is None:
                conn.execute(insert(Artifact).values(run_id=run_id, kind=kind, path=str(path), created=self._now()))

        self._write(tx, "log_artifact")

    def record_evaluation(self, run_id: str, task: str, params: Mapping[str, Any], metrics: Mapping[str, float],
                          checkpoint: str, code_version: str = "") -> int:
        """Record a capability probe of `run_id` as an evaluation of its own (the run's row, metrics and summary are
        not touched); returns its id. The run must exist."""
        def tx(conn: Connection) -> int:
            if conn.execute(select(RunRecord.id).where(RunRecord.id == run_id)).first() is None:
                raise UserError(f"no run {run_id!r} in registry {self.url}")
            res = conn.execute(insert(Evaluation).values(
                run_id=run_id, task=task, params_json=json.dumps(dict(params), sort_keys=True),
                checkpoint=stored(checkpoint), code_version=code_version, created=self._now()))
            evaluation_id = int(res.inserted_primary_key[0])
            rows = [{"evaluation_id": evaluation_id, "key": k, "value": None if math.isnan(v) else v}
                    for k, v in ((k, float(v)) for k, v in metrics.items())]
            if rows:
                conn.execute(insert(EvaluationMetric), rows)
            return evaluation_id

        return self._write(tx, "record_evaluation")

    def finish_run(self, run_id: str, attempt: int, status: str, error: str | None = None) -> bool:
        """Set the final status of this attempt. False when a newer attempt owns the run."""
        if status not in (FINISHED, FAILED, KILLED):
            raise ValueError(f"final status must be FINISHED, FAILED or KILLED, got {status!r}")

        def tx(conn: Connection) -> bool:
            now = self._now()
            res = conn.execute(
                update(RunRecord)
                .where(RunRecord.id == run_id, RunRecord.attempt == attempt)
                .values(status=status, ended=now, heartbeat=now, error=error)
            )
            return res.rowcount == 1

        return self._write(tx, "end_run")

    def set_scheduler_job(self, run_id: str, job_id: str) -> None:
        """Record the scheduler's id of the job that runs `run_id` (archspec.launch): a SLURM job or array task, a Ray
        task. Set at submission and again by the worker once it starts (an array task knows its index only then)."""
        self._write(lambda conn: conn.execute(update(RunRecord).where(RunRecord.id == run_id).values(
            scheduler_job=str(job_id)[:128])), "set_scheduler_job")

    def mark_killed(self, run_id: str, error: str) -> bool:
        """A run whose process the launcher saw die (submitit reported the job failed, Ray raised): KILLED now if
        it is still RUNNING, instead of after its heartbeat timeout. False when it is not RUNNING (it ended)."""

        def tx(conn: Connection) -> bool:
            res = conn.execute(update(RunRecord).where(RunRecord.id == run_id, RunRecord.status == RUNNING).values(
                status=KILLED, ended=self._now(), error=error))
            return res.rowcount == 1

        return self._write(tx, "mark_killed")

    # liveness

    def _is_stale(self, row, now: datetime, timeout_s: float | None = None) -> bool:
        return is_stale(row.heartbeat, row.heartbeat_timeout_s if timeout_s is None else timeout_s, now)

    def reap(self, timeout_s: float | None = None) -> list[str]:
        """Mark KILLED every RUNNING run whose last heartbeat is older than its writer's timeout (or `timeout_s`), and
        at once every RUNNING run whose writer ran on this host and whose process (its `pid` tag) is gone (`kill -9`).

        A write, done where writes happen: at a run start, by a sweep before each job, and by `archspec runs reap`.
        Reads never reap; they show such a run as stale (`RunRow.stale`). The update re-checks the heartbeat (or,
        for a dead writer, the attempt), so a run that beat or restarted in between is left alone. Returns the ids
        marked.
        """
        now = self._now()

        def find(conn: Connection):
            rows = conn.execute(
                select(RunRecord.id, RunRecord.heartbeat, RunRecord.heartbeat_timeout_s, RunRecord.attempt,
                       RunRecord.host).where(RunRecord.status == RUNNING)
            ).all()
            tags: dict[str, dict[str, str]] = {}
            for run_id, key, value in conn.execute(select(RunTag.run_id, RunTag.key, RunTag.value).where(
                    RunTag.key.in_(WRITER_IDENTITY),
                    RunTag.run_id.in_(select(RunRecord.id).where(RunRecord.status == RUNNING)))).all():
                tags.setdefault(run_id, {})[key] = value
            return [(r, writer_gone(r.host, tags.get(r.id, {}))) for r in rows]

        rows = self._read(find, "find stale runs", empty=list)
        stale = [(r, gone) for r, gone in rows if gone or self._is_stale(r, now, timeout_s)]
        if not stale:
            return []

        def tx(conn: Connection) -> list[str]:
            marked = []
            for r, gone in stale:
                limit = r.heartbeat_timeout_s if timeout_s is None else timeout_s
                cond = RunRecord.id == r.id, RunRecord.status == RUNNING, RunRecord.attempt == r.attempt
                if gone:
                    error = f"its writer's process on this host ({r.host}) is gone: it was killed or died"
                else:
                    cutoff = now - timedelta(seconds=limit)
                    cond += ((RunRecord.heartbeat.is_(None)) | (RunRecord.heartbeat < cutoff),)
                    error = (f"no heartbeat since {fmt_time(r.heartbeat)} (timeout {limit:g}s): "
                             "the process died or was killed")
                res = conn.execute(update(RunRecord).where(*cond).values(
                    status=KILLED, ended=r.heartbeat or now, error=error))
                if res.rowcount:
                    marked.append(r.id)
            return marked

        return self._write(tx, "mark stale runs KILLED")

    mark_stale_killed = reap  # the earlier name

    # housekeeping: what a user asks for explicitly (`archspec runs tag|note|rename|delete`); nothing else changes

    def _require_run(self, conn: Connection, run_id: str) -> None:
        if conn.execute(select(RunRecord.id).where(RunRecord.id == run_id)).first() is None:
            raise UserError(f"no run {run_id!r} in registry {self.url}")

    def set_tags(self, run_id: str, tags: Mapping[str, str], remove: Sequence[str] = ()) -> None:
        """Set (`tags`) and remove (`remove`) user tags of a run, in one transaction; removing an absent tag is no
        error. The writer's own tags (`WRITER_TAGS`) are refused by the CLI."""
        def tx(conn: Connection) -> None:
            self._require_run(conn, run_id)
            keys = sorted({*tags, *remove})
            if keys:
                conn.execute(delete(RunTag).where(RunTag.run_id == run_id, RunTag.key.in_(keys)))
            if tags:
                conn.execute(insert(RunTag), [{"run_id": run_id, "key": k, "value": v} for k, v in tags.items()])

        self._write(tx, "set tags")

    def add_note(self, run_id: str, text: str) -> None:
        """Add a free-text note to a run; the latest note is the run's `note` (earlier ones stay, oldest first)."""
        def tx(conn: Connection) -> None:
            self._require_run(conn, run_id)
            conn.execute(insert(RunNote).values(run_id=run_id, text=text, created=self._now()))

        self._write(tx, "add note")

    def rename_run(self, run_id: str, name: str | None) -> None:
        """Give a run a display name (None: back to its spec's name). Its id never changes."""
        def tx(conn: Connection) -> None:
            self._require_run(conn, run_id)
            conn.execute(update(RunRecord).where(RunRecord.id == run_id).values(display_name=name))

        self._write(tx, "rename run")

    def delete_runs(self, run_ids: Sequence[str]) -> int:
        """Delete runs and every row that belongs to them (params, accounting, tags, notes, sweep memberships,
        metrics, summary, artifacts, evaluations) in one transaction; their specs stay (specs exist without runs).
        Returns the number of runs deleted. The files are the caller's (archspec.registry.housekeeping)."""
        ids = list(dict.fromkeys(run_ids))

        def tx(conn: Connection) -> int:
            evaluations = select(Evaluation.id).where(Evaluation.run_id.in_(ids))
            conn.execute(delete(EvaluationMetric).where(EvaluationMetric.evaluation_id.in_(evaluations)))
            for table in (Evaluation, RunNote, Artifact, SummaryMetric, MetricStats, Metric, RunTag, SweepRun,
                          RunAccounting, RunParam):
                conn.execute(delete(table).where(table.run_id.in_(ids)))
            return conn.execute(delete(RunRecord).where(RunRecord.id.in_(ids))).rowcount

        return self._write(tx, "delete runs")

    def forget_artifacts(self, paths_by_run: Mapping[str, Sequence[str]]) -> None:
        """Forget recorded artifacts (run id → paths) in one transaction: their files are gone (`archspec gc`)."""
        def tx(conn: Connection) -> None:
            for run_id, paths in paths_by_run.items():
                forms = sorted({form for p in paths for form in (str(p), stored(p))})  # as read, and as stored
                conn.execute(delete(Artifact).where(Artifact.run_id == run_id, Artifact.path.in_(forms)))

        self._write(tx, "forget artifacts")
