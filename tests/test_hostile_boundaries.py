"""Hostile input at every boundary (issue 12): nesting, huge integers, special and huge files, sweep files, filters
and sorts, the environment, YAML merge keys and control characters. Each case must end in exit code 2 and one line
naming the thing and the limit, never a traceback; and the legitimate neighbour of each case must still work.

A Hypothesis property throws structurally random YAML (nesting, aliases, huge scalars) at `archspec build`.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from archspec.ablate.sweep import MAX_VARIANTS, load_sweep
from archspec.cli import main
from archspec.errors import UserError
from archspec.spec import load_spec, safe_yaml

SPEC_OK = "name: t\nmodel: {vocab_size: 257, context_length: 8, d_model: 16, n_layers: 1, attention: {n_heads: 2}}\n"


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """Nothing lands in the checkout: runs/, the default registry and the cache all live under tmp_path."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ARCHSPEC_REGISTRY", f"sqlite:///{tmp_path}/default-registry.db")
    monkeypatch.setenv("ARCHSPEC_CACHE", str(tmp_path / "cache"))


def _run(capsys, *argv):
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _assert_refused(rc, out, err, *needles):
    assert rc == 2, (rc, err[-2000:])
    assert "Traceback" not in out + err
    assert err.startswith("error: "), err[:500]
    for needle in needles:
        assert needle in err, (needle, err[:1000])


@pytest.fixture
def spec_file(tmp_path) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC_OK)
    return path


def _build(capsys, path, tmp_path, *extra):
    return _run(capsys, "build", path, "--no-record", "--out", tmp_path / "gen", *extra)


# ── deep nesting ─────────────────────────────────────────────────────────────────────────────────────────────────


def _deep_block_mapping(depth: int) -> str:
    return "name: t\nmodel:\n" + "".join(" " * (i + 1) + f"k{i}:\n" for i in range(depth)) + " " * (depth + 1) + "1\n"


@pytest.mark.parametrize("text", [
    "name: t\nmodel: " + "[" * 1000 + "]" * 1000 + "\n",
    "name: t\nmodel: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n",
    _deep_block_mapping(300),
], ids=["flow-seq-1000", "flow-map-3000", "block-map-300"])
def test_deep_nesting_in_a_spec_file_is_refused_at_its_line(text, tmp_path, capsys):
    path = tmp_path / "deep.yaml"
    path.write_text(text)
    rc, out, err = _build(capsys, path, tmp_path)
    _assert_refused(rc, out, err, f"{path}:", f"nested deeper than {safe_yaml.MAX_DEPTH} levels")
    assert len(err.strip().splitlines()) == 1


def test_nesting_within_the_limit_still_parses():
    assert safe_yaml.parse("[" * 60 + "]" * 60) is not None


@pytest.mark.parametrize("override,needle", [
    ("model.x=" + "[" * 1000 + "]" * 1000, "nested deeper than"),
    ("model.x=" + "{a: " * 2000 + "1" + "}" * 2000, "nested deeper than"),
    ("model." + ".".join(["a"] * 3000) + "=1", f"more than {safe_yaml.MAX_DEPTH} levels"),
    ("model.x=" + "9" * 5000, "integer literal with 5,000 digits"),
    ("model.x=[&a [*a]]", "a YAML alias refers to a value that contains it"),
], ids=["seq", "map", "key", "bigint", "recursive"])
def test_hostile_set_values_are_refused(override, needle, spec_file, tmp_path, capsys):
    rc, out, err = _build(capsys, spec_file, tmp_path, "--set", override)
    _assert_refused(rc, out, err, "--set model.", needle)
    assert len(err) < 1000  # the value is quoted in part, not echoed whole


# ── integers past Python's 4300-digit limit, wherever they are ──────────────────────────────────────────────────


@pytest.mark.parametrize("text", [
    SPEC_OK + "unknown_key: " + "9" * 5000 + "\n",
    SPEC_OK.replace("d_model: 16", "d_model: " + "1" * 4301),
    SPEC_OK + "junk: [" + "-" + "7" * 10_000 + "]\n",
], ids=["unknown-key", "field", "in-a-list"])
def test_integer_literals_over_4300_digits_are_refused(text, tmp_path, capsys):
    path = tmp_path / "big.yaml"
    path.write_text(text)
    rc, out, err = _build(capsys, path, tmp_path)
    _assert_refused(rc, out, err, "invalid YAML: integer literal with", f"at most {safe_yaml.MAX_INT_DIGITS}")


