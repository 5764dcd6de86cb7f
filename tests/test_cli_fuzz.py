"""Hostile input by class (issue 22, item 7): every command and option of the CLI, driven with generated hostile
values, exits 0 or 2 with escaped one-line messages, never a traceback.

Each command has a cheap base invocation (a dry run, a tiny spec, a registry holding one finished run); Hypothesis
replaces one of its values, or adds one option, with a value drawn from the classes that broke archspec before:
text with control bytes, NUL and lone surrogates (bytes that are not UTF-8), numbers at and past their limits
(NaN, infinities, subnormals, 4300-digit integers), paths to special files (a FIFO, /dev/zero, a directory, a name
too long for the file system), dates that leave years 1-9999 in UTC; and hostile environment variables. Commands are
found by walking the click tree, so a new command or option joins without editing this file (a command without a
base invocation fails `test_every_command_has_a_base_invocation`). In-process (click's CliRunner isolation), within a
budget of about 40 s of the suite.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
from contextlib import contextmanager
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from archspec.cli import cli, main
from archspec.cli.options import FiniteFloat

CORPUS = ("The quick brown fox jumps over the lazy dog. " * 40 + "\n") * 4


def _commands(group: click.Group = cli, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], click.Command]:
    out = {}
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            out.update(_commands(command, (*path, name)))
        else:
            out[(*path, name)] = command
    return out


COMMANDS = _commands()


# ── the world the commands run in: a spec, a corpus, a registry with one finished run, a sweep, an HF config ───────

@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    corpus = root / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text(CORPUS)
    spec = root / "tiny.yaml"
    spec.write_text(
        "name: tiny\nmodel: {vocab_size: 320, context_length: 32, d_model: 16, n_layers: 1, attention: {n_heads: 2}}\n"
        f"train: {{steps: 2, batch_size: 2, seq_len: 16, warmup_steps: 1, eval_tokens: 32, compile: none, "
        f"data: {{corpus: {{kind: files, paths: ['{corpus}']}}, val_fraction: 0.2}}}}\n")
    specs = root / "specs"
    specs.mkdir()
    (specs / "tiny.yaml").write_text(spec.read_text())
    sweep = root / "sweep.yaml"
    sweep.write_text(f"name: fz\nbase: {spec}\nseeds: [0]\nbudget: {{steps: 2}}\ngrid:\n  model.d_model: [16, 32]\n")
    fifo = root / "fifo"
    os.mkfifo(fifo)
    url = f"sqlite:///{root}/registry.db"
    code, out, err = run_cli(["ablate", str(sweep), "--registry", url, "--no-compile", "--out", str(root / "ablate")])
    assert code == 0, err
    code, out, err = run_cli(["runs", "list", "--registry", url, "--format", "json"])
    assert code == 0, err
    run = json.loads(out)[0]["id"]
    code, out, err = run_cli(["runs", "show", run, "--registry", url, "--format", "json"])
    checkpoint = Path(next(a["path"] for a in json.loads(out)["artifacts"] if a["kind"] == "checkpoint"))
    code, _, err = run_cli(["check", "--fix", "--specs", str(specs), "--generated", str(root / "out" / "checked")])
    assert code == 0, err
    hf = root / "config.json"
    hf.write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 320, "hidden_size": 16,
        "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
        "max_position_embeddings": 32, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "hidden_act": "silu",
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return {"port": port, "root": root, "spec": spec, "specs": specs, "sweep": sweep, "fifo": fifo, "url": url, "run": run,
            "hf": hf, "checkpoint": checkpoint}


def base_invocations(w) -> dict[tuple[str, ...], list[str]]:
    """A cheap invocation of every command (a dry run where the command would train)."""
    r, url, run = w["root"], w["url"], w["run"]
    out = r / "out"
    return {
        ("build",): ["build", str(w["spec"]), "--out", str(out / "gen"), "--registry", url],
        ("check",): ["check", "--specs", str(w["specs"]), "--generated", str(out / "checked")],
        ("schema",): ["schema"],
        ("train",): ["train", str(w["spec"]), "--dry-run", "--registry", url],
        ("peak",): ["peak", "--cache", str(r / "cache")],
        ("runs", "list"): ["runs", "list", "--registry", url],
        ("runs", "show"): ["runs", "show", run, "--registry", url],
        ("runs", "compare"): ["runs", "compare", run, run, "--registry", url],
        ("runs", "reap"): ["runs", "reap", "--registry", url],
        ("runs", "export"): ["runs", "export", "--registry", url, "-o", str(out / "runs.csv")],
        ("runs", "tag"): ["runs", "tag", run, "fuzz=1", "--registry", url],
        ("runs", "note"): ["runs", "note", run, "a note", "--registry", url],
        ("runs", "rename"): ["runs", "rename", run, "renamed", "--registry", url],
        ("runs", "delete"): ["runs", "delete", run, "--force", "--dry-run", "--registry", url],  # a flag added keeps it dry
        ("gc",): ["gc", "--registry", url],  # a dry run unless --apply; --keep last frees nothing here
        ("specs", "list"): ["specs", "list", "--registry", url],
        ("registry", "upgrade"): ["registry", "upgrade", "--registry", url],
        ("registry", "status"): ["registry", "status", "--registry", url],
        ("ablate",): ["ablate", str(w["sweep"]), "--dry-run", "--registry", url],
        ("report",): ["report", "fz", "--registry", url, "--out", str(out / "report")],
        ("import-hf",): ["import-hf", str(w["hf"]), "-o", str(out / "imported.yaml")],
        ("export-hf",): ["export-hf", run, "-o", str(out / "hf"), "--registry", url],
        ("sample",): ["sample", str(w["spec"]), "--max-new-tokens", "2", "--prompt", "ab", "--device", "cpu"],
        ("probe",): ["probe", run, "--task", "mqar", "--pairs", "2", "--examples", "2", "--no-record", "--registry", url,
                     "--device", "cpu"],
        ("scaling",): ["scaling", "fz", "--registry", url],
        ("quantize",): ["quantize", run, "--scheme", "int8", "--no-record", "--registry", url],
        ("mup-check",): ["mup-check", str(w["spec"]), "--widths", "8,16", "--steps", "2", "--seq-len", "8",
                         "--batch-size", "2"],
        ("ui",): ["ui", "--registry", url, "--check", "--port", str(w["port"])],  # --check: never serves
    }


# ── hostile values by class ─────────────────────────────────────────────────────────────────────────────────────

HOSTILE_TEXT = ["", " ", "\x00", "a\x00b", "a\udcff", "\udcff\udcfe", "\ud800", "\x1b[2J\x1b[31mred", "a\rOK",
                "x\ny", "\x07\x08\x9b", "\u202e\u2066", "é中😀", "-", "--", "--help", "-x", "'", '"', "\\", "%s%n",
                "{{ 7*7 }}", "$(touch /tmp/pwned)", "a" * 5000]
HOSTILE_NUMBERS = ["nan", "NaN", "inf", "-inf", "1e-45", "5e-324", "1e-320", "1e308", "1e309", "-1", "0", "-0",
                   "9223372036854775808", "1" + "0" * 30, "1" * 4400, "0x10", "1_000", " 3 ", "٣", "3.5", "1e3"]
HOSTILE_FILTERS = ["started > '0001-01-01T00:00+01:00'", "started < '9999-12-31T23:59-05:00'",
                   "started > '10000-01-01'", "summary.val_loss > 1e309", "summary.val_loss > nan",
                   "params.model.d_model = 99999999999999999999999999", "(((((((((((x", "a" * 3000 + " = 1",
                   "status = 'FINISHED' OR", "tag.\x00 = 1", "metrics.last.\udcff < 1"]
ENVIRONMENT = ["WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT", "COLUMNS", "ARCHSPEC_REGISTRY"]
HOSTILE_ENV = ["abc", "0", "-1", "1" * 40, "99999999999999999999", "1.5", " ", "٣", "2", "sqlite:///", "postgres://x",
               "sqlite:////dev/null/x.db", "mysql://", "://", "\udcff"]


def _paths(w) -> list[str]:
    r = w["root"]
    return ["/dev/zero", "/dev/null", str(w["fifo"]), str(r), str(r / "missing" / "x.yaml"), str(r / ("n" * 300)),
            str(r / "a\nb"), str(w["checkpoint"]), str(w["hf"]), "/proc/self/mem", "/", "~", "."]


def values(w) -> st.SearchStrategy[tuple[str, str]]:
    """(class, value)."""
    text = st.text(st.characters(codec=None, categories=["L", "N", "P", "S", "Z", "Cc", "Cs", "Cf"]), max_size=24)
    return st.one_of(*(st.tuples(st.just(name), strategy) for name, strategy in [
        ("text", st.sampled_from(HOSTILE_TEXT)), ("number", st.sampled_from(HOSTILE_NUMBERS)),
        ("path", st.sampled_from(_paths(w))), ("filter", st.sampled_from(HOSTILE_FILTERS)), ("random text", text)]))


def _value_params(command: click.Command) -> list[click.Parameter]:
    return [p for p in command.params if not getattr(p, "is_flag", False) and p.name != "help"]


def _flags(command: click.Command) -> list[click.Option]:
    # --measure runs a long matmul benchmark, --fix rewrites files: both belong to their own tests
    return [p for p in command.params if getattr(p, "is_flag", False) and p.name not in ("help", "measure", "fix")]


def mutate(argv: list[str], path: tuple[str, ...], command: click.Command, data, w) -> tuple[str, list[str]]:
    """(the value's class, argv with one option's value replaced or the option added, one positional replaced, or
    one flag added)."""
    params = _value_params(command)
    choices = ["value"] * bool(params) + ["flag"] * bool(_flags(command))
    how = data.draw(st.sampled_from(choices or ["none"]), label="how")
    if how == "flag":
        flag = data.draw(st.sampled_from(_flags(command)), label="flag")
        return "flag", [*argv, max(flag.opts, key=len)]
    if how == "none":
        return "none", argv
    param = data.draw(st.sampled_from(params), label="param")
    kind, value = data.draw(values(w), label="value")
    if isinstance(param, click.Argument):  # every base invocation puts its positionals right after the command
        i = len(path)
        fits = i < len(argv) and not argv[i].startswith("-")
        return kind, [*argv[:i], value, *argv[i + 1:]] if fits else argv
    flag = max(param.opts, key=len)
    if flag in argv:
        i = argv.index(flag)
        return kind, [*argv[:i + 1], value, *argv[i + 2:]]
    return kind, [*argv, flag, value]


_LINE_OK = re.compile(r"[^\x00-\x08\x0b-\x1f\x7f-\x9f]*")  # no raw control characters except \t and \n


@contextmanager
def _alarm(seconds: int):
    """A command that blocks (a FIFO read, an endless loop) fails the test instead of hanging the suite."""
    def fire(signum, frame):
        raise AssertionError(f"no answer within {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def run_cli(argv: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """main(argv) in a scratch working directory (hostile relative paths land there, never in the checkout)."""
    runner = CliRunner()
    with runner.isolated_filesystem(), runner.isolation(env=env) as outstreams:
        with _alarm(600):  # a hang guard, not a speed limit: a cold matplotlib font cache alone can take a minute
            try:
                code = main(argv)
            except SystemExit as e:  # pragma: no cover - main() returns codes, it does not exit
                code = e.code
        sys.stdout.flush()
        sys.stderr.flush()
        out, err = outstreams[0].getvalue(), outstreams[1].getvalue()
    return code, out.decode("utf-8"), err.decode("utf-8")


def assert_clean(argv, code, out, err) -> None:
    shown = f"argv={argv!r}\nexit {code}\nstderr: {err[-2000:]}"
    if argv[0] == "check" and code == 1:  # a linter's answer: files out of sync, listed
        assert "archspec check:" in err, shown
        code = 0
    if argv[0] == "mup-check" and code == 1:  # the check's answer: a coordinate grows with the width, named
        assert "not flat" in out or '"flat": false' in out, shown
        code = 0
    assert code in (0, 2), shown
    assert "Traceback" not in err and "Traceback" not in out, shown
    for line in (out + err).splitlines():
        assert _LINE_OK.fullmatch(line), f"raw control character in output line {line!r}\n{shown}"
    if code == 2:
        assert err.strip(), shown
        first = err.strip().splitlines()[0]
        assert first.startswith(("error:", "Error:", "Usage:")) or "Error:" in err, shown


# ── the tests ──────────────────────────────────────────────────────────────────────────────────────────────────

def test_every_command_has_a_base_invocation_and_it_runs(world):
    bases = base_invocations(world)
    assert set(bases) == set(COMMANDS), f"commands without a base invocation: {set(COMMANDS) - set(bases)}"
    for path, argv in bases.items():
        code, out, err = run_cli(argv)
        assert_clean(argv, code, out, err)
        if path == ("mup-check",):  # the check's answer: 1 when a coordinate grows (a standard model's do)
            assert code in (0, 1) and "flat" in out, (argv, err)
        elif path != ("scaling",):  # one finished run of a two-variant sweep: nothing to fit, said with exit 2
            assert code == 0, (argv, err)


def test_every_number_option_is_bounded_and_floats_are_finite():
    """The class behind `--temperature 1e-45`, `--timeout nan`, `--limit 1e30`: a number option without an upper
    bound reaches SQL or torch as a value they cannot hold."""
    for path, command in COMMANDS.items():
        for p in command.params:
            where = f"{' '.join(path)} {p.name}"
            assert not isinstance(p.type, click.types.FloatParamType) or isinstance(p.type, FiniteFloat), where
            if isinstance(p.type, click.IntRange):
                assert p.type.min is not None and p.type.max is not None, where


# CI runs a fixed set of examples (the suite's derandomized profile: the same cases each run, about 20 s);
# ARCHSPEC_HYPOTHESIS=explore draws fresh ones, ARCHSPEC_FUZZ_EXAMPLES=N draws
# N fresh ones, for a longer search by hand (ARCHSPEC_FUZZ_REPORT=FILE tallies them).
_FRESH = int(os.environ.get("ARCHSPEC_FUZZ_EXAMPLES", "0"))


@settings(max_examples=_FRESH or 250, deadline=None, **({"derandomize": False} if _FRESH else {}), database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_hostile_values_in_any_option_of_any_command_exit_0_or_2(world, data):
    bases = base_invocations(world)
    path = data.draw(st.sampled_from(sorted(COMMANDS)), label="command")
    kind, argv = mutate(bases[path], path, COMMANDS[path], data, world)
    env = None
    if data.draw(st.integers(0, 5), label="env?") == 0:
        kind = "environment"
        name = data.draw(st.sampled_from(ENVIRONMENT), label="env")
        env = {name: data.draw(st.sampled_from(HOSTILE_ENV), label="env value")}
        if name in ("RANK", "LOCAL_RANK") or env[name] == "\udcff":
            env["WORLD_SIZE"] = "1"
    try:
        code, out, err = run_cli(argv, env)
    except UnicodeEncodeError:
        if env and any("\udcff" in v for v in env.values()):
            return  # os.environ cannot hold a lone surrogate from Python (a real process can: see the next test)
        raise
    try:
        assert_clean(argv, code, out, err)
    except AssertionError:
        _tally(" ".join(path), kind, False)
        raise
    _tally(" ".join(path), kind, True)


def _tally(command: str, kind: str, clean: bool) -> None:
    """With ARCHSPEC_FUZZ_REPORT=FILE, one JSON line per case (command, class, clean): the closing note's figures."""
    report = os.environ.get("ARCHSPEC_FUZZ_REPORT")
    if report:
        with open(report, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"command": command, "class": kind, "clean": clean}) + "\n")


@pytest.mark.parametrize("case", ["prompt", "spec", "where", "run-dir", "draft", "set"])
def test_arguments_that_are_not_utf8_are_refused_at_the_gate(world, case):
    """A real process hands Python undecodable bytes as lone surrogates (`--prompt $'a\\xff'` ended in a
    UnicodeEncodeError); every command refuses them once, naming the option."""
    bad = "a\udcff"
    argv = {"prompt": ["sample", str(world["spec"]), "--prompt", bad],
            "spec": ["build", bad],
            "where": ["runs", "list", "--where", bad, "--registry", world["url"]],
            "run-dir": ["train", str(world["spec"]), "--run-dir", bad, "--dry-run"],
            "draft": ["sample", str(world["spec"]), "--draft", bad],
            "set": ["train", str(world["spec"]), "--set", "name=" + bad, "--dry-run"]}[case]
    code, out, err = run_cli(argv)
    assert code == 2 and "is not UTF-8 text" in err and "\\udcff" in err and len(err.strip().splitlines()) == 1, err
