"""First use inside a read-only sandbox: quiet imports, a home that works, caches built once.

One image of matplotlib, nltk, IPython, tldextract, numba and jupyter-core, plus a wheel of
our own whose import writes a warning to stderr, built by the real CLI on a base made from
this tree's server, then run as the platform runs it: read-only root, uid 65532, all
capabilities dropped, a tmpfs /workspace, and /tmp a memory-backed tmpfs of 64 MiB as the
example SandboxTemplate mounts it (and once without any writable /tmp).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from support.images import Built, build, docker, run_hardened
from support.waiting import wait_serving
from support.wheelfactory import make_wheel
from support.wheelindex import serve_wheel

from builder import contract
from builder.verify.client import Sandbox

REPO_ROOT = Path(__file__).resolve().parents[2]
LIBRARIES = ("matplotlib", "nltk", "IPython", "tldextract", "numba", "jupyter_core")
REQUIREMENTS = "matplotlib\nnltk\nipython\ntldextract\nnumba\njupyter-core\nbsi-noisy\n"
NOISE = "bsi-noisy: this module is deprecated, use something else"
IMPORTS = f"import {', '.join(LIBRARIES)}"
# matplotlib logs this (INFO) whenever a process builds its font list instead of reading it
REBUILT = "generated new fontManager"
FONT_CHECK = (
    "import logging; logging.basicConfig(level=logging.INFO);"
    " import matplotlib.font_manager as fm, matplotlib.pyplot as plt;"
    " import io; plt.plot([1, 2]); plt.savefig(io.BytesIO(), format='png');"
    " print(fm.findfont('DejaVu Sans'))"
)
# numba's cache=True in a module whose directory is read-only (as librosa's in /app/deps-extra):
# the cache goes to $XDG_CACHE_HOME/numba; the cache hits of this process are printed
NUMBA_CACHE = """
import os, pathlib, sys
lib = pathlib.Path("/tmp/lib")
if not lib.exists():
    lib.mkdir()
    (lib / "jitted.py").write_text(
        "from numba import njit\\n@njit(cache=True)\\ndef add(x):\\n    return x + 1\\n")
    lib.chmod(0o555)
sys.path.insert(0, str(lib))
import jitted
assert jitted.add(1) == 2
print(sum(jitted.add.stats.cache_hits.values()))
"""
TEMPLATE_TMP = "rw,nosuid,nodev,size=64m,mode=1777"  # the template's emptyDir: Memory, 64Mi
WORKSPACE_TMPFS = f"rw,nosuid,nodev,size=256m,uid={contract.SANDBOX_UID},gid={contract.SANDBOX_GID}"


@pytest.fixture(scope="module")
def own_base(test_env: dict, docker_client: Any) -> Iterator[str]:
    """The reference base built from this tree's server (`base`), under a tag of its own: the
    shared reference tag may hold another tree's server at any moment."""
    tag = f"bsi-firstuse-base-{uuid.uuid4().hex[:8]}:test"
    result = subprocess.run(
        [sys.executable, "-m", "builder", "base", "--tag", tag, "--from", test_env["base_image"]],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    yield tag
    docker(test_env, "rmi", "-f", tag, check=False)


def noisy_wheel(directory: Path) -> Path:
    source = f"import sys\nprint({NOISE!r}, file=sys.stderr)\n".encode()
    return make_wheel(
        directory, "bsi-noisy", "1.0", "py3-none-any",
        {"bsi_noisy/__init__.py": source}, top_level=["bsi_noisy"],
    )  # fmt: skip


@pytest.fixture(scope="module")
def first_use_image(
    own_base: str,
    shared_cache: Path,
    test_env: dict,
    package_index: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Built]:
    tmp_path = tmp_path_factory.mktemp("first-use")
    tag = f"bsi-e2e/first-use-{uuid.uuid4().hex[:8]}:test"
    with serve_wheel(noisy_wheel(tmp_path / "wheels"), "bsi-noisy") as port:
        index = f"--extra-index-url http://127.0.0.1:{port}/simple\n"
        result = build(tmp_path, shared_cache, own_base, index + REQUIREMENTS, tag)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "context" / "report.json").read_text())
    yield Built(tag, result, report)
    docker(test_env, "rmi", "-f", tag, check=False)