def test_an_int_too_long_to_repr_in_a_python_dict_is_refused_at_its_field():
    from archspec.spec import SpecError, load_spec_dict

    data = yaml.safe_load(SPEC_OK)
    data["model"]["d_model"] = 10**5000
    with pytest.raises(SpecError) as info:
        load_spec_dict(data)
    assert any(p.startswith("model.d_model:") and "digits" in p for p in info.value.problems), info.value.problems


# ── special and huge files ───────────────────────────────────────────────────────────────────────────────────────


def _fifo(tmp_path) -> Path:
    path = tmp_path / "fifo.yaml"
    os.mkfifo(path)
    return path


def _with_timeout(fn, seconds: float = 30):
    """Run fn in a thread: a regression that blocks (a FIFO) fails the test instead of hanging the suite."""
    result: list = []

    def target():
        try:
            result.append((fn(), None))
        except BaseException as e:  # noqa: BLE001 - handed back to the test's thread
            result.append((None, e))

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert result, f"still running after {seconds} s (blocked on a special file?)"
    value, error = result[0]
    if error is not None:
        raise error
    return value


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "huge"])
def test_special_and_huge_spec_files_are_refused_without_reading_them(kind, tmp_path, capsys):
    if kind == "dev-zero":
        path, needle = Path("/dev/zero"), "not a regular file"
    elif kind == "fifo":
        path, needle = _fifo(tmp_path), "not a regular file"
    else:
        path, needle = tmp_path / "huge.yaml", f"may hold at most {safe_yaml.MAX_FILE_BYTES:,}"
        with open(path, "w") as f:  # 50 MB: refused from its size, before a byte is parsed
            f.write(SPEC_OK)
            f.truncate(50_000_000)
    rc, out, err = _with_timeout(lambda: _build(capsys, path, tmp_path))
    _assert_refused(rc, out, err, str(path), needle)


def test_a_sweep_whose_base_is_a_device_or_fifo_is_refused(tmp_path):
    for base in ("/dev/zero", str(_fifo(tmp_path))):
        path = tmp_path / "sweep.yaml"
        path.write_text(f"name: s\nbase: {base}\n")
        with pytest.raises(UserError, match="not a regular file"):
            _with_timeout(lambda: load_sweep(path))


# ── sweep files ──────────────────────────────────────────────────────────────────────────────────────────────────


def _sweep(tmp_path, body: str) -> Path:
    (tmp_path / "base.yaml").write_text(SPEC_OK)
    path = tmp_path / "sweep.yaml"
    path.write_text("name: s\nbase: base.yaml\n" + body)
    return path


def _bomb_grid() -> str:
    lines = ['l0: &l0 "' + "x" * 100 + '"']
    lines += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, 8)]
    return "\n".join(lines) + "\ngrid:\n  model.x: [*l7, *l7]\n"


@pytest.mark.parametrize("body,needle", [
    ("seeds: [-1]\n", "seeds.0: Input should be greater than or equal to 0"),
    ("seeds: [1099511627776]\n", "seeds.0: Input should be less than or equal to 2147483647"),
    ("seeds: [true]\n", "seeds.0: Input should be a valid integer"),
    ("seeds: [" + ", ".join(map(str, range(500))) + "]\n", "seeds: List should have at most"),
    ("grid:\n  model.ffn: [&f {kind: mlp, x: *f}]\n", "a YAML alias refers to a value that contains it"),
    ("grid:\n  model.x: [" + "[" * 500 + "]" * 500 + "]\n", "nested deeper than"),
    ("grid:\n  model.x: [" + "9" * 4400 + "]\n", "integer literal with 4,400 digits"),
    (_bomb_grid(), "more than 100,000 values once YAML aliases are expanded"),
    ("grid:\n" + "".join(f"  model.k{i}: [1, 2]\n" for i in range(30)), "grid: 1,073,741,824 variants (2 × 2"),
    ("grid:\n" + "".join(f"  model.k{i}: [{', '.join(['1'] * 100)}]\n" for i in range(300)),
     "grid: about 10^600 variants"),
    ("zip:\n  model.d_model: [" + ", ".join(["16"] * 2000) + "]\n", "grid: 2,000 variants"),
], ids=["seed-negative", "seed-huge", "seed-bool", "too-many-seeds", "recursive-grid", "deep-grid", "bigint-grid",
        "alias-bomb-grid", "30-keys", "300-keys", "long-zip"])
