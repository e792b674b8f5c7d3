"""The reference runtime base (Dockerfile.base, its locks) and `build-sandbox-image verify`.

Fast tests cover the locks and the Dockerfile (verify's report and its command's exit codes
are unit tests: tests/verify/test_report.py, tests/cli/test_verify_command.py). Engine tests
build the reference base once per session (the `reference_image` fixture in conftest.py), prove
that it serves the runtime contract when run hardened, and that verify fails, naming the failing
line, on images that break the contract.
"""

from __future__ import annotations

import http.client
import json
import select
import shutil
import socket
import subprocess
import sys
import tomllib
import uuid
from pathlib import Path

import pytest
from packaging.utils import parse_wheel_filename
from support.waiting import wait_for, wait_serving

from builder.assemble.build import BuildSpec, build_image
from builder.orchestration import reference_base as reference
from builder.resolve.target import ARCHES, Target, shipped_facts
from builder.runtime import SERVER, SERVER_PACKAGE
from builder.verify.checks import CONTRACT
from builder.verify.container import LABEL, image_user_check

REPO_ROOT = Path(__file__).resolve().parents[2]
# Where the server's timeout exit code is set, in the image.
COMMANDS = f"/opt/sandbox/server/{SERVER_PACKAGE}/execution/commands.py"
CONTRACT_NAMES = {"image-user", "health", "still-serving", *(name for name, _ in CONTRACT)}


# --- locks and Dockerfile (no engine) ----------------------------------------------------------


@pytest.mark.parametrize("arch", sorted(ARCHES))
def test_base_lock_matches_the_shipped_profile(arch):
    assert reference.locked_versions(arch) == dict(shipped_facts().distributions)


@pytest.mark.parametrize("arch", sorted(ARCHES))
def test_base_lock_pins_one_acceptable_hashed_wheel_per_distribution(arch):
    wheels = reference.chosen_wheels(arch)
    target = Target(shipped_facts(), (ARCHES[arch],))
    for wheel in wheels:
        tags = frozenset(parse_wheel_filename(wheel.file.filename)[3])
        assert target.tag_rank(ARCHES[arch], tags) is not None, wheel.file.filename
        assert len(wheel.file.sha256) == 64
    lines = reference.requirements_lock(wheels).splitlines()
    assert len(lines) == len(shipped_facts().distributions)
    assert all(" --hash=sha256:" in line and "==" in line for line in lines)
    machine = ARCHES[arch].machine
    native = [w.file.filename for w in wheels if not w.file.filename.endswith("-any.whl")]
    assert native and all(machine in name for name in native), native


def test_requirements_in_names_the_base_set():
    text = (reference.RUNTIME_DIR / "requirements.in").read_text()
    names = {line.strip() for line in text.splitlines() if line.strip() and line[0] != "#"}
    assert names == {"requests", "pandas", "pydantic"}
    for arch in ARCHES:
        lock = tomllib.loads(reference.lock_path(arch).read_text())
        assert lock["lock-version"] == "1.0"
        assert names <= {package["name"] for package in lock["packages"]}


