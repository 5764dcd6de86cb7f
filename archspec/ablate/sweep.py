"""Sweep files: a base spec, a grid (and zipped keys) of dotted-key variants, seeds and one budget.

    name: ffn-variants
    base: ../llama-like-tiny.yaml          # a path (relative to this file) or an inline spec mapping
    seeds: [0, 1, 2]
    budget: {tokens: 2_000_000}            # or {steps: N}, or {flops: X} (steps per variant from train FLOPs/token)
    grid:                                  # cartesian product over dotted keys; values may be whole sub-specs
      model.ffn:
        - {kind: mlp, activation: gelu, hidden_dim: 512}
        - {kind: glu, activation: silu, hidden_dim: 344}
    zip:                                   # optional: keys varied together (equal-length lists)
      model.d_model: [64, 128]
      model.attention.n_heads: [2, 4]
    baseline: 0                            # index of the variant the deltas are against
    eval_points: 10                        # evaluations per curve: train.eval_interval = ceil(steps / eval_points)
    match: params                          # optional: params | flops | kv_bytes, matched to the baseline variant by
    solve: model.ffn.hidden_dim            #   solving this width per variant (archspec.ablate.match)
    tolerance: 0.02                        #   relative mismatch allowed (default 2%)
    multiple_of: 8                         #   the solved width is a multiple of this (default 8)
    stability: true                        # optional: per-layer stability metrics in every run (train.stability)
    lr_sweep: [1.0e-3, 3.0e-3, 1.0e-2]     # optional: each variant at each rate with the first seed (its pilot), then
                                           #   the other seeds at the variant's best rate only (archspec.ablate.rates)
    quantize: [int8, int4]                 # optional: every finished run quantized at each scheme, once (the
    quantize_group_size: 32                #   `archspec quantize` evaluation; archspec.ablate.quantize); int4's group

Nothing here knows any spec kind: a variant is a set of dotted overrides applied to the base mapping and validated by
the spec language, so new kinds (moe, sparse attention) are sweepable the day they exist.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, model_validator

from archspec.ablate.match import MULTIPLE_OF, TOLERANCE, Solution, count, dotted_value, solve_width
from archspec.accounting import Accounting, account
from archspec.errors import UserError
from archspec.errors import printable
from archspec.launch.settings import LauncherSettings
from archspec.quant.schemes import SCHEMES
from archspec.recipe import RecipeView
from archspec.spec import SLUG_RE, Spec, apply_overrides, canonical_dict, format_validation_error, parse_spec, read_yaml, set_dotted
from archspec.spec.safe_yaml import check_structure, variant_count_text
from archspec.spec.train import EVAL_POINTS, TrainSpec, auto_eval_points, auto_eval_tokens

# A sweep is trained, variant by variant: past these counts it is a mistake (or an attack), not an experiment, and
# the count is checked from the list lengths before a single variant is built.
MAX_VARIANTS = 1000
MAX_SEEDS = 100
MAX_JOBS = 10_000
MAX_RATES = 16

# A seed is a spec's train.seed: the same bounds, from the one place that states them.
Seed = Annotated[StrictInt, *TrainSpec.model_fields["seed"].metadata]


class Budget(BaseModel):
    """Exactly one of tokens / steps / flops: every variant trains for the same amount of it."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    tokens: int | None = Field(None, ge=1)
    steps: int | None = Field(None, ge=1)
    flops: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _exactly_one(self) -> "Budget":
        given = [k for k in ("tokens", "steps", "flops") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of tokens, steps, flops (got {', '.join(given) or 'none'})")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in ("tokens", "steps", "flops") if getattr(self, k) is not None)


class SweepFile(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    # Variant specs are named <name>-v<index>, and a spec name is at most 64 characters.
    name: str = Field(pattern=SLUG_RE, max_length=56)
    base: str | dict[str, Any]
    seeds: list[Seed] = Field(default_factory=lambda: [0], min_length=1, max_length=MAX_SEEDS)
    budget: Budget | None = None  # None: each variant's own train.steps
    grid: dict[str, list[Any]] = Field(default_factory=dict)
    zip: dict[str, list[Any]] = Field(default_factory=dict)
    baseline: int = Field(0, ge=0)
    eval_points: int | None = Field(None, ge=1, le=10_000, description="evaluations per variant's curve, whatever its "
                                    "steps: train.eval_interval = ceil(steps / eval_points) unless the grid sets it; "
                                    "default: the budget rule's (ten, fewer but at least four for a run too short to "
                                    "afford them; docs/budgets.md)")
    # Where the jobs train (archspec.launch.settings): `archspec ablate --launcher ...` options win over it. Not part
    # of the sweep's identity (sweep_hash covers the variants and seeds only).
    launcher: LauncherSettings | None = None
    match: Literal["params", "flops", "kv_bytes"] | None = Field(
        None, description="hold this count equal to the baseline variant's: params (total), flops (train FLOPs per "
                          "token at train.seq_len) or kv_bytes (KV-cache bytes per token), by solving `solve` per variant")
    solve: str | None = Field(None, pattern=r"^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*$", max_length=200,
                              description="the dotted integer width solved per variant for `match`, e.g. "
                                          "model.ffn.hidden_dim")
    tolerance: float = Field(TOLERANCE, gt=0, le=1, description="relative mismatch `match` allows (0.02: 2%)")
    multiple_of: int = Field(MULTIPLE_OF, ge=1, le=1 << 16, description="the solved width is a multiple of this")
    lr_sweep: list[Annotated[float, Field(gt=0.0, le=10.0)]] | None = Field(
        None, min_length=2, max_length=MAX_RATES,
        description="peak learning rates (train.lr) each variant trains at with the first seed (its pilot run); the "
                    "other seeds train at each variant's best rate only (lowest pilot val loss)")
    stability: bool = Field(False, description="record per-layer stability metrics in every run (train.stability: "
                                               "observation, not identity: run ids are unchanged)")
    # Schemes are checked in _shape_problems (one message per bad value, naming the valid ones), so the item type is a
    # string here and the schema's enum says what is valid.
    quantize: list[Annotated[str, Field(json_schema_extra={"enum": list(SCHEMES)})]] | None = Field(
        None, min_length=1, max_length=len(SCHEMES),
        description="after each run finishes, quantize it at each scheme (`archspec quantize`: its evaluation, once "
                    "per run); the report shows each scheme's val-loss delta over seeds")
    quantize_group_size: int | None = Field(
        None, ge=2, le=1 << 16, description="int4's weights per scale (`archspec quantize --group-size`); default: the "
                                            "largest of 128, 64, 32 that divides every quantized layer's input width")


def _shape_problems(data: dict) -> list[str]:
    """The rules across sweep fields and the size limits, on the raw mapping, so that they are reported with the field
    errors in one round (a pydantic after-validator runs only once every field is valid). Nothing is expanded here:
    the variant count comes from the list lengths."""
    out: list[str] = []
    sections = {name: data.get(name) for name in ("grid", "zip") if isinstance(data.get(name), dict)}
    for section, table in sections.items():
        for key, values in table.items():
            if isinstance(values, list) and not values:
                out.append(f"{section}.{key}: needs at least one value")
    lengths = {len(v) for v in (sections.get("zip") or {}).values() if isinstance(v, list)}
    if len(lengths) > 1:
        out.append(f"zip: every key needs the same number of values, got {sorted(lengths)}")
    both = set(sections.get("grid") or {}) & set(sections.get("zip") or {})
    if both:
        out.append(f"{', '.join(sorted(map(str, both)))}: in both grid and zip")
    match, solve = data.get("match"), data.get("solve")
    if (match is None) != (solve is None):
        out.append("match and solve: give both (match: params | flops | kv_bytes, solve: the dotted width key to "
                   "solve, e.g. model.ffn.hidden_dim) or neither")
    if isinstance(solve, str) and solve in set(sections.get("grid") or {}) | set(sections.get("zip") or {}):
        out.append(f"solve: {printable(solve, 200)} is also a grid/zip key; the solver sets it per variant")
    rates = data.get("lr_sweep")
    if isinstance(rates, list) and all(isinstance(x, (int, float)) for x in rates) and len(set(rates)) != len(rates):
        out.append(f"lr_sweep: repeated rate in {printable(str(rates), 200)}")
    if rates is not None and "train.lr" in set(sections.get("grid") or {}) | set(sections.get("zip") or {}):
        out.append("lr_sweep and a grid/zip key train.lr: give the rates in one of them (lr_sweep picks each "
                   "variant's best)")
    out += _quantize_problems(data.get("quantize"), data.get("quantize_group_size"))
    seeds = data.get("seeds")
    if isinstance(seeds, list) and all(isinstance(x, int) for x in seeds) and len(set(seeds)) != len(seeds):
        out.append(f"seeds: repeated seed in {printable(str(seeds), 200)}")
    counts = [len(v) for v in (sections.get("grid") or {}).values() if isinstance(v, list)]
    counts += [max(lengths)] if lengths else []
    if math.prod(min(c, MAX_VARIANTS + 1) for c in counts) > MAX_VARIANTS:  # capped factors: no huge product
        shape = " × ".join(str(c) for c in counts[:12]) + (" × ..." if len(counts) > 12 else "")
        out.append(f"grid: {variant_count_text(counts)} variants ({shape}), more than the limit of "
                   f"{MAX_VARIANTS:,}; split the sweep into several files")
    else:
        variants = math.prod(counts)
        n_seeds = len(seeds) if isinstance(seeds, list) else 1
        if variants * n_seeds > MAX_JOBS:
            out.append(f"{variants:,} variants × {n_seeds} seeds = {variants * n_seeds:,} runs, "
                       f"more than the limit of {MAX_JOBS:,}")
    return out


def _quantize_problems(schemes: Any, group_size: Any) -> list[str]:
    out: list[str] = []
    expected = " or ".join(SCHEMES)
    if isinstance(schemes, list):
        for i, scheme in enumerate(schemes):
            if isinstance(scheme, str) and scheme not in SCHEMES:
                out.append(f"quantize[{i}]: unknown scheme {printable(repr(scheme), 60)}; expected {expected}")
        known = [s for s in schemes if isinstance(s, str)]
        if len(set(known)) != len(known):
            out.append(f"quantize: repeated scheme in {printable(str(schemes), 200)}")
    if group_size is not None:
        if not (isinstance(schemes, list) and "int4" in schemes):
            out.append("quantize_group_size: applies to int4 (int8 keeps one scale per output row); add int4 to "
                       "quantize or drop it")
        if isinstance(group_size, int) and not isinstance(group_size, bool) and group_size % 2:
            out.append(f"quantize_group_size: must be even (two 4-bit values per byte), got {group_size}")
    return out


def _raw_rows(data: dict) -> list[dict[str, Any]] | None:
    """Variant overrides from the raw grid/zip when they are well-formed (and within the limits) enough to expand,
    else None: so that variant problems are found in the same round as the sweep file's own."""
    grid, zip_ = data.get("grid") or {}, data.get("zip") or {}
    if not isinstance(grid, dict) or not isinstance(zip_, dict) or _shape_problems({"grid": grid, "zip": zip_}):
        return None
    if not all(isinstance(v, list) and v for v in [*grid.values(), *zip_.values()]):
        return None
    if not all(isinstance(k, str) for k in [*grid, *zip_]):
        return None
    return variant_overrides(SweepFile.model_construct(grid=grid, zip=zip_))


@dataclass
class Variant:
    index: int
    overrides: dict[str, Any]  # dotted key → value, what differs from the base
    spec: Spec  # seed not yet applied; train.steps set from the budget
    accounting: Accounting
    solution: Solution | None = None  # the width solved to match the baseline (sweep `match`/`solve`)

    @property
    def label(self) -> str:
        if not self.overrides:
            return "base"
        return printable(", ".join(f"{k}={spec_text(v)}" for k, v in self.overrides.items()))


@dataclass
class Job:
    """One run: a variant at one seed (and, in an lr_sweep, at one rate: its spec's train.lr)."""

    variant: Variant
    seed: int
    spec: Spec
    lr: float | None = None  # the swept rate; None when the sweep has no lr_sweep

    @property
    def key(self) -> str:
        return f"{self.variant.index}:{self.seed}" + (f"@{self.lr!r}" if self.lr is not None else "")


@dataclass
class Sweep:
    name: str
    path: Path | None
    file: SweepFile
    base: dict[str, Any]
    variants: list[Variant]
    sweep_hash: str
    jobs: list[Job] = field(default_factory=list)
    # The options it was loaded with that make it another budget of its file (archspec.ablate.budgets): --steps
    # (None when absent or the file's own) and the --set overrides.
    steps_option: int | None = None
    overrides: tuple[str, ...] = ()

    @property
    def baseline(self) -> Variant:
        return self.variants[self.file.baseline]

    def shard(self, index: int, count: int, jobs: list[Job] | None = None) -> list[Job]:
        """Deterministic round-robin split of the jobs (or of `jobs`): shards 0..count-1 partition them exactly."""
        return [job for i, job in enumerate(self.jobs if jobs is None else jobs) if i % count == index]

    # ── lr_sweep: a pilot seed at every rate, then the other seeds at each variant's best rate ──

    @property
    def rates(self) -> list[float]:
        return list(self.file.lr_sweep or [])

    @property
    def pilot_seed(self) -> int:
        return self.file.seeds[0]

    def job(self, variant: Variant, seed: int, lr: float | None = None) -> Job:
        spec = variant.spec.model_copy(deep=True)
        spec.train.seed = seed
        if lr is not None:
            spec.train.lr = lr
        return Job(variant, seed, spec, lr)

    def all_jobs(self) -> list[Job]:
        """Every run the sweep may train: with lr_sweep, each variant at each rate and seed (which rate gets the
        seeds is known only once the pilots have run); else `jobs`."""
        if not self.rates:
            return list(self.jobs)
        return [self.job(v, seed, lr) for v in self.variants for lr in self.rates for seed in self.file.seeds]

    def seed_jobs(self, best: dict[int, float]) -> list[Job]:
        """With lr_sweep: the seeds after the pilot, for each variant whose best rate `best` holds, at that rate."""
        return [self.job(v, seed, best[v.index]) for v in self.variants if v.index in best
                for seed in self.file.seeds if seed != self.pilot_seed]


def spec_text(value: Any) -> str:
    """A value as a spec file writes it (YAML flow style): `null`, `true`, `1.0e-05`, `{kind: mlp, bias: false}`,
    `[0, 1]`; never Python's `None`/`True`."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {spec_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(spec_text(v) for v in value) + "]"
    if value is None or isinstance(value, (bool, int)):
        return json.dumps(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else {math.inf: ".inf", -math.inf: "-.inf"}.get(value, ".nan")
    return str(value)


def parse_shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise UserError(f"--shard {text!r}: expected I/N, e.g. 0/4") from None
    if n < 1 or not 0 <= i < n:
        raise UserError(f"--shard {text!r}: need 0 <= I < N")
    return i, n


def variant_overrides(file: SweepFile) -> list[dict[str, Any]]:
    grid_keys = list(file.grid)
    grid_rows = [dict(zip(grid_keys, combo)) for combo in itertools.product(*(file.grid[k] for k in grid_keys))]
    zip_keys = list(file.zip)
    n_zip = len(next(iter(file.zip.values()))) if file.zip else 0
    zip_rows = [{k: file.zip[k][i] for k in zip_keys} for i in range(n_zip)] or [{}]
    return [{**g, **z} for g in grid_rows for z in zip_rows]


def steps_for_budget(spec: Spec, budget: Budget | None) -> int:
    """Steps a budget buys one run of `spec`, at its tokens per step as one process trains them (a sweep variant's
    identity does not depend on how many processes later run it; archspec.recipe)."""
    t = spec.train
    if budget is None:
        return t.steps
    if budget.kind == "steps":
        return budget.steps
    tokens_per_step = RecipeView.of(t).tokens_per_step
    if budget.kind == "tokens":
        return max(1, math.ceil(budget.tokens / tokens_per_step))
    flops_per_step = account(spec, seq_len=t.seq_len).flops_train * tokens_per_step
    return max(1, math.ceil(budget.flops / flops_per_step))


def load_sweep(path: str | Path | None = None, data: dict | None = None, *, overrides: Sequence[str] = (),
               seeds: Sequence[int] | None = None, steps: int | None = None) -> Sweep:
    """Read and validate a sweep, and every variant in it. Every problem is reported at once, each once: the sweep
    file's fields, the rules across them, the base spec, and each variant (a problem every variant shares, such as
    one in the base, is one line, not one per variant). Raises UserError listing them.

    From the command line (`archspec ablate --set/--seeds/--steps`): `overrides` (K=V) apply to the base spec before
    the grid (a grid key still wins), `seeds` replace the file's seeds, `steps` replaces its budget by that many
    steps per variant."""
    origin = str(path) if path else "sweep"
    if data is None:
        data = read_yaml(path, what="sweep")
    else:
        check_structure(data, origin)  # a mapping built in Python gets the limits a file gets
    if not isinstance(data, dict):
        raise UserError(f"{origin}: expected a mapping with name/base/seeds/budget/grid, got {type(data).__name__}")
    data = dict(data)
    own = data.get("budget")
    steps_option = None if steps is None or (isinstance(own, dict) and own == {"steps": steps}) else steps
    if seeds is not None:
        data["seeds"] = list(seeds)
    if steps is not None:
        data["budget"] = {"steps": steps}
    problems: list[str] = []
    file: SweepFile | None = None
    try:
        file = SweepFile.model_validate(data)
    except ValidationError as e:
        problems += format_validation_error(e, data=data, root=SweepFile)
    problems += _shape_problems(data)

    raw_base = data.get("base")
    base: dict[str, Any] | None = None
    if isinstance(raw_base, str):
        base_path = (Path(path).parent if path else Path.cwd()) / raw_base
        try:
            loaded = read_yaml(base_path, what="base spec")
        except UserError as e:
            problems.append(f"base: {e.render()}")
        else:
            if isinstance(loaded, dict):
                base = loaded
            else:
                problems.append(f"base: {printable(str(base_path), 200)}: expected a spec mapping")
    elif isinstance(raw_base, dict):
        base = raw_base
    if base is not None and overrides:
        try:
            base = apply_overrides(copy.deepcopy(base), overrides)
        except UserError as e:
            problems.append(e.render())

    rows = variant_overrides(file) if file is not None and not problems else _raw_rows(data)
    baseline = data.get("baseline", 0)
    if rows is not None and isinstance(baseline, int) and not isinstance(baseline, bool) and baseline >= len(rows):
        problems.append(f"baseline: index {baseline} but the sweep has {len(rows)} variants")

    variants: list[Variant] = []
    by_message: dict[str, list[str]] = {}  # problem → the variants that have it, so a shared one is said once
    name = data.get("name") if isinstance(data.get("name"), str) else "sweep"
    budget = file.budget if file is not None else None
    target = _match_target(file, base, rows, name) if file is not None and file.match and file.solve else None
    for i, row in enumerate(rows if base is not None and rows is not None else []):
        data_i = _variant_data(base, name, i)
        lines: list[str] = []
        solution = None
        try:
            for key, value in row.items():
                set_dotted(data_i, key, copy.deepcopy(value), f"grid/zip key {key}")
            if target is not None and i != file.baseline:  # the baseline keeps its own width: it is the target
                solution = solve_width(data_i, file.solve, file.match, target, tolerance=file.tolerance,
                                       multiple_of=file.multiple_of, what="match")
                data_i = solution.data
            spec = parse_spec(data_i)
            if target is not None and i == file.baseline:
                solution = Solution(file.solve, file.match, dotted_value(spec, file.solve), target, target, spec,
                                    data_i)
            steps_i = steps_for_budget(spec, budget)
            train_i = data_i.setdefault("train", {})
            if steps_i != spec.train.steps:
                train_i["steps"] = steps_i
                warm = train_i.get("warmup_steps", spec.train.warmup_steps)
                train_i["warmup_steps"] = min(warm, steps_i)  # short budgets keep a valid schedule
            if file is not None and file.stability:
                train_i["stability"] = True
            spec = parse_spec(data_i)
            if file is not None and file.lr_sweep and getattr(spec.train.optimizer, "lr", None) is not None:
                lines = [f"train.optimizer.lr: lr_sweep sweeps train.lr, which a muon optimizer with a rate of its own "
                         f"({spec.train.optimizer.lr:g}) does not follow for its matrices; leave train.optimizer.lr "
                         "out (Muon then takes train.lr) or drop lr_sweep"]
        except UserError as e:
            lines = [e.render()]
        except ValidationError as e:
            lines = format_validation_error(e, data=data_i)
        if lines:
            for line in lines:
                by_message.setdefault(line, []).append(f"{i} ({_label(row)})")
            continue
        variants.append(Variant(i, row, spec, account(spec, seq_len=spec.train.seq_len), solution))
    n_rows = len(rows or [])
    if file is not None:
        variants = _observed_alike(variants, rows, file)
    eval_tokens = {v.spec.train.eval_tokens for v in variants}
    if len(eval_tokens) > 1:
        problems.append(f"train.eval_tokens: every variant is evaluated on the same validation set, but the variants "
                        f"ask for {', '.join(f'{n:,}' for n in sorted(eval_tokens))} tokens")
    for line, which in by_message.items():
        if len(which) == n_rows and n_rows > 1:
            problems.append(f"every variant: {line}")
        else:
            problems.append(f"variant{'s' if len(which) > 1 else ''} {', '.join(which)}: {line}")
    if len(problems) == 1:
        raise UserError(f"{origin}: {problems[0]} (nothing was trained)")
    if problems or file is None:
        raise UserError(f"{origin}: {len(problems)} problems in the sweep; nothing was trained", problems)

    sweep_hash = budget_hash(variants, file.lr_sweep)
    sweep = Sweep(file.name, Path(path) if path else None, file, base, variants, sweep_hash,
                  steps_option=steps_option, overrides=tuple(overrides))
    for v in variants:
        if file.lr_sweep:  # the pilots; the other seeds follow at each variant's best rate (Sweep.seed_jobs)
            sweep.jobs += [sweep.job(v, sweep.pilot_seed, lr) for lr in file.lr_sweep]
        else:
            sweep.jobs += [sweep.job(v, seed) for seed in file.seeds]
    return sweep


def _observed_alike(variants: list[Variant], rows: list[dict[str, Any]] | None, file: SweepFile) -> list[Variant]:
    """Every variant evaluated on the same validation set, as often: a variant whose recipe leaves train.eval_tokens
    to the budget rule gets the baseline's size by that rule (archspec.spec.train.resolved_eval), and each curve gets
    `eval_points` points (default: the rule's count at the baseline's budget) unless the grid sets
    train.eval_interval. How things are observed: no run key moves (archspec.train.logger.NOT_IDENTITY)."""
    if not variants:
        return variants
    base = next((v for v in variants if v.index == file.baseline), variants[0]).spec.train
    train_tokens = base.steps * base.tokens_per_step
    size = base.eval_tokens or auto_eval_tokens(train_tokens)
    points = file.eval_points or (auto_eval_points(train_tokens, size) if base.eval_tokens is None else EVAL_POINTS)
    out = []
    for v in variants:
        t = v.spec.train
        update: dict[str, Any] = {}
        if t.eval_tokens is None:
            update["eval_tokens"] = size
        if rows is None or "train.eval_interval" not in rows[v.index]:  # curves get their points whatever the budget
            update["eval_interval"] = max(1, math.ceil(t.steps / points))
        spec = v.spec.model_copy(update={"train": t.model_copy(update=update)}) if update else v.spec
        out.append(replace(v, spec=spec))
    return out


def budget_hash(variants: list[Variant], lr_sweep: list[float] | None = None) -> str:
    """What a sweep's memberships record as its hash: its variants' models and learning recipes (the parts of a run
    key a seed does not make), and its rates. One sweep file at another --steps or --set has another; other seeds or
    another evaluation size have the same (archspec.ablate.budgets groups runs by it)."""
    from archspec.kinds.base import identity_dump
    from archspec.spec import model_hash
    from archspec.train.logger import recipe_hash

    return hashlib.sha256(json.dumps(
        [[model_hash(v.spec), recipe_hash(identity_dump(v.spec.train))] for v in variants]
        + ([lr_sweep] if lr_sweep else []), sort_keys=True).encode()).hexdigest()


def _variant_data(base: dict[str, Any], name: str, index: int) -> dict[str, Any]:
    data = copy.deepcopy(base)
    data["name"] = f"{name}-v{index}"
    return data


def _match_target(file: SweepFile, base: dict[str, Any] | None, rows: list[dict[str, Any]] | None,
                  name: str) -> int | None:
    """The baseline variant's count that every variant is matched to (None when the baseline itself is invalid: its
    problem is reported with the variants')."""
    if base is None or not rows or file.baseline >= len(rows):
        return None
    data = _variant_data(base, name, file.baseline)
    try:
        for key, value in rows[file.baseline].items():
            set_dotted(data, key, copy.deepcopy(value), f"grid/zip key {key}")
        return count(parse_spec(data), file.match)
    except (UserError, ValidationError, ValueError):
        return None


def _label(overrides: dict[str, Any]) -> str:
    return printable(", ".join(f"{k}={spec_text(v)}" for k, v in overrides.items()) or "base", 200)


def spec_diff(base: Spec, other: Spec) -> dict[str, tuple[Any, Any]]:
    """Dotted keys whose values differ between two specs (name and train.seed excluded)."""
    a, b = _flatten(canonical_dict(base)), _flatten(canonical_dict(other))
    skip = {"name", "train.seed"}
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if k not in skip and a.get(k) != b.get(k)}


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def sweep_json_schema() -> dict[str, Any]:
    """The JSON Schema of a sweep file (`archspec schema --sweep`): pydantic's, plus the rules across fields that a
    schema can say (exactly one budget, non-empty value lists, distinct seeds, dotted keys)."""
    schema = SweepFile.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "archspec sweep file"
    props = schema["properties"]
    budget = schema["$defs"]["Budget"]
    budget["oneOf"] = [{"required": [k], "properties": {k: {"type": "number"}}} for k in ("tokens", "steps", "flops")]
    budget["minProperties"] = budget["maxProperties"] = 1
    props["seeds"]["uniqueItems"] = True
    props["lr_sweep"]["anyOf"][0]["uniqueItems"] = True
    props["quantize"]["anyOf"][0]["uniqueItems"] = True
    # match and solve come together (one without the other is refused)
    schema["dependentRequired"] = {"match": ["solve"], "solve": ["match"]}
    for section in ("grid", "zip"):
        props[section]["additionalProperties"]["minItems"] = 1
        props[section]["propertyNames"] = {"pattern": r"^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*$"}
    props["base"]["description"] = "a spec file path relative to the sweep file, or a spec mapping"
    return schema


__all__ = ["sweep_json_schema", "Budget", "SweepFile", "Variant", "Job", "Sweep", "load_sweep", "parse_shard", "spec_diff",
           "steps_for_budget", "variant_overrides"]
