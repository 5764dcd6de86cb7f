"""A run recorded RUNNING whose writer is dead (issue 12): on this host the registry sees that the writer's pid is gone
and lets a new attempt start at once; for a writer on another machine, `--take-over` says so."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from archspec.registry import Registry, RunActiveError
from archspec.cli.train import make_logger

from .helpers import make_info, writer_tags


def test_a_live_run_elsewhere_is_refused_unless_taken_over(tmp_path):
    url = f"sqlite:///{tmp_path}/registry.db"
    info = make_info(tags={"pid": "1"})  # host "testhost": not this machine, so its pid cannot be checked
    with Registry(url) as reg:
        reg.start_run(info, heartbeat_timeout_s=3600)
        with pytest.raises(RunActiveError, match="--take-over"):
            reg.start_run(info, heartbeat_timeout_s=3600)
        assert reg.start_run(info, heartbeat_timeout_s=3600, take_over=True) == 2
    assert make_logger(url, take_over=True).take_over and not make_logger(url).take_over


@pytest.mark.parametrize("writer", ["dead", "alive"])
def test_a_dead_writer_on_this_host_is_recognised_by_its_pid(writer, tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        tags = writer_tags(proc.pid)
        if writer == "dead":
            proc.kill()
            proc.wait()
        info = make_info(tags=tags)
        info.host = socket.gethostname()
        with Registry(f"sqlite:///{tmp_path}/registry.db") as reg:
            reg.start_run(info, heartbeat_timeout_s=3600)
            if writer == "dead":
                assert reg.start_run(info, heartbeat_timeout_s=3600) == 2
            else:
                with pytest.raises(RunActiveError):
                    reg.start_run(info, heartbeat_timeout_s=3600)
    finally:
        proc.kill()
        proc.wait()
