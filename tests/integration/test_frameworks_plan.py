"""Plans against the real package index, amd64 and arm64: what pip installs, the tool plans.
PyTorch and TensorFlow sets (legacy manylinux tags: libclang's manylinux2010,
nvidia-cuda-nvrtc's manylinux_2_12), Playwright (manylinux1) and Selenium (an index file named
for another project) plan; the NVIDIA driver's libraries are the GPU node's; what only loads on
demand or on another vendor's accelerator is never required; warnings stay few, none about
Windows or macOS. tensorflow-cpu has no aarch64 wheel at all (pip refuses it there too: on
arm64 `tensorflow` is the CPU build): planned on amd64, refused on arm64 in one line."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.clirun import assert_one_error_line
from support.plans import reference_profile

from builder.cache import Cache
from builder.inspect.wheel_reader import cached_inspection, inspect_wheel
from builder.inspect.wheels import WheelInspection
from builder.plan.plan import ArchPlan, Plan, choose_wheel, plan_arch
from builder.resolve.index import download_all
from builder.resolve.requirements import RequirementSet, read_requirements
from builder.resolve.resolution import RemoteFile
from builder.resolve.target import ARCHES as ARCH
from builder.resolve.target import Arch, BaseProfile, Target
from builder.resolve.uv import resolve

pytestmark = pytest.mark.usefixtures("package_index")

ARCHES = ("amd64", "arm64")
SETS = {
    "sentence-transformers": ["sentence-transformers"],
    "transformers-torch": ["transformers[torch]"],
    "tensorflow": ["tensorflow"],
    "tensorflow-cpu": ["tensorflow-cpu"],  # amd64 only: see the module's docstring
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


@pytest.fixture(scope="module")
def frameworks_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cache]:
    """The module's own cache: inspections and resolutions kept for every set, the wheels (13 GB
    for these sets on both arches) dropped as soon as each is inspected, and the rest removed
    with the module, so the run's disk never holds them all at once."""
    root = tmp_path_factory.mktemp("frameworks-cache")
    yield Cache(root)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module", params=sorted(SETS))
def planned(request: pytest.FixtureRequest, frameworks_cache: Cache) -> tuple[str, Plan]:
    """One plan of the set on its arches, as the CLI's makes it (resolution, wheels, inspection,
    plan) without writing its layers: a PyTorch set's would be 11 GB a run."""
    name: str = request.param
    requirements_file = frameworks_cache.root / f"frameworks-{name}.txt"
    requirements_file.write_text("".join(f"{line}\n" for line in SETS[name]))
    requirements = read_requirements((requirements_file,), ())
    target = Target(reference_profile(), tuple(ARCH[arch] for arch in arches_of(name)))
    cache = frameworks_cache
    plans = tuple(_plan_arch(requirements, target, arch, cache) for arch in target.arches)
    return name, Plan(target.base, "base", plans, (), ())


def _plan_arch(
    requirements: RequirementSet, target: Target[BaseProfile], arch: Arch, cache: Cache
) -> ArchPlan:
    resolution = resolve(requirements, target, arch, cache)
    chosen = {p.name: choose_wheel(p, target, arch) for p in resolution.packages}
    inspections = _inspect_once([file for file, _ in chosen.values()], cache)
    return plan_arch(resolution, chosen, inspections, target)


def _inspect_once(files: list[RemoteFile], cache: Cache) -> dict[str, WheelInspection]:
    """sha256 -> inspection of each file: a wheel inspected before (torch, for the second set
    that pulls it) is not downloaded again; one downloaded here is deleted once inspected."""
    found = {f.sha256: cached_inspection(cache, f.filename, f.sha256) for f in files}
    missing = [f for f in files if found[f.sha256] is None]
    for sha256, path in download_all(missing, cache).items():
        found[sha256] = inspect_wheel(path, sha256, cache)
        path.unlink()
    return {sha256: inspection for sha256, inspection in found.items() if inspection is not None}


def arches_of(name: str) -> tuple[str, ...]:
    return ("amd64",) if name == "tensorflow-cpu" else ARCHES


