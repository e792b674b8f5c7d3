"""The GPU node's libraries and GPU weight in a plan, on synthetic wheels: the NVIDIA driver's
libraries are the node's (never an apt package, never a refusal), another accelerator's
runtime is optional, and the GPU-weight advice never drops what the set links."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from support.plans import SOURCE, TAG, plan_for, reference_profile
from support.wheelfactory import EXTENSION_SUFFIX, compile_so, make_wheel

from builder.analysis.gpu import accelerator_only, driver_library, gpu_weight
from builder.analysis.plan import Plan
from builder.analysis.stale import HeldBack, held_back_notes
from builder.cli.summary import summary


@pytest.mark.parametrize(
    ("soname", "capability"),
    [("libcuda.so.1", "compute"), ("libnvidia-ml.so.1", "utility"),
     ("libnvidia-ptxjitcompiler.so.1", "compute"), ("libnvidia-nvvm.so.4", "compute"),
     ("libnvcuvid.so.1", "video")],
)  # fmt: skip
def test_the_drivers_libraries_are_named_with_their_capability(
    soname: str, capability: str
) -> None:
    driver = driver_library(soname)
    assert driver is not None and driver.capability == capability and driver.reason


@pytest.mark.parametrize("soname", ["libcudart.so.13", "libcublas.so.12", "libgomp.so.1"])
def test_runtimes_the_wheels_ship_are_not_the_drivers(soname: str) -> None:
    assert driver_library(soname) is None


def torch_like(tmp_path: Path) -> Path:
    """An extension linking libcuda.so.1 (torch's libcaffe2_nvrtc), Python loading NVML, AMD's
    HIP runtime on its ROCm branch, and names only Windows, macOS or nothing loads."""
    extension = compile_so(tmp_path, SOURCE, "core.so", libs=[":libcuda.so.1"],
                           libdirs=[_fake_libcuda(tmp_path)])  # fmt: skip
    code = b"""import ctypes, sys
if sys.platform == "win32":
    ctypes.CDLL("ucrtbase")
nvml = ctypes.CDLL("libnvidia-ml.so.1")
hip = ctypes.CDLL("libamdhip64.so")
rtc = ctypes.CDLL("libhiprtc.so")
iokit = ctypes.CDLL("/System/Library/Frameworks/IOKit.framework/IOKit")
source = ctypes.CDLL("codegen/interface.cpp")
"""
    return make_wheel(tmp_path, "torchlike", "1.0", TAG, {
        f"torchlike/_C{EXTENSION_SUFFIX}": extension.read_bytes(),
        "torchlike/__init__.py": code,
    })  # fmt: skip


def _fake_libcuda(tmp_path: Path) -> Path:
    directory = tmp_path / "driver"
    directory.mkdir()
    compile_so(directory, SOURCE, "libcuda.so.1", soname="libcuda.so.1")
    return directory / "build"


def test_the_gpu_nodes_libraries_are_never_installed_nor_refused(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, [torch_like(tmp_path)])
    node = {lib.soname: lib for lib in plan.gpu_node}
    assert set(node) == {"libcuda.so.1", "libnvidia-ml.so.1"}
    assert node["libcuda.so.1"].how == "linked" and node["libcuda.so.1"].capability == "compute"
    assert node["libnvidia-ml.so.1"].needed_by == ("torchlike==1.0: torchlike/__init__.py:4",)
    assert plan.apt_packages == ()
    assert not any("libcuda" in lib.soname or "nvidia" in lib.soname for lib in plan.libraries)
    report = Plan(reference_profile(), "base", (plan,), (), ()).to_dict()
    recorded = json.loads(json.dumps(report))["architectures"]["amd64"]["provided_by_gpu_node"]
    assert [lib["soname"] for lib in recorded] == ["libcuda.so.1", "libnvidia-ml.so.1"]
    assert "provided by the GPU node" in summary(Plan(reference_profile(), "b", (plan,), (), ()))


def test_another_accelerators_runtime_is_optional_and_no_os_is_a_warning(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, [torch_like(tmp_path)])
    assert plan.warnings == ()  # not ucrtbase, IOKit, a .cpp file, nor the HIP runtime
    hip = {lib.soname: lib for lib in plan.libraries}
    assert hip["libamdhip64.so.5"].optional and "ROCm" in hip["libamdhip64.so.5"].reason
    assert hip["libhiprtc.so"].package == "" and hip["libhiprtc.so"].optional
    assert plan.optional_packages == ("libamdhip64-5",)


def test_a_load_the_set_ships_unversioned_is_satisfied(tmp_path: Path) -> None:
    """`ctypes.CDLL("cudart")` beside the CUDA wheel's libcudart.so.13 needs nothing more."""
    runtime = compile_so(tmp_path, SOURCE, "libcudart.so.13", soname="libcudart.so.13")
    cuda = make_wheel(tmp_path, "nvidia-cuda-runtime", "13.0", TAG, {
        "nvidia/cu13/lib/libcudart.so.13": runtime.read_bytes(),
    })  # fmt: skip
    user = make_wheel(tmp_path, "kernelslike", "1.0", "py3-none-any", {
        "kernelslike/__init__.py": b"import ctypes\nctypes.CDLL('cudart')\n",
    })  # fmt: skip
    plan = plan_for(tmp_path, [cuda, user])
    assert not any("cudart" in lib.soname for lib in plan.libraries)
    assert not any("cudart" in line for line in plan.warnings[:-1])  # the GPU weight line aside


@pytest.mark.parametrize(
    "name", ["libamdhip64.so", "amdhip64", "libze_loader.so.1", "cudart", "libnvrtc.so"]
)
def test_accelerator_runtimes_have_a_reason(name: str) -> None:
    assert accelerator_only(name)


def test_gpu_advice_drops_only_what_the_set_does_not_link(tmp_path: Path) -> None:
    """cuBLAS is linked by the framework's extension: dropping it breaks the import; Triton is
    not: the one warning offers to drop only Triton, and the framework's CPU route."""
    blas = compile_so(tmp_path, SOURCE, "libcublas.so.13", soname="libcublas.so.13")
    extension = compile_so(tmp_path, SOURCE, "core.so", libs=[":libcublas.so.13"],
                           libdirs=[blas.parent])  # fmt: skip
    wheels = [
        make_wheel(tmp_path, "torch", "2.0", TAG,
                   {f"torch/_C{EXTENSION_SUFFIX}": extension.read_bytes()}),
        make_wheel(tmp_path, "nvidia-cublas", "13.0", TAG,
                   {"nvidia/cu13/lib/libcublas.so.13": blas.read_bytes()}),
        make_wheel(tmp_path, "triton", "3.0", "py3-none-any", {"triton/__init__.py": b""}),
    ]  # fmt: skip
    plan = plan_for(tmp_path, wheels)
    (warning,) = plan.warnings
    assert warning.startswith("warning: 2 distributions only work on a GPU (")
    assert "nvidia-cublas==13.0, triton==3.0" in warning
    assert "torch → PyTorch's CPU build" in warning
    assert "drop triton with --override (a line `triton ; python_version < '0'`)" in warning
    assert "nvidia-cublas ;" not in warning


def test_gpu_weight_is_no_warning_without_gpu_distributions(tmp_path: Path) -> None:
    small = make_wheel(tmp_path, "small", "1.0", "py3-none-any", {"small/__init__.py": b""})
    assert gpu_weight("amd64", plan_for(tmp_path, [small]).wheels, ()) is None


def test_a_family_held_back_together_is_one_note() -> None:
    via = {
        "cuda-toolkit": ("torch",),
        "nvidia-cublas": ("cuda-toolkit", "nvidia-cudnn"),
        "nvidia-cudnn": ("torch",),
        "nvidia-nccl": ("torch",),  # pinned by torch alone: still torch's family
        "mpmath": ("sympy",),
    }
    names = ("cuda-toolkit", "mpmath", "nvidia-cublas", "nvidia-cudnn", "nvidia-nccl", "other")
    family, single = held_back_notes([HeldBack(name, "1", "2") for name in names], via)
    assert family.startswith("note: 4 distributions chosen older than their newest release")
    assert "held back together by torch's requirements: cuda-toolkit==1 (newest 2)" in family
    assert single == HeldBack("mpmath", "1", "2").message(via)


def test_the_gpu_weight_of_both_arches_is_one_line(tmp_path: Path) -> None:
    """The same GPU-only set on amd64 and arm64 is said once, with each arch's bytes."""
    nccl = make_wheel(tmp_path, "nvidia-nccl-cu13", "2.0", TAG, {"nvidia/x.bin": b"\0" * 1000})
    amd64 = plan_for(tmp_path, [nccl])
    arm64 = replace(amd64, arch="arm64", gpu_weight=replace(amd64.gpu_weight, arch="arm64",
                                                             download=7_000_000))  # fmt: skip
    (line,) = Plan(reference_profile(), "base", (amd64, arm64), (), ()).warnings
    assert "(amd64: " in line and "; arm64: 7.0 MB download" in line
