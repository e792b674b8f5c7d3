"""The main job without an engine (--no-build), against the real package index.

These are the acceptance checks of the core: the right packages and apt packages per arch,
nothing the base already has, one clear line and exit 1 for requirements that cannot work,
exit 2 for usage errors, nothing half-written, and a hadolint-clean Dockerfile.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from packaging.utils import parse_wheel_filename
from packaging.version import Version

from builder.context.render import APT_LISTS, APT_SCRATCH, APT_UPDATE
from builder.resolve.target import shipped_facts

pytestmark = pytest.mark.usefixtures("package_index")


@pytest.fixture(scope="session")
def cache_dir(shared_cache: Path) -> Path:
    """The session's warm cache (conftest): each big wheel is downloaded once."""
    return shared_cache


def run(
    tmp_path: Path, cache_dir: Path, requirements: str, *args: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    tmp_path.mkdir(exist_ok=True)
    req = tmp_path / "requirements.txt"
    req.write_text(requirements)
    out = tmp_path / "context"
    result = subprocess.run(
        [sys.executable, "-m", "builder", "-r", str(req), "--output", str(out),
         "--cache-dir", str(cache_dir), "--no-build", *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )  # fmt: skip
    return result, out


def report(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


def names(report: dict, arch: str) -> set[str]:
    return {p["name"] for p in report["architectures"][arch]["packages"]}


def test_beautifulsoup4_needs_no_apt_and_nothing_from_the_base(
    tmp_path: Path, cache_dir: Path
) -> None:
    result, out = run(tmp_path, cache_dir, "beautifulsoup4\n")
    assert result.returncode == 0, result.stderr
    data = report(out)
    assert data["architectures"]["amd64"]["apt_packages"] == []
    installed = names(data, "amd64")
    assert "beautifulsoup4" in installed
    assert not installed & set(shipped_facts().distributions)
    assert "beautifulsoup4" in result.stdout and "apt packages: none" in result.stdout
    assert "not building (--no-build)" in result.stdout
    lock = (out / "requirements-amd64.lock").read_text()
    assert "beautifulsoup4==" in lock and "--hash=sha256:" in lock
    layers = data["architectures"]["amd64"]["extras_layers"]
    assert {"beautifulsoup4", "soupsieve"} <= {n for one in layers for n in one["distributions"]}
    index = next(i for i, one in enumerate(layers, 1) if one["distributions"] == ["beautifulsoup4"])
    with tarfile.open(out / f"deps-extra-amd64-{index:02d}.tar") as layer:
        assert "app/deps-extra/bs4/__init__.py" in layer.getnames()
        assert not any(name.startswith("app/deps-extra/soupsieve") for name in layer.getnames())


def test_lightgbm_needs_libgomp1_on_both_arches(tmp_path: Path, cache_dir: Path) -> None:
    result, out = run(tmp_path, cache_dir, "lightgbm\n", "--arch", "amd64", "--arch", "arm64")
    assert result.returncode == 0, result.stderr
    data = report(out)
    for arch in ("amd64", "arm64"):
        assert "libgomp1" in data["architectures"][arch]["apt_packages"]
        assert "scipy" in names(data, arch)
        assert "numpy" not in names(data, arch)
        assert "numpy==" in " ".join(data["architectures"][arch]["provided_by_base"])
        machine = {"amd64": "x86_64", "arm64": "aarch64"}[arch]
        wheels = [w["filename"] for w in data["architectures"][arch]["wheels"]]
        assert all(machine in w or w.endswith("-any.whl") for w in wheels), wheels
    assert "libgomp.so.1 -> libgomp1" in result.stdout
    dockerfile = (out / "Dockerfile").read_text()
    assert "libgomp1" in dockerfile


def test_opencv_and_python_magic_native_needs(tmp_path: Path, cache_dir: Path) -> None:
    result, out = run(tmp_path, cache_dir, "opencv-python\npython-magic\n")
    assert result.returncode == 0, result.stderr
    apt = report(out)["architectures"]["amd64"]["apt_packages"]
    assert {"libgl1", "libglib2.0-0t64", "libmagic1t64"} <= set(apt)
    assert apt == sorted(apt)
    assert any("magic" in check for check in report(out)["runtime_checks"])


@pytest.mark.parametrize(
    ("requirements", "expected"),
    [
        (
            "scipy==1.11.4\n",
            ["scipy==1.11.4", "no wheel for cp313", "newest version with a usable wheel"],
        ),
        ("pandas<2\n", ["pandas<2", "conflicts with the base image", "pandas==3"]),
        ("no-such-distribution-zzq\n", ["no-such-distribution-zzq", "no such distribution"]),
    ],
)
def test_unworkable_requirements_exit_1_with_one_line(
    tmp_path: Path, cache_dir: Path, requirements: str, expected: list[str]
) -> None:
    result, out = run(tmp_path, cache_dir, requirements)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in expected:
        assert fragment in lines[0]
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["requirements.txt"]


def test_failure_leaves_a_previous_context_untouched(tmp_path: Path, cache_dir: Path) -> None:
    result, out = run(tmp_path, cache_dir, "beautifulsoup4\n")
    assert result.returncode == 0
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    result, out = run(tmp_path, cache_dir, "pandas<2\n")
    assert result.returncode == 1
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before


def one_error(result: subprocess.CompletedProcess[str]) -> str:
    """The run's one `error:` line (it must have failed with exactly one)."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_boto3_on_the_reference_base_names_the_override_that_plans_it(
    tmp_path: Path, cache_dir: Path
) -> None:
    """botocore caps python-dateutil below 3 and the base holds 4.0.0: the line names the
    newest botocore's conflict (not a 2019 release's urllib3) and the override; with that
    override the set plans, python-dateutil taken from the base."""
    pinned = f"python-dateutil=={shipped_facts().distributions['python-dateutil']}"
    refused, _ = run(tmp_path / "refused", cache_dir, "boto3\n", "--arch", "amd64")
    line = one_error(refused)
    assert "botocore==" in line and "depends on python-dateutil" in line
    assert f"but the base image pins {pinned}" in line
    assert line.endswith(f"give --override FILE with the line {pinned}")
    assert "urllib3" not in line
    alone, _ = run(tmp_path / "botocore", cache_dir, "botocore\n", "--arch", "amd64")
    assert one_error(alone) == line  # not its 2019 releases' urllib3 cap, which uv reached last
    overrides = tmp_path / "overrides.txt"
    overrides.write_text(f"{pinned}\n")
    planned, out = run(
        tmp_path / "planned", cache_dir, "boto3\n", "--arch", "amd64", "--override", str(overrides)
    )
    assert planned.returncode == 0, planned.stderr
    amd64 = report(out)["architectures"]["amd64"]
    assert {"boto3", "botocore", "s3transfer"} <= {p["name"] for p in amd64["packages"]}
    assert pinned in amd64["provided_by_base"]


def pip_newest(name: str, download: Path) -> str:
    """The release `pip download --no-deps` takes of `name` for the target today."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
         "--python-version", "3.13", "--platform", "manylinux_2_28_x86_64",
         "--index-url", "https://pypi.org/simple", "--dest", str(download), "--quiet", name],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    (wheel,) = download.glob("*.whl")
    return str(parse_wheel_filename(wheel.name)[1])


def test_unpinned_dbt_core_gets_a_final_release_as_pip_does(
    tmp_path: Path, cache_dir: Path
) -> None:
    """uv alone took 2.0.0a4: every final release's python-dateutil cap conflicts with the
    base's. The run says that conflict instead, and with the override plans a final release:
    pip's own, or one with a note naming pip's and why it is held back."""
    pip_version = pip_newest("dbt-core", tmp_path / "pip")
    assert not Version(pip_version).is_prerelease
    refused, _ = run(tmp_path / "refused", cache_dir, "dbt-core\n", "--arch", "amd64")
    assert "depends on python-dateutil" in one_error(refused)
    assert "2.0.0a" not in refused.stdout + refused.stderr
    overrides = tmp_path / "overrides.txt"
    pinned = shipped_facts().distributions["python-dateutil"]
    overrides.write_text(f"python-dateutil=={pinned}\n")
    planned, out = run(
        tmp_path / "planned", cache_dir, "dbt-core\n", "--arch", "amd64", "--override",
        str(overrides),
    )  # fmt: skip
    assert planned.returncode == 0, planned.stderr
    packages = report(out)["architectures"]["amd64"]["packages"]
    versions = {p["name"]: p["version"] for p in packages}
    assert not Version(versions["dbt-core"]).is_prerelease
    held = f"dbt-core=={versions['dbt-core']} chosen, not the newest {pip_version}"
    if versions["dbt-core"] != pip_version:  # what the newest requires has no usable wheel
        assert held in planned.stdout + planned.stderr


def test_markers_for_other_platforms_are_skipped(tmp_path: Path, cache_dir: Path) -> None:
    result, out = run(
        tmp_path,
        cache_dir,
        'pywin32; sys_platform == "win32"\nbeautifulsoup4\nappnope; sys_platform == "darwin"\n',
    )
    assert result.returncode == 0, result.stderr
    assert not names(report(out), "amd64") & {"pywin32", "appnope"}


def test_pure_python_source_only_distribution_is_built(tmp_path: Path, cache_dir: Path) -> None:
    result, out = run(tmp_path, cache_dir, "docopt==0.6.2\n")
    assert result.returncode == 0, result.stderr
    arch = report(out)["architectures"]["amd64"]
    assert arch["built_from_source"] == ["docopt==0.6.2"]
    assert [w["tag"] for w in arch["wheels"]] == ["py3-none-any"]


@pytest.mark.parametrize(
    "args",
    [[], ["-r", "requirements.txt", "--arch", "s390x"], ["--bogus"]],
)
def test_usage_errors_exit_2(tmp_path: Path, args: list[str]) -> None:
    (tmp_path / "requirements.txt").write_text("requests\n")
    result = subprocess.run(
        [sys.executable, "-m", "builder", *args], capture_output=True, text=True, cwd=tmp_path
    )
    assert result.returncode == 2, result.stderr


def test_dockerfile_follows_the_recipe_and_passes_hadolint(tmp_path: Path, cache_dir: Path) -> None:
    result, out = run(tmp_path, cache_dir, "lightgbm\n")
    assert result.returncode == 0, result.stderr
    lines = (out / "Dockerfile").read_text().splitlines()
    instructions = [line.split()[0] for line in lines if line and not line.startswith(("#", " "))]
    assert instructions[-1] == "USER" and lines[-1] == "USER 65532:65532"
    froms = [line for line in lines if line.startswith("FROM ")]
    # BuildKit builds the system stage; the tool appends the very layer files the stage ADDs
    assert froms == [
        "FROM ${BASE_IMAGE} AS system",
        "FROM system AS extras-amd64",
        "FROM extras-${TARGETARCH}",
    ]
    system = lines[lines.index(froms[0]) : lines.index(froms[1])]
    extras = lines[lines.index(froms[1]) : lines.index(froms[2])]
    final = lines[lines.index(froms[2]) :]
    text = "\n".join(system)
    assert "install -y --no-install-recommends" in text
    # the package lists live in a BuildKit cache mount: revalidated next time, never in a layer
    assert "rm -rf /var/lib/apt/lists" not in text
    # root only around apt-get: USER 0:0 right before the apt RUN, the sandbox user right after
    apt_run = system[system.index("USER 0:0") + 1]
    assert apt_run.startswith(f"RUN {APT_LISTS} {APT_SCRATCH}")
    assert "target=/var/lib/apt/lists" in APT_LISTS and "sharing=private" in APT_LISTS
    assert f"{APT_UPDATE} \\" in text  # the lists of the other arch are kept
    assert system[-2] == "USER 65532:65532"
    stack = report(out)["architectures"]["amd64"]["extras_layers"]
    adds = [f"ADD deps-extra-amd64-{i:02d}.tar /" for i in range(1, len(stack) + 1)]
    assert [line for line in extras if line.startswith("ADD")] == adds
    assert "ENV PYTHONPATH=${PYTHONPATH:+${PYTHONPATH}:}/app/deps-extra" in final
    assert any(line.startswith("LABEL ") for line in final)
    assert any("org.build-sandbox-image.version=" in line for line in final)
    # no engine compiled the bytecode: the Dockerfile's own step does, and the label says so
    assert any('org.build-sandbox-image.bytecode="dockerfile"' in line for line in final)
    assert any("compileall.compile_dir('/app/deps-extra'" in line for line in final)
    assert "bytecode compiled by the Dockerfile's own step" in result.stdout
    assert report(out)["bytecode_step"] == "dockerfile"
    # the sandbox user's home, on the writable /tmp; no seed step without matplotlib
    assert "ENV HOME=/tmp/home \\" in final and "MPLCONFIGDIR" not in "\n".join(final)
    assert not any("/opt/sandbox/home" in line for line in final)
    assert all((out / add.split()[1]).is_file() for add in adds)
    assert not (out / "wheels").exists()  # no wheel is copied into a context or a layer
    hadolint = subprocess.run(  # in the context, with the config the context carries
        [str(Path(sys.executable).parent / "hadolint"), "Dockerfile"],
        capture_output=True,
        text=True,
        cwd=out,
    )
    assert hadolint.returncode == 0, hadolint.stdout + hadolint.stderr
