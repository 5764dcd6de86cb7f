"""Launchers (archspec.launch): the same sweep through slurm-local (submitit's subprocesses) and Ray as through this
process, with the same run keys and losses; a job killed mid-run retried; the sbatch script archspec generates; the
refusals. Tiny spec, no compile, 4 steps: each run takes about a second, most of a test is process start-up."""

from __future__ import annotations

import os
import stat

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

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


_LOCAL: dict[str, dict[str, float]] = {}


def local_losses(workdir, path, capsys) -> dict[str, float]:
    """The sweep under --launcher local, trained once per session (run ids are content keys: the same in every
    test's registry, the corpus and cache being the session's)."""
    if "mini" not in _LOCAL:
        url = f"sqlite:///{workdir / 'local.db'}"
        assert main(["ablate", str(path), "--registry", url, "--no-compile", "--device", "cpu", "--json"]) == 0
        capsys.readouterr()
        _LOCAL["mini"] = losses(url, "mini")
    return _LOCAL["mini"]


@pytest.mark.parametrize("url", BACKENDS, indirect=True)
def test_slurm_local_runs_the_sweep_with_the_local_run_keys_and_losses(workdir, base_spec, url, capsys):
    path = write_sweep(workdir, base_spec)
    here = local_losses(workdir, path, capsys)
    assert main(["ablate", str(path), "--registry", url, "--no-compile", "--device", "cpu", "--json",
                 "--launcher", "slurm-local", "--max-parallel", "2"]) == 0
    capsys.readouterr()
    there = losses(url, "mini")
    assert len(here) == 4 and set(here) == set(there)  # the same run keys
    for run_id in here:
        assert there[run_id] == pytest.approx(here[run_id], abs=1e-6)
    rows = Registry(url).runs(where="sweep = 'mini'")
    assert {r.status for r in rows} == {"FINISHED"}
    assert all(r.scheduler_job for r in rows)  # the local job's id, recorded at submission and by the worker
    assert main(["ablate", str(path), "--registry", url, "--status"]) == 0
    out = capsys.readouterr().out
    assert "finished" in out and out.count(" 2 ") >= 2


def test_a_job_killed_mid_run_is_marked_killed_then_retried_and_the_sweep_completes(workdir, base_spec, capsys,
                                                                                  monkeypatch):
    path = write_sweep(workdir, base_spec, grid={"model.norm.kind": ["rmsnorm"]}, seeds=(0,))
    url = f"sqlite:///{workdir / 'reg.db'}"
    monkeypatch.setenv("ARCHSPEC_TEST_DIE_ON_ATTEMPT", "1")  # each worker SIGKILLs itself in its first attempt
    args = ["ablate", str(path), "--registry", url, "--no-compile", "--device", "cpu", "--launcher", "slurm-local"]
    main([*args, "--retries", "0"])  # no retry: the run its dead job left RUNNING is KILLED at once
    assert "marked KILLED" in capsys.readouterr().err
    (run,) = Registry(url).runs(where="sweep = 'mini'")
    assert run.status == "KILLED" and "died" in run.error
    assert main([*args, "--retries", "1"]) == 0  # the first attempt dies again, the retry finishes
    err = capsys.readouterr().err
    assert "marked KILLED" in err and "resubmitting 1 job(s)" in err
    (run,) = Registry(url).runs(where="sweep = 'mini'")
    assert run.status == "FINISHED" and run.attempt == 3  # killed, killed, finished: never left RUNNING


STUB_SBATCH = """#!/bin/sh
# records the script it is given, as sbatch would read it, and answers as sbatch does
n=$(ls "{record}" | wc -l)
cp "$1" "{record}/script-$n.sh"
echo "Submitted batch job 1234"
"""