def test_a_distribution_without_a_wheel_for_the_arch_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text("tensorflow-cpu\n")
    result = subprocess.run(
        [sys.executable, "-m", "builder", "-r", "requirements.txt", "--output", "context",
         "--cache-dir", str(tmp_path / "cache"), "--no-build", "--arch", "arm64"],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert_one_error_line(
        result, "tensorflow-cpu (requirements.txt:1): no wheel for arm64 (aarch64)",
        "has wheels only for manylinux_2_27_x86_64",
    )  # fmt: skip
    assert not (tmp_path / "context").exists()


TORCH_SETS = ("sentence-transformers", "transformers-torch")
LEGACY_ONLY = {  # set -> a distribution whose x86_64 wheels carry only legacy tags, and its tag
    "tensorflow": ("libclang", "manylinux2010_x86_64"),
    "sentence-transformers": ("nvidia-cuda-nvrtc", "manylinux_2_12_x86_64"),
    "playwright": ("playwright", "manylinux1_x86_64"),
}


@pytest.mark.parametrize("arch", ARCHES)
def test_the_set_plans_with_nothing_required_that_nothing_loads(
    planned: tuple[str, Plan], arch: str
) -> None:
    name, plan = planned
    if arch not in arches_of(name):
        return
    record = plan.to_dict()["architectures"][arch]
    assert not NEVER_REQUIRED & set(record["apt_packages"]), (name, record["apt_packages"])
    names = {package["name"] for package in record["packages"]}
    assert {"sentence-transformers": "torch", "transformers-torch": "torch",
            "tensorflow": "tensorflow", "tensorflow-cpu": "tensorflow-cpu",
            "playwright": "playwright", "selenium": "selenium"}[name] in names  # fmt: skip
    if arch == "amd64" and name in LEGACY_ONLY:  # a wheel pip installs by a legacy tag alone
        distribution, tag = LEGACY_ONLY[name]
        (wheel,) = [w for w in record["wheels"] if w["name"] == distribution]
        assert wheel["tag"].endswith(tag), wheel
    if name in TORCH_SETS:  # NVSHMEM's and cuFile's plugins; torch's ROCm and XPU branches,
        # whose runtimes Debian ships for amd64 only
        wanted = {"libucx0", "libamdhip64-5", "libze1"} if arch == "amd64" else {"libucx0"}
        assert wanted <= set(record["optional_apt_packages"])


@pytest.mark.parametrize("arch", ARCHES)
def test_the_cuda_driver_is_the_gpu_nodes(planned: tuple[str, Plan], arch: str) -> None:
    name, plan = planned
    if arch not in arches_of(name):
        return
    record = plan.to_dict()["architectures"][arch]
    node = {lib["soname"]: lib for lib in record["provided_by_gpu_node"]}
    if name not in TORCH_SETS:
        assert node == {}
        return
    assert node["libcuda.so.1"]["capability"] == "compute"
    assert all(lib["reason"] for lib in node.values())
    assert not any(lib["soname"].startswith("libcuda.so") for lib in record["native_libraries"])


def test_warnings_are_few_and_none_about_another_os(planned: tuple[str, Plan]) -> None:
    """What the CLI prints before its table (`Plan.warnings`): a handful of lines at most."""
    name, plan = planned
    warnings = [line for line in plan.warnings if line.startswith("warning:")]
    assert len(warnings) <= 2, (name, warnings)
    assert not any(marker in line for line in warnings for marker in FOREIGN), warnings
    notes = [line for line in plan.warnings if line.startswith("note:")]
    assert len(notes) <= 3, (name, notes)


def test_gpu_advice_drops_nothing_torch_links(planned: tuple[str, Plan]) -> None:
    """One GPU warning for both arches offers PyTorch's CPU build; it never offers to drop
    cuBLAS or cuDNN, which torch's extension links (its import would fail)."""
    name, plan = planned
    gpu = [line for line in plan.warnings if "only work on a GPU" in line]
    if name not in TORCH_SETS:
        assert gpu == []
        return
    (line,) = gpu
    assert "PyTorch's CPU build" in line and "amd64: " in line and "arm64: " in line
    assert "nvidia-cublas ;" not in line and "nvidia-cudnn-cu13 ;" not in line
