"""Per-rank environments for the local launcher, one provider per framework convention.

Each provider may start a service for the job (a rendezvous server, say) and adds variables
to every rank's environment. All providers run for every job: their variables are inert for
frameworks that do not read them, so an unmodified script finds what it expects whatever it
uses. Add a framework by adding a provider class to :data:`PROVIDERS`.
"""

from __future__ import annotations

import os
import socket
from typing import Protocol


def free_port() -> int:
    """A TCP port that was free a moment ago on the loopback interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EnvProvider(Protocol):
    def start(self, nprocs: int) -> None:
        """Prepare the job (ports, servers); called once before any rank starts."""
        ...

    def env(self, rank: int, nprocs: int) -> dict[str, str]:
        """Variables for ``rank``."""
        ...

    def stop(self) -> None:
        """Release what ``start`` took; called once after all ranks ended."""
        ...


class TorchrunEnv:
    """torchrun's variables for a single-node job (``init_process_group`` reads them)."""

    def __init__(self) -> None:
        self.port = 0

    def start(self, nprocs: int) -> None:
        self.port = free_port()

    def env(self, rank: int, nprocs: int) -> dict[str, str]:
        env = {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(nprocs),
            "LOCAL_WORLD_SIZE": str(nprocs),
            "GROUP_RANK": "0",
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(nprocs),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(self.port),
        }
        # As torchrun does: ranks sharing a machine must not each start a thread per core.
        if "OMP_NUM_THREADS" not in os.environ:
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nprocs))
        return env

    def stop(self) -> None:
        pass


PROVIDERS: list[type] = [TorchrunEnv]
