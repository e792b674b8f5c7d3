"""A lazy-loading node on this machine: Debian 13's soci-snapshotter 0.4.1 beside a private
containerd 1.6, reaching the test registry's storage through a TLS docker-registry of its own.

Facts about 0.4.1 this harness is shaped by (found on this machine):
- it fetches the SOCI index and the ztocs over HTTPS only, and forces plain HTTP for range
  requests to loopback names: so a second `docker-registry` serves the test registry's storage
  over TLS (read-only), reached by a non-loopback name that the node's private `/etc/hosts`
  maps to 127.0.0.1, with a CA bundle (the system's plus this one's certificate) mounted over
  the system's;
- it keeps its state in /var/lib/soci-snapshotter-grpc whatever `-root` says, and containerd 1.6
  its shim files under /run/containerd: each node gets tmpfs mounts there, in a mount
  namespace of its own (one `unshare` holder process that every command enters with nsenter);
- `soci` needs absolute socket paths.
What a node writes (containerd's content and snapshots, soci's mounts) goes to a tmpfs of its
own, as the snapshotter's state already does: a fresh node's filesystem. On the machine's ext4,
a normal pull right after an earlier node's tree was deleted spent most of its CPU in ext4's
inode allocator stepping over the recently deleted inodes (`recently_deleted`, 40% of
containerd's samples), so its unpack took 17-46 s instead of what the pull itself costs.
Registry credentials reach the snapshotter through a docker config under the node's own HOME.
Every process is started here and stopped by its pid; the namespace goes with its holder.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

from support.waiting import STARTS_SECONDS, accepts, wait_for

NAME = "bsi-soci-registry.test"  # not a loopback name: soci 0.4.1 keeps HTTPS for it
STATE = Path("/var/lib/soci-snapshotter-grpc")
SHIMS = Path("/run/containerd")
SYSTEM_CA = Path("/etc/ssl/certs/ca-certificates.crt")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_for(check: Any, what: str, process: subprocess.Popen[bytes], log: Path) -> None:
    wait_for(
        check,
        deadline_s=STARTS_SECONDS,
        what=f"{what} to start",
        process=process,
        detail=lambda: log.read_text()[-3000:],
        error=RuntimeError,
    )


def _stop(process: subprocess.Popen[bytes] | None) -> None:
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class TlsRegistry:
    """A docker-registry over TLS on the test registry's storage and htpasswd: read-only unless
    `writable` (the benchmark's `soci push`); its access log counts what nodes fetch."""

    def __init__(self, work: Path, registry_dir: Path, writable: bool = False) -> None:
        self.work, self.registry_dir, self.writable = work, registry_dir, writable
        self.port = free_port()
        self.host = f"{NAME}:{self.port}"
        self.certificate = work / "registry.crt"
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> TlsRegistry:
        key = self.work / "registry.key"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
             "-subj", f"/CN={NAME}", "-addext", f"subjectAltName=DNS:{NAME}",
             "-keyout", str(key), "-out", str(self.certificate)],
            check=True, capture_output=True,
        )  # fmt: skip
        config = self.work / "registry.yml"
        config.write_text(
            "version: 0.1\nlog:\n  level: info\n  formatter: json\n"
            f"storage:\n  filesystem:\n    rootdirectory: {self.registry_dir / 'storage'}\n"
            f"  maintenance:\n    readonly:\n      enabled: {str(not self.writable).lower()}\n"
            f"http:\n  addr: 127.0.0.1:{self.port}\n"
            f"  tls:\n    certificate: {self.certificate}\n    key: {key}\n"
            "auth:\n  htpasswd:\n    realm: build-sandbox-image-test\n"
            f"    path: {self.registry_dir / 'htpasswd'}\n"
        )
        log = self.log = self.work / "registry.log"
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                ["/usr/bin/docker-registry", "serve", str(config)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        _wait_for(self._answers, "the TLS registry", self.process, log)
        return self

    def _answers(self) -> bool:
        return accepts("127.0.0.1", self.port)

    def sent(self, since: int = 0) -> tuple[int, int]:
        """(bytes of blobs and manifests sent, log lines) after the first `since` log lines."""
        lines = self.log.read_text(errors="replace").splitlines()
        total = 0
        for line in lines[since:]:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            total += int(entry.get("http.response.written") or 0)
        return total, len(lines)

    def __exit__(self, *_: object) -> None:
        _stop(self.process)


class SociNode:
    """containerd + soci-snapshotter-grpc in a private mount namespace; run commands in it."""

    def __init__(
        self,
        work: Path,
        soci: str,
        snapshotter: str,
        registry: TlsRegistry,
        login: tuple[str, str],
    ) -> None:
        self.work, self.soci_binary, self.snapshotter = work, soci, snapshotter
        self.registry, self.login = registry, login
        self.containerd_socket = work / "containerd.sock"
        self.soci_socket = work / "soci.sock"
        self.holder: subprocess.Popen[bytes] | None = None
        self.daemons: list[subprocess.Popen[bytes]] = []
        self.created: list[Path] = []
        self.disk = work / "disk"  # the node's tmpfs, inside its mount namespace only

    def __enter__(self) -> SociNode:
        try:
            self._start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start(self) -> None:
        work = self.work
        hosts = work / "hosts"
        hosts.write_text(f"127.0.0.1 localhost {NAME}\n")
        bundle = work / "ca-certificates.crt"
        bundle.write_bytes(SYSTEM_CA.read_bytes() + self.registry.certificate.read_bytes())
        user, password = self.login
        docker_config = work / "home" / ".docker" / "config.json"
        docker_config.parent.mkdir(parents=True)
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        docker_config.write_text(json.dumps({"auths": {self.registry.host: {"auth": token}}}))
        for point in (STATE, SHIMS):  # mount points on the machine: removed at the end if made
            if not point.exists():
                point.mkdir(parents=True)
                self.created.append(point)
        self.disk.mkdir()
        mounts = " && ".join(
            [
                f"mount -t tmpfs tmpfs {self.disk}",
                f"mount -t tmpfs tmpfs {STATE}",
                f"mount -t tmpfs tmpfs {SHIMS}",
                f"mount --bind {hosts} /etc/hosts",
                f"mount --bind {bundle} {SYSTEM_CA}",
                "exec sleep infinity",
            ]
        )
        self.holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", mounts]
        )
        wait_for(
            self._mounted,
            deadline_s=STARTS_SECONDS,
            what="the node's mount namespace",
            process=self.holder,
            error=RuntimeError,
        )
        config = work / "containerd.toml"
        config.write_text(
            "version = 2\n"
            f'root = "{self.disk / "containerd-root"}"\n'
            f'state = "{self.disk / "containerd-state"}"\n'
            'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
            f'[grpc]\n  address = "{self.containerd_socket}"\n'
            '[proxy_plugins]\n  [proxy_plugins.soci]\n    type = "snapshot"\n'
            f'    address = "{self.soci_socket}"\n'
        )
        self._daemon(
            [self.snapshotter, "--address", str(self.soci_socket), "--root",
             str(self.disk / "soci-root"), "--log-level", "debug"],
            "soci-snapshotter-grpc", self.soci_socket,
        )  # fmt: skip
        self._daemon(
            ["/usr/bin/containerd", "--config", str(config)], "containerd", self.containerd_socket
        )

    def _mounted(self) -> bool:
        if self.holder is None:
            return False
        mounts = Path(f"/proc/{self.holder.pid}/mounts")
        try:
            return str(SYSTEM_CA) in mounts.read_text()
        except OSError:
            return False

    def _daemon(self, command: list[str], name: str, socket_path: Path) -> None:
        log = self.work / f"{name}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                self._entered(command), stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env=self._env(),
            )  # fmt: skip
        self.daemons.append(process)
        _wait_for(socket_path.exists, name, process, log)

    def _entered(self, command: list[str]) -> list[str]:
        assert self.holder is not None
        return ["nsenter", "-t", str(self.holder.pid), "-m", "--", *command]

    def _env(self) -> dict[str, str]:
        return {**os.environ, "HOME": str(self.work / "home")}

    def run(self, *command: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """A command in the node's mount namespace (its /etc/hosts, CA bundle and state)."""
        return subprocess.run(
            self._entered(list(command)), capture_output=True, text=True, timeout=timeout,
            env=self._env(),
        )  # fmt: skip

    def popen(self, *command: str) -> subprocess.Popen[str]:
        """A command in the node's mount namespace whose output is read as it comes (the
        benchmark's clock stops at lines the command prints)."""
        return subprocess.Popen(
            self._entered(list(command)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=self._env(),
        )  # fmt: skip

    def soci(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return self.run(
            self.soci_binary, "--address", str(self.containerd_socket), *args, timeout=timeout
        )

    def ctr(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return self.run("ctr", "-a", str(self.containerd_socket), *args, timeout=timeout)

    def log(self, name: str) -> str:
        path = self.work / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def __exit__(self, *_: object) -> None:
        # A task's shim outlives containerd (it is made to survive a restart) until the task is
        # deleted: killed and deleted here, each container with it, or the shims stay behind.
        for task in self.ctr("tasks", "ls", "-q").stdout.split() if self.daemons else ():
            self.ctr("tasks", "delete", "--force", task)
        for container in self.ctr("containers", "ls", "-q").stdout.split() if self.daemons else ():
            self.ctr("containers", "delete", container)
        for process in reversed(self.daemons):
            _stop(process)
        if self.holder is not None and self.holder.poll() is None:
            self.run("sh", "-c", f"umount -R {self.disk} 2>/dev/null; true")
            self.holder.kill()
            self.holder.wait()
        for point in self.created:
            point.rmdir()
