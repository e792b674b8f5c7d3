"""Plan-only (--no-build) against the real package index, amd64 and arm64: what pip installs,
the tool plans. PyTorch and TensorFlow sets (legacy manylinux tags: libclang's manylinux2010,
nvidia-cuda-nvrtc's manylinux_2_12), Playwright (manylinux1) and Selenium (an index file named
for another project) plan; the NVIDIA driver's libraries are the GPU node's; what only loads on
demand or on another vendor's accelerator is never required; warnings stay few, none about
Windows or macOS."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("package_index")

ARCHES = ("amd64", "arm64")
SETS = {
    "sentence-transformers": ["sentence-transformers"],
    "transformers-torch": ["transformers[torch]"],
    "tensorflow": ["tensorflow"],
    "tensorflow-cpu": ["tensorflow-cpu"],
    "playwright": ["playwright"],
    "selenium": ["selenium>=4"],
}
# What torch's ROCm and XPU branches load, and what NVSHMEM's transport and bootstrap plugins and
# cuFile's RDMA plugin link: 282 MB of apt packages nothing loads on a CPU node.
NEVER_REQUIRED = {
    "libamdhip64-5", "libze1", "libopenmpi40", "libucx0", "libfabric1", "libpmix2t64",
    "libibverbs1", "librdmacm1t64", "ibverbs-providers", "libopenmpi3t64",
}  # fmt: skip
FOREIGN = ("ucrtbase", "msvcr", "/System/Library", ".dll", ".dylib", "IOKit")


@pytest.fixture(scope="module", params=sorted(SETS))
def planned(
    request: pytest.FixtureRequest, shared_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, str, dict]:
    """One plan of the set on both arches: its name, what it printed, its report.json."""
    name: str = request.param
    tmp = tmp_path_factory.mktemp(name)
    (tmp / "requirements.txt").write_text("".join(f"{line}\n" for line in SETS[name]))
    result = subprocess.run(
        [sys.executable, "-m", "builder", "-r", "requirements.txt", "--output", "context",
         "--cache-dir", str(shared_cache), "--no-build",
         *(a for arch in ARCHES for a in ("--arch", arch))],
        capture_output=True, text=True, cwd=tmp,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp / "context" / "report.json").read_text())
    return name, result.stdout + result.stderr, report


@pytest.mark.parametrize("arch", ARCHES)
def test_the_set_plans_with_nothing_required_that_nothing_loads(
    planned: tuple[str, str, dict], arch: str
) -> None:
    name, _, report = planned
    record = report["architectures"][arch]
    assert not NEVER_REQUIRED & set(record["apt_packages"]), (name, record["apt_packages"])
    names = {package["name"] for package in record["packages"]}
    assert {"sentence-transformers": "torch", "transformers-torch": "torch",
            "tensorflow": "tensorflow", "tensorflow-cpu": "tensorflow-cpu",
            "playwright": "playwright", "selenium": "selenium"}[name] in names  # fmt: skip


@pytest.mark.parametrize("arch", ARCHES)
def test_the_cuda_driver_is_the_gpu_nodes(planned: tuple[str, str, dict], arch: str) -> None:
    name, _, report = planned
    node = {lib["soname"]: lib for lib in report["architectures"][arch]["provided_by_gpu_node"]}
    if "torch" not in name and "sentence" not in name:
        assert node == {}
        return
    assert node["libcuda.so.1"]["capability"] == "compute"
    assert all(lib["reason"] for lib in node.values())
    libraries = report["architectures"][arch]["native_libraries"]
    assert not any(lib["soname"].startswith("libcuda.so") for lib in libraries)


def test_warnings_are_few_and_none_about_another_os(planned: tuple[str, str, dict]) -> None:
    name, output, _ = planned
    warnings = [line for line in output.splitlines() if line.startswith("warning:")]
    assert len(warnings) <= 3, (name, warnings)
    assert not any(marker in line for line in warnings for marker in FOREIGN), warnings
    notes = [line for line in output.splitlines() if line.startswith("note:")]
    assert len(notes) <= 4, (name, notes)


def test_gpu_advice_drops_nothing_torch_links(planned: tuple[str, str, dict]) -> None:
    """The one GPU warning offers PyTorch's CPU build; it never offers to drop cuBLAS or cuDNN,
    which torch's extension links (its import would fail)."""
    name, output, _ = planned
    gpu = [line for line in output.splitlines() if "only work on a GPU" in line]
    if "torch" not in name and "sentence" not in name:
        assert gpu == []
        return
    (line,) = gpu
    assert "PyTorch's CPU build" in line
    assert "nvidia-cublas ;" not in line and "nvidia-cudnn-cu13 ;" not in line
