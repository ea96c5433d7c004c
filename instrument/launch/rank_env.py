"""Ranks' environments: what the local launcher gives each rank (one provider per framework
convention), and how a rank reads who it is from whichever launcher started it.

Each provider may start a service for the job (a rendezvous server, say) and adds variables
to every rank's environment. All providers run for every job: their variables are inert for
frameworks that do not read them, so an unmodified script finds what it expects whatever it
uses. Add a framework by adding a provider class to :data:`PROVIDERS`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import threading
from typing import Any, Protocol

_RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID", "HOROVOD_RANK")
_SIZE_VARS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "HOROVOD_SIZE")
_LOCAL_RANK_VARS = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "HOROVOD_LOCAL_RANK")


class RankEnvError(Exception):
    """The rank's environment does not say where or who it is."""


def _first_int(env: dict[str, str], names: tuple[str, ...]) -> int | None:
    for name in names:
        value = env.get(name)
        if value is not None and value.strip().lstrip("-").isdigit():
            return int(value)
    return None


def rank_from_env(env: dict[str, str]) -> tuple[int, int, int | None]:
    """(rank, world size, local rank) from whichever launcher's variables are present."""
    rank = _first_int(env, _RANK_VARS)
    size = _first_int(env, _SIZE_VARS)
    if rank is None or size is None:
        raise RankEnvError(
            "cannot tell this process's rank: none of "
            + ", ".join(_RANK_VARS)
            + " is set. Start ranks with `instrument run` or a launcher that sets them "
            "(torchrun, mpirun, srun, horovodrun)."
        )
    return rank, size, _first_int(env, _LOCAL_RANK_VARS)


def torch_env(env: dict[str, str]) -> dict[str, str]:
    """torch.distributed's ``env://`` variables (RANK, WORLD_SIZE, LOCAL_RANK) that ``env``
    lacks, from the launcher's own (mpirun and srun set only theirs), so DDP scripts started
    by any launcher initialize their process group unmodified."""
    rank, size, local = rank_from_env(env)
    wanted = {"RANK": rank, "WORLD_SIZE": size, "LOCAL_RANK": local}
    return {k: str(v) for k, v in wanted.items() if v is not None and k not in env}


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


class TFConfigEnv:
    """``TF_CONFIG`` for ``MultiWorkerMirroredStrategy``: rank r is worker r of a cluster of
    local workers on free ports. Only ``tf.distribute`` reads it, when a strategy is created."""

    def __init__(self) -> None:
        self.ports: list[int] = []

    def start(self, nprocs: int) -> None:
        # All sockets are held at once, so the ports differ from each other.
        socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(nprocs)]
        try:
            for s in socks:
                s.bind(("127.0.0.1", 0))
            self.ports = [int(s.getsockname()[1]) for s in socks]
        finally:
            for s in socks:
                s.close()

    def env(self, rank: int, nprocs: int) -> dict[str, str]:
        cluster = {"worker": [f"localhost:{p}" for p in self.ports]}
        return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": rank}})}

    def stop(self) -> None:
        pass


class HorovodGlooEnv:
    """What ``horovodrun --gloo`` gives a single-node job: Horovod's own rendezvous HTTP server
    (which ``hvd.init()`` contacts) and the ``HOROVOD_*`` slot variables. Where Horovod is not
    installed it does nothing, so jobs of other frameworks pay only a ``find_spec`` lookup;
    otherwise starting costs ~60 ms (importing the server), stopping ~50 ms (its poll)."""

    HOST = "localhost"

    def __init__(self) -> None:
        self.server: Any = None
        self.thread: threading.Thread | None = None
        self.port = 0

    def start(self, nprocs: int) -> None:
        if importlib.util.find_spec("horovod") is None:
            return
        from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
        from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

        self.server = RendezvousHTTPServer(("", 0), RendezvousHandler, False)
        self.port = int(self.server.server_address[1])
        self.server.init(get_host_assignments(parse_hosts(f"{self.HOST}:{nprocs}"), nprocs))
        # horovodrun's RendezvousServer polls for shutdown every 0.5 s; the launcher waits for it
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       name="dltrace-horovod-rendezvous", daemon=True)
        self.thread.start()

    def env(self, rank: int, nprocs: int) -> dict[str, str]:
        if self.server is None:
            return {}
        return {
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(self.port),
            "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_GLOO_IFACE": "lo",
            "HOROVOD_HOSTNAME": self.HOST,
            "HOROVOD_RANK": str(rank),
            "HOROVOD_SIZE": str(nprocs),
            "HOROVOD_LOCAL_RANK": str(rank),
            "HOROVOD_LOCAL_SIZE": str(nprocs),
            "HOROVOD_CROSS_RANK": "0",
            "HOROVOD_CROSS_SIZE": "1",
        }

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            if self.thread is not None:
                self.thread.join(timeout=1)
            self.server = self.thread = None


PROVIDERS: list[type] = [TorchrunEnv, HorovodGlooEnv, TFConfigEnv]
