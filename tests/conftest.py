"""Shared fixtures for tests that use the real Docker engine and the local test registry.

`scripts/setup-env.sh` (run by `make test`) starts both and writes `.test-env.json` at the repo
root (or where ``BSI_TEST_ENV`` points)::

    {"docker": "/usr/bin/docker", "docker_host": "unix:///var/run/docker.sock",
     "base_image": "python:3.13-slim-trixie", "registry": "127.0.0.1:5000",
     "registry_user": "bsi", "registry_password": "...",
     "ca_bundle": "/etc/ssl/certs/ca-certificates.crt"}

Policy: a test that needs the engine (it requests ``docker_client``) or the registry (it requests
``registry``) FAILS in CI (``CI=true``) when the service does not answer, and is skipped with a
reason elsewhere. Use ``test_env["docker"]`` for the CLI: a newer docker CLI earlier on PATH may
demand buildx.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.images import Built
from support.machine import SESSION, Registry, unavailable
from support.registryhelp import NO_PROXY_OPENER

from builder import reporter

REPO_ROOT = Path(__file__).resolve().parent.parent
DOCKER_SOCK = "unix:///var/run/docker.sock"  # default when the test-env file names none


def _test_env_path() -> Path:
    return Path(os.environ.get("BSI_TEST_ENV") or REPO_ROOT / ".test-env.json")


@functools.cache
def _load_test_env() -> dict | None:
    try:
        return json.loads(_test_env_path().read_text())
    except FileNotFoundError:
        return None


def _docker_host() -> str:
    return (_load_test_env() or {}).get("docker_host", DOCKER_SOCK)


@functools.cache
def _engine_problem() -> str | None:
    """None when the engine answers, else why not."""
    try:
        import docker

        client = docker.DockerClient(base_url=_docker_host(), timeout=10)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:
        return f"Docker engine not answering on {_docker_host()}: {exc}"
    return None


@functools.cache
def _registry_problem() -> str | None:
    env = _load_test_env()
    if env is None:
        return f"no test-env file at {_test_env_path()}"
    url = f"http://{env['registry']}/v2/"
    try:
        NO_PROXY_OPENER.open(url, timeout=5)
    except urllib.error.HTTPError as exc:
        if exc.code == 401:
            return None
        return f"test registry at {url} answered {exc.code}, expected 401"
    except OSError as exc:
        return f"test registry not answering at {url}: {exc}"
    return f"test registry at {url} does not ask for credentials"


# Tiers come from what a test uses, never from a hand-set marker: each fixture below stands for a
# part of the machine, and a test that requests it (directly, through another fixture, or with
# `pytest.mark.usefixtures`) gets that part's marker. A test that requests none is `fast`:
# `make test-fast` runs exactly those, in a network namespace with no engine socket.
MACHINE_PARTS = {
    "test_env": "machine",  # .test-env.json, written by scripts/setup-env.sh
    "docker_client": "engine",
    "registry": "registry",
    "second_engine": "second_engine",
    "arm64_emulation": "emulation",
    "arm64_standin": "emulation",
    "package_index": "network",
}


# `make test` runs the suite on every core (pytest-xdist, `--dist loadgroup`). The tests that use
# a part of the machine run in groups, each group in one worker: a module's tests together (its
# module fixtures are set up once), and every module that uses one of the session fixtures below
# in one group with the others that use it, so what they build, or what only one process may
# hold, is made once a run and not once a worker. Tests that use nothing are handed out singly.
# The emulated modules stay one group: spread over both workers a run took 20 min 34 s against
# 18 min 23-42 s in one group, two workers' qemu contending for the same two cores
# (docs/development.md).
ONCE_A_RUN = ("arm64_standin", "second_engine", "union_image")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups (it names them in node ids)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    groups = _machine_groups(items)
    for item in items:
        requested = getattr(item, "fixturenames", ())
        parts = {MACHINE_PARTS[name] for name in requested if name in MACHINE_PARTS}
        for part in sorted(parts) or ["fast"]:
            item.add_marker(part)
        if item in groups:
            item.add_marker(pytest.mark.xdist_group(groups[item]))
    # The emulation group is the longest, and on a fresh machine it waits for the arm64
    # stand-in that scripts/setup-env.sh is still building in the background. Under xdist it
    # goes first: one worker waits for the stand-in and then runs it while the other runs
    # everything else. In one process it goes last, so the rest runs meanwhile. Each group
    # stays in one piece, module by module, so that no module fixture is set up twice.
    distributed = "PYTEST_XDIST_WORKER" in os.environ  # xdist's workers collect; it does not
    emulated_groups = {
        groups[i] for i in items if i in groups and "arm64_standin" in i.fixturenames
    }
    first_seen: dict[str, int] = {}
    for index, item in enumerate(items):
        first_seen.setdefault(groups.get(item, item.nodeid), index)
        first_seen.setdefault(_module_of(item), index)

    def order(item: pytest.Item) -> tuple[int, int, int]:
        group = groups.get(item)
        emulated = group in emulated_groups
        rank = (0 if emulated else 1) if distributed else (1 if emulated else 0)
        if group is None:  # a fast test: after every group, to fill the workers' last minutes
            rank = 2 if distributed else 0
        return rank, first_seen[group or item.nodeid], first_seen[_module_of(item)]

    items.sort(key=order)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Fail rather than run the groups apart: xdist names an item's group in its node id, which
    some pytest releases ignore (pytest-xdist#1386), and then every worker would build the
    emulated base and start a second engine of its own."""
    if not getattr(session.config.option, "loadgroup", False):  # set on xdist's workers only
        return
    grouped = [item for item in session.items if item.get_closest_marker("xdist_group")]
    if grouped and "@" not in grouped[0].nodeid:
        raise pytest.UsageError(
            f"pytest {pytest.__version__} drops pytest-xdist's groups (pytest-xdist#1386):"
            " run with XDIST= or a pytest that keeps them"
        )


