"""Launchers (archspec.launch): the same sweep through slurm-local (submitit's subprocesses) and Ray as through this
process, with the same run keys and losses; a job killed mid-run retried; the sbatch script archspec generates; the
refusals. Tiny spec, no compile, 4 steps: each run takes about a second, most of a test is process start-up."""

from __future__ import annotations

import json
import os
import stat
import sys

import pytest
import yaml

from archspec.cli import main
from archspec.registry import Registry

# Worker processes start per test (submitit, Ray): marked slow like the registry's multi-process tests.
pytestmark = pytest.mark.slow

PG_URL = os.environ.get("ARCHSPEC_TEST_PG_URL")
BACKENDS = ["sqlite", pytest.param("postgres", marks=[
    pytest.mark.postgres, pytest.mark.skipif(not PG_URL, reason="ARCHSPEC_TEST_PG_URL not set")])]


def write_sweep(workdir, base_spec, grid=None, seeds=(0, 1), name="mini", **extra):
    sweep = {"name": name, "base": base_spec, "seeds": list(seeds), "budget": {"steps": 4},
             "grid": grid or {"model.norm.kind": ["layernorm", "rmsnorm"]}, **extra}
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(sweep))
    return path


@pytest.fixture
def url(request, workdir):
    backend = getattr(request, "param", "sqlite")
    if backend == "sqlite":
        yield f"sqlite:///{workdir / 'reg.db'}"
        return
    import uuid

    from sqlalchemy import create_engine, text

    schema = "t_" + uuid.uuid4().hex[:12]
    admin = create_engine(PG_URL)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield f"{PG_URL}{'&' if '?' in PG_URL else '?'}options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def losses(url: str, sweep: str) -> dict[str, float]:
    return {r.id: r.summary["val_loss"] for r in Registry(url).runs(where=f"sweep = '{sweep}'")}


@pytest.mark.parametrize("url", BACKENDS, indirect=True)
def test_slurm_local_runs_the_sweep_with_the_local_run_keys_and_losses(workdir, base_spec, url, capsys):
    path = write_sweep(workdir, base_spec)
    local_url = f"sqlite:///{workdir / 'local.db'}"
    assert main(["ablate", str(path), "--registry", local_url, "--no-compile", "--device", "cpu", "--json"]) == 0
    capsys.readouterr()
    assert main(["ablate", str(path), "--registry", url, "--no-compile", "--device", "cpu", "--json",
                 "--launcher", "slurm-local", "--max-parallel", "2"]) == 0
    capsys.readouterr()
    here, there = losses(local_url, "mini"), losses(url, "mini")
    assert len(here) == 4 and set(here) == set(there)  # the same run keys
    for run_id in here:
        assert there[run_id] == pytest.approx(here[run_id], abs=1e-6)
    rows = Registry(url).runs(where="sweep = 'mini'")
    assert {r.status for r in rows} == {"FINISHED"}
    assert all(r.scheduler_job for r in rows)  # the local job's id, recorded at submission and by the worker
    assert main(["ablate", str(path), "--registry", url, "--status"]) == 0
    out = capsys.readouterr().out
    assert "finished" in out and out.count(" 2 ") >= 2


def test_a_job_killed_mid_run_is_marked_killed_retried_and_the_sweep_completes(workdir, base_spec, capsys,
                                                                               monkeypatch):
    path = write_sweep(workdir, base_spec, grid={"model.norm.kind": ["rmsnorm"]}, seeds=(0,))
    url = f"sqlite:///{workdir / 'reg.db'}"
    monkeypatch.setenv("ARCHSPEC_TEST_DIE_ON_ATTEMPT", "1")  # each worker SIGKILLs itself in its first attempt
    assert main(["ablate", str(path), "--registry", url, "--no-compile", "--device", "cpu",
                 "--launcher", "slurm-local", "--retries", "1"]) == 0
    err = capsys.readouterr().err
    assert "marked KILLED" in err and "resubmitting 1 job(s)" in err
    (run,) = Registry(url).runs(where="sweep = 'mini'")
    assert run.status == "FINISHED" and run.attempt == 2  # the killed attempt, then the retry


def test_a_job_that_dies_every_time_ends_killed_never_running(workdir, base_spec, capsys, monkeypatch):
    path = write_sweep(workdir, base_spec, grid={"model.norm.kind": ["rmsnorm"]}, seeds=(0,))
    url = f"sqlite:///{workdir / 'reg.db'}"
    monkeypatch.setenv("ARCHSPEC_TEST_DIE_ON_ATTEMPT", "1")
    main(["ablate", str(path), "--registry", url, "--no-compile", "--device", "cpu", "--launcher", "slurm-local",
          "--retries", "0"])
    capsys.readouterr()
    (run,) = Registry(url).runs(where="sweep = 'mini'")
    assert run.status == "KILLED" and "died" in run.error
