"""PyTorch's CPU route, by its mechanism: a second index serving `+cpu` local versions beside
PyPI (docs/usage.md). PyTorch's own index is not reachable from the test machine; a loopback
PEP 503 index serving a distribution the test builds stands in for it, with its links
percent-encoded as PyTorch's are (`%2Bcpu`). The run plans, builds and verifies a real image,
and says where each distribution came from.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from support.images import build, docker, run_hardened
from support.wheelfactory import make_wheel
from support.wheelindex import serve_wheel

from builder.config import load_config
from builder.errors import UserError
from builder.resolve.target import shipped_facts

PROJECT = "bsi-torchlike"
INIT = b"import filelock\n\nBUILD = 'cpu'\n"  # a dependency only PyPI serves, as torch's filelock


def _cpu_wheels(tmp_path: Path) -> list[Path]:
    """Two `+cpu` releases of a pure distribution that needs filelock from PyPI."""
    files = {"bsi_torchlike/__init__.py": INIT}
    return [
        make_wheel(
            tmp_path / "wheels",
            PROJECT,
            version,
            "py3-none-any",
            files,
            top_level=["bsi_torchlike"],
            requires=["filelock"],
        )
        for version in ("2.0+cpu", "2.1+cpu")
    ]


@pytest.mark.usefixtures("docker_client", "package_index")
def test_a_cpu_build_from_its_own_index_beside_pypi_builds_and_says_where_it_came_from(
    tmp_path: Path, reference_image: str, test_env: dict
) -> None:
    pinned, newer = _cpu_wheels(tmp_path)
    tag = f"bsi-e2e/cpu-route-{uuid.uuid4().hex[:12]}:test"
    cache = tmp_path / "cache"
    with serve_wheel(pinned, PROJECT, credentials="ci:idx-token", more=(newer,)) as port:
        index = f"http://127.0.0.1:{port}/simple"
        requirements = f"--extra-index-url http://ci:idx-token@127.0.0.1:{port}/simple\n"
        requirements += f"{PROJECT}==2.0+cpu\n"
        try:
            result = build(tmp_path, cache, reference_image, requirements, tag)
            assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
            run = run_hardened(
                test_env,
                tag,
                "import importlib.metadata as m, bsi_torchlike, filelock\n"
                "print(m.version('bsi-torchlike'), bsi_torchlike.BUILD, m.version('filelock'))",
            )
        finally:
            docker(test_env, "rmi", "-f", tag, check=False)
        again = subprocess.run(  # the same set again, plan only: the cached resolution
            [sys.executable, "-m", "builder", "-r", str(tmp_path / "requirements.txt"),
             "--no-build", "--arch", "amd64", "--output", str(tmp_path / "again"),
             "--cache-dir", str(cache)],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
    assert "idx-token" not in result.stdout + result.stderr + again.stdout + again.stderr
    assert "PASS  import bsi_torchlike" in result.stdout
    assert "PASS  sbom" in result.stdout  # the SBOM names 2.0+cpu as the image holds it
    report = json.loads((tmp_path / "context" / "report.json").read_text())
    assert report["image"]["verification"]["passed"] is True
    wheels = {w["name"]: w for w in report["architectures"]["amd64"]["wheels"]}
    assert wheels[PROJECT]["version"] == "2.0+cpu"
    assert wheels[PROJECT]["filename"] == "bsi_torchlike-2.0+cpu-py3-none-any.whl"
    assert wheels[PROJECT]["index"] == index  # credentials removed
    assert wheels["filelock"]["index"] == "https://pypi.org/simple"
    assert "idx-token" not in json.dumps(report)
    # the table's index column
    row = next(line.split() for line in result.stdout.splitlines() if f" {PROJECT} " in line)
    assert row[1] == "2.0+cpu" and index in row
    filelock = next(line.split() for line in result.stdout.splitlines() if " filelock " in line)
    assert "PyPI" in filelock
    # the check for newer releases read the index the distribution came from
    assert f"note: {PROJECT}==2.0+cpu is pinned; newest release: 2.1+cpu" in result.stderr
    # the image holds the +cpu build, which imports, hardened, beside PyPI's filelock
    assert run.returncode == 0, run.stderr
    version, build_kind, filelock_version = run.stdout.split()
    assert (version, build_kind) == ("2.0+cpu", "cpu")
    assert filelock_version == wheels["filelock"]["version"]
    # a rerun reads the resolution from the cache, origins included
    assert again.returncode == 0, again.stderr[-2000:]
    cached = json.loads((tmp_path / "again" / "report.json").read_text())
    assert {w["name"]: w["index"] for w in cached["architectures"]["amd64"]["wheels"]} == {
        name: wheel["index"] for name, wheel in wheels.items()
    }


@pytest.mark.usefixtures("package_index")
def test_an_index_that_does_not_answer_fails_in_one_line_naming_it(tmp_path: Path) -> None:
    """As PyTorch's index from a network that cannot reach it: one line, naming the index and
    the project asked for (uv's retries set to none, as an operator may: each would wait)."""
    with socket.socket() as closed:  # a port nothing listens on: bound, never listening
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        requirements = tmp_path / "requirements.txt"
        requirements.write_text(
            f"--extra-index-url http://127.0.0.1:{port}/simple\ntorch==2.9.0+cpu\n"
        )
        result = subprocess.run(
            [sys.executable, "-m", "builder", "-r", str(requirements), "--no-build",
             "--arch", "amd64", "--output", str(tmp_path / "out"),
             "--cache-dir", str(tmp_path / "cache")],
            capture_output=True, text=True, timeout=600,
            env={**os.environ, "UV_HTTP_RETRIES": "0"},
        )  # fmt: skip
    assert result.returncode == 1
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert error.startswith(
        f"error: cannot resolve for amd64: the index http://127.0.0.1:{port}/simple could not be"
        " read for torch ("
    ), result.stderr
    assert "refused" in error
    assert not (tmp_path / "out").exists()


def _plan_only(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """A plan-only run whose HTTPS goes to a proxy that refuses: the first index uv asks is
    named in the error line, without any network (and without uv's retries, each a wait)."""
    with socket.socket() as closed:  # bound, never listening: a connection is refused
        closed.bind(("127.0.0.1", 0))
        proxy = f"http://127.0.0.1:{closed.getsockname()[1]}"
        return subprocess.run(
            [sys.executable, "-m", "builder", *args, "--no-build",
             "--cache-dir", str(tmp_path / "cache")],
            capture_output=True, text=True, timeout=600, cwd=tmp_path,
            env={**os.environ, "HTTPS_PROXY": proxy, "https_proxy": proxy, "UV_HTTP_RETRIES": "0"},
        )  # fmt: skip


def test_torch_backend_sends_torch_to_pytorchs_cpu_index_from_the_flag_or_the_config(
    tmp_path: Path,
) -> None:
    """uv's --torch-backend, passed through: torch is asked of PyTorch's CPU index, not PyPI
    (the index is unreachable here, so the run stops at that question, in one line)."""
    (tmp_path / "requirements.txt").write_text("torch\n")
    (tmp_path / "build-sandbox-image.toml").write_text(
        'requirements = ["requirements.txt"]\nbase-repository = "sandbox-runtime"\n'
        'platform-version = "3.13-trixie"\narchitectures = ["amd64"]\ntorch-backend = "cpu"\n'
    )
    default = _plan_only(tmp_path, "-r", "requirements.txt", "--arch", "amd64")
    flag = _plan_only(
        tmp_path, "-r", "requirements.txt", "--arch", "amd64", "--torch-backend", "cpu"
    )
    config = _plan_only(tmp_path, "--config", "build-sandbox-image.toml")
    asked = "error: cannot resolve for amd64: the index {} could not be read for torch ("
    for run, index in (
        (default, "https://pypi.org/simple"),
        (flag, "https://download.pytorch.org/whl/cpu"),
        (config, "https://download.pytorch.org/whl/cpu"),
    ):
        assert run.returncode == 1
        (error,) = [line for line in run.stderr.splitlines() if line.startswith("error:")]
        assert error.startswith(asked.format(index)), run.stderr


@pytest.mark.parametrize(
    ("value", "why"),
    [("auto", "the build machine's GPU"), ("cu12;8", "is not one of uv's"), ("7", "must be")],
)
def test_a_torch_backend_that_names_no_build_is_refused(
    tmp_path: Path, value: str, why: str
) -> None:
    (tmp_path / "requirements.txt").write_text("torch\n")
    config = tmp_path / "build-sandbox-image.toml"
    quoted = value if value.isdigit() else f'"{value}"'
    config.write_text(
        'requirements = ["requirements.txt"]\nbase-repository = "sandbox-runtime"\n'
        f'platform-version = "3.13-trixie"\ntorch-backend = {quoted}\n'
    )
    with pytest.raises(UserError, match=why) as refused:
        load_config(config)
    assert str(refused.value).startswith(f"{config}: ")
    if not value.isdigit():
        flag = _plan_only(tmp_path, "-r", "requirements.txt", "--torch-backend", value)
        assert flag.returncode == 2 and why in flag.stderr


def test_an_extra_index_that_mirrors_a_base_pin_hides_pypis_version_and_the_error_says_so(
    tmp_path: Path,
) -> None:
    """PyTorch's CPU index mirrors torch's dependencies (typing-extensions among them), at its
    own versions. uv takes a project from the first index that lists it, extra ones first: a
    base pin the mirror lacks cannot be met, although PyPI has it. The error says why."""
    pinned = shipped_facts().distributions["typing-extensions"]
    mirrored = make_wheel(
        tmp_path / "wheels", "typing-extensions", "4.0.0", "py3-none-any",
        {"typing_extensions.py": b""},
    )  # fmt: skip
    cpu = make_wheel(
        tmp_path / "wheels", PROJECT, "2.0+cpu", "py3-none-any", {"bsi_torchlike/__init__.py": b""},
        requires=["typing-extensions>=4"],
    )  # fmt: skip
    with serve_wheel(cpu, PROJECT, others={"typing-extensions": mirrored}) as port:
        (tmp_path / "requirements.txt").write_text(
            f"--extra-index-url http://127.0.0.1:{port}/simple\n{PROJECT}==2.0+cpu\n"
        )
        result = _plan_only(tmp_path, "-r", "requirements.txt", "--arch", "amd64")
    assert result.returncode == 1
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert f"there is no version of typing-extensions=={pinned}" in error, error
    assert error.endswith(
        f"(the base image pins typing-extensions=={pinned}); with several indexes uv takes"
        " typing-extensions only from the first that lists it (--extra-index-url ones before"
        " --index-url): the others' versions are not seen"
    ), error