def test_hostile_sweep_files_are_refused_before_expanding(body, needle, tmp_path, capsys):
    path = _sweep(tmp_path, body)
    rc, out, err = _run(capsys, "ablate", path, "--dry-run")
    _assert_refused(rc, out, err, str(path), needle)
    assert len(err) < 2000


def test_a_sweep_at_the_variant_limit_still_loads(tmp_path):
    values = ", ".join(str(16 * (i + 1)) for i in range(8))
    sweep = load_sweep(_sweep(tmp_path, f"grid:\n  model.d_model: [{values}]\n  train.lr: [1.0e-3, 2.0e-3]\n"))
    assert len(sweep.variants) == 16 <= MAX_VARIANTS


def test_a_sweep_built_in_python_gets_the_same_limits():
    data = {"name": "s", "base": yaml.safe_load(SPEC_OK), "grid": {"model.x": []}}
    data["grid"]["model.x"].append(data["grid"]["model.x"])
    with pytest.raises(UserError, match="recursive structure"):
        load_sweep(data=data)


# ── YAML merge keys ──────────────────────────────────────────────────────────────────────────────────────────────


def test_yaml_merge_keys_are_accepted_as_safe_load_does(tmp_path):
    path = tmp_path / "merge.yaml"
    path.write_text("name: t\nshapes: &small {vocab_size: 257, context_length: 8, d_model: 16, n_layers: 3}\n"
                    "model:\n  <<: *small\n  n_layers: 1\n  attention: {n_heads: 2}\n")
    text = path.read_text()
    assert safe_yaml.parse(text) == yaml.safe_load(text)
    data = safe_yaml.parse(text)
    assert data["model"]["n_layers"] == 1 and data["model"]["d_model"] == 16  # explicit keys win over merged ones
    with pytest.raises(UserError) as info:  # the anchor's holder is still an unknown key
        load_spec(path)
    assert info.value.problems[0].startswith("shapes: unknown field")
    path.write_text("name: t\nmodel:\n  <<: [{vocab_size: 257, context_length: 8}, {d_model: 16, n_layers: 1}]\n"
                    "  attention: {n_heads: 2}\n")
    assert load_spec(path).model.d_model == 16


def test_a_key_given_twice_is_still_refused_next_to_a_merge_key():
    with pytest.raises(yaml.YAMLError, match="duplicate key 'a'"):
        safe_yaml.parse("m:\n  <<: {b: 1}\n  a: 1\n  a: 2\n")


# ── filters and sorts ────────────────────────────────────────────────────────────────────────────────────────────


@pytest.fixture
def registry_url(tmp_path, spec_file, capsys) -> str:
    url = f"sqlite:///{tmp_path}/registry.db"
    rc, _, err = _run(capsys, "build", spec_file, "--out", tmp_path / "gen", "--registry", url)
    assert rc == 0, err
    return url


@pytest.mark.parametrize("option,text,needle", [
    ("--where", "(" * 400 + "seed = 1" + ")" * 400, "nested deeper than 50 levels"),
    ("--where", "not " * 1000 + "seed = 1", "nested deeper than 50 levels"),
    ("--where", " or ".join(["seed=1"] * 900), "more than 200 comparisons"),
    ("--where", " and ".join(["seed>0"] * 800), "more than 200 comparisons"),
    ("--where", "seed in (" + ",".join(["1"] * 2000) + ")", "more than 1000 values in IN lists"),
    ("--where", "seed = " + "9" * 5000, "is out of range"),
    ("--where", "seed = 1 " * 3000, "more than the limit of 10,000"),
    ("--sort", ",".join(["seed"] * 1900), "more than 16 sort keys"),
    ("--sort", ",".join(["params.model.d_model"] * 100), "more than 16 sort keys"),
], ids=["parens", "nots", "flat-or", "flat-and", "in-list", "bigint", "long", "sort-1900", "sort-params"])
def test_hostile_filters_and_sorts_are_refused(option, text, needle, registry_url, capsys):
    rc, out, err = _run(capsys, "runs", "list", "--registry", registry_url, option, text)
    _assert_refused(rc, out, err, needle)
    assert max(len(line) for line in err.splitlines()) < 400  # a window of the text, not all of it


