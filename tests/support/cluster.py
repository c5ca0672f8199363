"""A throwaway Redis Cluster on loopback: N redis-server processes in cluster mode joined by `redis-cli --cluster
create`, with replicas when asked (for failover tests). Readiness is the cluster's own `cluster_state:ok` on
every node (bounded), never a guessed sleep."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from harness.services import end_process, free_port, redis_process

# node timeout 1 s: a failover within a test's patience; no sync delay: a replica is usable as soon as it is up
CLUSTER_OPTIONS = [
    "--cluster-enabled",
    "yes",
    "--cluster-config-file",
    "nodes.conf",
    "--cluster-node-timeout",
    "1000",
    "--repl-diskless-sync-delay",
    "0",
]


_TAKEN: set[int] = set()  # ports handed to nodes in this process: a freed port can be handed out twice


def _unique_port() -> int:
    for _ in range(50):
        port = free_port()
        if port not in _TAKEN:
            _TAKEN.add(port)
            return port
    raise RuntimeError("no free port that this process has not handed out already")


class ClusterNodeProc:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = _unique_port()
        self.bus_port = _unique_port()
        self.dir = root / str(self.port)
        self.dir.mkdir()
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        """Start the node; a port another process took between our probe and redis-server's bind is replaced by a
        fresh pair (bounded), since a probed port is only a guess until bound."""
        for attempt in range(3):
            options = (*CLUSTER_OPTIONS, "--cluster-port", str(self.bus_port))
            try:
                self.proc = redis_process(self.port, self.dir, *options, what="redis-server (cluster)")
                return
            except RuntimeError as exc:
                if "Address already in use" not in str(exc) or attempt == 2:
                    raise
            self.port, self.bus_port = _unique_port(), _unique_port()
            self.dir = self.root / str(self.port)
            self.dir.mkdir()

    def kill(self) -> None:
        """SIGKILL: a crashed master; its replica is promoted after cluster-node-timeout."""
        if self.proc is not None:
            end_process(self.proc, crash=True)
            self.proc = None

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2)


class LocalCluster:
    def __init__(self, masters: int = 3, replicas_per_master: int = 0) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="tokenedge-cluster-"))
        self.replicas_per_master = replicas_per_master
        self.nodes = [ClusterNodeProc(self.root) for _ in range(masters * (1 + replicas_per_master))]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        cli = shutil.which("redis-cli")
        if cli is None:
            raise RuntimeError("redis-cli is not installed")
        subprocess.run(
            [
                cli,
                "--cluster",
                "create",
                *(f"127.0.0.1:{n.port}" for n in self.nodes),
                "--cluster-replicas",
                str(self.replicas_per_master),
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        self.wait_ok([n for n in self.nodes if n.proc is not None])
        self.wait_replicas_synced()

    def wait_replicas_synced(self, timeout_s: float = 30.0) -> None:
        """Every replica's link to its master is up: only a synced replica can be promoted on failover."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            links = []
            for node in self.nodes:
                client = node.client()
                try:
                    info = client.info("replication")
                finally:
                    client.close()
                if info.get("role") == "slave":
                    links.append(
                        info.get("master_link_status") == "up" and not info.get("master_sync_in_progress")
                    )
            if len(links) == len(self.nodes) - len(self.nodes) // (1 + self.replicas_per_master) and all(
                links
            ):
                return
            time.sleep(0.1)
        raise RuntimeError("the cluster's replicas did not sync")

    def wait_ok(self, nodes: list[ClusterNodeProc], timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(self._ok(n) for n in nodes):
                return
            time.sleep(0.1)
        raise RuntimeError("the cluster did not reach cluster_state:ok")

    @staticmethod
    def _ok(node: ClusterNodeProc) -> bool:
        client = node.client()
        try:
            info = client.cluster("info")
            state = info.get("cluster_state") if isinstance(info, dict) else None
            text = info.decode() if isinstance(info, bytes) else str(info)
            return state == "ok" or "cluster_state:ok" in text
        except redis.RedisError:
            return False
        finally:
            client.close()

    def masters(self) -> list[ClusterNodeProc]:
        out = []
        for node in self.nodes:
            if node.proc is None:
                continue
            client = node.client()
            try:
                if client.info("replication").get("role") == "master":
                    out.append(node)
            finally:
                client.close()
        return out

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()
        shutil.rmtree(self.root, ignore_errors=True)
