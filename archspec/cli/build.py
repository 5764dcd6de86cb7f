"""`archspec build`, `archspec check`, `archspec schema`: the spec → generated module half of the CLI."""

from __future__ import annotations

import difflib
import json
import shlex
import re
import sys
import time
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from archspec.accounting import Accounting, account, kv_cache_bytes
from archspec.ablate.match import MULTIPLE_OF, TOLERANCE
from archspec.cli.options import FiniteFloat, registry_option, set_option
from archspec.codegen import DEFAULT_OUT, generate, render, source_label
from archspec.console import echo, human, make_console, terminal_text
from archspec.errors import UserError
from archspec.memory import check_memory
from archspec.spec import SpecError, json_schema, load_spec, model_hash
from archspec.spec.rules import trainability_problems


def build_json(spec, gen, acc: Accounting) -> dict:
    """The `build --json` object (its keys are a contract: docs/guides/generated-model.md, tests/test_cli_build.py):
    integers throughout."""
    return {
        "name": spec.name,
        "model_hash": model_hash(spec),
        "generated": str(gen.path),
        # to_dict() includes kv_cache_bytes_per_sequence: one sequence of context_length, each layer holding what its
        # pattern needs (a window layer at most its window), bf16
        **acc.to_dict(),
    }


def accounting_table(spec, acc: Accounting) -> Table:
    flops = acc.flops_by_component
    flops_of = {
        "attention": flops.get("attention_proj", 0),
        "ffn": flops["ffn"],
        "lm_head": flops["lm_head"] if "lm_head" in acc.by_component else 0,
    }
    # another token mixer's FLOPs are under its own column, named as its parameters are (a short conv: conv)
    rows = [(name, n, flops_of.get(name, flops.get(name, 0))) for name, n in acc.by_component.items()]
    if "attention_scores" in flops:
        rows.insert([r[0] for r in rows].index("attention") + 1,
                    (f"attention scores·values ({acc.attention_keys:,.1f} keys/query)", 0, flops["attention_scores"]))
    if "lm_head" not in acc.by_component:
        rows.append(("lm_head (tied to embedding)", 0, flops["lm_head"]))

    table = Table(title=f"{spec.name}  ({model_hash(spec)[:12]})", title_justify="left")
    for col in ("component", "params", "share", "fwd FLOPs/token", "share"):
        table.add_column(col, justify="left" if col == "component" else "right")
    for name, n, f in rows:
        if name == "mtp":  # training only: its FLOPs are not part of the (inference) forward the shares are of
            table.add_row("mtp (training only)", f"{n:,}", f"{100 * n / acc.total:.1f}%", human(acc.mtp_flops_forward),
                          "")
            continue
        table.add_row(name, f"{n:,}", f"{100 * n / acc.total:.1f}%", human(f), f"{100 * f / acc.flops_forward:.1f}%")
    table.add_section()
    table.add_row("total", f"{acc.total:,}", "100%", human(acc.flops_forward), "100%", style="bold")
    table.add_row("active", f"{acc.active:,}", f"{100 * acc.active / acc.total:.1f}%", "", "")
    table.add_row("non-embedding", f"{acc.total - acc.embedding:,}", f"{100 * (acc.total - acc.embedding) / acc.total:.1f}%", "", "")
    if acc.mtp_params:  # what inference keeps, and what the multi-token prediction modules add to training
        table.add_row("main model (inference)", f"{acc.main_total:,}", f"{100 * acc.main_total / acc.total:.1f}%",
                      human(acc.flops_forward), "")
        table.add_row("main model active", f"{acc.main_active:,}", f"{100 * acc.main_active / acc.total:.1f}%", "", "")
        table.add_row(f"mtp modules ({spec.model.mtp.depth})", f"{acc.mtp_params:,}",
                      f"{100 * acc.mtp_params / acc.total:.1f}%", human(acc.mtp_flops_forward), "")
        table.add_row("mtp modules active", f"{acc.mtp_active:,}", f"{100 * acc.mtp_active / acc.total:.1f}%", "", "")
    m = spec.model
    keys = (f" ({m.attention.sparsity.describe(m)}: {acc.attention_keys:,.1f} keys per query on average, the exact sum "
            "over positions)") if "attention_scores" in acc.flops_by_component else ""  # no layer attends: no keys
    table.caption = (
        f"FLOPs per token at T={acc.seq_len}{keys}: forward {human(acc.flops_forward)}, "
        f"train {human(acc.flops_train)} (3×{' (forward + MTP modules)' if acc.mtp_params else ''}).  KV cache (bf16): {acc.kv_cache_bytes_per_token:,} B/token, "
        f"{kv_cache_bytes(m, m.context_length, 'bf16') / 2**20:.1f} MiB per sequence of {m.context_length}."
    )
    table.caption_justify = "left"
    return table


