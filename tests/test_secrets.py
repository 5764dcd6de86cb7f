"""A registry password never reaches a line or a file archspec writes (archspec.errors.redact, the one redaction),
the workers of a launcher get it through their environment, and `ablate` never says "trained" of a run that did not
train (issue 42).

A SQLite URL cannot carry a password: these tests use a postgresql+psycopg URL string where the code only shows or
writes it, and a SQLite registry where something must be read (the report), opened through a patched constructor
that records the URL it was given."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from archspec.cli import main
from archspec.errors import UserError, printable, redact
from tests.ablate.conftest import base_spec, corpus, session_cache, workdir  # noqa: F401 (pytest fixtures)

SECRET = "Pa55-w0rd!x"
PG = f"postgresql+psycopg://alice:{quote(SECRET, safe='')}@db.example:5432/reg?sslmode=require"

TEXT = st.text(st.characters(codec="utf-8", exclude_characters="@"), max_size=30)


@given(before=TEXT, after=TEXT, user=st.text("abcxyz_.", min_size=1, max_size=8),
       password=st.text(st.characters(codec="ascii", exclude_categories=("Cc",)), min_size=1, max_size=24),
       scheme=st.sampled_from(["postgresql", "postgresql+psycopg", "mysql+pymysql", "redis", "https"]))
@settings(max_examples=200, deadline=None)
def test_redact_hides_every_password_a_url_carries(before, after, user, password, scheme):
    marked = "ZQ" + password  # distinctive: it cannot come from the text around it
    url = f"{scheme}://{user}:{quote(marked, safe='')}@host:5432/db"
    out = redact(f"{before} {url} {after}")
    assert quote(marked, safe="") not in out and "ZQ" not in out.replace(before, "").replace(after, "")
    assert f"{scheme}://{user}:***@host:5432/db" in out
    query = f"postgresql://{user}@host/db?sslmode=require&password={quote(marked, safe='')}"
    assert "ZQ" not in redact(query).replace(user, "") and "sslmode=require" in redact(query)


@pytest.mark.parametrize("text", ["sqlite:///registry/archspec.db", "postgresql://alice@db/reg", "https://x.org/a:b",
                                  "lr=3e-3 steps=10", "a: b @ c"])
def test_redact_leaves_text_without_a_password_as_it_is(text):
    assert redact(text) == text


def test_messages_console_lines_and_registry_urls_are_redacted(capsys):
    from archspec.console import echo, make_console

    assert SECRET not in UserError(f"cannot open registry {PG}: timeout").render()
    assert SECRET not in printable(PG) and "***" in printable(PG)
    echo(f"follow them with: archspec ablate s.yaml --status --registry {PG}")
    make_console(stderr=True).print(f"registry {PG}")
    make_console(data=True).print(PG)
    out, err = capsys.readouterr()
    assert SECRET not in out + err and quote(SECRET, safe="") not in out + err and out.count("***") == 2


def _sweep(workdir: Path, base_spec: dict, **extra) -> Path:
    sweep = {"name": "sec", "base": base_spec, "seeds": [0], "budget": {"steps": 2},
             "grid": {"model.norm.kind": ["rmsnorm"]}, **extra}
    path = workdir / "sec.yaml"
    path.write_text(yaml.safe_dump(sweep))
    return path


def _files_holding(root: Path, needles: list[str]) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and any(n.encode() in p.read_bytes() for n in needles)]


def test_the_sweep_report_and_run_directories_hold_no_password(workdir, base_spec, capsys, monkeypatch):
    """The sweep is trained into SQLite; the report is then rebuilt by `archspec report --registry <a PostgreSQL URL
    with a password>` whose Registry is the SQLite one: every file the report writes, and every line printed, is
    checked for the password (plain and percent-encoded)."""
    import archspec.registry as registry_module
    from archspec.registry import Registry

    sqlite = f"sqlite:///{workdir / 'reg.db'}"
    path = _sweep(workdir, base_spec)
    assert main(["ablate", str(path), "--registry", sqlite, "--no-compile", "--device", "cpu", "--json"]) == 0
    capsys.readouterr()
    opened = []

    def registry(url=None, **kwargs):
        opened.append(url)
        return Registry(sqlite, **kwargs)

    monkeypatch.setattr(registry_module, "Registry", registry)
    assert main(["report", str(path), "--registry", PG, "--out", str(workdir / "out")]) == 0
    out, err = capsys.readouterr()
    assert opened and opened[0] == PG  # the report was asked for the password URL
    needles = [SECRET, quote(SECRET, safe="")]
    written = list((workdir / "out").iterdir())
    assert any(p.suffix == ".html" for p in written)
    assert "db.example" in (workdir / "out" / "sec.html").read_text()  # the registry is named, its password not
    assert _files_holding(workdir / "out", needles) == [] and _files_holding(workdir / "runs", needles) == []
    assert not any(n in out + err for n in needles)


def test_ablate_does_not_say_trained_when_the_workers_trained_nothing(workdir, base_spec, capsys, monkeypatch):
    """A launcher whose workers could not open the registry (REFUSED) or whose runs stayed SCHEDULED: the command
    says so and exits non-zero, instead of '1 trained' and exit 0."""
    pytest.importorskip("submitit")
    import archspec.launch.sweeps as sweeps
    from archspec.launch.base import WorkerResult

    for status in ("REFUSED", "SCHEDULED", "KILLED"):
        monkeypatch.setattr(sweeps, "launch", lambda launcher, payloads, registry, **kw: [
            WorkerResult(p.run_id, status, "cannot open registry postgresql://alice:***@db/reg: password "
                                           "authentication failed") for p in payloads])
        path = _sweep(workdir, base_spec)
        rc = main(["ablate", str(path), "--registry", f"sqlite:///{workdir / 'reg.db'}", "--no-compile", "--device",
                   "cpu", "--launcher", "slurm-local"])
        err = capsys.readouterr().err
        assert rc != 0, status
        assert "0 trained, 1 NOT trained" in err and "were not trained" in err and "authentication failed" in err


def test_worker_url_is_given_the_url_that_connects_and_workers_put_the_password_back(monkeypatch):
    """`registry.url` is redacted for messages: the launcher must hand its workers the engine's URL (the one that
    connects), whose password goes to PGPASSWORD; the worker puts it back for any driver."""
    from sqlalchemy.engine import make_url

    from archspec.launch.base import with_password, worker_url

    with pytest.raises(ValueError, match="redacted"):
        worker_url(redact(PG))
    job_url, env = worker_url(make_url(PG).render_as_string(hide_password=False))
    assert env == {"PGPASSWORD": SECRET} and SECRET not in job_url
    monkeypatch.setenv("PGPASSWORD", SECRET)
    assert make_url(with_password(job_url)).password == SECRET
    assert with_password("sqlite:///x.db") == "sqlite:///x.db"
    source = (Path(__file__).parents[1] / "archspec" / "launch" / "sweeps.py").read_text()
    assert "worker_url(registry.url)" not in source  # the redacted form would hand the workers PGPASSWORD=***


def test_ray_tasks_never_carry_the_password_in_their_runtime_env(recwarn):
    """Ray's runtime_env agent writes a task's env_vars into its log files: a local cluster's workers inherit the
    password from the environment the cluster was started in; a remote cluster is told to provide it."""
    from archspec.launch.base import Payload
    from archspec.launch.ray import RayLauncher
    from archspec.launch.settings import LauncherSettings

    seen = []

    class Ref:
        def task_id(self):
            return type("T", (), {"hex": lambda self: "t1"})()

    class Task:
        def options(self, **kw):
            seen.append(kw)
            return self

        def remote(self, payload):
            return Ref()

    class FakeRay:
        def remote(self, fn):
            return Task()

    for address in (None, "ray://head:10001"):
        launcher = object.__new__(RayLauncher)
        launcher.ray, launcher.env = FakeRay(), {"PGPASSWORD": SECRET}
        launcher.settings = LauncherSettings(kind="ray", ray_address=address)
        launcher.submit([Payload(spec={}, run_id="r", registry_url="postgresql://alice@db/reg")])
    assert seen and all("runtime_env" not in kw and SECRET not in repr(kw) for kw in seen)
    assert any("not sent to the cluster" in str(w.message) for w in recwarn.list)