def _module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def _machine_groups(items: list[pytest.Item]) -> dict[pytest.Item, str]:
    """Each machine test's group: its module, joined with every module sharing a fixture of
    ONCE_A_RUN (named after those fixtures)."""
    parent: dict[str, str] = {}

    def root(node: str) -> str:
        while parent.setdefault(node, node) != node:
            node = parent[node]
        return node

    machine = [item for item in items if MACHINE_PARTS.keys() & set(item.fixturenames)]
    for item in machine:
        for name in ONCE_A_RUN:
            if name in item.fixturenames:
                parent[root(_module_of(item))] = root(name)
    members: dict[str, set[str]] = {}
    for node in list(parent):
        members.setdefault(root(node), set()).add(node)
    names = {top: "+".join(sorted(set(ONCE_A_RUN) & nodes)) for top, nodes in members.items()}
    return {item: names.get(root(_module_of(item))) or _module_of(item) for item in machine}


def pytest_runtest_setup(item: pytest.Item) -> None:
    fixtures = getattr(item, "fixturenames", ())
    if "docker_client" in fixtures:
        problem = _engine_problem()
        if problem:
            unavailable(problem)
    if "registry" in fixtures:
        problem = _registry_problem()
        if problem:
            unavailable(problem)


@pytest.fixture(scope="session")
def test_env() -> dict:
    """The machine's test settings written by scripts/setup-env.sh (see module docstring)."""
    env = _load_test_env()
    if env is None:
        unavailable(f"no test-env file at {_test_env_path()}")
    return env


@pytest.fixture(scope="session")
def docker_client():
    """A docker SDK client on the local engine (the engine check runs before the test)."""
    import docker

    client = docker.DockerClient(base_url=_docker_host(), timeout=300)
    yield client
    client.close()


@pytest.fixture(scope="session")
def registry(test_env: dict) -> Registry:
    """(host, user, password) of the local htpasswd-protected registry; host is "127.0.0.1:5000"."""
    return Registry(test_env["registry"], test_env["registry_user"], test_env["registry_password"])