def test_lock_script_check_agrees():
    result = subprocess.run(
        [sys.executable, "scripts/lock_base.py", "--check"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_top_level_dockerfile_is_the_packaged_one():
    top = REPO_ROOT / "Dockerfile.base"
    assert top.is_symlink()
    assert top.resolve() == reference.DOCKERFILE.resolve()


def test_dockerfile_base_shape_and_hadolint():
    text = reference.DOCKERFILE.read_text()
    assert "ARG BASE_IMAGE=python:3.13-slim-trixie" in text
    assert "--require-hashes" in text and "--no-index" in text and "--target /app/deps" in text
    assert "ENV PYTHONPATH=/app/deps" in text
    assert "EXPOSE 8888" in text
    users = [line for line in text.splitlines() if line.startswith("USER ")]
    assert users[-1] == "USER 65532:65532"
    assert text.rstrip().splitlines()[-1] == ('ENTRYPOINT ["python3", "-I", "/opt/sandbox/server"]')
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if hadolint is None:
        pytest.skip("hadolint is not installed in this environment")
    result = subprocess.run(
        [hadolint, "--config", str(REPO_ROOT / ".hadolint.yaml"), str(reference.DOCKERFILE)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# --- verify's report logic (no engine) ---------------------------------------------------------


@pytest.mark.parametrize(
    ("user", "passed"),
    [
        ("65532:65532", True),
        ("65532", True),
        ("", False),
        ("0", False),
        ("0:0", False),
        ("root", False),
        ("sandbox:sandbox", False),
        ("1000:1000", False),
        ("65532:0", False),
    ],
)
def test_image_user_check(user, passed):
    check = image_user_check(user)
    assert check.name == "image-user"
    assert check.passed is passed


# --- the built reference image (engine) -----------------------------------------------------


def run_verify(image: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "builder", "verify", image, *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


def table_line(output: str, name: str) -> str:
    """The report line of check `name` ("" if there is none)."""
    for line in output.splitlines():
        if line[:6] in ("PASS  ", "FAIL  ") and line[6:].startswith(name + " "):
            return line
    return ""


def failed_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("FAIL ")]


def no_verify_containers_left(docker_client, image: str) -> bool:
    """No verify container of `image` remains (other images' runs may be going on)."""
    image_id = docker_client.images.get(image).id
    # the engine's own listing: docker-py's would inspect each container it lists, and one of
    # another worker's runs may be gone by then (a 404 for a container that is no concern here)
    containers = docker_client.api.containers(all=True, filters={"label": LABEL})
    return not [c for c in containers if c["ImageID"] == image_id]


@pytest.mark.usefixtures("docker_client")
def test_reference_image_config(reference_image, docker_client):
    config = docker_client.images.get(reference_image).attrs["Config"]
    assert config["User"] == "65532:65532"
    assert "PYTHONPATH=/app/deps" in config["Env"]
    assert config["Entrypoint"] == ["python3", "-I", "/opt/sandbox/server"]
    assert not config.get("Cmd")
    assert "8888/tcp" in config["ExposedPorts"]
    assert config["WorkingDir"] == "/workspace"


@pytest.mark.usefixtures("docker_client")
def test_reference_image_files_are_root_owned(reference_image, docker_client):
    script = (
        "import os, json; server = '/opt/sandbox/server'\n"
        "paths = ['/app/deps', '/workspace', '/opt/sandbox', server]\n"
        "for top, dirs, files in os.walk(server):\n"
        "    paths += [os.path.join(top, name) for name in dirs + files]\n"
        "print(json.dumps({p: [os.stat(p).st_uid, oct(os.stat(p).st_mode)] for p in paths}))"
    )
    output = docker_client.containers.run(
        reference_image,
        entrypoint=["python3", "-I", "-c", script],
        network_disabled=True,
        read_only=True,
        remove=True,
    )
    found = json.loads(output)
    assert found.pop("/app/deps") == [0, "0o40755"]
    assert found.pop("/workspace") == [65532, "0o40755"]
    # The server: the repository's package directory as it is, no bytecode, root-owned, read-only.
    image_paths = {
        path: str(Path("/opt/sandbox/server") / path.relative_to(SERVER))
        for path in SERVER.rglob("*")
        if "__pycache__" not in path.parts
    }
    directories = {"/opt/sandbox", "/opt/sandbox/server"}
    directories |= {image for path, image in image_paths.items() if path.is_dir()}
    assert set(found) == set(image_paths.values()) | directories
    for path, owner_mode in found.items():
        assert owner_mode == [0, "0o40755" if path in directories else "0o100444"], path


@pytest.fixture(scope="module")
def own_reference(reference_image, docker_client, tmp_path_factory):
    """The reference image under an id of this module's own (one label added): other tests may
    verify the reference image meanwhile, and their containers must not count as this module's
    strays."""
    tag = f"bsi-reference-own-{uuid.uuid4().hex[:8]}:test"
    context = tmp_path_factory.mktemp("own-reference")
    (context / "Dockerfile").write_text(
        f"FROM {reference_image}\nLABEL org.example.test-run={tag.split(':')[0]}\n"
    )
    with open(context / "build.log", "w") as log:
        build_image(context, BuildSpec(tag=tag), log)
    yield tag
    docker_client.images.remove(tag, force=True)


@pytest.fixture(scope="module")
def verified_reference(own_reference, tmp_path_factory):
    """`verify` of the reference image as an operator runs it, once for the tests below: the
    base's own set imported (-r) and the upstream SDK's round trip required (--client sdk)."""
    requirements = tmp_path_factory.mktemp("verify-reference") / "requirements.txt"
    requirements.write_text("requests\npandas\npydantic\npython-dateutil\n")
    return run_verify(own_reference, "-r", str(requirements), "--client", "sdk")


def test_verify_passes_on_the_reference_image(verified_reference, own_reference, docker_client):
    result = verified_reference
    assert result.returncode == 0 and not failed_lines(result.stdout), result.stdout + result.stderr
    names = {line[6:].split("  ")[0].strip() for line in result.stdout.splitlines()
             if line.startswith("PASS  ")}  # fmt: skip
    assert names >= CONTRACT_NAMES
    assert {"import requests", "import pandas", "import pydantic", "import dateutil"} <= names
    assert no_verify_containers_left(docker_client, own_reference)


@pytest.fixture(scope="module")
def derived_images(reference_image, docker_client, tmp_path_factory):
    """Images FROM the reference that break the contract, built once for this module."""
    recipes = {
        # The server answers a timeout with exit code 1, as the upstream server does.
        "bsi-reference-timeout1:test": [
            "USER 0:0",
            f"RUN sed -i 's/^TIMEOUT_EXIT_CODE = 124$/TIMEOUT_EXIT_CODE = 1/' {COMMANDS}"
            f" && grep -q '^TIMEOUT_EXIT_CODE = 1$' {COMMANDS}",
            "USER 65532:65532",
        ],
        # Runs as root, and ships an /app/deps-extra the sandbox user can write to.
        "bsi-reference-root:test": [
            "USER 0:0",
            "RUN mkdir -p /app/deps-extra && chown 65532:65532 /app/deps-extra",
            "ENV PYTHONPATH=/app/deps:/app/deps-extra",
        ],
    }
    built = {}
    for tag, lines in recipes.items():
        context = tmp_path_factory.mktemp("derived")
        (context / "Dockerfile").write_text("\n".join([f"FROM {reference_image}", *lines, ""]))
        with open(context / "build.log", "w") as log:
            build_image(context, BuildSpec(tag=tag), log)
        built[tag] = tag
    yield built
    for tag in built:
        docker_client.images.remove(tag, force=True)


def test_verify_client_sdk_and_the_hardening_checks_pass_on_the_reference_image(
    verified_reference, own_reference, docker_client
):
    """The table an operator sees: the SDK's round trip and issue 9's adversarial checks."""
    result = verified_reference
    assert result.returncode == 0, result.stdout + result.stderr
    wanted = ["sdk run", "sdk python3", "sdk timeout", "sdk write-read", "sdk list", "sdk exists"]
    wanted += ["race", "detached", "flood", "starve"]
    lines = {name: table_line(result.stdout, name) for name in wanted}
    assert all(line.startswith("PASS ") for line in lines.values()), result.stdout
    assert " 0 escapes in download " in lines["race"] and "upload" in lines["race"]
    assert "none left after an exit" in lines["detached"]
    assert "truncated" in lines["flood"]
    assert "300 half-sent connections from inside" in lines["starve"]
    assert no_verify_containers_left(docker_client, own_reference)


@pytest.mark.usefixtures("docker_client")
def test_verify_fails_on_a_server_whose_timeout_exits_1(derived_images, docker_client):
    result = run_verify("bsi-reference-timeout1:test")
    assert result.returncode == 1, result.stdout
    failed = failed_lines(result.stdout)
    assert any(line.split()[1] == "timeout" for line in failed), result.stdout
    assert "exit_code 1" in next(line for line in failed if line.split()[1] == "timeout")
    assert "timeout" in result.stderr
    assert no_verify_containers_left(docker_client, "bsi-reference-timeout1:test")


@pytest.mark.usefixtures("docker_client")
def test_verify_fails_on_an_image_that_runs_as_root(derived_images, docker_client):
    result = run_verify("bsi-reference-root:test")
    assert result.returncode == 1, result.stdout
    failed = {line.split()[1] for line in failed_lines(result.stdout)}
    assert {"image-user", "deps-extra-readonly"} <= failed, result.stdout
    assert "image-user" in result.stderr
    assert no_verify_containers_left(docker_client, "bsi-reference-root:test")


@pytest.mark.usefixtures("docker_client")
def test_verify_fails_on_an_image_without_a_server(test_env, docker_client):
    result = run_verify(test_env["base_image"], "--json")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert {c["name"] for c in report["checks"] if not c["passed"]} >= {"health"}
    assert no_verify_containers_left(docker_client, test_env["base_image"])


@pytest.mark.usefixtures("docker_client")
def test_verify_names_a_failing_import_and_snippet(own_reference, docker_client):
    result = run_verify(
        own_reference,
        "--import", "json",
        "--import", "no_such_module_bsi",
        "--check", "import pandas; assert pandas.__version__.startswith('3.')",
        "--check", "raise SystemExit(3)",
    )  # fmt: skip
    assert result.returncode == 1
    failed = {" ".join(line.split()[1:3]) for line in failed_lines(result.stdout)}
    assert failed == {"import no_such_module_bsi", "check 2"}, result.stdout
    assert "PASS  import json" in result.stdout
    assert no_verify_containers_left(docker_client, own_reference)


# The OOM case: a container limited to MEMORY_LIMIT (no swap), the server holding a reply
# spooled in its tmpfs /tmp while a command allocates until the kernel kills something.
MEMORY_LIMIT = "192m"
SPOOLED = "import sys; sys.stdout.buffer.write(b'x' * (8 << 20))"
GREEDY = "chunks = []\nwhile True:\n    chunks.append(b'\\x01' * (16 << 20))\n"


def http_request(port: int, line: str, payload: object = None) -> tuple[int, bytes]:
    """(status, body) of one request ("METHOD /path", a JSON payload) to a published port."""
    body = b"" if payload is None else json.dumps(payload).encode()
    method, path = line.split(" ", 1)
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request(method, path, body=body or None)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def execute_request(command: list[str]) -> bytes:
    body = json.dumps({"command": command, "timeout_seconds": 120}).encode()
    head = f"POST /execute HTTP/1.1\r\nHost: sandbox\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


@pytest.mark.usefixtures("docker_client")
def test_under_a_memory_limit_the_kernel_kills_the_command_and_the_server_keeps_serving(
    reference_image, docker_client
):
    container = docker_client.containers.run(
        reference_image,
        detach=True,
        read_only=True,
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        mem_limit=MEMORY_LIMIT,
        memswap_limit=MEMORY_LIMIT,
        tmpfs={"/workspace": "uid=65532,gid=65532", "/tmp": "mode=1777"},
        ports={"8888/tcp": ("127.0.0.1", None)},
        labels={LABEL: "1"},
    )
    try:
        port = wait_serving(container, 8888)
        # A reply of 8 MiB the server has spooled and is sending to a client that does not read.
        held = socket.create_connection(("127.0.0.1", port), timeout=120)
        held.sendall(execute_request(["python3", "-c", SPOOLED]))
        wait_for(
            lambda: select.select([held], [], [], 0)[0],
            deadline_s=120,
            what="the 8 MiB reply to start arriving",
        )
        with socket.create_connection(("127.0.0.1", port), timeout=120) as greedy:
            greedy.sendall(execute_request(["python3", "-c", GREEDY]))
            reply = b""
            while chunk := greedy.recv(65536):
                reply += chunk
                if b"\r\n\r\n" in reply:
                    head, _, body = reply.partition(b"\r\n\r\n")
                    length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
                    if len(body) >= length:
                        break
        result = json.loads(reply.partition(b"\r\n\r\n")[2])
        assert result["exit_code"] == 137, result["stderr"][-500:]
        # The server lived through it: it still answers, and the held reply arrives whole.
        assert http_request(port, "GET /") == (200, b'{"status": "ok"}')
        answer = b""
        while chunk := held.recv(1 << 20):
            answer += chunk
            head, _, body = answer.partition(b"\r\n\r\n")
            if body and len(body) >= int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0]):
                break
        held.close()
        assert len(json.loads(answer.partition(b"\r\n\r\n")[2])["stdout"]) == 8 << 20
        container.reload()
        assert container.status == "running"
    finally:
        container.remove(force=True)


# Another container on the engine's bridge network: a client with its own address. It holds
# its share of 4 connections, then asks for more, and holds on while the host asks too.
OVER_SHARE = """
import json, signal, socket, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # PID 1: the test's SIGTERM ends the hold
server = (sys.argv[1], 8888)
held = [socket.create_connection(server, timeout=60) for _ in range(4)]
for conn in held:  # each one answered by a thread of its own: the share is taken
    conn.sendall(b"GET / HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
    answer = b""
    while not answer.endswith(b"}"):
        chunk = conn.recv(4096)
        assert chunk, answer
        answer += chunk
started = time.monotonic()
with socket.create_connection(server, timeout=60) as extra:
    extra.sendall(b"GET /exists/x HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n")
    answer = extra.recv(4096)
print(json.dumps({"head": answer.split(b"\\r\\n\\r\\n")[0].decode(),
                  "seconds": time.monotonic() - started}), flush=True)
signal.pause()  # holding the share until the test has asked from the host
"""


@pytest.mark.usefixtures("docker_client")
def test_in_the_image_a_source_over_its_share_gets_503_another_is_served_children_oom_1000(
    reference_image, docker_client
):
    """SANDBOX_MAX_CONNECTIONS_PER_SOURCE sets the share; the client container's address is one
    source, the host (through the published port) another."""
    server = docker_client.containers.run(
        reference_image,
        detach=True,
        read_only=True,
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        environment={"SANDBOX_MAX_CONNECTIONS_PER_SOURCE": "4"},
        tmpfs={"/workspace": "uid=65532,gid=65532", "/tmp": "mode=1777"},
        ports={"8888/tcp": ("127.0.0.1", None)},
        labels={LABEL: "1"},
    )
    client = None
    try:
        port = wait_serving(server, 8888)
        address = server.attrs["NetworkSettings"]["IPAddress"]
        client = docker_client.containers.run(
            reference_image,
            entrypoint=["python3", "-c", OVER_SHARE, address],
            detach=True,
            labels={LABEL: "1"},
        )

        def answered() -> bytes:
            client.reload()
            logs = client.logs(stdout=True, stderr=False)
            assert logs or client.status != "exited", client.logs().decode()
            return logs

        refused = json.loads(wait_for(answered, deadline_s=120, what="the client's 503"))
        assert refused["head"].startswith("HTTP/1.1 503 "), refused
        assert "\r\nRetry-After: 1" in refused["head"] and refused["seconds"] < 0.5, refused
        # The host is another source: served while the client holds its share.
        assert http_request(port, "GET /exists/x")[0] == 200
        client.kill(signal="SIGTERM")
        assert client.wait(timeout=60)["StatusCode"] == 0
        # Every process of a command at 1000; the server (PID 1) keeps its own 0.
        script = (
            'cat /proc/self/oom_score_adj; sh -c "cat /proc/self/oom_score_adj";'
            " cat /proc/1/oom_score_adj"
        )
        status, body = http_request(port, "POST /execute", {"command": ["sh", "-c", script]})
        assert status == 200 and json.loads(body)["stdout"] == "1000\n1000\n0\n", body
    finally:
        for container in (client, server):
            if container is not None:
                container.remove(force=True)