@contextmanager
def platform_run(client: Any, image: str, tmp: bool = True) -> Iterator[tuple[Any, Sandbox]]:
    """`image` run as the platform runs it; its container and a client of its server."""
    tmpfs = {contract.WORKSPACE: WORKSPACE_TMPFS} | ({"/tmp": TEMPLATE_TMP} if tmp else {})
    container = client.containers.run(
        image,
        detach=True,
        read_only=True,
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        user=contract.SANDBOX_USER,
        tmpfs=tmpfs,
        ports={f"{contract.PORT}/tcp": ("127.0.0.1", None)},
        name=f"bsi-first-use-{uuid.uuid4().hex[:8]}",
    )
    try:
        sandbox = Sandbox(wait_serving(container, contract.PORT, contract.HEALTH))
        yield container, sandbox
    finally:
        container.remove(force=True)


def docker_history(test_env: dict, tag: str) -> list[dict]:
    lines = docker(test_env, "history", "--no-trunc", "--format", "{{json .}}", tag).stdout
    return [{"created_by": json.loads(line)["CreatedBy"]} for line in lines.splitlines()]


def plain_python(container: Any, code: str) -> tuple[int, str, str]:
    """A plain `python3 -c` beside the server (as `kubectl exec` runs one): exit, out, err."""
    result = container.exec_run(
        ["python3", "-c", code], user=contract.SANDBOX_USER, demux=True, workdir="/workspace"
    )
    out, err = result.output
    return result.exit_code, (out or b"").decode(), (err or b"").decode()


def test_the_build_hears_the_noisy_import_and_names_its_distribution(
    first_use_image: Built,
) -> None:
    lines = first_use_image.result.stdout.splitlines()
    warned = [line for line in lines if line.startswith("WARN")]
    assert len(warned) == 1, warned
    assert warned[0].split()[1:3] == ["import", "bsi_noisy"]
    assert f"bsi-noisy: wrote to stderr at import: {NOISE}" in warned[0]
    for module in LIBRARIES:  # the others imported quietly in the build's own verification
        assert any(line.startswith(f"PASS  import {module} ") for line in lines), module
    checks = first_use_image.report["image"]["verification"]["checks"]
    statuses = {check["name"]: check["status"] for check in checks}
    assert statuses["import bsi_noisy"] == "warn" and statuses["import matplotlib"] == "pass"


def test_a_strict_build_fails_on_the_noisy_import(
    first_use_image: Built, own_base: str, shared_cache: Path, tmp_path: Path
) -> None:
    with serve_wheel(noisy_wheel(tmp_path / "wheels"), "bsi-noisy") as port:
        index = f"--extra-index-url http://127.0.0.1:{port}/simple\n"
        result = build(
            tmp_path, shared_cache, own_base, index + REQUIREMENTS, first_use_image.tag, "--strict"
        )
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr
    assert any(line.startswith("FAIL  import bsi_noisy") for line in result.stdout.splitlines())
    # strict fails the deep imports' information too (matplotlib's backends for Tk, Qt, GTK):
    # the error line names the noisy import first, the table lists the rest
    assert "failed: import bsi_noisy, " in result.stderr.strip().splitlines()[-1]


def test_verify_strict_fails_the_noisy_import(first_use_image: Built) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "builder", "verify", first_use_image.tag, "--import", "bsi_noisy",
         "--strict"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr
    assert any(
        line.startswith("FAIL  import bsi_noisy") and "bsi-noisy: wrote to stderr" in line
        for line in result.stdout.splitlines()
    ), result.stdout
    assert result.stderr.strip().endswith("failed: import bsi_noisy"), result.stderr


def test_the_image_sets_a_home_and_carries_matplotlibs_font_list(
    first_use_image: Built, test_env: dict
) -> None:
    config = json.loads(docker(test_env, "image", "inspect", first_use_image.tag).stdout)[0]
    env = dict(entry.split("=", 1) for entry in config["Config"]["Env"])
    assert env["HOME"] == contract.HOME == "/tmp/home"
    assert env["XDG_CACHE_HOME"] == "/tmp/home/.cache"
    assert env["XDG_CONFIG_HOME"] == "/tmp/home/.config"
    assert env["MPLCONFIGDIR"] == "/tmp/home/.config/matplotlib"
    layers = first_use_image.report["image"]["arches"]["amd64"]["extras_layers"]
    assert layers[-1]["kind"] == "home" and layers[-1]["distributions"] == ["matplotlib"]
    history = [
        entry.get("created_by", "") for entry in docker_history(test_env, first_use_image.tag)
    ]
    assert any("# home seed of matplotlib, built from /app/deps-extra" in line for line in history)


