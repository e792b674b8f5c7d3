"""A Docker engine behind ssh://, for the per-arch engine tests: an sshd of the test's own.

It listens on 127.0.0.1 with a host key, an authorized client key and a config of its own (all
in a temporary directory), in front of this machine's engine: `ssh://root@127.0.0.1:PORT` runs
`docker system dial-stdio` there, as it would on an arm64 build host. The client side is the
`ssh` binary with a config naming that key and the host key (`ssh_on_path`: a wrapper earlier
on PATH, as a user's ~/.ssh/config would be read), so the tool, the docker CLI and the
verification's port forward all go through real ssh. Stopped by its pid when the tests end.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

from support.waiting import STARTS_SECONDS, accepts, wait_for

SSHD = Path("/usr/sbin/sshd")


class SshEngine:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"ssh://root@127.0.0.1:{self.port}"

    def start(self) -> SshEngine:
        if not SSHD.exists():
            raise RuntimeError(f"{SSHD} not installed (openssh-server)")
        here = self.directory
        here.mkdir(parents=True, exist_ok=True)
        for key in ("host_key", "client_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(here / key)],
                           check=True, capture_output=True)  # fmt: skip
        shutil.copy(here / "client_key.pub", here / "authorized_keys")
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        (here / "sshd_config").write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {here / 'host_key'}\n"
            f"AuthorizedKeysFile {here / 'authorized_keys'}\nPidFile {here / 'sshd.pid'}\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nAllowTcpForwarding yes\n"
        )
        host_key = (here / "host_key.pub").read_text().split()
        (here / "known_hosts").write_text(f"[127.0.0.1]:{self.port} {host_key[0]} {host_key[1]}\n")
        (here / "ssh_config").write_text(
            f"Host *\n  IdentityFile {here / 'client_key'}\n  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {here / 'known_hosts'}\n  StrictHostKeyChecking yes\n"
            "  BatchMode yes\n"
        )
        wrapper = here / "bin" / "ssh"
        wrapper.parent.mkdir()
        wrapper.write_text(f'#!/bin/sh\nexec /usr/bin/ssh -F {here / "ssh_config"} "$@"\n')
        wrapper.chmod(0o755)
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
        self.process = subprocess.Popen(
            [str(SSHD), "-D", "-e", "-f", str(here / "sshd_config")],
            stdout=subprocess.DEVNULL,
            stderr=(here / "sshd.log").open("wb"),
        )
        wait_for(
            lambda: accepts("127.0.0.1", self.port),
            deadline_s=STARTS_SECONDS,
            what="sshd to start",
            process=self.process,
            detail=lambda: (here / "sshd.log").read_text()[-500:],
            error=RuntimeError,
        )
        return self

    def ssh_on_path(self) -> str:
        """PATH with the wrapper first: every `ssh` the run starts uses the test's config."""
        return f"{self.directory / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