# ---------------------------------------------------------------------------------------------
# The reference runtime base image (builder/runtime/Dockerfile.base), built once per session.
# ---------------------------------------------------------------------------------------------
REFERENCE_TAG = "bsi-reference:test"


@pytest.fixture(scope="session")
def reference_image(test_env: dict, docker_client, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Tag of the reference base built from the stand-in by `build-sandbox-image base`.

    Built once per session (BuildKit's cache makes a rebuild of unchanged inputs take seconds),
    so it always reflects the current Dockerfile.base, server.py and base locks. The run's
    workers take turns (a lock in the run's directory): the first builds, the others find
    BuildKit's cache warm and tag the same image.
    """
    import subprocess
    import sys

    command = [
        sys.executable, "-m", "builder", "base",
        "--tag", REFERENCE_TAG, "--from", test_env["base_image"],
    ]  # fmt: skip
    with (run_directory(tmp_path_factory) / "reference-image.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        result = subprocess.run(
            command,
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            env={**os.environ, "DOCKER_HOST": _docker_host()},
            timeout=1800,
        )
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-30:])
        pytest.fail(f"building the reference base failed ({result.returncode}):\n{tail}")
    return REFERENCE_TAG


@pytest.fixture(scope="session")
def second_engine(docker_client):
    """A second Docker engine on this machine (support/secondengine.py), stopped after the session.

    Needs the first engine's setup (binfmt, the registry) but none of its images: what the second
    engine builds from comes from the local registry, as a remote build host's would.
    """
    from support.secondengine import SecondEngine

    engine = SecondEngine()
    try:
        engine.start()
    except (RuntimeError, OSError, subprocess.CalledProcessError) as error:
        unavailable(f"second engine: {error}")
    yield engine
    engine.stop()


@pytest.fixture(autouse=True)
def _secrets_of_this_test_only() -> Iterator[None]:
    """builder.reporter remembers the secrets a run reads for the rest of the process, and masks
    them in every line: one test's (a password "wrong") must not mask another's messages."""
    yield
    reporter._secrets.clear()


@pytest.fixture(scope="session")
def package_index() -> str:
    """The Python package index's simple API, checked once: the tests that resolve or download.

    Requesting it is what puts a test in the `network` tier (and out of `make test-fast`).
    """
    url = "https://pypi.org/simple/pip/"
    try:
        with urllib.request.urlopen(url, timeout=20) as response:
            response.read(1)
    except OSError as exc:
        unavailable(f"the package index does not answer at {url}: {exc}")
    return "https://pypi.org/simple/"


@pytest.fixture(scope="session")
def arm64_emulation() -> None:
    """binfmt_misc runs arm64 binaries (scripts/setup-env.sh registers qemu-aarch64-static)."""
    if not Path("/proc/sys/fs/binfmt_misc/status").exists():
        unavailable("binfmt_misc is not mounted: no arm64 emulation")


@pytest.fixture(scope="session")
def arm64_standin(test_env: dict, arm64_emulation: None) -> str:
    """The arm64 stand-in image (python:3.13-slim-trixie-arm64) and the two-arch index of both
    stand-ins in the test registry. On a fresh machine scripts/setup-env.sh builds them in the
    background (about 11 min under emulation); this waits for that run, under its lock, and then
    reads the index's keys into `test_env`."""
    if "multiarch_base" not in test_env:
        setup = subprocess.run(
            [str(REPO_ROOT / "scripts" / "setup-env.sh"), "--arm64"],
            capture_output=True,
            text=True,
            timeout=3600,
        )
        if setup.returncode != 0:
            unavailable(f"scripts/setup-env.sh --arm64 failed:\n{setup.stderr[-2000:]}")
        test_env.update(json.loads(_test_env_path().read_text()))
    return test_env["base_image_arm64"]


@pytest.fixture(scope="session")
def standin_index(test_env: dict, registry: Registry, arm64_standin: str) -> str:
    """`host/library/python:3.13-slim-trixie` in the test registry: the amd64 and arm64 stand-ins
    under one index (each arch also tagged `-amd64`, `-arm64`)."""
    return test_env["multiarch_base"]


# ---------------------------------------------------------------------------------------------
# Expensive set-up shared by the whole session. A test that is about cold caches, isolation or
# reproducibility from scratch makes its own instead.
# ---------------------------------------------------------------------------------------------


def run_directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of this run's that all its xdist workers share (each has its own basetemp,
    under the run's); in one process, the session's own."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if "PYTEST_XDIST_WORKER" in os.environ else base


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One wheel, probe and bytecode cache for every build that is not about a cold cache, and
    for every worker of the run: a distribution is downloaded, inspected and compiled once a run,
    as on a CI runner that keeps its cache (the cache writes by rename and downloads take a
    per-key lock, so concurrent CLI runs share it safely)."""
    path = run_directory(tmp_path_factory) / "shared-cache"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="session")
def two_arch_base(standin_index: str, registry: Registry, shared_cache: Path) -> str:
    """The reference base built for amd64 and arm64 (arm64 under emulation) on the stand-in
    index by `build-sandbox-image base`, pushed as one index: built once a run (every module
    that uses it is in the emulation group, so in one worker)."""
    from support.registryhelp import tool

    tag = f"{registry.host}/bsi-shared-{SESSION}/runtime:1.0"
    result = tool(
        registry, "base", "--tag", tag, "--from", standin_index,
        "--arch", "amd64", "--arch", "arm64", "--cache-dir", str(shared_cache),
    )  # fmt: skip
    if result.returncode != 0:
        pytest.fail(
            f"building the two-arch base failed:\n{result.stdout[-2000:]}{result.stderr[-3000:]}"
        )
    assert result.stdout.split()[-1].startswith(
        f"{registry.host}/bsi-shared-{SESSION}/runtime@sha256:"
    )
    return tag


@pytest.fixture(scope="session")
def union_image(
    reference_image: str, shared_cache: Path, test_env: dict, package_index: str, tmp_path_factory
) -> Iterator[Built]:
    """One image for the tests that only look at a built image: beautifulsoup4 (pure Python),
    lightgbm (libgomp1, found in its ELF needs), python-magic (libmagic, loaded through ctypes),
    psycopg (libpq, found through find_library) and Wand (MagickWand, whose name is computed at
    run time: ctypes.toml names it) — planned, built and verified hardened by one CLI run on
    the reference base, instead of one build each."""
    from support.images import build, docker

    tmp_path = tmp_path_factory.mktemp("union")
    tag = f"bsi-e2e/union-{SESSION}:test"
    result = build(
        tmp_path, shared_cache, reference_image,
        "beautifulsoup4\nlightgbm\npython-magic\npsycopg\nWand\n", tag,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    report = json.loads((tmp_path / "context" / "report.json").read_text())
    yield Built(tag, result, report)
    docker(test_env, "rmi", "-f", tag, check=False)


@pytest.fixture(scope="session")
def pushed_reference(reference_image: str, registry: Registry, docker_client) -> str:
    """The reference base pushed once a session to `host/bsi-shared-<session>/reference:base`
    (host/repo@digest). A test that needs it in a repository of its own mounts it from there
    (support.registryhelp.mount_image) instead of pushing it again."""
    from support.registryhelp import push

    repository = f"{registry.host}/bsi-shared-{SESSION}/reference"
    docker_client.api.tag(reference_image, repository, "base")
    digest = push(docker_client, registry, f"{repository}:base")
    docker_client.images.remove(f"{repository}:base")
    return f"{repository}@{digest}"


@pytest.fixture
def sandbox_workspace() -> Iterator[Path]:
    """A fresh directory that the sandbox user (uid 65532) owns and can reach (pytest's own
    tmp_path is root's, under a 0700 directory): the workspace of a server run as that user,
    in a directory of its own under /tmp that also takes the server's log; both removed
    afterwards, whatever became of the server."""
    from support.sandboxserver import give_to_sandbox_user, sandbox_dir

    parent = sandbox_dir()
    workspace = parent / "workspace"
    workspace.mkdir()
    give_to_sandbox_user(workspace)
    yield workspace
    shutil.rmtree(parent, ignore_errors=True)
