"""Model identity, run keys, run accounting, sweep membership.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30

- `specs` is keyed by the model hash (the `model:` section alone; name and recipe were hashed in before): rows of
  one model under several names or recipes merge into one, `spec_names` lists the names, `canonical_json` holds the
  model section and `spec_params` its `model.*` keys.
- Runs get their own accounting (`runs.accounting_json`, `run_accounting`), at their own seq_len.
- Run ids become run keys (model hash, learning-recipe hash, data hash, seed): a run is re-keyed, its metrics, params,
  tags, summary and artifacts with it. Runs that now share a key (one experiment under two names) keep the best as the
  key's run (FINISHED first, then the latest) and the others under their old ids: nothing is deleted.
- `runs.sweep` becomes membership (`sweep_runs`, with the variant the sweep's tags recorded).

Accounting carried over: the old registry kept one accounting per spec, written at context_length by `build` and at
train.seq_len by a run, whichever came last. Where those agree (seq_len = context_length) the figures are kept with
their seq_len; elsewhere only the figures that do not depend on the sequence length (params.*, kv_cache_bytes) are
kept, and the next build or run records the rest.

Written against the tables, not archspec's models, and with its own copy of the hashing rules as they were at this
revision, so that it stays what it was. Downgrade restores the shape of 0002 (one sweep per run, no run accounting,
no names table); specs stay keyed by model hash.
"""

import hashlib
import json
import math

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

# archspec.train.logger.NOT_IDENTITY at this revision, plus `eval_tokens` (added later; no recipe older than this
# revision has it, so it changes no real upgrade, and a registry downgraded and upgraded again keeps its run ids).
NOT_IDENTITY = frozenset({"seed", "compile", "activation_checkpointing", "checkpointing", "parallel", "strategy",
                          "fsdp", "eval_interval", "eval_batches", "eval_tokens", "checkpoint_interval", "device"})
RUN_CHILDREN = ("run_params", "run_tags", "metrics", "metric_stats", "summary_metrics", "artifacts")
RENAMES = {"flops_per_token": "flops", "kv_cache_bytes_per_token": "kv_cache_bytes"}


def _canonical(data) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _digest(data) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                                     default=str).encode()).hexdigest()


def _run_key(model_hash: str, recipe: dict, data_hash: str, seed: int) -> str:
    learning = {k: v for k, v in recipe.items() if k not in NOT_IDENTITY}
    learning.setdefault("world_size", 1)
    return _digest({"model": model_hash, "recipe": _digest(learning), "data": data_hash, "seed": int(seed)})[:16]


def _flatten(data, prefix: str = "") -> dict:
    out = {}
    for k, v in data.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _typed(value) -> dict:
    if isinstance(value, bool):
        return {"kind": "bool", "value_num": None, "value_str": "true" if value else "false"}
    if isinstance(value, int):
        return {"kind": "int", "value_num": float(value), "value_str": None}
    if isinstance(value, float):
        return {"kind": "float", "value_num": None if math.isnan(value) else value, "value_str": None}
    if isinstance(value, str):
        return {"kind": "str", "value_num": None, "value_str": value}
    if value is None:
        return {"kind": "null", "value_num": None, "value_str": None}
    return {"kind": "json", "value_num": None, "value_str": json.dumps(value, sort_keys=True, separators=(",", ":"))}


def _accounting(accounting_json: str, seq_len, context_length) -> dict:
    """The old figures, with their seq_len where it is certain, else without the seq_len-dependent ones."""
    acct = json.loads(accounting_json or "{}")
    if seq_len is not None and seq_len == context_length:
        return {**acct, "seq_len": context_length}
    return {k: v for k, v in acct.items() if k != "flops_per_token"}


def _fields(acct: dict) -> dict:
    out = {}
    for key, value in _flatten(acct).items():
        head, dot, rest = key.partition(".")
        if head == "seq_len":
            head = "flops.seq_len"
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[RENAMES.get(head, head) + dot + rest] = value
    return out