def test_filters_at_the_limits_still_run(registry_url, capsys):
    for option, text in [("--where", "(" * 40 + "seed = 1" + ")" * 40), ("--where", " or ".join(["seed=1"] * 200)),
                         ("--sort", ",".join(["params.model.d_model"] * 16))]:
        rc, out, err = _run(capsys, "runs", "list", "--registry", registry_url, option, text)
        assert rc == 0, err
    rc, out, err = _run(capsys, "specs", "list", "--registry", registry_url, "--where",
                        " or ".join(["params.model.d_model = 16"] * 200))
    assert rc == 0 and "t" in out, err


# ── environment ──────────────────────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("env,needle", [
    ({"WORLD_SIZE": "2", "RANK": "0"}, "$WORLD_SIZE=2 but $MASTER_ADDR and $MASTER_PORT are not set"),
    ({"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "localhost"}, "$MASTER_PORT is not set"),
    ({"RANK": "1"}, "$RANK=1 / $LOCAL_RANK=0 is set but $WORLD_SIZE is not"),
    ({"WORLD_SIZE": "2", "RANK": "5"}, "$RANK=5 is outside the world of $WORLD_SIZE=2"),
    ({"WORLD_SIZE": "0"}, "$WORLD_SIZE must be at least 1"),
    ({"WORLD_SIZE": "9" * 5000}, "$WORLD_SIZE must be an integer"),
], ids=["no-master", "no-port", "rank-alone", "rank-outside", "world-0", "world-bigint"])
def test_inconsistent_torchrun_variables_are_refused_before_training(env, needle, spec_file, monkeypatch, capsys):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    rc, out, err = _run(capsys, "train", spec_file, "--steps", "1")
    _assert_refused(rc, out, err, needle)


def test_an_unusable_cache_directory_is_named(tmp_path, monkeypatch):
    from archspec.cache import cache_dir

    afile = tmp_path / "afile"
    afile.write_text("x")
    monkeypatch.setenv("ARCHSPEC_CACHE", str(afile / "cache"))
    with pytest.raises(UserError, match=r"\$ARCHSPEC_CACHE=.*afile/cache: a part of the path is a file"):
        cache_dir()
    monkeypatch.setenv("ARCHSPEC_CACHE", str(afile))
    with pytest.raises(UserError, match="exists and is not a directory"):
        cache_dir()
    if os.geteuid() != 0:  # root writes anywhere: the permission case needs an ordinary user
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
        monkeypatch.setenv("ARCHSPEC_CACHE", str(ro))
        with pytest.raises(UserError, match="not writable"):
            cache_dir()


def test_a_full_cache_disk_is_a_user_error_naming_the_cache(tmp_path, monkeypatch):
    import errno

    from archspec.train import data as data_module
    from archspec.cache import writing_cache

    with pytest.raises(UserError, match=f"cache {tmp_path}: cannot write \\(No space left on device\\)"):
        with writing_cache(tmp_path):
            raise OSError(errno.ENOSPC, "No space left on device")
    assert data_module.writing_cache is writing_cache  # the token store writes under it


# ── control characters never reach the terminal raw ──────────────────────────────────────────────────────────────


@pytest.mark.parametrize("text", ["a\rOK: all good\x1b[2K", "x\ny", "\x07\x08\x9b31m"], ids=["cr-ansi", "lf", "c1"])
def test_control_characters_in_paths_are_escaped_in_messages(text, tmp_path, capsys):
    rc, out, err = _build(capsys, tmp_path / f"missing{text}.yaml", tmp_path)
    _assert_refused(rc, out, err, "no such spec file")
    assert len(err.strip().splitlines()) == 1 and err.strip().isprintable(), repr(err)
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC_OK)
    rc, out, err = _build(capsys, spec, tmp_path, "--set",
                          f"train.data.corpus={{kind: files, paths: [{json.dumps(str(tmp_path / text))}]}}")
    # build validates without reading the corpus; a missing corpus shows up at train time, escaped the same way
    assert rc == 0, err
    rc, out, err = _run(capsys, "train", spec, "--steps", "1", "--no-compile", "--set",
                        f"train.data.corpus={{kind: files, paths: [{json.dumps(str(tmp_path / text))}]}}")
    _assert_refused(rc, out, err, "no such corpus file or directory")
    assert all(line.isprintable() for line in err.strip().splitlines()), repr(err)


