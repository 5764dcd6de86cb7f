"""The registry schema as SQLAlchemy 2.x typed models.

Alembic migrations in `archspec/registry/migrations/versions/` create exactly these tables (a test compares the two),
so a change here goes with a new migration.

Why the tables look as they do:
- `specs` / `spec_params` / `spec_accounting` exist without any run: `archspec build` records a spec with its
  accounting so that `specs list --where "params.active < 20e6"` works before anything trains.
- Params are stored flattened (`model.attention.n_heads`) with a typed value: numbers in `value_num` (so that
  `n_layers >= 8` compares numerically), strings and booleans in `value_str`.
- `metric_stats` holds, per (run, metric key), the latest and extreme values. The writer keeps it current as it
  flushes, so that filtering and sorting 10,000 runs on `metrics.val_loss` never scans the raw metric points.
- Side tables carry a (key, value) index: a filter compiles to `id IN (SELECT run_id ... WHERE key = ? AND value
  < ?)`, answered from that index. Text values are not indexed: PostgreSQL cannot index arbitrarily long text, and
  the (key, value_num) index already narrows a text predicate to one key.
- Times are naive UTC in the database (SQLite has no time zone type); `UTCDateTime` hands out aware UTC datetimes.
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import BigInteger, Double, ForeignKey, Index, Integer, MetaData, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import DateTime, TypeDecorator

# SQLite only auto-increments an `INTEGER PRIMARY KEY`; elsewhere metric ids may outgrow 32 bits.
BigIntId = BigInteger().with_variant(Integer(), "sqlite")


class UTCDateTime(TypeDecorator):
    """Stored as naive UTC, returned as aware UTC; naive inputs are taken to be UTC already."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect) -> datetime | None:
        if value is not None and value.tzinfo is not None:
            value = value.astimezone(timezone.utc).replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return value

    def result_processor(self, dialect, coltype):
        # A time written by something else that the driver cannot parse ('yesterday') reads as None, with a warning,
        # instead of failing the whole query (SQLite stores times as text).
        inner = super().result_processor(dialect, coltype)
        if inner is None:
            return None

        def process(value):
            try:
                return inner(value)
            except (ValueError, TypeError):
                from archspec.registry.values import report_damage

                report_damage("a time column", f"{value!r} is not an ISO date/time")
                return None

        return process


class Base(DeclarativeBase):
    # Named constraints, so that a later migration can drop or alter them by name on every backend.
    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(column_0_label)s",
            "uq": "uq_%(table_name)s_%(column_0_name)s",
            "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
            "pk": "pk_%(table_name)s",
        }
    )


class SpecRecord(Base):
    """One model (the fully-defaulted `model:` section), keyed by its hash; the names it was built under are in
    `spec_names`, its recipes live with its runs."""

    __tablename__ = "specs"

    hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(128), index=True)  # the name it was first recorded under
    canonical_json: Mapped[str] = mapped_column(Text)  # canonical JSON of the model section (SPEC_JSON)
    generated_hash: Mapped[str | None] = mapped_column(String(64))  # sha256 of the generated module source
    # At context_length, exact integers with their seq_len, for display; spec_accounting is for queries.
    accounting_json: Mapped[str] = mapped_column(Text)
    created: Mapped[datetime] = mapped_column(UTCDateTime)