def block_table(spec, acc: Accounting) -> Table | None:
    """Per layer group (each distinct block configuration): its layers, components and what one layer costs."""
    if len(acc.by_block) < 2:
        return None
    table = Table(title="per layer group (one block class each; figures per layer)", title_justify="left")
    for col in ("block", "layers", "norm / mixer / ffn", "params", "active", "fwd FLOPs/token", "KV elems/token"):
        table.add_column(col, justify="right" if col not in ("block", "layers", "norm / mixer / ffn") else "left")
    for j, b in enumerate(acc.by_block):
        layers = b["layers"]
        shown = ", ".join(map(str, layers[:12])) + (", …" if len(layers) > 12 else "")
        table.add_row(f"Block{j}", f"{shown} ({len(layers)})", f"{b['norm']} / {b['mixer']} / {b['ffn']}",
                      f"{b['params']:,}", f"{b['active']:,}", human(b["flops_forward"]), f"{b['kv_elements_per_token']:,}")
    return table


def _record_spec(registry_url: str | None, spec, gen, acc: Accounting, console: Console) -> None:
    """Record the spec and its accounting so that `archspec specs list` can answer before any training."""
    try:
        from archspec.registry import Registry
    except ImportError:  # the registry package is optional for build
        return
    Registry(registry_url).record_spec(spec, gen.source_hash, acc.to_dict())


@click.command()
@click.argument("spec_path", metavar="SPEC", type=click.Path(dir_okay=False, path_type=Path))
@set_option
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory for the generated module [default: generated/ for a spec in ./specs/, else the "
                   "spec's own directory].")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (name, hash, params, FLOPs) on stdout.")
@click.option("--compile", "do_compile", is_flag=True, help="Also torch.compile each block (train.compile: per_block) and report compile time.")
@registry_option
@click.option("--no-record", is_flag=True, help="Do not record the spec in the registry.")
@click.option("--match", "match", metavar="MEASURE=N", default=None,
              help="Solve --solve so that the spec's count comes within --tolerance of N: params=N (total "
                   "parameters), flops=N (train FLOPs per token at train.seq_len) or kv_bytes=N (KV-cache bytes per "
                   "token, bf16). N is an integer.")
@click.option("--solve", "solve_key", metavar="KEY", default=None,
              help="The dotted integer width --match solves, e.g. model.ffn.hidden_dim (a multiple of "
                   "--multiple-of that the spec's rules accept).")
@click.option("--tolerance", type=FiniteFloat(0.0, 1.0, min_open=True), default=TOLERANCE, show_default=True,
              help="With --match: the relative mismatch allowed.")
@click.option("--multiple-of", type=click.IntRange(1, 1 << 16), default=MULTIPLE_OF, show_default=True,
              help="With --match: the solved width is a multiple of this.")
