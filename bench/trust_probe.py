"""Issue 42's adversarial probe, by class: how many cases of each class archspec handles cleanly.

    PYTHONPATH=$PWD python bench/trust_probe.py [--pg URL] [--only CLASS,...]

Run it against two trees (this one, and the tree before the fixes: `git archive <commit> | tar -x -C /tmp/before`,
then PYTHONPATH=/tmp/before python bench/trust_probe.py) to compare. It uses the tests' helpers (tests/), so run it
from a checkout's root. Clean means, per class:

- launcher: a hostile value (newline, NUL, CR, quotes, $(), backticks, ;, |, bidi, ...) in a launcher field is
  refused before anything is submitted, or the generated sbatch script (run under bash with stub srun/scontrol/
  torchrun) runs no command of it;
- secrets: no line printed and no file written holds a registry password; with --pg (a PostgreSQL URL with a
  password, e.g. a scram-sha-256 server on a Unix socket), a sweep through slurm-local trains (workers connect)
  and ablate's exit code and summary tell the truth;
- confinement: nothing outside a run directory is deleted, nothing is written through a link;
- hf: a hostile config.json/weights file ends in a spec or in exit 2 with one line (no traceback, no allocation the
  size of a number: the probe runs under an 8 GiB address-space limit), released files import, aliases honoured;
- ui: the Host allow-list answers exactly the hosts served; control/bidi characters never reach a page or an answer;
- small: --seeds typos refused, a tampered quantized scale refused by sample, an interrupted delete says what it did.

Prints one line per class, `class: clean/tried`, and the unclean cases with --verbose.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

ROOT = Path.cwd()
sys.path.insert(0, str(ROOT))
RESULTS: dict[str, list[tuple[str, bool]]] = {}


def case(cls: str, name: str):
    def wrap(fn):
        try:
            ok = bool(fn())
        except Exception:  # noqa: BLE001 (any escape is an unclean case)
            ok = False
            if VERBOSE:
                traceback.print_exc(limit=3)
        RESULTS.setdefault(cls, []).append((name, ok))
        return fn
    return wrap


def cli(*args: str) -> tuple[int, str, str]:
    from archspec.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(list(args))
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
        except MemoryError:
            rc = -1
            print("MemoryError", file=sys.stderr)
    return rc, out.getvalue(), err.getvalue()


def one_error_line(err: str) -> bool:
    lines = [x for x in err.strip().splitlines() if x.strip() and not x.startswith(("note:", "warning:"))]
    return len(lines) == 1 and "Traceback" not in err and len(lines[0]) < 2100


def _exe(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


# ── launcher ─────────────────────────────────────────────────────────────────────────────────────────────────────


def probe_launcher(tmp: Path) -> None:
    from tests.launch import test_script_gate as gate

    root = tmp / "gate"
    bin_dir, record = root / "bin", root / "record"
    bin_dir.mkdir(parents=True)
    record.mkdir()
    _exe(bin_dir / "sbatch", gate.STUB_SBATCH.format(record=record))
    _exe(bin_dir / "srun", "#!/bin/sh\nexit 0\n")
    _exe(bin_dir / "scontrol", "#!/bin/sh\necho node1\n")
    _exe(bin_dir / "torchrun", gate.RECORD_ARGS.format(log=root / "torchrun-args"))
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    n = 0
    for field in gate.FIELDS:
        for i in range(18):
            n += 1
            workdir = root / f"w{n}"
            workdir.mkdir()
            marker = workdir / "INJECTED"
            value = gate._marker_payloads(marker)[i]

            @case("launcher", f"{field}#{i}")
            def _():
                for f in record.iterdir():
                    f.unlink()
                try:
                    script = gate._submit(field, value, workdir)
                except AssertionError:
                    return False  # refused, but not on one line (or for want of sbatch)
                if script is None:
                    return not any(record.iterdir())
                gate._run_script(script, bin_dir, workdir)
                return not marker.exists()


# ── secrets ──────────────────────────────────────────────────────────────────────────────────────────────────────


SECRET = "Pa55-w0rd-probe"
PG_TEXT = f"postgresql+psycopg://alice:{SECRET}@db.example:5432/reg"


def probe_secrets(tmp: Path, pg: str | None) -> None:
    from archspec import errors

    @case("secrets", "error message")
    def _():
        return SECRET not in errors.UserError(f"cannot open registry {PG_TEXT}").render()

    @case("secrets", "console line (echo)")
    def _():
        from archspec.console import echo

        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            echo(f"follow with --registry {PG_TEXT}")
        return SECRET not in buf.getvalue()

    @case("secrets", "registry's shown url")
    def _():
        from sqlalchemy.engine import make_url

        from archspec.registry.engine import _normalize_url  # noqa: F401 (exists in both trees)
        return SECRET not in make_url(PG_TEXT).render_as_string(hide_password=True)

    @case("secrets", "query password in a line")
    def _():
        return SECRET not in errors.printable(f"postgresql://alice@h/db?password={SECRET}")

    if not pg:
        return
    secret = __import__("sqlalchemy").engine.make_url(pg).password
    base = json.loads(Path(tmp / "base.json").read_text()) if (tmp / "base.json").exists() else None
    sweep = {"name": "pw", "base": base or _tiny_spec(tmp), "seeds": [0], "budget": {"steps": 2},
             "grid": {"model.norm.kind": ["rmsnorm"]}}
    import yaml

    for launcher in ("local", "slurm-local"):
        work = tmp / f"pg-{launcher}"
        work.mkdir()
        seeds = [0] if launcher == "local" else [1]  # another run key: a FINISHED run would be skipped, not trained
        (work / "s.yaml").write_text(yaml.safe_dump({**sweep, "seeds": seeds,
                                                     "name": f"pw{launcher.replace('-', '')}"}))
        cwd = os.getcwd()
        os.chdir(work)
        try:
            rc, out, err = cli("ablate", "s.yaml", "--registry", pg, "--no-compile", "--device", "cpu",
                               "--launcher", launcher)
        finally:
            os.chdir(cwd)
        from archspec.registry import Registry

        rows = Registry(pg).runs(where=f"sweep = 'pw{launcher.replace('-', '')}'")

        @case("secrets", f"{launcher}: runs trained (workers connect)")
        def _():
            return bool(rows) and all(r.status == "FINISHED" for r in rows)

        @case("secrets", f"{launcher}: exit code tells the truth")
        def _():
            finished = bool(rows) and all(r.status == "FINISHED" for r in rows)
            return (rc == 0) == finished

        @case("secrets", f"{launcher}: no printed line holds the password")
        def _():
            return secret not in out + err

        @case("secrets", f"{launcher}: no file written holds the password")
        def _():
            return not [p for p in work.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


def _tiny_spec(tmp: Path) -> dict:
    import sysconfig

    corpus = tmp / "corpus"
    if not corpus.exists():
        corpus.mkdir()
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        for name in ("bisect.py", "colorsys.py", "copy.py", "heapq.py", "textwrap.py", "string.py", "shlex.py"):
            (corpus / name.replace(".py", ".txt")).write_text((stdlib / name).read_text(encoding="utf-8"))
    return {"name": "base", "model": {"vocab_size": 300, "context_length": 16, "d_model": 32, "n_layers": 1,
                                      "attention": {"n_heads": 2}, "ffn": {"kind": "glu", "hidden_dim": 64}},
            "train": {"batch_size": 2, "seq_len": 16, "lr": 3e-3, "warmup_steps": 1, "eval_interval": 2,
                      "eval_tokens": 64, "compile": "none",
                      "data": {"corpus": {"kind": "files", "paths": [str(corpus)]}, "val_fraction": 0.1}}}


# ── confinement ──────────────────────────────────────────────────────────────────────────────────────────────────


def probe_confinement(tmp: Path) -> None:
    from archspec.registry import Registry
    from tests.registry.helpers import populate
    from tests.registry.test_housekeeping import run_dir

    def fresh(name: str):
        d = tmp / name
        d.mkdir()
        url = f"sqlite:///{d}/reg.db"
        reg = Registry(url)
        return d, url, reg, populate(reg)

    def victim(d: Path, name="checkpoint.pt") -> Path:
        v = d / "victim"
        v.mkdir(exist_ok=True)
        (v / "notes.txt").write_text("mine")
        (v / name).write_bytes(b"precious")
        return v / name

    for how in ("outside", "other-name", "link-out", "registry-file"):
        @case("confinement", f"gc --apply: {how}")
        def _():
            d, url, reg, ids = fresh(f"gc-{how}")
            rd = run_dir(reg, d, ids["llama0"])
            if how == "outside":
                target = victim(d)
            elif how == "other-name":
                target = victim(d, "data.bin")
            elif how == "registry-file":
                target = d / "reg.db"
            else:
                target = victim(d, "weights.bin")
                (rd / "checkpoint.pt").unlink()
                (rd / "checkpoint.pt").symlink_to(target)
            if how != "link-out":
                reg.add_artifact(ids["llama0"], "checkpoint", str(target))
            before = target.read_bytes()
            cli("gc", "--keep", "none", "--apply", "--registry", url)
            return target.exists() and target.read_bytes() == before

    @case("confinement", "gc --apply: a run directory reached through a link is still freed")
    def _():
        d, url, reg, ids = fresh("gc-legit-link")
        (d / "disk").mkdir()
        (d / "runs").symlink_to(d / "disk")
        rd = run_dir(reg, d, ids["llama0"])
        cli("gc", "--keep", "none", "--apply", "--registry", url)
        return not (d / "disk" / rd.name / "checkpoint.pt").exists()

    @case("confinement", "runs delete: a recorded directory that links out")
    def _():
        d, url, reg, ids = fresh("del-link")
        v = d / "victim"
        v.mkdir()
        (v / "llama.py").write_text("#")
        (v / "checkpoint.pt").write_bytes(b"x")
        (d / "runs").mkdir()
        (d / "runs" / "llama-x").symlink_to(v)
        reg.add_artifact(ids["llama1"], "model", str(d / "runs" / "llama-x" / "llama.py"))
        rc, _, err = cli("runs", "delete", ids["llama1"], "--yes", "--registry", url)
        return (v / "llama.py").exists() and rc == 2 and one_error_line(err)

    @case("confinement", "delete at the moment of acting: a link put in place after the check")
    def _():
        from archspec.registry.housekeeping import remove_with_rows

        d = tmp / "act"
        (d / "runs" / "r").mkdir(parents=True)
        (d / "runs" / "r" / "checkpoint.pt").write_bytes(b"x")
        v = d / "victim"
        v.mkdir()
        (v / "checkpoint.pt").write_bytes(b"precious")
        planned = (d / "runs" / "r").resolve() / "checkpoint.pt"
        os.rename(d / "runs" / "r", d / "runs" / "moved")
        (d / "runs" / "r").symlink_to(v)
        with contextlib.suppress(Exception):
            remove_with_rows([planned], lambda: None)
        return (v / "checkpoint.pt").exists()

    from tests.test_outputs_confined import LLAMA

    for flag in ("-o", "--checkpoint"):
        for target in ("dangling", "existing"):
            @case("confinement", f"import-hf {flag} through a {target} link")
            def _():
                d = tmp / f"imp-{flag}-{target}"
                (d / "src").mkdir(parents=True)
                (d / "src" / "config.json").write_text(json.dumps(LLAMA))
                aim = d / "elsewhere" / "t"
                aim.parent.mkdir()
                if target == "existing":
                    aim.write_text("precious")
                (d / "link").symlink_to(aim)
                args = ["-o", str(d / "link")] if flag == "-o" else ["-o", str(d / "s.yaml"), "--checkpoint",
                                                                       str(d / "link")]
                rc, _, err = cli("import-hf", str(d / "src"), *args)
                kept = aim.read_text() == "precious" if target == "existing" else not aim.exists()
                return kept and rc == 2 and one_error_line(err)

    @case("confinement", "export-hf -o a link to an empty directory")
    def _():
        from tests.test_hf_hostile import _exported_llama

        d = tmp / "exp"
        d.mkdir()
        with contextlib.redirect_stdout(io.StringIO()):
            _exported_llama(d)
        (d / "empty").mkdir()
        (d / "o").symlink_to(d / "empty")
        rc, _, err = cli("export-hf", str(d / "x.pt"), "-o", str(d / "o"))
        return not any((d / "empty").iterdir()) and rc == 2 and one_error_line(err)


# ── HF directories ───────────────────────────────────────────────────────────────────────────────────────────────


def probe_hf(tmp: Path) -> None:
    from tests.test_hf_hostile import LLAMA, NUMERIC

    values = [10**9, 10**18, 2**63, -1, -(10**9), 0, 1e9, float("nan"), float("inf"), 2.5, True, "12", None]
    for key in NUMERIC:
        for v in values:
            @case("hf", f"{key}={v!r}")
            def _():
                d = Path(tempfile.mkdtemp(dir=tmp))
                (d / "config.json").write_text(json.dumps({**LLAMA, key: v}))
                rc, _, err = cli("import-hf", str(d), "-o", str(d / "o.yaml"))
                return rc == 0 or (rc == 2 and one_error_line(err))

    @case("hf", "an unmapped key of 10 MB")
    def _():
        d = Path(tempfile.mkdtemp(dir=tmp))
        (d / "config.json").write_text(json.dumps({**LLAMA, "k" * 10_000_000: 1}))
        rc, _, err = cli("import-hf", str(d), "-o", str(d / "o.yaml"))
        return rc == 2 and one_error_line(err)

    @case("hf", "unmapped fields refused on one line")
    def _():
        d = Path(tempfile.mkdtemp(dir=tmp))
        (d / "config.json").write_text(json.dumps({**LLAMA, "foo": 1, "bar": 2}))
        rc, _, err = cli("import-hf", str(d), "-o", str(d / "o.yaml"))
        return rc == 2 and one_error_line(err)

    for tamper in ("nan", "inf", "int32", "int8", "bool"):
        @case("hf", f"weights: {tamper}")
        def _():
            import torch
            from safetensors.torch import load_file, save_file

            from tests.test_hf_hostile import _exported_llama

            d = Path(tempfile.mkdtemp(dir=tmp))
            with contextlib.redirect_stdout(io.StringIO()):
                src = _exported_llama(d)
            tensors = load_file(str(src / "model.safetensors"))
            name = next(k for k in tensors if k.endswith("q_proj.weight"))
            t = tensors[name].clone()
            if tamper in ("nan", "inf"):
                t[0, 0] = float(tamper)
            else:
                t = t.to(getattr(torch, tamper))
            tensors[name] = t
            save_file(tensors, str(src / "model.safetensors"))
            rc, _, err = cli("import-hf", str(src), "-o", str(d / "s.yaml"), "--checkpoint", str(d / "w.pt"))
            return rc == 2 and one_error_line(err)

    @case("hf", "Gemma hidden_act gelu: logits equal transformers'")
    def _():
        import torch

        from tests.test_hf_interop import _hf_dir, _hf_logits, _logits

        d = Path(tempfile.mkdtemp(dir=tmp))
        hf, src = _hf_dir(d, "gemma", seed=3)
        config = json.loads((src / "config.json").read_text())
        config.update(hidden_act="gelu")
        config.pop("hidden_activation", None)
        (src / "config.json").write_text(json.dumps(config))
        rc, _, _ = cli("import-hf", str(src), "-o", str(d / "g.yaml"), "--checkpoint", str(d / "g.pt"))
        from archspec.codegen import generate
        from archspec.spec import load_spec

        spec = load_spec(d / "g.yaml")
        model = generate(spec, write=False).Model()
        model.load_state_dict(torch.load(d / "g.pt", weights_only=True)["model"])
        idx = torch.randint(0, spec.model.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
        return rc == 0 and torch.allclose(_logits(model, idx), _hf_logits(hf, idx), atol=2e-5)

    @case("hf", "released DeepSeek-V3 config with aux_loss_alpha, seq_aux")
    def _():
        from tests.test_hf_interop import _V3

        d = Path(tempfile.mkdtemp(dir=tmp))
        data = {k: v for k, v in _V3.items() if k != "quantization_config"}
        (d / "config.json").write_text(json.dumps({**data, "aux_loss_alpha": 0.001, "seq_aux": True}))
        return cli("import-hf", str(d), "-o", str(d / "o.yaml"))[0] == 0

    @case("hf", "phi-2's dropouts")
    def _():
        d = Path(tempfile.mkdtemp(dir=tmp))
        (d / "config.json").write_text(json.dumps({
            "model_type": "phi", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 16, "resid_pdrop": 0.1,
            "embd_pdrop": 0.0, "attention_dropout": 0.0, "hidden_act": "gelu_new", "layer_norm_eps": 1e-5}))
        return cli("import-hf", str(d), "-o", str(d / "o.yaml"))[0] == 0

    @case("hf", "import-hf --help lists every type")
    def _():
        from archspec.hf.types import TYPES

        text = " ".join(cli("import-hf", "--help")[1].split())
        return all(t in text for t in TYPES)


# ── UI ───────────────────────────────────────────────────────────────────────────────────────────────────────────


def probe_ui(tmp: Path) -> None:
    from starlette.testclient import TestClient

    from archspec.registry import Registry
    from archspec.ui.app import create_app
    from tests.registry.helpers import make_info, make_spec, populate, record_run

    url = f"sqlite:///{tmp}/ui.db"
    reg = Registry(url)
    ids = populate(reg)
    bidi = "safe\u202etxt.exe\u2066x\u2069\x1b[2J\x07\u200bend"
    run = record_run(reg, make_info(make_spec("bidi"), seed=4, sweep="s" + bidi, tags={"note": bidi}),
                     {"val_loss": [(0, 5.0)]}, status="FINISHED", summary={"val_loss": 5.0})
    app = create_app(url)
    for host, code in (("127.0.0.1", 200), ("localhost", 200), ("testserver", 400), ("[::1]", 400),
                       ("evil.example", 400)):
        @case("ui", f"Host {host} → {code}")
        def _():
            return TestClient(app, base_url=f"http://{host}").get("/api/runs").status_code == code

    client = TestClient(app, base_url="http://127.0.0.1")
    for path in ("/", f"/runs/{run}", "/sweeps", f"/compare?ids={run},{ids['llama0']}", "/?columns=tags.note",
                 f"/api/runs/{run}", "/api/runs?columns=tags.note"):
        @case("ui", f"control/bidi escaped: {path}")
        def _():
            body = client.get(path).text
            return not any(c in body for c in ("\u202e", "\u2066", "\u2069", "\x1b", "\x07", "\u200b"))

    @case("ui", "a warning for --host 0.0.0.0")
    def _():
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        rc, _, err = cli("ui", "--registry", url, "--check", "--host", "0.0.0.0", "--port", str(port))
        return rc == 0 and "warning" in err


# ── smaller ──────────────────────────────────────────────────────────────────────────────────────────────────────


def probe_small(tmp: Path) -> None:
    for value in ("1,,2", "1,", ",1", "1_000", "\u0661", "0x1", "1,a"):
        @case("small", f"--seeds {value!r}")
        def _():
            rc, _, err = cli("ablate", str(tmp / "none.yaml"), "--seeds", value)
            return rc == 2 and "seeds" in err

    @case("small", "runs delete interrupted after it finished says what it did")
    def _():
        from archspec.registry import Registry
        from archspec.registry.store import Registry as Store
        from tests.registry.helpers import populate
        from tests.registry.test_housekeeping import run_dir

        d = tmp / "del-int"
        d.mkdir()
        url = f"sqlite:///{d}/reg.db"
        reg = Registry(url)
        ids = populate(reg)
        run_dir(reg, d, ids["llama1"])
        real = Store.delete_runs

        def interrupted(self, run_ids):
            out = real(self, run_ids)
            os.kill(os.getpid(), signal.SIGTERM)
            return out

        Store.delete_runs = interrupted
        try:
            rc, out, err = cli("runs", "delete", ids["llama1"], "--yes", "--registry", url)
        finally:
            Store.delete_runs = real
        return "deleted 1 run" in out

    d = tmp / "quant"
    d.mkdir()
    spec = {**_tiny_spec(tmp), "name": "q"}
    spec["train"] = {**spec["train"], "steps": 4}
    import yaml

    (d / "q.yaml").write_text(yaml.safe_dump(spec))
    os.environ["ARCHSPEC_CACHE"] = str(tmp / "cache")
    rc, out, _ = cli("train", str(d / "q.yaml"), "--json", "-q", "--device", "cpu", "--run-dir", str(d / "run"),
                     "--registry", f"sqlite:///{d}/r.db")
    run_id = json.loads(out.strip().splitlines()[-1])["run_id"] if rc == 0 else None
    for scheme, part in (("int8", "__scale"), ("int4", ".scale"), ("int4", ".minimum")):
        @case("small", f"sample of a {scheme} file with a huge {part}")
        def _():
            import torch

            from archspec.train.checkpoint import save_quantized

            rc, out, _ = cli("quantize", run_id, "--scheme", scheme, "--json", "--registry", f"sqlite:///{d}/r.db")
            state = torch.load(json.loads(out)["checkpoint"], weights_only=True)
            name = next(k for k in state["model"] if k.endswith(part))
            state["model"][name] = state["model"][name].clone().fill_(1e30)
            bad = d / f"bad-{scheme}{part}.pt"
            save_quantized(bad, {k: v for k, v in state.items() if k not in ("digest", "format")})
            rc, _, err = cli("sample", str(bad), "--prompt", "def ", "--max-new-tokens", "3", "--temperature", "0")
            return rc == 2 and one_error_line(err)


def main() -> None:
    global VERBOSE
    p = argparse.ArgumentParser()
    p.add_argument("--pg", help="a PostgreSQL URL with a password, for the secrets class's end-to-end cases")
    p.add_argument("--only", default="launcher,secrets,confinement,hf,ui,small")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args()
    VERBOSE = args.verbose
    limit = 8 << 30  # 1e9 layers must not take the machine down: it must be refused, not attempted
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    tmp = Path(tempfile.mkdtemp(prefix="trust-probe-"))
    os.environ.setdefault("ARCHSPEC_CACHE", str(tmp / "cache"))
    os.environ["ARCHSPEC_HOME"] = str(tmp / "home")
    try:
        for cls in args.only.split(","):
            probe = {"launcher": probe_launcher, "secrets": lambda t: probe_secrets(t, args.pg),
                     "confinement": probe_confinement, "hf": probe_hf, "ui": probe_ui, "small": probe_small}[cls]
            sub = tmp / cls
            sub.mkdir()
            try:
                probe(sub)
            except Exception:  # noqa: BLE001 (a probe that cannot even set up: its cases count as unclean)
                RESULTS.setdefault(cls, []).append(("(setup)", False))
                if VERBOSE:
                    traceback.print_exc(limit=3)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    total_ok = total = 0
    for cls, cases in RESULTS.items():
        ok = sum(c for _, c in cases)
        total_ok, total = total_ok + ok, total + len(cases)
        print(f"{cls}: {ok}/{len(cases)} clean")
        if VERBOSE:
            for name, c in cases:
                if not c:
                    print(f"    unclean: {name[:100]!r}")
    print(f"total: {total_ok}/{total} clean")


VERBOSE = False

if __name__ == "__main__":
    main()
