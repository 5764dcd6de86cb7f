"""Values as the registry stores them: flattened dotted keys, typed columns, accounting figures under filter names."""

from __future__ import annotations

import json
import logging
import math
import os
import socket
from datetime import datetime
from typing import Any, Mapping

log = logging.getLogger("archspec.registry")
_REPORTED: set[str] = set()


def report_damage(where: str, problem: str) -> None:
    """A row changed by something other than archspec (bad JSON, a non-ISO time, text in a number column): say which
    and carry on with the rest (the damaged value reads as empty / NaN). Each problem is reported once per process."""
    from archspec.errors import printable

    message = f"warning: registry row damaged: {printable(where, 120)}: {printable(problem, 200)}; shown without it"
    if message not in _REPORTED and len(_REPORTED) < 1000:
        _REPORTED.add(message)
        log.warning(message)


def load_json(text: Any, where: str, default: Any) -> Any:
    """A JSON column's value; `default` (and a warning naming the row) when it is not valid JSON."""
    try:
        return json.loads(text)
    except (TypeError, ValueError, RecursionError) as e:
        report_damage(where, f"not valid JSON ({type(e).__name__}: {str(e)[:80]})")
        return default


def number(value: Any, where: str) -> float:
    """A numeric column's value as a float (NaN for NULL); text stored there by something else reads as NaN."""
    if value is None:
        return float("nan")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        report_damage(where, f"{value!r} is not a number")
        return float("nan")


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts → dotted keys; lists stay values (`train.data.corpus.paths`)."""
    out: dict[str, Any] = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def typed_value(value: Any) -> tuple[str, float | None, str | None]:
    """(kind, value_num, value_str): numbers go to value_num so they compare numerically; bool before int."""
    if isinstance(value, bool):
        return "bool", None, "true" if value else "false"
    if isinstance(value, int):
        return "int", float(value), None
    if isinstance(value, float):
        return "float", (None if math.isnan(value) else value), None
    if isinstance(value, str):
        return "str", None, value
    if value is None:
        return "null", None, None
    return "json", None, json.dumps(value, sort_keys=True, separators=(",", ":"))


_ACCOUNTING_RENAMES = {"flops_per_token": "flops", "kv_cache_bytes_per_token": "kv_cache_bytes",
                       "seq_len": "flops.seq_len"}


def with_seq_len(accounting: Mapping[str, Any], seq_len: int | None) -> dict[str, Any]:
    """Accounting that says the sequence length its FLOPs are at (`seq_len`, filtered as `flops.seq_len`): the one
    it already names, else `seq_len`."""
    out = dict(accounting)
    if "seq_len" not in out and seq_len is not None:
        out["seq_len"] = int(seq_len)
    return out


def accounting_fields(accounting: Mapping[str, Any]) -> dict[str, int | float]:
    """`RunInfo.accounting` → its filter fields (params.*, flops.*, kv_cache_bytes) with their exact values."""
    out: dict[str, int | float] = {}
    for key, value in flatten(accounting).items():
        head, dot, rest = key.partition(".")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[_ACCOUNTING_RENAMES.get(head, head) + dot + rest] = value
    return out


def canonical_text(spec_json: Mapping[str, Any]) -> str:
    # The same form as archspec.spec.canonical_json, from the dict the loop hands over in RunInfo.
    return json.dumps(spec_json, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def run_params(spec_json: Mapping[str, Any], recipe: Mapping[str, Any]) -> dict[str, Any]:
    """A run's params: its spec's keys, with `train.*` overlaid by the recipe actually used."""
    params = flatten(spec_json)
    params.update(flatten(recipe, "train."))
    return params


def typed_row(value: Any) -> dict[str, Any]:
    kind, num, text = typed_value(value)
    return {"kind": kind, "value_num": num, "value_str": text}



def is_stale(heartbeat: datetime | None, timeout_s: float, now: datetime) -> bool:
    """A RUNNING run whose writer has not beaten for longer than its own timeout: the process died or was killed."""
    return heartbeat is None or (now - heartbeat).total_seconds() > timeout_s


# The tags that identify the writer's process (archspec.train.loop `run_info` writes `writer_identity()`): its pid,
# the pid namespace it is a pid in (the inode of /proc/self/ns/pid), the boot it ran in (the kernel's boot_id) and
# the process's start time (field 22 of /proc/<pid>/stat, clock ticks since boot).
WRITER_IDENTITY = ("pid", "pid_namespace", "boot_id", "pid_start")
# Every tag archspec records by itself (the loop's run_info, the launchers): how and where a run ran. A user's own
# tags (`archspec runs tag`) are the others; the UI shows those first and folds these.
SYSTEM_TAGS = frozenset({*WRITER_IDENTITY, "device", "precision", "world_size", "compile", "parallel",
                         "activation_checkpointing", "corpus", "corpus_hash", "tokenizer", "train_tokens", "val_tokens",
                         "resumed_from_step", "repeat_of", "launcher", "scheduler_job", "node", "host"})


def _proc_start(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (the start time, in clock ticks since boot); None when there is no such process
    (or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # after the command name, which may hold spaces and ')'
    return fields[19] if len(fields) > 19 else None  # field 3 is fields[0]


def _namespace_and_boot() -> tuple[str | None, str | None]:
    try:
        ns = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        ns = None
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip() or None
    except OSError:
        boot = None
    return ns, boot


def writer_identity() -> dict[str, str]:
    """This process as a run's writer: the `WRITER_IDENTITY` tags (those /proc cannot tell are left out)."""
    ns, boot = _namespace_and_boot()
    pid = os.getpid()
    tags = {"pid": str(pid), "pid_namespace": ns, "boot_id": boot, "pid_start": _proc_start(pid)}
    return {k: v for k, v in tags.items() if v is not None}


def writer_gone(host: str | None, tags: Mapping[str, str]) -> bool:
    """The run's writer ran on this host, in this pid namespace and this boot (its recorded `host` and its
    `WRITER_IDENTITY` tags), and its process no longer exists (its pid is absent, or a process started at another
    time holds it: the pid was reused): the run is dead now, whatever its heartbeat timeout says (`kill -9`).

    A hostname alone proves nothing (containers share one without sharing pids; a cloned VM keeps it): without the
    namespace and boot tags (runs of an older archspec), or when they differ from this process's, or off Linux, the
    writer cannot be checked and only the heartbeat tells (False here). So does another host's writer (that is what
    `--take-over` and the heartbeat are for), and this very process. Reading /proc changes nothing: reads use it too."""
    if not host or host != socket.gethostname():
        return False
    ns, boot = _namespace_and_boot()
    if ns is None or boot is None or tags.get("pid_namespace") != ns or tags.get("boot_id") != boot:
        return False
    try:
        pid = int(tags.get("pid") or "")
    except ValueError:
        return False
    if pid <= 0 or pid == os.getpid() or not tags.get("pid_start"):
        return False
    start = _proc_start(pid)
    if start is None:  # no such process: but is it ours to see? /proc lists every pid of this namespace
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except (OSError, OverflowError):
            return False
        return False  # it exists after all (raced with its start)
    return start != tags["pid_start"]  # another process now holds the pid