def upgrade() -> None:
    op.create_table(
        "spec_names",
        sa.Column("spec_hash", sa.String(64), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("created", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["spec_hash"], ["specs.hash"], name="fk_spec_names_spec_hash_specs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("spec_hash", "name", name="pk_spec_names"),
    )
    op.create_index("ix_spec_names_name", "spec_names", ["name"])
    op.create_table(
        "run_accounting",
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("value", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_run_accounting_run_id_runs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "key", name="pk_run_accounting"),
    )
    op.create_index("ix_run_accounting_key_value", "run_accounting", ["key", "value"])
    op.create_table(
        "sweep_runs",
        sa.Column("sweep", sa.String(128), nullable=False),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("variant", sa.Integer(), nullable=False),
        sa.Column("label", sa.Text(), nullable=False),
        sa.Column("sweep_hash", sa.String(64), nullable=False),
        sa.Column("baseline", sa.Integer(), nullable=False),
        sa.Column("created", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_sweep_runs_run_id_runs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("sweep", "run_id", name="pk_sweep_runs"),
    )
    op.create_index("ix_sweep_runs_run_id", "sweep_runs", ["run_id"])
    # Plain ALTER TABLE, never a batch "move and copy": on SQLite that drops and recreates `runs`, and dropping it
    # with foreign keys on cascades to every metric (SQLite >= 3.35 drops columns in place).
    op.add_column("runs", sa.Column("accounting_json", sa.Text(), nullable=False, server_default="{}"))

    _carry_over(op.get_bind())

    op.drop_index("ix_runs_sweep", table_name="runs")
    op.execute("ALTER TABLE runs DROP COLUMN sweep")


def _carry_over(conn) -> None:
    q = lambda sql, **kw: conn.execute(sa.text(sql), kw)  # noqa: E731
    # ── specs: one row per model ──
    new_of: dict[str, str] = {}
    groups: dict[str, list] = {}
    for r in q("SELECT hash, name, canonical_json, generated_hash, accounting_json, created FROM specs "
               "ORDER BY created, hash").all():
        data = json.loads(r.canonical_json)
        model = data.get("model", data)
        h = hashlib.sha256(_canonical(model).encode()).hexdigest()
        new_of[r.hash] = h
        groups.setdefault(h, []).append((r, data, model))
    old_hashes = set(new_of)
    for h, rows in groups.items():
        first, _, model = rows[0]
        last = rows[-1][0]
        train = rows[-1][1].get("train") or {}
        acct = _accounting(last.accounting_json, train.get("seq_len", model.get("context_length")),
                           model.get("context_length"))
        generated = next((r.generated_hash for r, _, _ in reversed(rows) if r.generated_hash), None)
        if h in old_hashes:  # already a model-keyed row
            q("DELETE FROM spec_params WHERE spec_hash = :h", h=h)
            q("DELETE FROM spec_accounting WHERE spec_hash = :h", h=h)
            q("UPDATE specs SET canonical_json = :c, accounting_json = :a WHERE hash = :h", c=_canonical(model),
              a=json.dumps(acct, sort_keys=True), h=h)
        else:
            q("INSERT INTO specs (hash, name, canonical_json, generated_hash, accounting_json, created) "
              "VALUES (:h, :n, :c, :g, :a, :t)", h=h, n=first.name, c=_canonical(model), g=generated,
              a=json.dumps(acct, sort_keys=True), t=first.created)
        for key, value in _flatten({"model": model}).items():
            q("INSERT INTO spec_params (spec_hash, key, kind, value_num, value_str) "
              "VALUES (:h, :k, :kind, :value_num, :value_str)", h=h, k=key, **_typed(value))
        for key, value in _fields(acct).items():
            q("INSERT INTO spec_accounting (spec_hash, key, value) VALUES (:h, :k, :v)", h=h, k=key, v=float(value))
        seen = set()
        for r, _, _ in rows:
            if r.name not in seen:
                seen.add(r.name)
                q("INSERT INTO spec_names (spec_hash, name, created) VALUES (:h, :n, :t)", h=h, n=r.name, t=r.created)
    accounting_of = {r.hash: r.accounting_json for r in q("SELECT hash, accounting_json FROM specs").all()}

    # ── runs: re-keyed, with their own accounting ──
    runs = q("SELECT id, spec_hash, data_hash, seed, recipe_json, status, sweep, created, ended FROM runs").all()
    tags: dict[str, dict[str, str]] = {}
    for run_id, key, value in q("SELECT run_id, key, value FROM run_tags").all():
        tags.setdefault(run_id, {})[key] = value
    by_key: dict[str, list] = {}
    for r in runs:
        h = new_of.get(r.spec_hash, r.spec_hash)
        recipe = json.loads(r.recipe_json)
        by_key.setdefault(_run_key(h, recipe, r.data_hash, r.seed), []).append((r, h, recipe))
    final_id: dict[str, str] = {}
    for key, members in by_key.items():
        members.sort(key=lambda m: (m[0].status == "FINISHED", str(m[0].ended or m[0].created)), reverse=True)
        for i, (r, h, recipe) in enumerate(members):
            final_id[r.id] = key if i == 0 else r.id  # the best takes the key; the others keep their ids
    for r in runs:
        h = new_of.get(r.spec_hash, r.spec_hash)
        model = json.loads(q("SELECT canonical_json FROM specs WHERE hash = :h", h=h).scalar())
        recipe = json.loads(r.recipe_json)
        acct = _accounting(accounting_of.get(r.spec_hash, "{}"), recipe.get("seq_len"), model.get("context_length"))
        q("UPDATE runs SET spec_hash = :h, accounting_json = :a WHERE id = :i", h=h,
          a=json.dumps(acct, sort_keys=True), i=r.id)
        new = final_id[r.id]
        if new != r.id and q("SELECT 1 FROM runs WHERE id = :n", n=new).first() is None:
            cols = "spec_hash, name, data_hash, seed, recipe_json, code_version, status, sweep, host, error, created, " \
                   "started, ended, heartbeat, heartbeat_timeout_s, attempt, accounting_json"
            q(f"INSERT INTO runs (id, {cols}) SELECT :n, {cols} FROM runs WHERE id = :o", n=new, o=r.id)
            for table in RUN_CHILDREN:
                q(f"UPDATE {table} SET run_id = :n WHERE run_id = :o", n=new, o=r.id)
            q("DELETE FROM runs WHERE id = :o", o=r.id)
        else:
            new = r.id
            final_id[r.id] = new
        for k, v in _fields(acct).items():
            q("INSERT INTO run_accounting (run_id, key, value) VALUES (:i, :k, :v)", i=new, k=k, v=float(v))
        if r.sweep is not None:
            t = tags.get(r.id, {})

            def num(name: str) -> int:
                try:
                    return int(t.get(name, "0"))
                except ValueError:
                    return 0

            q("INSERT INTO sweep_runs (sweep, run_id, variant, label, sweep_hash, baseline, created) "
              "VALUES (:s, :i, :v, :l, :h, :b, :t)", s=r.sweep, i=new, v=num("variant"),
              l=t.get("variant_label", ""), h=t.get("sweep_hash", ""), b=num("baseline"), t=r.created)

    # ── the old spec rows, now that nothing refers to them ──
    for old in old_hashes - set(groups):
        q("DELETE FROM spec_params WHERE spec_hash = :h", h=old)
        q("DELETE FROM spec_accounting WHERE spec_hash = :h", h=old)
        q("DELETE FROM specs WHERE hash = :h", h=old)


def downgrade() -> None:
    op.add_column("runs", sa.Column("sweep", sa.String(128), nullable=True))
    op.create_index("ix_runs_sweep", "runs", ["sweep"])
    op.get_bind().execute(sa.text(
        "UPDATE runs SET sweep = (SELECT min(sweep) FROM sweep_runs WHERE sweep_runs.run_id = runs.id)"))
    op.execute("ALTER TABLE runs DROP COLUMN accounting_json")
    op.drop_index("ix_sweep_runs_run_id", table_name="sweep_runs")
    op.drop_table("sweep_runs")
    op.drop_index("ix_run_accounting_key_value", table_name="run_accounting")
    op.drop_table("run_accounting")
    op.drop_index("ix_spec_names_name", table_name="spec_names")
    op.drop_table("spec_names")
