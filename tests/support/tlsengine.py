"""A Docker engine behind tcp:// with TLS client certificates, for the per-arch engine tests.

Docker's own `--tlsverify` listener would need a daemon of its own; this stands in front of an
engine's unix socket instead: it serves TLS on 127.0.0.1 with a server certificate for that
address, requires a client certificate signed by its CA (as `dockerd --tlsverify` does), and
relays the bytes to the socket. `make_certs` writes what openssl makes into DOCKER_CERT_PATH's
layout: ca.pem, cert.pem, key.pem for the client, server-*.pem for the server.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

DAYS = "2"


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certs(directory: Path, ca_name: str = "bsi-test-ca") -> Path:
    """A CA, a server certificate for 127.0.0.1 (and localhost) and a client certificate,
    signed by the CA."""
    directory.mkdir(parents=True)
    key = ["-newkey", "rsa:2048", "-nodes"]
    openssl("req", "-x509", *key, "-keyout", "ca-key.pem", "-out", "ca.pem", "-days", DAYS,
            "-subj", f"/CN={ca_name}", cwd=directory)  # fmt: skip
    (directory / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    (directory / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name, subject in (("server", "/CN=127.0.0.1"), ("client", "/CN=bsi-client")):
        openssl("req", *key, "-keyout", f"{name}-key.pem", "-out", f"{name}.csr",
                "-subj", subject, cwd=directory)  # fmt: skip
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem",
                "-CAcreateserial", "-out", f"{name}-cert.pem", "-days", DAYS,
                "-extfile", f"{name}.ext", cwd=directory)  # fmt: skip
    (directory / "cert.pem").write_bytes((directory / "client-cert.pem").read_bytes())
    (directory / "key.pem").write_bytes((directory / "client-key.pem").read_bytes())
    return directory


def _pump(source: socket.socket, target: socket.socket) -> None:
    try:
        while chunk := source.recv(65536):
            target.sendall(chunk)
    except OSError:
        pass
    finally:
        for one in (source, target):
            with contextlib.suppress(OSError):
                one.close()


@contextlib.contextmanager
def tls_engine(unix_socket: str, certs: Path) -> Iterator[int]:
    """Serve the engine at `unix_socket` on 127.0.0.1:<port> over verified TLS; the port."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certs / "server-cert.pem", certs / "server-key.pem")
    context.load_verify_locations(certs / "ca.pem")
    context.verify_mode = ssl.CERT_REQUIRED
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen(32)
    stopping = threading.Event()

    def serve(connection: socket.socket) -> None:
        try:
            secure = context.wrap_socket(connection, server_side=True)
        except (ssl.SSLError, OSError):
            connection.close()  # no valid client certificate: refused, as dockerd refuses
            return
        engine = socket.socket(socket.AF_UNIX)
        engine.connect(unix_socket)
        threading.Thread(target=_pump, args=(engine, secure), daemon=True).start()
        _pump(secure, engine)

    def accept() -> None:
        while not stopping.is_set():
            try:
                connection, _ = listening.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(connection,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield listening.getsockname()[1]
    finally:
        stopping.set()
        listening.close()
