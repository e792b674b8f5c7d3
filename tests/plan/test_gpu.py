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

from builder.cli.summary import summary
from builder.plan.gpu import accelerator_only, driver_library, droppable, gpu_weight
from builder.plan.plan import Plan
from builder.resolve.requirements import RequirementSet
from builder.resolve.stale import HeldBack, held_back_notes
from builder.resolve.target import ARCHES, Target, shipped_facts
from builder.resolve.unresolvable import unresolvable


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
    """torch's shape: its NVRTC bridge links libcuda.so.1 (opened only for run-time CUDA
    compilation), Python loads NVML, AMD's HIP runtime on its ROCm branch, and names only
    Windows, macOS or nothing loads."""
    bridge = compile_so(tmp_path, SOURCE, "libcaffe2_nvrtc.so", libs=[":libcuda.so.1"],
                        libdirs=[_fake_libcuda(tmp_path)])  # fmt: skip
    extension = compile_so(tmp_path, SOURCE, "core.so")
    code = b"""import ctypes, sys
if sys.platform == "win32":
    ctypes.CDLL("ucrtbase")
nvml = ctypes.CDLL("libnvidia-ml.so.1")
hip = ctypes.CDLL("libamdhip64.so")
rtc = ctypes.CDLL("libhiprtc.so")
iokit = ctypes.CDLL("/System/Library/Frameworks/IOKit.framework/IOKit")
source = ctypes.CDLL("codegen/interface.cpp")
"""
    return make_wheel(tmp_path, "torch", "1.0", TAG, {
        f"torch/_C{EXTENSION_SUFFIX}": extension.read_bytes(),
        "torch/lib/libcaffe2_nvrtc.so": bridge.read_bytes(),
        "torch/__init__.py": code,
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
    assert node["libnvidia-ml.so.1"].needed_by == ("torch==1.0: torch/__init__.py:4",)
    assert plan.apt_packages == ()
    assert not any("libcuda" in lib.soname or "nvidia" in lib.soname for lib in plan.libraries)
    report = Plan(reference_profile(), "base", (plan,), (), ()).to_dict()
    recorded = json.loads(json.dumps(report))["architectures"]["amd64"]["provided_by_gpu_node"]
    assert [lib["soname"] for lib in recorded] == ["libcuda.so.1", "libnvidia-ml.so.1"]
    assert "provided by the GPU node" in summary(Plan(reference_profile(), "b", (plan,), (), ()))


def test_an_extension_that_links_the_driver_is_said_to_need_a_gpu_node(tmp_path: Path) -> None:
    """pycuda's shape: an import links libcuda.so.1, so it fails on a CPU node; said once."""
    extension = compile_so(tmp_path, SOURCE, "core.so", libs=[":libcuda.so.1"],
                           libdirs=[_fake_libcuda(tmp_path)])  # fmt: skip
    wheel = make_wheel(tmp_path, "cudaish", "1.0", TAG,
                       {f"cudaish/_driver{EXTENSION_SUFFIX}": extension.read_bytes()})  # fmt: skip
    plan = plan_for(tmp_path, [wheel])
    (warning,) = plan.warnings
    assert warning.startswith("warning: cudaish==1.0: cudaish/_driver.cpython-313")
    assert (
        "links libcuda.so.1, the NVIDIA driver's: what loads it works only on a GPU node" in warning
    )
    assert plan.apt_packages == () and [lib.soname for lib in plan.gpu_node] == ["libcuda.so.1"]


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


def test_a_versioned_load_wants_its_own_soname(tmp_path: Path) -> None:
    """`libpq.so.5` is not satisfied by a vendored `libpq.so.4`: Debian's libpq5."""
    old = compile_so(tmp_path, SOURCE, "libpq.so.4", soname="libpq.so.4")
    wheel = make_wheel(tmp_path, "pqish", "1.0", TAG, {
        "pqish/vendor/libpq.so.4": old.read_bytes(),
        "pqish/__init__.py": b"import ctypes\nctypes.CDLL('libpq.so.5')\n",
    })  # fmt: skip
    assert plan_for(tmp_path, [wheel]).apt_packages == ("libpq5",)


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
    assert gpu_weight("amd64", plan_for(tmp_path, [small]).wheels, {}, ()) is None


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


def test_distributions_holding_each_other_back_keep_their_own_notes() -> None:
    via = {"sphinx": ("sphinxcontrib-applehelp",), "sphinxcontrib-applehelp": ("sphinx",)}
    held = [HeldBack("sphinx", "1", "2"), HeldBack("sphinxcontrib-applehelp", "1", "2")]
    assert held_back_notes(held, via) == [pick.message(via) for pick in held]


def test_a_wheel_for_other_platforms_only_is_named_with_them() -> None:
    """uv's platform hint, when its cause is about that distribution (tensorflow-cpu on arm64);
    a hint about another distribution than the cause's is not taken for it."""
    stderr = (
        "  cause: Because tensorflow-cpu>=2.20.0rc0 has no wheels with a matching platform tag"
        " (e.g., `manylinux_2_40_aarch64`) and you require tensorflow-cpu, we can conclude that"
        " your requirements are unsatisfiable.\n\n"
        "hint: Wheels are available for `tensorflow-cpu` (v2.21.0) on the following platforms:"
        " `manylinux_2_27_x86_64`, `win_amd64`\n"
    )
    arm64 = ARCHES["arm64"]
    error = unresolvable(stderr, RequirementSet((), ()), Target(shipped_facts(), (arm64,)), arm64)
    assert str(error) == (
        "tensorflow-cpu (a dependency): no wheel for arm64 (aarch64) on the package index;"
        " release 2.21.0 has wheels only for manylinux_2_27_x86_64, win_amd64"
    )
    other = stderr.replace("hint: Wheels are available for `tensorflow-cpu`", "hint: Wheels are"
                           " available for `keras`")  # fmt: skip
    error = unresolvable(other, RequirementSet((), ()), Target(shipped_facts(), (arm64,)), arm64)
    assert str(error).startswith("cannot resolve for arm64: Because tensorflow-cpu")


def test_what_an_override_may_drop_follows_requirements_and_links() -> None:
    """torch's set (as its metadata says): torch links cuBLAS, which it gets through the
    metapackage cuda-toolkit, and requires triton and cuda-bindings (which requires
    cuda-pathfinder): nothing may go. xgboost requires NCCL but does not link it: it may."""
    torch_set = {
        "torch": {"cuda-toolkit", "triton", "cuda-bindings", "nvidia-nccl-cu13"},
        "cuda-toolkit": {"nvidia-cublas", "nvidia-cuda-runtime"},
        "nvidia-cublas": set(), "nvidia-cuda-runtime": set(), "triton": set(),
        "cuda-bindings": {"cuda-pathfinder"}, "cuda-pathfinder": set(),
        "nvidia-nccl-cu13": set(),
    }  # fmt: skip
    links = {("torch", "nvidia-cublas"), ("torch", "nvidia-nccl-cu13")}
    gpu = sorted(name for name in torch_set if name != "torch")
    assert droppable(gpu, torch_set, links) == []
    xgboost_set = {"xgboost": {"nvidia-nccl-cu13", "numpy"}, "nvidia-nccl-cu13": set()}
    assert droppable(["nvidia-nccl-cu13"], xgboost_set, set()) == ["nvidia-nccl-cu13"]
    # a GPU distribution nothing requires, whose own requirement is linked, stays too
    assert droppable(["cuda-toolkit"], {"cuda-toolkit": {"nvidia-cublas"}, "nvidia-cublas": set()},
                     {("torch", "nvidia-cublas")}) == []  # fmt: skip