# ── Hypothesis: structurally random YAML at `archspec build` ─────────────────────────────────────────────────────

_scalars = st.one_of(
    st.integers(min_value=-(10**20), max_value=10**20).map(str),
    st.integers(min_value=4290, max_value=4400).map(lambda n: "9" * n),  # around Python's int() digit limit
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["true", "no", "null", "~", "'x'", '"\\x1b[2J"', ".inf", "-.nan", "0x1F", "0o17", "1_000",
                     "!!binary aGk=", "!!python/name:os.system", "*undefined", "&a 1", "<<"]),
    st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=8).map(json.dumps),
    st.integers(min_value=1, max_value=200_000).map(lambda n: "x" * n),  # huge scalars
)
_keys = st.one_of(st.sampled_from(["name", "model", "train", "d_model", "n_layers", "attention", "kind", "<<", "n_heads",
                                   "vocab_size", "context_length", "ffn", "norm", "data", "corpus"]),
                  st.from_regex(r"[a-z_]{1,8}", fullmatch=True))


def _flow(children):
    return st.one_of(
        st.lists(children, max_size=4).map(lambda xs: "[" + ", ".join(xs) + "]"),
        st.lists(st.tuples(_keys, children), max_size=4).map(
            lambda kv: "{" + ", ".join(f"{k}: {v}" for k, v in kv) + "}"),
    )


_values = st.recursive(_scalars, _flow, max_leaves=30)


@st.composite
def _documents(draw) -> str:
    """A YAML document: random top-level keys (often the real ones), random flow values, sometimes very deep
    nesting, anchors and aliases (including alias bombs and self-reference)."""
    lines = []
    for i in range(draw(st.integers(0, 6))):
        key = draw(_keys)
        shape = draw(st.sampled_from(["value", "deep", "anchor", "alias", "bomb", "self"]))
        if shape == "value":
            lines.append(f"{key}: {draw(_values)}")
        elif shape == "deep":
            n = draw(st.sampled_from([10, 63, 64, 65, 200, 2000]))
            lines.append(f"{key}: " + "[" * n + "]" * n)
        elif shape == "anchor":
            lines.append(f"{key}: &a{i} {draw(_values)}")
        elif shape == "alias":
            lines.append(f"{key}: [*a{draw(st.integers(0, 6))}, *a{draw(st.integers(0, 6))}]")
        elif shape == "bomb":
            lines.append(f"b{i}0: &b{i}0 [x, x, x, x, x, x, x, x, x, x]")
            lines += [f"b{i}{j}: &b{i}{j} [" + ", ".join([f"*b{i}{j - 1}"] * 10) + "]" for j in range(1, 7)]
        else:
            lines.append(f"{key}: &s{i} [1, *s{i}]")
    if draw(st.booleans()):
        lines.insert(0, "name: t")
    return "\n".join(lines) + "\n"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(text=st.one_of(_documents(), _documents().map(lambda d: SPEC_OK + d.replace("name: t\n", ""))))
def test_random_yaml_structures_exit_0_or_2_never_a_traceback(text, tmp_path, capsys):
    path = tmp_path / "random.yaml"
    path.write_text(text, encoding="utf-8")
    try:
        rc, out, err = _build(capsys, path, tmp_path)
    except Exception as e:  # noqa: BLE001 - the property is exactly "nothing escapes"
        pytest.fail(f"{type(e).__name__} escaped for:\n{text[:2000]}")
    assert rc in (0, 2), (rc, err[-2000:], text[:2000])
    assert "Traceback" not in out + err
    if rc == 2:
        assert err.startswith("error: ") and all(line.isprintable() for line in err.splitlines())