def build_cmd(spec_path: Path, overrides, out_dir: Path | None, as_json: bool, do_compile: bool, registry_url,
              no_record, match: str | None, solve_key: str | None, tolerance: float, multiple_of: int):
    """Validate SPEC, generate its module, run one forward on a tiny batch, print its accounting.

    generated/ belongs to the specs in ./specs/ (`archspec check` keeps them in sync): a spec kept anywhere else is
    generated next to itself unless --out says where."""
    import torch

    console = make_console(stderr=as_json)
    elsewhere = out_dir is None and not _inside(spec_path, Path("specs"))
    solution = None
    if (match is None) != (solve_key is None):
        raise UserError("--match and --solve: give both (e.g. --match params=400000 --solve model.ffn.hidden_dim)")
    if match is not None:
        solution = _solve(spec_path, overrides, match, solve_key, tolerance, multiple_of)
        spec = solution.spec
    else:
        spec = load_spec(spec_path, overrides)
    # With --set (or --match) the module is not what the file says: it never replaces the file's own module
    # (generated/ holds what specs/ say, `archspec check` keeps it so); it goes under the state root, named by its
    # model hash.
    overridden = out_dir is None and (bool(overrides) or solution is not None)
    if overridden:
        from archspec.paths import builds_dir

        out_dir = builds_dir() / f"{spec.name}-{model_hash(spec)[:12]}"
    elif out_dir is None:
        out_dir = spec_path.parent if elsewhere else DEFAULT_OUT
    problems = trainability_problems(spec)
    if problems:  # `train` would refuse it after tokenising: say so now, at the field
        raise SpecError(f"{spec_path}: the recipe cannot train this model", problems)
    acc = account(spec)
    # With --set the module is not what the file alone says: its banner says so (no "regenerate with" line).
    source = None if overrides or solution is not None else spec_path
    check_memory(spec)  # refuse before anything is allocated
    gen = generate(spec, out_dir=out_dir, source=source)
    model = gen.Model()
    actual = sum(p.numel() for p in model.parameters())
    if actual != acc.total:  # the accounting's promise; a mismatch is a bug worth shouting about
        raise RuntimeError(f"accounting says {acc.total:,} parameters, the generated module has {actual:,}")

    T = min(8, spec.model.context_length)
    idx = torch.randint(0, spec.model.vocab_size, (1, T), generator=torch.Generator().manual_seed(0))
    model.eval()
    with torch.no_grad():
        logits = model(idx)
    if tuple(logits.shape) != (1, T, spec.model.vocab_size) or not torch.isfinite(logits).all():
        raise RuntimeError(f"generated module returned {tuple(logits.shape)} logits (finite: {torch.isfinite(logits).all()})")

    compile_s = None
    if do_compile:
        t0 = time.perf_counter()
        for block in model.blocks:
            block.compile()
        with torch.no_grad():
            compiled_logits = model(idx)
        compile_s = time.perf_counter() - t0
        if not torch.allclose(compiled_logits, logits, atol=1e-4, rtol=1e-4):
            raise RuntimeError("compiled and eager logits differ")

    if not no_record:
        _record_spec(registry_url, spec, gen, acc, console)

    solved_file = _write_solved(spec, gen.path.parent) if solution is not None else None
    if solution is not None:
        from archspec.console import program

        console.print(f"matched: {solution.text()}", highlight=False, soft_wrap=True)
        console.print(f"solved spec: {solved_file} (train it: {program()} train {shlex.quote(str(solved_file))})",
                      highlight=False, soft_wrap=True)
    if overridden:
        console.print(f"note: --set{'/--match' if solution is not None else ''} changes {spec_path}'s model, so its module goes to {gen.path}, not beside the "
                      "file's own; --out DIR puts it elsewhere", highlight=False, soft_wrap=True)
    elif elsewhere:
        console.print(f"note: {spec_path} is not in ./specs/, so its module goes next to it ({gen.path}), not into "
                      f"{DEFAULT_OUT}/; --out DIR puts it elsewhere", highlight=False)
    if as_json:
        out = build_json(spec, gen, acc)
        if solution is not None:
            out["matched"] = {"key": solution.key, "value": solution.value, "measure": solution.measure,
                              "count": solution.count, "target": solution.target, "residual": solution.residual,
                              "spec_file": str(solved_file)}
        if compile_s is not None:
            console.print(f"compiled {spec.model.n_layers} blocks + first forward in {compile_s:.1f} s")
        echo(json.dumps(out))
        return
    console.print(accounting_table(spec, acc))
    if (per_group := block_table(spec, acc)) is not None:
        console.print(per_group)
    console.print(f"generated [bold]{gen.path}[/] (sha256 {gen.source_hash[:12]}); forward on (1, {T}) → logits {tuple(logits.shape)}")
    if compile_s is not None:
        console.print(f"torch.compile per block ({spec.model.n_layers} blocks, one graph) + first forward: {compile_s:.1f} s")


def _write_solved(spec, directory: Path) -> Path:
    """The spec `build --match` solved (the width in place), as a spec file beside its generated module: what the
    match was for is training it (`archspec train <this file>`), and the file says exactly what was built."""
    import yaml

    from archspec.spec import canonical_dict

    path = directory / f"{spec.name}-{model_hash(spec)[:12]}.yaml"
    text = (f"# solved by `archspec build --match` (model hash {model_hash(spec)}): train it with `archspec train "
            f"{path.name}`\n" + yaml.safe_dump(canonical_dict(spec), sort_keys=False, allow_unicode=True))
    path.write_text(text, encoding="utf-8")
    return path


