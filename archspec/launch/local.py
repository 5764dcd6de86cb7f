"""`--launcher local`, the default: the command's own process trains each job, one after another.

The sweep runner keeps today's path for it (archspec.ablate.runner trains in-process with the builds it checked);
this class is the same contract over the worker, for callers that hold payloads (a bench, a test of the contract).
"""

from __future__ import annotations

import os
from typing import Sequence

from archspec.launch.base import Died, Handle, Launcher, Payload, WorkerResult


class LocalLauncher(Launcher):
    name = "local"

    def submit(self, payloads: Sequence[Payload]) -> list[Handle]:
        return [Handle(p, f"local-{os.getpid()}-{i}", p) for i, p in enumerate(payloads)]

    def wait(self, handles: Sequence[Handle]) -> list[WorkerResult | Died]:
        from archspec.launch.worker import run_payload

        return [run_payload(h.native) for h in handles]
