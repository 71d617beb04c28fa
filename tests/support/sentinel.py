"""A real Sentinel deployment on loopback: a master, a replica and three sentinels.

Every process is a real ``redis-server`` (sentinels run with ``--sentinel``), started on free ports
and killed in :meth:`SentinelGroup.stop`. Failover is quick on purpose (``down-after-milliseconds``
1000 by default), so a test can SIGKILL the master and poll for the promotion.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from celery_ha.runtime.redis_process import RedisProcess, find_redis_server, free_port
from tests.support.polling import wait_until

MASTER_NAME = "mymaster"


@dataclass(frozen=True)
class TLSFiles:
    """A self-signed certificate for 127.0.0.1 (made with openssl), used as its own CA."""

    cert: Path
    key: Path

    @classmethod
    def make(cls, folder: Path) -> TLSFiles:
        folder.mkdir(parents=True, exist_ok=True)
        cert, key = folder / "cert.pem", folder / "key.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                        "-out", str(cert), "-days", "2", "-subj", "/CN=127.0.0.1",
                        "-addext", "subjectAltName=IP:127.0.0.1"],
                       check=True, capture_output=True, timeout=60)
        return cls(cert, key)


class SentinelGroup:
    """Master + replica + sentinels; ``url`` is the kombu-style ``sentinel://`` URL of them."""

    def __init__(self, tmp: Path, sentinels: int = 3, down_after_ms: int = 1000,
                 sentinel_password: str | None = None, tls: TLSFiles | None = None) -> None:
        self.tmp = tmp
        self.binary = find_redis_server()
        self.down_after_ms = down_after_ms
        self.sentinel_password = sentinel_password
        self.tls = tls
        self.client_tls: dict[str, object] = {"ssl": True, "ssl_ca_certs": str(tls.cert)} if tls else {}
        ports = free_port(), free_port()
        self.master = RedisProcess(port=ports[0], data_dir=tmp / "master", binary=self.binary,
                                   extra_args=self._tls_args(ports[0]), client_options=self.client_tls)
        self.replica = RedisProcess(port=ports[1], data_dir=tmp / "replica", binary=self.binary,
                                    client_options=self.client_tls)
        self.sentinel_ports = [free_port() for _ in range(sentinels)]
        self.sentinel_procs: list[subprocess.Popen[bytes]] = []

    def serves_tls(self) -> bool:
        """Whether the binary was built with TLS. One without it refuses the ``tls-port`` directive at
        once ("Bad directive"); one with it fails later, on the missing certificate. Both exit at once,
        so the answer never depends on timing."""
        probe = subprocess.run([self.binary, "--port", "0", "--tls-port", str(free_port()), "--tls-cert-file",
                                "/nonexistent", "--save", ""], capture_output=True, text=True, timeout=30)
        return "Bad directive" not in probe.stdout + probe.stderr

    def _tls_args(self, port: int) -> list[str]:
        """Command-line options that move a server to TLS only (the plain port closed)."""
        if self.tls is None:
            return []
        return ["--port", "0", "--tls-port", str(port), "--tls-cert-file", str(self.tls.cert),
                "--tls-key-file", str(self.tls.key), "--tls-ca-cert-file", str(self.tls.cert),
                "--tls-auth-clients", "no", "--tls-replication", "yes"]

    @property
    def url(self) -> str:
        query = f"?ssl=true&ssl_ca_certs={self.tls.cert}" if self.tls else ""
        return ";".join(f"sentinel://127.0.0.1:{port}{query}" for port in self.sentinel_ports)

    def db_url(self, db: int) -> str:
        """The URL of database ``db`` as a user writes it: the database after the last part."""
        parts = self.url.split(";")
        last, _, query = parts[-1].partition("?")
        parts[-1] = f"{last}/{db}" + (f"?{query}" if query else "")
        return ";".join(parts)

    def start(self) -> SentinelGroup:
        self.master.start()
        self.replica.extra_args = ["--replicaof", "127.0.0.1", str(self.master.port),
                                   *self._tls_args(self.replica.port)]
        self.replica.start()
        for n, port in enumerate(self.sentinel_ports):
            folder = self.tmp / f"sentinel{n}"
            folder.mkdir(parents=True, exist_ok=True)
            conf = folder / "sentinel.conf"
            listen = [f"port {port}"] if self.tls is None else [
                "port 0", f"tls-port {port}", f"tls-cert-file {self.tls.cert}",
                f"tls-key-file {self.tls.key}", f"tls-ca-cert-file {self.tls.cert}", "tls-auth-clients no",
                "tls-replication yes"]
            lines = [*listen, "bind 127.0.0.1", "protected-mode no", f"dir {folder}",
                     f"logfile {folder / 'sentinel.log'}",
                     f"sentinel monitor {MASTER_NAME} 127.0.0.1 {self.master.port} 2",
                     f"sentinel down-after-milliseconds {MASTER_NAME} {self.down_after_ms}",
                     f"sentinel failover-timeout {MASTER_NAME} 10000",
                     f"sentinel parallel-syncs {MASTER_NAME} 1"]
            if self.sentinel_password:
                lines.append(f"requirepass {self.sentinel_password}")
            conf.write_text("\n".join(lines) + "\n")
            self.sentinel_procs.append(subprocess.Popen([self.binary, str(conf), "--sentinel"],
                                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_until(self._ready, timeout=20, what="sentinels to see the master and the replica")
        return self

    def sentinel(self, n: int = 0) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.sentinel_ports[n], decode_responses=True,
                           password=self.sentinel_password, socket_timeout=2, **self.client_tls)

    def _ready(self) -> bool:
        try:
            for n in range(len(self.sentinel_ports)):
                state = self.sentinel(n).sentinel_master(MASTER_NAME)
                if int(state.get("num-slaves", 0)) < 1 or int(state.get("num-other-sentinels", 0)) < \
                        len(self.sentinel_ports) - 1:
                    return False
            replica = redis.Redis(host="127.0.0.1", port=self.replica.port, **self.client_tls)
            master = redis.Redis(host="127.0.0.1", port=self.master.port, **self.client_tls)
            seen = master.info("replication").get("slave0") or {}
            return replica.info("replication").get("master_link_status") == "up" and \
                seen.get("state") == "online"
        except (redis.RedisError, OSError):
            return False

    def master_address(self) -> tuple[str, int]:
        host, port = self.sentinel().sentinel_get_master_addr_by_name(MASTER_NAME)
        return host, int(port)

    def kill_master(self) -> float:
        """SIGKILL the current master (the machine dies); returns the monotonic time of the kill."""
        old = self.master_address()[1]
        victim = self.master if self.master.port == old else self.replica
        assert victim.proc is not None
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait(timeout=10)
        self.dead_port = old
        return time.monotonic()

    def current_master(self) -> RedisProcess:
        port = self.master_address()[1]
        return self.master if self.master.port == port else self.replica

    def pause_master(self) -> RedisProcess:
        """SIGSTOP the current master (a frozen VM, a long GC pause): it comes back with SIGCONT."""
        victim = self.current_master()
        assert victim.proc is not None
        victim.proc.send_signal(signal.SIGSTOP)
        return victim

    def wait_promoted(self, old_port: int, timeout: float = 30.0) -> tuple[str, int]:
        """Poll until every sentinel names a new, healthy master; returns its address."""

        def agreed() -> tuple[str, int] | None:
            seen = set()
            for n in range(len(self.sentinel_ports)):
                try:
                    state = self.sentinel(n).sentinel_master(MASTER_NAME)
                except (redis.RedisError, OSError):
                    return None
                if int(state["port"]) == old_port or "down" in str(state.get("flags", "")):
                    return None
                seen.add((state["ip"], int(state["port"])))
            return seen.pop() if len(seen) == 1 else None

        return wait_until(agreed, timeout=timeout, what="every sentinel to name the promoted replica")

    def stop(self) -> None:
        for server in (self.replica, self.master):
            if server.proc is not None and server.proc.poll() is None:
                server.proc.send_signal(signal.SIGCONT)
        for proc in self.sentinel_procs:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        for server in (self.replica, self.master):
            with contextlib.suppress(Exception):
                if server.proc is not None and server.proc.poll() is None:
                    server.proc.kill()
                    server.proc.wait(timeout=10)
