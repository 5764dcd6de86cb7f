"""A registry that needs a password, end to end (issue 42): a PostgreSQL server with scram-sha-256 authentication
on a Unix socket (no port) in a temporary directory; a sweep through slurm-local whose workers must connect with the
password they never see in a file or on a command line; nothing written holds it.

Skipped where no PostgreSQL server binaries are installed (initdb, pg_ctl). As root, the server runs as the
`postgres` user (initdb refuses root)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from archspec.cli import main
from tests.ablate.conftest import base_spec, corpus, session_cache, workdir  # noqa: F401 (pytest fixtures)
from archspec.registry import Registry

pytestmark = [pytest.mark.slow, pytest.mark.postgres]
SECRET = "Tr0ub4dor-3x"


@pytest.fixture(scope="module")
def password_pg(tmp_path_factory):
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if not initdb or not pg_ctl:
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl)")
    pytest.importorskip("psycopg")
    as_user: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("runuser") is None or subprocess.run(["id", "postgres"], capture_output=True).returncode:
            pytest.skip("running as root without a postgres user to run the server")
        as_user = ["runuser", "-u", "postgres", "--"]
    # Not under pytest's own temporary root: it is private to this user, and the server may run as another.
    root = Path(tempfile.mkdtemp(prefix="archspec-pg-"))
    data, sock, pwfile = root / "data", root / "s", root / "pw"
    sock.mkdir()
    pwfile.write_text(SECRET + "\n")
    for p in (root, sock):
        p.chmod(0o777)
    pwfile.chmod(0o644)
    subprocess.run([*as_user, initdb, "-D", str(data), "-U", "alice", f"--pwfile={pwfile}",
                    "--auth=scram-sha-256", "-E", "UTF8"], check=True, capture_output=True)
    subprocess.run([*as_user, pg_ctl, "-D", str(data), "-w", "-l", str(root / "log"), "-o",
                    f"-k {sock} -c listen_addresses=''", "start"], check=True, capture_output=True)
    try:
        yield f"postgresql+psycopg://alice:{SECRET}@/postgres?host={sock}"
    finally:
        subprocess.run([*as_user, pg_ctl, "-D", str(data), "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("launcher", ["slurm-local", "ray"])
def test_launcher_workers_open_a_registry_that_needs_a_password(password_pg, workdir, base_spec, capsys,
                                                                monkeypatch, launcher):
    pytest.importorskip("submitit" if launcher == "slurm-local" else "ray")
    monkeypatch.delenv("PGPASSWORD", raising=False)
    seed = 0 if launcher == "slurm-local" else 1  # its own run key: a run FINISHED by the other test is skipped
    sweep = {"name": "pw", "base": base_spec, "seeds": [seed], "budget": {"steps": 2},
             "grid": {"model.norm.kind": ["rmsnorm"]}}
    path = workdir / "pw.yaml"
    path.write_text(yaml.safe_dump(sweep))
    rc = main(["ablate", str(path), "--registry", password_pg, "--no-compile", "--device", "cpu",
               "--launcher", launcher, "--max-parallel", "1"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "1 trained" in err and "NOT trained" not in err
    (run,) = [r for r in Registry(password_pg).runs(where="sweep = 'pw'") if r.seed == seed]
    assert run.status == "FINISHED"
    assert SECRET not in out + err
    held = [str(p) for p in workdir.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert held == []  # reports, run directories, submitit's job folder and logs
    assert os.environ.get("PGPASSWORD") is None  # given back after the command