def _solve(spec_path: Path, overrides, match: str, key: str, tolerance: float, multiple_of: int):
    """`build --match MEASURE=N --solve KEY`: the spec file (after --set) with KEY solved (archspec.ablate.match)."""
    from archspec.ablate.match import parse_match, solve_width
    from archspec.spec import apply_overrides, read_yaml

    measure, target = parse_match(match)
    data = read_yaml(spec_path)
    if not isinstance(data, dict):
        load_spec(spec_path)  # the loader's own message for a file that is not a spec mapping
    load_spec(spec_path, overrides)  # an invalid spec is reported as such, before any width is tried
    data = apply_overrides(data, overrides)
    return solve_width(data, key, measure, target, tolerance=tolerance, multiple_of=multiple_of,
                       what=f"{spec_path}: --match {match}")


_BANNER = re.compile(r"^# .*: generated by archspec from (.+) — do not edit\.$")


def _banner_source(path: Path) -> str | None:
    """The spec file a generated module's banner names, or None (not archspec's, or built from memory)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            head = [f.readline().rstrip("\n") for _ in range(3)]
    except OSError:
        return None
    for line in head:
        m = _BANNER.match(line)
        if m:
            return m.group(1)
    return None


def _inside(path: Path, directory: Path) -> bool:
    try:
        path.resolve().relative_to(directory.resolve())
    except ValueError:
        return False
    return True


def _spec_files(specs_dir: Path) -> list[Path]:
    return sorted(p for p in specs_dir.glob("*.y*ml") if p.suffix in (".yaml", ".yml"))


@click.command()
@click.option("--fix", is_flag=True, help="Rewrite out-of-sync generated files.")
@click.option("--specs", "specs_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("specs"),
              show_default=True, help="Directory of the spec files to check (every *.yaml / *.yml in it).")
@click.option("--generated", "gen_dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_OUT,
              show_default=True, help="Directory of the generated modules to compare them with.")
def check_cmd(fix: bool, specs_dir: Path, gen_dir: Path):
    """Regenerate every spec in specs/ in memory and diff against generated/; exit 1 when out of sync."""
    if not specs_dir.is_dir():
        raise UserError(f"{specs_dir}: no such directory (run from the repository root or pass --specs)")
    problems: list[str] = []
    expected: dict[str, str] = {}
    for path in _spec_files(specs_dir):
        try:
            spec = load_spec(path)
        except SpecError as e:
            problems.append(e.render())
            continue
        label = source_label(path)
        target = gen_dir / f"{spec.name}.py"
        if target.name in expected:
            problems.append(f"{path}: spec name {spec.name!r} is also used by {expected[target.name]}")
            continue
        expected[target.name] = label
        text = render(spec, label)
        current = target.read_text(encoding="utf-8") if target.exists() else ""
        if current == text:
            continue
        if fix:
            gen_dir.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
            echo(f"fixed {target}")
            continue
        diff = difflib.unified_diff(current.splitlines(True), text.splitlines(True), f"{target} (on disk)", f"{target} (from {label})")
        sys.stdout.writelines(terminal_text(line) for line in diff)  # file names and contents: no terminal codes
        problems.append(f"{target}: out of sync with {label}" if current else f"{target}: missing (from {label})")
    # Files no spec in specs/ generates are never touched, --fix or not (they may be a user's own, or a build of a
    # spec kept elsewhere). One whose banner names a spec file in specs/ that is gone is reported: delete it by hand.
    for orphan in sorted(gen_dir.glob("*.py")) if gen_dir.is_dir() else []:
        if orphan.name in expected:
            continue
        source = _banner_source(orphan)
        if source is not None and _inside(Path(source), specs_dir) and not Path(source).exists():
            problems.append(f"{orphan}: generated from {source}, which no longer exists; delete it by hand if it "
                            "is not wanted (check --fix deletes nothing)")
        else:
            echo(f"note: {orphan}: no spec in {specs_dir}/ generates it; left alone", err=True)
    if problems:
        echo("\n".join(problems), err=True)
        echo(f"archspec check: {len(problems)} problem(s); `archspec check --fix` regenerates", err=True)
        raise click.exceptions.Exit(1)
    echo(f"archspec check: {len(expected)} generated module(s) in sync with {specs_dir}/")


@click.command()
@click.option("--sweep", is_flag=True, help="The schema of a sweep file (archspec ablate) instead of a spec file.")
def schema_cmd(sweep: bool):
    """Print the JSON Schema of a spec file, or of a sweep file with --sweep (for editor completion and validation)."""
    if sweep:
        from archspec.ablate.sweep import sweep_json_schema

        echo(json.dumps(sweep_json_schema(), indent=2))
        return
    echo(json.dumps(json_schema(), indent=2))