@pytest.fixture
def stub_sbatch(tmp_path, monkeypatch):
    bin_dir, record = tmp_path / "bin", tmp_path / "sbatch-record"
    bin_dir.mkdir()
    record.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(STUB_SBATCH.format(record=record))
    sbatch.chmod(sbatch.stat().st_mode | stat.S_IEXEC)
    srun = bin_dir / "srun"  # submitit looks for it; only the job script (never run here) calls it
    srun.write_text("#!/bin/sh\nexit 1\n")
    srun.chmod(srun.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return record


def test_the_sbatch_script_asks_for_the_planned_resources(workdir, stub_sbatch):
    """The launcher as the sweep uses it, over a stub sbatch: one job array with GPUs, time, memory, partition,
    account, qos and the extra options, the time from the estimate with its margin."""
    from archspec.launch.base import Payload, Resources
    from archspec.launch.settings import LauncherSettings
    from archspec.launch.slurm import SubmititLauncher

    settings = LauncherSettings(kind="slurm", partition="gpu", account="lab", qos="high", max_parallel=2,
                                sbatch=["--constraint=a100", "--exclusive"], folder=str(workdir / "jobs"))
    launcher = SubmititLauncher(settings)
    payloads = [Payload(spec={}, run_id=f"r{i}", registry_url="postgresql://x/y",
                        resources=Resources(gpus=1, cpus=8, mem_mb=6000, time_min=42)) for i in range(3)]
    handles = launcher.submit(payloads)
    assert [h.job_id for h in handles] == ["1234_0", "1234_1", "1234_2"]  # one array, one task per job
    (script,) = [p.read_text() for p in stub_sbatch.iterdir()]
    for line in ("#SBATCH --gpus-per-node=1", "#SBATCH --time=42", "#SBATCH --mem=6000MB", "#SBATCH --cpus-per-task=8",
                 "#SBATCH --partition=gpu", "#SBATCH --account=lab", "#SBATCH --qos=high", "#SBATCH --array=0-2%2",
                 "#SBATCH --constraint=a100", "#SBATCH --exclusive", "#SBATCH --ntasks-per-node=1"):
        assert line in script.splitlines(), (line, script)


@pytest.mark.skipif(not PG_URL, reason="--launcher slurm refuses SQLite: needs ARCHSPEC_TEST_PG_URL")
@pytest.mark.parametrize("url", ["postgres"], indirect=True)
def test_ablate_detach_submits_an_array_and_records_scheduled_runs(workdir, base_spec, url, stub_sbatch, capsys):
    path = write_sweep(workdir, base_spec)
    assert main(["ablate", str(path), "--registry", url, "--no-compile", "--launcher", "slurm", "--detach",
                 "--partition", "gpu", "--account", "lab", "--time-min", "30"]) == 0
    out, err = capsys.readouterr()
    assert "--status" in out and "1234_0" in err
    (script,) = [p.read_text() for p in stub_sbatch.iterdir()]
    lines = script.splitlines()
    assert {"#SBATCH --gpus-per-node=1", "#SBATCH --time=30", "#SBATCH --partition=gpu", "#SBATCH --account=lab",
            "#SBATCH --array=0-3%4"} <= set(lines)
    assert any(line.startswith("#SBATCH --mem=") and line.endswith("MB") for line in lines)
    rows = Registry(url).runs(where="sweep = 'mini'")
    assert len(rows) == 4 and {r.status for r in rows} == {"SCHEDULED"}
    assert sorted(r.scheduler_job for r in rows) == ["1234_0", "1234_1", "1234_2", "1234_3"]
    assert main(["ablate", str(path), "--registry", url, "--status"]) == 0
    assert "queued" in capsys.readouterr().out


@pytest.mark.parametrize("args, words", [
    (["--launcher", "slurm"], "no `sbatch` on PATH"),
    (["--launcher", "ray", "--ray-address", "ray://head:10001"], "PostgreSQL"),
    (["--launcher", "slurm-local", "--partition", "gpu"], "SLURM options"),
    (["--launcher", "slurm-local", "--ray-address", "auto"], "--ray-address is an option of --launcher ray"),
    (["--detach"], "--detach needs --launcher slurm"),
    (["--launcher", "slurm-local", "--detach"], "--detach needs --launcher slurm"),
    (["--launcher", "pbs"], "Invalid value for '--launcher'"),
    (["--launcher", "slurm-local", "--max-parallel", "0"], "Invalid value for '--max-parallel'"),
])
def test_bad_launcher_requests_exit_2_with_one_line(workdir, base_spec, capsys, monkeypatch, args, words):
    monkeypatch.setenv("PATH", "/nonexistent")  # no sbatch here, whatever the machine has
    path = write_sweep(workdir, base_spec)
    assert main(["ablate", str(path), "--registry", f"sqlite:///{workdir / 'reg.db'}", *args]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err
    assert not (workdir / "reg.db").exists()  # refused before anything was recorded


def test_slurm_refuses_sqlite_naming_postgresql(workdir, base_spec, stub_sbatch, capsys):
    path = write_sweep(workdir, base_spec)
    assert main(["ablate", str(path), "--registry", f"sqlite:///{workdir / 'reg.db'}", "--launcher", "slurm"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--registry postgresql://" in err and len(err.splitlines()) == 1
    assert main(["ablate", str(path), "--registry", "postgresql://u@nowhere.invalid/db", "--launcher", "slurm",
                 "--sbatch", "constraint=a100"]) == 2  # checked before the registry is opened
    err = capsys.readouterr().err.strip()
    assert "expected an sbatch long option" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("kind, extra", [("slurm-local", "slurm"), ("ray", "ray")])
def test_a_missing_extra_names_it(workdir, base_spec, capsys, monkeypatch, kind, extra):
    import importlib.util

    real = importlib.util.find_spec
    module = "submitit" if extra == "slurm" else "ray"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == module else real(name, *a))
    path = write_sweep(workdir, base_spec)
    assert main(["ablate", str(path), "--registry", f"sqlite:///{workdir / 'reg.db'}", "--launcher", kind]) == 2
    assert f"pip install 'archspec[{extra}]'" in capsys.readouterr().err


def test_the_sweep_file_launcher_section_is_read_and_checked(workdir, base_spec, capsys, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    path = write_sweep(workdir, base_spec, launcher={"kind": "slurm", "partition": "gpu"})
    assert main(["ablate", str(path), "--registry", f"sqlite:///{workdir / 'reg.db'}"]) == 2
    assert "no `sbatch` on PATH" in capsys.readouterr().err  # the file's kind, checked like the option
    bad = write_sweep(workdir, base_spec, name="bad", launcher={"kind": "slurm", "partitoin": "gpu"})
    assert main(["ablate", str(bad), "--registry", f"sqlite:///{workdir / 'reg.db'}"]) == 2
    assert "launcher.partitoin" in capsys.readouterr().err


def test_a_local_ray_cluster_runs_the_sweep_with_the_local_run_keys_and_losses(workdir, base_spec, capsys):
    pytest.importorskip("ray")
    path = write_sweep(workdir, base_spec)
    here, ray_url = local_losses(workdir, path, capsys), f"sqlite:///{workdir / 'ray.db'}"
    assert main(["ablate", str(path), "--registry", ray_url, "--no-compile", "--device", "cpu", "--json",
                 "--launcher", "ray", "--max-parallel", "2"]) == 0  # ray.init(num_cpus=2): one CPU per task
    capsys.readouterr()
    there = losses(ray_url, "mini")
    assert len(here) == 4 and set(here) == set(there)
    for run_id in here:  # Ray gives a task one thread (its one CPU): equal within float rounding, not bitwise
        assert there[run_id] == pytest.approx(here[run_id], abs=1e-5)
    assert all(r.scheduler_job and r.status == "FINISHED" for r in Registry(ray_url).runs(where="sweep = 'mini'"))


def test_train_with_slurm_local_trains_one_run_in_a_worker(workdir, base_spec, capsys):
    spec = workdir / "tiny.yaml"
    spec.write_text(yaml.safe_dump(base_spec))
    url = f"sqlite:///{workdir / 'reg.db'}"
    assert main(["train", str(spec), "--steps", "2", "--registry", url, "--no-compile", "--device", "cpu",
                 "--launcher", "slurm-local"]) == 0
    err = capsys.readouterr().err
    assert "FINISHED" in err
    (run,) = Registry(url).runs()
    assert run.status == "FINISHED" and run.scheduler_job and run.recipe["steps"] == 2
    assert err.count(run.id) == 1, err  # said once, at submission
    assert not list(workdir.rglob("%j"))  # no literal folder pattern left beside the job's own folder
    logs = list(workdir.rglob(f"{run.scheduler_job}_0_log.err"))
    assert logs and f"run {run.id}" in logs[0].read_text()  # the job's log holds the run's own lines


@pytest.mark.skipif(not PG_URL, reason="a multi-node job refuses SQLite: needs ARCHSPEC_TEST_PG_URL")
@pytest.mark.parametrize("url", ["postgres"], indirect=True)
def test_a_multi_node_train_job_runs_torchrun_in_the_allocation(workdir, base_spec, url, stub_sbatch, capsys):
    spec = workdir / "tiny.yaml"
    spec.write_text(yaml.safe_dump(base_spec))
    assert main(["train", str(spec), "--registry", url, "--launcher", "slurm", "--nodes", "2", "--gpus-per-task",
                 "8", "--partition", "gpu", "--time-min", "90", "--detach"]) == 0
    capsys.readouterr()
    (script,) = [p.read_text() for p in stub_sbatch.iterdir()]
    lines = script.splitlines()
    assert {"#SBATCH --nodes=2", "#SBATCH --gpus-per-node=8", "#SBATCH --ntasks-per-node=1", "#SBATCH --time=90",
            "#SBATCH --partition=gpu"} <= set(lines)
    (torchrun,) = [line for line in lines if "torchrun" in line]
    assert ("torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint $MASTER_ADDR:$MASTER_PORT "
            "--rdzv-id $SLURM_JOB_ID -m archspec train " + str(spec)) in torchrun
    assert any(line.startswith("export MASTER_ADDR=") and "scontrol show hostnames" in line for line in lines)


def test_train_launcher_refusals(workdir, base_spec, capsys):
    spec = workdir / "tiny.yaml"
    spec.write_text(yaml.safe_dump(base_spec))
    url = f"sqlite:///{workdir / 'reg.db'}"
    assert main(["train", str(spec), "--registry", url, "--nodes", "2"]) == 2
    assert "--nodes needs --launcher slurm" in capsys.readouterr().err
    assert main(["train", str(spec), "--registry", url, "--launcher", "slurm-local", "--nodes", "2"]) == 2
    assert "several nodes need --launcher slurm" in capsys.readouterr().err
    assert main(["train", str(spec), "--registry", url, "--launcher", "ray", "--resume", "x.pt"]) == 2
    assert "--resume is not available with --launcher" in capsys.readouterr().err


# ── a registry password never travels in a job file ─────────────────────────────────────────────────────────────


@given(user=st.text("abcxyz_", min_size=1, max_size=8),
       password=st.text(st.characters(codec="ascii", exclude_categories=("Cc",)), min_size=1, max_size=24))
@settings(max_examples=60, deadline=None)
def test_worker_url_takes_the_password_out_into_the_environment(user, password):
    from urllib.parse import quote

    from sqlalchemy.engine import make_url

    from archspec.launch.base import worker_url

    url = f"postgresql+psycopg://{user}:{quote(password, safe='')}@db.example:5432/reg?sslmode=require"
    job_url, env = worker_url(url)
    assert env == {"PGPASSWORD": password}
    parsed = make_url(job_url)
    assert parsed.password is None and parsed.username == user and parsed.host == "db.example"
    assert parsed.database == "reg" and parsed.query == {"sslmode": "require"}
    assert worker_url(job_url) == (job_url, {})  # none to take out
    assert worker_url("sqlite:///reg.db")[1] == {}


def test_exported_sets_the_environment_for_the_block_only(monkeypatch):
    from archspec.launch.base import exported

    monkeypatch.setenv("PGPASSWORD", "before")
    with exported({"PGPASSWORD": "pw", "ARCHSPEC_TEST_EXPORTED": "1"}):
        assert os.environ["PGPASSWORD"] == "pw" and os.environ["ARCHSPEC_TEST_EXPORTED"] == "1"
    assert os.environ["PGPASSWORD"] == "before" and "ARCHSPEC_TEST_EXPORTED" not in os.environ


def _holds(folder, secret: str) -> list[str]:
    return [str(p) for p in folder.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


@pytest.mark.skipif(not PG_URL, reason="--launcher slurm refuses SQLite: needs ARCHSPEC_TEST_PG_URL")
@pytest.mark.parametrize("url", ["postgres"], indirect=True)
def test_no_job_file_or_sbatch_script_holds_the_registry_password(workdir, base_spec, url, stub_sbatch, capsys):
    # The test server trusts loopback connections, so the password is accepted and ignored: what matters is where
    # it is written. A sweep array, then a multi-node train job.
    secret = "s3cr3t-Pw-9"
    with_pw = url.replace("postgres@", f"postgres:{secret}@", 1)
    assert with_pw != url
    path = write_sweep(workdir, base_spec)
    assert main(["ablate", str(path), "--registry", with_pw, "--no-compile", "--launcher", "slurm", "--detach"]) == 0
    spec = workdir / "tiny.yaml"
    spec.write_text(yaml.safe_dump(base_spec))
    assert main(["train", str(spec), "--registry", with_pw, "--launcher", "slurm", "--nodes", "2", "--detach"]) == 0
    capsys.readouterr()
    assert len(list(stub_sbatch.iterdir())) == 2
    assert _holds(stub_sbatch, secret) == [] and _holds(workdir / "runs", secret) == []
    assert "PGPASSWORD" not in os.environ or os.environ["PGPASSWORD"] != secret  # given back after the command


def test_worker_url_takes_a_password_given_in_the_query_out_too():
    from sqlalchemy.engine import make_url

    from archspec.launch.base import worker_url

    job_url, env = worker_url("postgresql+psycopg://u@h:5432/db?password=SECRET&sslmode=require")
    assert env == {"PGPASSWORD": "SECRET"} and "SECRET" not in job_url
    assert make_url(job_url).query == {"sslmode": "require"}


@given(value=st.text(st.characters(codec="ascii", exclude_categories=("Cc",)), min_size=1, max_size=30))
@settings(max_examples=80, deadline=None)
def test_the_multi_node_command_passes_every_set_value_as_one_word_and_runs_nothing(value):
    """The torchrun line reaches `bash -c` on every node: a --set value with $(...), `;`, spaces or quotes must arrive
    as one argument, unexpanded; only the rendezvous placeholders expand."""
    import shlex

    from archspec.launch.slurm import torchrun_setup
    from archspec.launch.train import train_args

    exported = torchrun_setup(2, 1, train_args("s.yaml", [f"name={value}"], None, "postgresql://u@h/db", False,
                                               "auto"))[2]
    line = shlex.split(exported.split("=", 1)[1])[0]  # what the task's environment holds
    words = shlex.split(line.replace("$MASTER_ADDR:$MASTER_PORT", "HOST:1").replace("$SLURM_JOB_ID", "7"))
    assert words[words.index("--set") + 1] == f"name={value}"
    assert "$MASTER_ADDR:$MASTER_PORT" in line and " $SLURM_JOB_ID " in line


def test_a_job_that_died_after_its_run_finished_is_not_trained_again():
    from archspec.launch.base import Died, Handle, Launcher, Payload, launch

    class Once(Launcher):
        name = "stub"
        submitted = 0

        def submit(self, payloads):
            Once.submitted += len(payloads)
            return [Handle(p, f"j{Once.submitted}", native=object()) for p in payloads]

        def wait(self, handles):
            return [Died("SIGKILL at exit") for _ in handles]

    class Reg:
        def mark_killed(self, run_id, why):
            return False  # not RUNNING: it ended

        def run_status(self, run_id):
            return "FINISHED"

        def set_scheduler_job(self, run_id, job):
            pass

    from archspec.launch.settings import LauncherSettings

    (result,) = launch(Once(LauncherSettings()), [Payload(spec={}, run_id="r1", registry_url="sqlite://")], Reg(),
                       retries=2)
    assert result.status == "FINISHED" and Once.submitted == 1
