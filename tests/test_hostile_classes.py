"""The cases behind issue 22, item 7, each with its class beside it: values from the environment, numbers at their
limits, text that is not Unicode, options that contradict each other, settings that would be silently dropped, a dry
run that skips the checks of a real one, and Ctrl-C while the CLI is still importing. tests/test_cli_fuzz.py drives
the same classes through every command; these keep the cases that found the bugs, with the exact messages."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from archspec.cli import main

SPEC = ("name: t\nmodel: {vocab_size: 320, context_length: 16, d_model: 16, n_layers: 1, attention: {n_heads: 2}}\n"
        "train: {batch_size: 2, seq_len: 8, eval_tokens: 16, data: {corpus: {kind: files, paths: [CORPUS]}}}\n")


@pytest.fixture
def spec_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("hello world, " * 200)
    path = tmp_path / "t.yaml"
    path.write_text(SPEC.replace("CORPUS", str(corpus)))
    return path


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def _refused(code, err, needle):
    assert code == 2 and err.startswith("error: ") and "Traceback" not in err, (code, err[-1500:])
    assert needle in err, (needle, err)
    assert len(err.strip().splitlines()) == 1, err


# ── values from the environment ──────────────────────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("name,value,needle", [
    ("WORLD_SIZE", "abc", "$WORLD_SIZE must be an integer, got 'abc'"),
    ("WORLD_SIZE", "0", "$WORLD_SIZE must be at least 1"),
    ("WORLD_SIZE", "1.5", "$WORLD_SIZE must be an integer"),
    ("LOCAL_WORLD_SIZE", "x", "$LOCAL_WORLD_SIZE must be an integer"),
    ("LOCAL_WORLD_SIZE", "-3", "$LOCAL_WORLD_SIZE must be between 0 and"),
    ("RANK", "9" * 30, "$RANK must be an integer"),
])
def test_environment_numbers_are_checked_on_a_dry_run_too(name, value, needle, spec_file, monkeypatch, capsys):
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(name, value)
    if name == "RANK":
        monkeypatch.setenv("WORLD_SIZE", "1")
    _refused(*_run(capsys, "train", spec_file, "--dry-run")[::2], needle)


def test_a_huge_columns_is_not_a_terminal_width(monkeypatch):
    from archspec.console import PIPED_WIDTH, terminal_width

    # Set only around the call: pytest's own reporter reads COLUMNS too and overflows on it (a crashed worker).
    with monkeypatch.context() as env, open(os.devnull, "w") as devnull:
        env.setenv("COLUMNS", "9" * 40)
        width = terminal_width(devnull)
    assert width == PIPED_WIDTH


# ── numbers at their limits ──────────────────────────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("temperature", [1e-45, 1e-300, 5e-324, 1e-7])
def test_any_positive_temperature_samples_the_most_likely_token_when_tiny(temperature):
    """`sample --temperature 1e-45` ended in 'probability tensor contains inf, nan': logits / T overflowed (and T
    itself is 0 in float32). The rule shifts by the largest logit and divides in float64."""
    from archspec import runtime as module  # the rule every generated model samples by
    logits = torch.randn(3, 64, generator=torch.Generator().manual_seed(0)) * 50
    probs = module.next_token_probs(logits, temperature)
    assert torch.isfinite(probs).all() and probs.dtype == torch.float32
    if temperature < 1e-30:
        assert torch.equal(probs.argmax(-1), logits.argmax(-1)) and torch.all(probs.max(-1).values == 1.0)
    token = module.sample_next(logits, temperature, top_k=5, top_p=0.9, generator=torch.Generator().manual_seed(1))
    assert token.shape == (3, 1)


@pytest.mark.parametrize("argv,needle", [
    (["--temperature", "nan"], "'nan' is not a finite number"),
    (["--temperature", "1e400"], "--temperature"),
    (["--top-k", "9" * 30], "--top-k"),
])
def test_non_finite_and_out_of_range_numbers_are_refused_at_the_option(argv, needle, spec_file, capsys):
    code, _, err = _run(capsys, "sample", spec_file, *argv)
    assert code == 2 and needle in err and "Traceback" not in err, err


def test_runs_reap_refuses_a_nan_timeout_and_limit_past_sql(tmp_path, capsys):
    url = f"sqlite:///{tmp_path}/r.db"
    for argv in (["runs", "reap", "--timeout", "nan"], ["runs", "list", "-n", "1" + "0" * 30]):
        code, _, err = _run(capsys, *argv, "--registry", url)
        assert code == 2 and "Traceback" not in err, err
    assert not (tmp_path / "r.db").exists()  # refused before anything was opened, let alone created


@pytest.mark.parametrize("when", ["'0001-01-01T00:00+01:00'", "'9999-12-31T23:59-05:00'"])
def test_dates_outside_years_1_to_9999_in_utc_are_refused_in_filters(when, tmp_path, capsys):
    code, _, err = _run(capsys, "runs", "list", "--where", f"started > {when}", "--registry",
                        f"sqlite:///{tmp_path}/r.db")
    assert code == 2 and "outside the years 1-9999 once converted to UTC" in err, err


# ── text that is not Unicode ─────────────────────────────────────────────────────────────────────────────────────

def test_a_prompt_of_bytes_that_are_not_utf8_is_refused_in_a_real_process(spec_file, tmp_path):
    """Through a real argv (bytes), as the shell passes `$'a\\xff'`."""
    out = subprocess.run([sys.executable, "-m", "archspec.entry", "sample", str(spec_file), "--prompt", b"a\xff"],
                         capture_output=True, cwd=tmp_path, timeout=120)
    err = out.stderr.decode("utf-8")
    assert out.returncode == 2 and "Traceback" not in err, err
    assert err.strip() == "error: the value of --prompt (a\\udcff) is not UTF-8 text (at character 1); archspec takes UTF-8 text and paths"


# ── options that contradict each other ───────────────────────────────────────────────────────────────────────────

def test_resume_and_init_from_together_are_refused(spec_file, tmp_path, capsys):
    code, _, err = _run(capsys, "train", spec_file, "--resume", tmp_path / "a.pt", "--init-from", tmp_path / "b.pt")
    _refused(code, err, "--resume and --init-from: give one")


def test_a_draft_with_another_vocabulary_size_is_refused(spec_file, tmp_path, capsys):
    draft = tmp_path / "draft.yaml"
    draft.write_text(spec_file.read_text().replace("name: t", "name: d").replace("vocab_size: 320", "vocab_size: 384"))
    code, _, err = _run(capsys, "sample", spec_file, "--draft", draft, "--max-new-tokens", "2")
    _refused(code, err, "its vocabulary has 384 ids, the model's 320")


# ── settings that would be silently dropped ──────────────────────────────────────────────────────────────────────

LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 320, "hidden_size": 16,
         "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
         "max_position_embeddings": 32, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "hidden_act": "silu"}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}


@pytest.mark.parametrize("extra,needle", [
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}, "rope_scaling": YARN},
     "rope_scaling: rope_type 'yarn' contradicts rope_parameters' 'default'"),
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
      "rope_scaling": {"type": "linear", "factor": 3.0}}, "factor 3.0 contradicts rope_parameters' 2.0"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}, "rope_theta": 5e5},
     "rope_theta: 500000.0 contradicts rope_parameters.rope_theta 10000.0"),
])
def test_import_hf_refuses_a_config_that_says_two_things_about_rope(extra, needle, tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, **extra}))
    code, _, err = _run(capsys, "import-hf", tmp_path / "config.json", "-o", tmp_path / "out.yaml")
    assert code == 2 and needle in err and "Traceback" not in err, err
    assert not (tmp_path / "out.yaml").exists()


def test_import_hf_takes_rope_settings_that_agree(tmp_path, capsys):
    same = {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, "rope_parameters": same, "rope_scaling": same,
                                                       "rope_theta": 1e4}))
    code, _, err = _run(capsys, "import-hf", tmp_path / "config.json", "-o", tmp_path / "out.yaml")
    assert code == 0, err
    assert "factor: 2.0" in (tmp_path / "out.yaml").read_text()


# ── a dry run makes the checks of a real run ─────────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("corpus,needle", [
    ("/dev/zero", "/dev/zero is neither a file nor a directory"),
    ("/nonexistent/corpus.txt", "no such corpus file or directory: /nonexistent/corpus.txt"),
])
def test_dry_run_checks_the_data_as_a_real_run_does(corpus, needle, spec_file, capsys):
    override = f"train.data.corpus={{kind: files, paths: [{corpus}]}}"
    code, _, err = _run(capsys, "train", spec_file, "--dry-run", "--set", override)
    _refused(code, err, needle)
    code, _, err = _run(capsys, "train", spec_file, "--set", override, "--steps", "1", "--no-compile")
    _refused(code, err, needle)  # the same message as the run it rehearses


# ── Ctrl-C while the CLI is still importing ──────────────────────────────────────────────────────────────────────

@pytest.mark.slow
def test_ctrl_c_at_any_moment_of_startup_never_prints_a_traceback(spec_file, tmp_path):
    """SIGINT at several moments of `archspec train --dry-run`: during the imports (click, pydantic, torch) and
    inside the command. Each ends `interrupted` or `aborted` with exit code 130, or finishes; never a traceback."""
    script = Path(sys.executable).with_name("archspec")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "archspec.entry"]
    delays = [0.1, 0.2, 0.35, 0.6, 1.0, 1.6]
    procs = []
    for delay in delays:
        procs.append((delay, subprocess.Popen([*command, "train", str(spec_file), "--dry-run"], cwd=tmp_path,
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)))
    start = time.monotonic()
    for delay, proc in procs:
        time.sleep(max(0.0, start + delay - time.monotonic()))
        proc.send_signal(signal.SIGINT)
    for delay, proc in procs:
        out, err = proc.communicate(timeout=120)
        text = err.decode("utf-8", "replace")
        # So early that no line of archspec had run: Python's own start-up (the site module), or the console-script
        # wrapper pip writes, still importing archspec.entry (the first line archspec controls is entry()).
        if "init_import_site" in text or ("from archspec.entry import entry" in text and "archspec/entry.py" not in text):
            continue
        # Earlier still (a loaded machine): the interpreter had not yet installed its own SIGINT handler, so the
        # signal's default action ended it, silently (exit -2); nothing of Python's or archspec's had run.
        if proc.returncode == -signal.SIGINT and not text and not out:
            continue
        assert "Traceback" not in text and "KeyboardInterrupt" not in text, (delay, text)
        assert proc.returncode in (0, 130), (delay, proc.returncode, text)
        if proc.returncode == 130:
            assert text.strip().splitlines()[-1] in ("interrupted", "aborted"), (delay, text)


# ── found by review (each a member of a class above) ─────────────────────────────────────────────────────────────

@pytest.mark.parametrize("value", ["+-1", "--1", "+", "1-", "１"])
def test_numbers_from_the_environment_take_one_sign_at_most(value, spec_file, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", value)
    _refused(*_run(capsys, "train", spec_file, "--dry-run")[::2], "$WORLD_SIZE must be an integer")


@pytest.mark.parametrize("url,needle", [("postgresql://u@h:abc/db", "invalid registry URL"),
                                        ("sqlite:///a\udcffb.db", "is not UTF-8 text")])
def test_registry_urls_that_cannot_be_parsed_or_stored_are_refused(url, needle, tmp_path, capsys):
    code, _, err = _run(capsys, "runs", "list", "--registry", url)
    assert code == 2 and needle in err and "Traceback" not in err, err


@pytest.mark.parametrize("name,value,needle", [
    ("ARCHSPEC_HOME", "/tmp/a\udcffb", "$ARCHSPEC_HOME: /tmp/a\\udcffb is not UTF-8 text"),
    ("ARCHSPEC_CACHE", "/tmp/a\udcffb", "$ARCHSPEC_CACHE: /tmp/a\\udcffb is not UTF-8 text"),
    ("ARCHSPEC_REGISTRY", "sqlite:////tmp/a\udcff.db", "(not UTF-8 text)"),
])
def test_path_variables_that_are_not_utf8_are_refused_where_they_are_read(name, value, needle, tmp_path, monkeypatch,
                                                                           capsys):
    monkeypatch.chdir(tmp_path)  # outside any project: the per-user state directories are read
    monkeypatch.setenv(name, value)
    code, _, err = _run(capsys, "runs", "list")
    if name == "ARCHSPEC_CACHE":
        code, _, err = _run(capsys, "peak")
    assert code == 2 and needle in err and "Traceback" not in err, err


def test_path_variables_and_the_working_directory_must_be_utf8(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ARCHSPEC_HOME", "~nosuchuser-archspec/x")
    code, _, err = _run(capsys, "runs", "list")
    assert code == 2 and "$ARCHSPEC_HOME: ~nosuchuser-archspec/x" in err, err
    monkeypatch.delenv("ARCHSPEC_HOME")
    odd = tmp_path / "cw\udcff"
    os.mkdir(odd)
    monkeypatch.chdir(odd)
    code, _, err = _run(capsys, "runs", "list", "--registry", f"sqlite:///{tmp_path}/r.db")
    assert code == 2 and "the working directory" in err and "is not UTF-8 text" in err, err


@pytest.mark.parametrize("top_p", [1e-300, 5e-324, 1e-46])
def test_any_positive_top_p_keeps_the_most_likely_token(top_p):
    from archspec import runtime

    logits = torch.randn(2, 50, generator=torch.Generator().manual_seed(0))
    probs = runtime.next_token_probs(logits, 1.0, top_p=top_p)
    assert torch.isfinite(probs).all() and torch.equal(probs.argmax(-1), logits.argmax(-1))
    assert torch.all(probs.max(-1).values == 1.0)


@pytest.mark.parametrize("extra,needle", [
    ({"rope_theta": [1]}, "rope_theta"),
    ({"rope_parameters": {"rope_type": ["linear"], "factor": 2.0}}, "rope_type"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4},
      "rope_scaling": {"rope_type": "default", "rope_theta": 5e5}}, "contradicts rope_parameters"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 1.0},
      "rope_scaling": {"rope_type": "default", "partial_rotary_factor": 0.5}}, "contradicts rope_parameters"),
    ({"rope_parameters": {"rope_type": "linear", "type": "dynamic", "factor": 2.0}}, "contradicts"),
])
def test_import_hf_refuses_odd_or_contradicting_rope_values(extra, needle, tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, **extra}))
    code, _, err = _run(capsys, "import-hf", tmp_path / "config.json", "-o", tmp_path / "out.yaml")
    assert code == 2 and needle in err and "Traceback" not in err, err


@pytest.mark.parametrize("then", ["breaks", "finishes"])
def test_an_interrupt_a_library_swallowed_still_ends_the_command_as_interrupted(then, spec_file, monkeypatch, capsys):
    """Ctrl-C during an import once left numpy half-imported: a library's broad `except` swallowed it, and the
    command died later with an AttributeError traceback. Any command: the interrupt is remembered, and it decides."""
    import archspec.cli.train as train_cli

    def swallowing(*args, **kwargs):
        try:
            os.kill(os.getpid(), signal.SIGINT)
        except KeyboardInterrupt:
            pass  # what a library's broad except does
        if then == "breaks":
            raise AttributeError("module 'numpy' has no attribute 'may_share_memory'")

    monkeypatch.setattr(train_cli, "_dry_run", swallowing)
    code, out, err = _run(capsys, "train", spec_file, "--dry-run")
    assert code == 130 and err.strip().splitlines()[-1] == "interrupted" and "Traceback" not in err, err