class SpecName(Base):
    """A name a model was built or trained under (one model, many names)."""

    __tablename__ = "spec_names"

    model_hash: Mapped[str] = mapped_column("spec_hash", ForeignKey("specs.hash", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(128), primary_key=True, index=True)
    created: Mapped[datetime] = mapped_column(UTCDateTime)


class SpecParam(Base):
    """One flattened spec key (`model.norm.kind`) with its typed value."""

    __tablename__ = "spec_params"
    __table_args__ = (Index("ix_spec_params_key_value_num", "key", "value_num"),)

    model_hash: Mapped[str] = mapped_column("spec_hash", ForeignKey("specs.hash", ondelete="CASCADE"), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    kind: Mapped[str] = mapped_column(String(8))  # int | float | bool | str | json | null
    value_num: Mapped[float | None] = mapped_column(Double)  # int and float values
    value_str: Mapped[str | None] = mapped_column(Text)  # str values, 'true'/'false', JSON of lists


class SpecAccounting(Base):
    """One accounting figure (`params.active`, `flops.train`, `flops.seq_len`, ...) of a spec, at context_length."""

    __tablename__ = "spec_accounting"
    __table_args__ = (Index("ix_spec_accounting_key_value", "key", "value"),)

    model_hash: Mapped[str] = mapped_column("spec_hash", ForeignKey("specs.hash", ondelete="CASCADE"), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    value: Mapped[float] = mapped_column(Double)


class RunRecord(Base):
    """One run. Its id is content-derived (`archspec.train.logger.run_key`): the same experiment is the same run."""

    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    model_hash: Mapped[str] = mapped_column("spec_hash", ForeignKey("specs.hash"), index=True)
    name: Mapped[str] = mapped_column(String(128), index=True)  # the spec's name (a label)
    data_hash: Mapped[str] = mapped_column(String(64))
    seed: Mapped[int] = mapped_column(Integer)
    recipe_json: Mapped[str] = mapped_column(Text)  # the train recipe actually used
    code_version: Mapped[str] = mapped_column(String(128), default="")
    status: Mapped[str] = mapped_column(String(16), index=True)
    host: Mapped[str] = mapped_column(String(255), default="")
    error: Mapped[str | None] = mapped_column(Text)
    created: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    started: Mapped[datetime | None] = mapped_column(UTCDateTime)
    ended: Mapped[datetime | None] = mapped_column(UTCDateTime)
    heartbeat: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # The writer's own timeout: a reader marks the run KILLED once `heartbeat` is older than this.
    heartbeat_timeout_s: Mapped[float] = mapped_column(Double)
    # Incremented by each restart of a FAILED/KILLED run; a writer whose attempt was superseded stops writing.
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    # The run's accounting, at its own seq_len (with it), for display; run_accounting is for queries.
    accounting_json: Mapped[str] = mapped_column(Text, server_default="{}")
    # The name a user gave the run (`archspec runs rename`); NULL: the spec's name above. The id never changes.
    display_name: Mapped[str | None] = mapped_column(String(128))
    # The scheduler's id of the job that ran it (SLURM job or array task, Ray task; archspec.launch); NULL: in-process.
    scheduler_job: Mapped[str | None] = mapped_column(String(128))


class RunParam(Base):
    """The run's flattened params: its spec's keys, with `train.*` taken from the recipe actually used."""

    __tablename__ = "run_params"
    __table_args__ = (Index("ix_run_params_key_value_num", "key", "value_num"),)

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    kind: Mapped[str] = mapped_column(String(8))
    value_num: Mapped[float | None] = mapped_column(Double)
    value_str: Mapped[str | None] = mapped_column(Text)


class RunAccounting(Base):
    """One accounting figure of a run, at the run's seq_len: what `flops.*` means in `runs list`."""

    __tablename__ = "run_accounting"
    __table_args__ = (Index("ix_run_accounting_key_value", "key", "value"),)

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    value: Mapped[float] = mapped_column(Double)


class SweepRun(Base):
    """A run's membership of a sweep, with its variant there: a run can belong to many sweeps."""

    __tablename__ = "sweep_runs"

    sweep: Mapped[str] = mapped_column(String(128), primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True, index=True)
    variant: Mapped[int] = mapped_column(Integer)
    label: Mapped[str] = mapped_column(Text)
    sweep_hash: Mapped[str] = mapped_column(String(64))
    baseline: Mapped[int] = mapped_column(Integer)
    created: Mapped[datetime] = mapped_column(UTCDateTime)


class RunTag(Base):
    __tablename__ = "run_tags"
    __table_args__ = (Index("ix_run_tags_key", "key"),)

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class RunNote(Base):
    """A free-text note on a run (`archspec runs note`), oldest first; the latest is the run's `note`. A table of its
    own: a restart rewrites the writer's tags, never the notes."""

    __tablename__ = "run_notes"

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    text: Mapped[str] = mapped_column(Text)
    created: Mapped[datetime] = mapped_column(UTCDateTime)


class Metric(Base):
    """One metric point. NaN is stored as NULL on SQLite (which cannot hold NaN) and read back as NaN."""

    __tablename__ = "metrics"
    __table_args__ = (Index("ix_metrics_run_key_step", "run_id", "key", "step"),)

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(255))
    step: Mapped[int] = mapped_column(BigInteger)
    value: Mapped[float | None] = mapped_column(Double)
    time: Mapped[float] = mapped_column(Double)  # Unix seconds, wall clock of the writer


class MetricStats(Base):
    """Per (run, key): latest point and extremes, maintained by the writer at each flush."""

    __tablename__ = "metric_stats"
    __table_args__ = (
        Index("ix_metric_stats_key_last_value", "key", "last_value"),
        Index("ix_metric_stats_key_min_value", "key", "min_value"),
    )

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    last_step: Mapped[int] = mapped_column(BigInteger)
    last_value: Mapped[float | None] = mapped_column(Double)
    min_value: Mapped[float | None] = mapped_column(Double)
    max_value: Mapped[float | None] = mapped_column(Double)
    count: Mapped[int] = mapped_column(BigInteger)


class SummaryMetric(Base):
    """Final/summary metrics set by the run (final val loss, tokens/s)."""

    __tablename__ = "summary_metrics"
    __table_args__ = (Index("ix_summary_metrics_key_value", "key", "value"),)

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    value: Mapped[float | None] = mapped_column(Double)


class Artifact(Base):
    """A file a run produced (checkpoint, plot); the registry stores the path, not the file."""

    __tablename__ = "artifacts"

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(64))
    path: Mapped[str] = mapped_column(Text)
    created: Mapped[datetime] = mapped_column(UTCDateTime)


class Evaluation(Base):
    """A capability probe of a trained run (`archspec probe RUN --task ...`): a record of its own beside the run, so
    the run's training record (status, metrics, summary) stays exactly as training left it."""

    __tablename__ = "evaluations"

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    task: Mapped[str] = mapped_column(String(64))  # mqar | passkey
    params_json: Mapped[str] = mapped_column(Text)  # the task's parameters and seq_len, as evaluated
    checkpoint: Mapped[str] = mapped_column(Text)  # the weights evaluated (path, as given by the run's artifact)
    code_version: Mapped[str] = mapped_column(String(128), default="")
    created: Mapped[datetime] = mapped_column(UTCDateTime)


class EvaluationMetric(Base):
    """One figure of an evaluation (`accuracy`, `accuracy.d64`, `answers`): what `probe.<key>` filters read."""

    __tablename__ = "evaluation_metrics"
    __table_args__ = (Index("ix_evaluation_metrics_key_value", "key", "value"),)

    evaluation_id: Mapped[int] = mapped_column(ForeignKey("evaluations.id", ondelete="CASCADE"), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    value: Mapped[float | None] = mapped_column(Double)
