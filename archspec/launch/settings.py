"""A launcher's settings: the `launcher:` section of a sweep file, with the command line's options over it.

    launcher:
      kind: slurm              # local | slurm | slurm-local | ray
      partition: gpu
      account: my-lab
      qos: normal
      sbatch: ["--constraint=a100"]   # more sbatch options, as given to sbatch
      cpus_per_task: 8
      time_margin: 2.0         # time limit = margin × the dry-run estimate + min_time_min
      max_parallel: 16         # jobs running at once (SLURM array %N, Ray/slurm-local concurrency)
      retries: 1
      ray_address: ray://head:10001

Imported by the sweep file's model (archspec.ablate.sweep): pydantic and the script gate (archspec.launch.shell)
only: no torch, no submitit, no ray.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from archspec.launch.shell import script_problem

LAUNCHERS = ("local", "slurm", "slurm-local", "ray")
LauncherKind = Literal["local", "slurm", "slurm-local", "ray"]
# Launchers whose workers may run on another host: they need a registry every host can write (PostgreSQL).
MULTI_HOST = ("slurm",)  # and `ray` with an address (a cluster); local Ray and slurm-local stay on this host


class LauncherSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    kind: LauncherKind = "local"
    partition: str | None = Field(None, max_length=128)
    account: str | None = Field(None, max_length=128)
    qos: str | None = Field(None, max_length=128)
    sbatch: list[str] = Field(default_factory=list, max_length=64,
                              description="more sbatch options, each as sbatch takes it: --constraint=a100")
    cpus_per_task: int | None = Field(None, ge=1, le=1024, description="default: 4 under SLURM, 1 under Ray")
    gpus_per_task: int | None = Field(None, ge=0, le=64, description="default: 1 when the device is not cpu")
    nodes: int = Field(1, ge=1, le=4096, description="archspec train only: nodes of one torchrun job")
    time_margin: float = Field(2.0, ge=1.0, le=100.0)
    min_time_min: int = Field(10, ge=1, le=10_080)
    time_min: int | None = Field(None, ge=1, le=525_600, description="the time limit itself, instead of the estimate's")
    max_parallel: int | None = Field(None, ge=1, le=100_000)
    retries: int = Field(1, ge=0, le=100)
    ray_address: str | None = Field(None, max_length=512)
    folder: str = Field("runs/launcher", max_length=1024, description="submitit's job files and logs")

    # Every value here may reach a generated sbatch script (archspec.launch.shell): checked when the section is read,
    # from a sweep file or from the command line, so nothing is recorded or submitted first.
    @field_validator("partition", "account", "qos")
    @classmethod
    def _slurm_word(cls, value: str | None) -> str | None:
        problem = None if value is None else script_problem(value, word=True)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("sbatch", "folder", "ray_address")
    @classmethod
    def _script_text(cls, value):
        for item in ([] if value is None else value if isinstance(value, list) else [value]):
            problem = script_problem(item)
            if problem:
                raise ValueError(problem)
        return value

    @property
    def multi_host(self) -> bool:
        return self.kind in MULTI_HOST or (self.kind == "ray" and self.ray_address is not None)


def merged(section: LauncherSettings | None, **options) -> LauncherSettings:
    """The sweep file's section (or the defaults) with every command-line option that was given (not None) over it."""
    base = (section or LauncherSettings()).model_dump()
    base.update({k: v for k, v in options.items() if v is not None and v != ()})
    if isinstance(base.get("sbatch"), tuple):
        base["sbatch"] = list(base["sbatch"])
    return LauncherSettings.model_validate(base)