def test_imports_are_quiet_and_the_font_list_is_never_built_in_the_sandbox(
    first_use_image: Built, docker_client: Any
) -> None:
    with platform_run(docker_client, first_use_image.tag) as (container, sandbox):
        for attempt in ("first", "second"):
            result = sandbox.python(IMPORTS)
            assert (result["exit_code"], result["stderr"]) == (0, ""), (attempt, result)
            fonts = sandbox.python(FONT_CHECK)
            assert fonts["exit_code"] == 0, fonts["stderr"]
            assert REBUILT not in fonts["stderr"], (attempt, fonts["stderr"])
            assert fonts["stdout"].strip().endswith("DejaVuSans.ttf")
            code, out, err = plain_python(container, IMPORTS)
            assert (code, err) == (0, ""), (attempt, out, err)
            code, out, err = plain_python(container, FONT_CHECK)
            assert code == 0 and REBUILT not in err, (attempt, err)
        jitted = [sandbox.python(NUMBA_CACHE) for _ in range(2)]
        assert [(run["exit_code"], run["stderr"]) for run in jitted] == [(0, "")] * 2, jitted
        assert [run["stdout"].strip() for run in jitted] == ["0", "1"]  # the second one hit
        assert sandbox.list("").json() == []  # nothing landed in the user's files
        code, out, _ = plain_python(
            container, "import os; print(sorted(os.listdir(os.environ['MPLCONFIGDIR'])))"
        )
        assert code == 0 and "fontlist-v" in out
        told = container.logs(stdout=False, stderr=True).decode()
        assert "home: /tmp/home, 1 files seeded from /opt/sandbox/home" in told, told


def test_without_a_writable_tmp_execute_stays_quiet_and_the_workspace_clean(
    first_use_image: Built, docker_client: Any
) -> None:
    with platform_run(docker_client, first_use_image.tag, tmp=False) as (container, sandbox):
        home = sandbox.python("import os; print(os.environ['HOME'], os.environ['MPLCONFIGDIR'])")
        assert home["stdout"].split() == ["/dev/shm/home", "/dev/shm/home/.config/matplotlib"]
        for attempt in ("first", "second"):
            result = sandbox.python(IMPORTS)
            assert (result["exit_code"], result["stderr"]) == (0, ""), (attempt, result)
            fonts = sandbox.python(FONT_CHECK)
            assert fonts["exit_code"] == 0 and REBUILT not in fonts["stderr"], fonts["stderr"]
        # beside the server, the image's environment: the reason docs/contract.md gives
        code, _, err = plain_python(container, "import matplotlib")
        assert code == 0 and "/tmp/home/.config/matplotlib" in err, err
        assert "Matplotlib created a temporary cache directory at /workspace/" in err, err
        assert sandbox.list("").json() == []  # that process removed its directory at exit
        told = container.logs(stdout=False, stderr=True).decode()
        assert (
            "home: /tmp/home cannot be made (Read-only file system); commands get"
            " HOME=/dev/shm/home, 1 files seeded from /opt/sandbox/home"
        ) in told, told


def test_a_no_build_context_builds_an_image_with_the_bytecode_and_the_seed(
    own_base: str, shared_cache: Path, test_env: dict, package_index: str, tmp_path: Path
) -> None:
    (tmp_path / "requirements.txt").write_text("matplotlib\n")
    context = tmp_path / "context"
    planned = subprocess.run(
        [sys.executable, "-m", "builder", "-r", "requirements.txt", "--output", str(context),
         "--cache-dir", str(shared_cache), "--no-build", "--arch", "amd64"],
        capture_output=True, text=True, cwd=tmp_path, timeout=900,
    )  # fmt: skip
    assert planned.returncode == 0, planned.stderr
    assert "bytecode compiled by the Dockerfile's own step" in planned.stdout
    tag = f"bsi-e2e/first-use-hand-{uuid.uuid4().hex[:8]}:test"
    built = subprocess.run(
        [test_env["docker"], "build", "-q", "--platform", "linux/amd64",
         "--build-arg", f"BASE_IMAGE={own_base}", "-t", tag, str(context)],
        capture_output=True, text=True, timeout=900, env={**os.environ, "DOCKER_BUILDKIT": "1"},
    )  # fmt: skip
    try:
        assert built.returncode == 0, built.stderr[-3000:]
        verified = subprocess.run(
            [sys.executable, "-m", "builder", "verify", tag, "--import", "matplotlib",
             "--import", "matplotlib.pyplot", "--strict"],
            capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert verified.returncode == 0, verified.stdout[-3000:] + verified.stderr
        lines = verified.stdout.splitlines()
        bytecode = next(line for line in lines if line.split()[1:2] == ["bytecode"])
        assert bytecode.startswith("PASS") and "loaded from .pyc" in bytecode, bytecode
        seed = run_hardened(
            test_env, tag, "import os; print(os.listdir('/opt/sandbox/home/.config/matplotlib'))"
        )
        assert seed.returncode == 0 and "fontlist-v" in seed.stdout, seed.stderr
    finally:
        docker(test_env, "rmi", "-f", tag, check=False)
