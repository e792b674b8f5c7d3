"""GPU plugins on synthetic wheels: a library loaded only by a GPU execution provider, kernel or
collective backend is never a refusal nor a required apt package; it is optional, and the set
gets one GPU warning saying where a GPU image gets it."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.plans import SOURCE, TAG, plan_for, reference_profile
from support.wheelfactory import EXTENSION_SUFFIX, compile_so, make_wheel

from builder.errors import UserError
from builder.plan.gpu import gpu_plugin
from builder.plan.plan import Plan


def _runtime(tmp_path: Path, soname: str) -> Path:
    """A stand-in for an accelerator's runtime library (cuBLAS, RCCL), to link against."""
    directory = tmp_path / soname
    directory.mkdir()
    compile_so(directory, SOURCE, soname, soname=soname)
    return directory / "build"


def provider_wheel(tmp_path: Path, name: str, provider: str, runtime: str) -> Path:
    """onnxruntime's shape: the Python extension links nothing of the providers; the CUDA
    provider links `runtime` and the shared provider library, and is opened by name only
    when its execution provider is asked for."""
    shared = compile_so(tmp_path, SOURCE, "libshared.so", soname="libshared.so")
    cuda = compile_so(
        tmp_path, SOURCE, "libprovider.so", libs=[f":{runtime}", ":libshared.so"],
        libdirs=[_runtime(tmp_path, runtime), shared.parent],
    )  # fmt: skip
    extension = compile_so(tmp_path, SOURCE, "state.so")
    return make_wheel(tmp_path, name, "1.0", TAG, {
        f"ortish/capi/_state{EXTENSION_SUFFIX}": extension.read_bytes(),
        f"ortish/capi/{provider}": cuda.read_bytes(),
        "ortish/capi/libshared.so": shared.read_bytes(),
    })  # fmt: skip


def test_a_cuda_execution_provider_is_no_refusal_and_one_warning(tmp_path: Path) -> None:
    wheel = provider_wheel(tmp_path, "ortish", "libprovider_cuda.so", "libcublas.so.13")
    plan = plan_for(tmp_path, [wheel])
    assert plan.apt_packages == () and plan.optional_packages == ()
    (cublas,) = plan.libraries
    assert (cublas.soname, cublas.package, cublas.optional) == ("libcublas.so.13", "", True)
    assert cublas.needed_by == ("ortish==1.0: ortish/capi/libprovider_cuda.so",)
    assert cublas.reason.startswith("a GPU plugin: it links libcublas.so.13 (cuBLAS")
    (warning,) = Plan(reference_profile(), "base", (plan,), (), ()).warnings
    assert "(libcublas.so.13: no Debian 13 package" in warning
    assert "docs/gpu.md#gpu-plugins" in warning and "only works on a GPU" not in warning


def test_the_gpu_warning_is_one_line_with_the_gpu_weight(tmp_path: Path) -> None:
    """onnxruntime-gpu is a GPU-only distribution too: its weight and its plugins' libraries
    are one warning."""
    wheel = provider_wheel(tmp_path, "onnxruntime-gpu", "libprovider_cuda.so", "libcudnn.so.9")
    plan = plan_for(tmp_path, [wheel])
    (warning,) = Plan(reference_profile(), "base", (plan,), (), ()).warnings
    assert warning.startswith("warning: onnxruntime-gpu==1.0 only works on a GPU")
    assert "instead: onnxruntime-gpu → onnxruntime" in warning and "libcudnn.so.9" in warning


def test_a_collective_backend_debian_ships_is_optional_not_required(tmp_path: Path) -> None:
    """A plugin linking ROCm's RCCL: Debian 13 ships librccl1, offered with --with-optional."""
    wheel = provider_wheel(tmp_path, "ortish", "libprovider_rocm.so", "librccl.so.1")
    plan = plan_for(tmp_path, [wheel])
    assert plan.apt_packages == () and plan.optional_packages == ("librccl1",)
    assert plan.warnings == ()
    installed = plan_for(tmp_path / "with", [wheel], with_optional=True)
    assert installed.apt_packages == ("librccl1",)


def test_a_library_an_extension_links_is_required_whatever_it_links(tmp_path: Path) -> None:
    """What an import loads is no plugin: the same provider linked by the extension module
    makes cuBLAS a need Debian cannot meet (a refusal, as before)."""
    cuda = compile_so(
        tmp_path, SOURCE, "libprovider_cuda.so", soname="libprovider_cuda.so",
        libs=[":libcublas.so.13"], libdirs=[_runtime(tmp_path, "libcublas.so.13")],
    )  # fmt: skip
    extension = compile_so(
        tmp_path, SOURCE, "state.so", libs=[":libprovider_cuda.so"], libdirs=[cuda.parent],
        rpath="$ORIGIN",
    )  # fmt: skip
    wheel = make_wheel(tmp_path, "linked", "1.0", TAG, {
        f"linked/_state{EXTENSION_SUFFIX}": extension.read_bytes(),
        "linked/libprovider_cuda.so": cuda.read_bytes(),
    })  # fmt: skip
    with pytest.raises(UserError, match=r"^libcublas\.so\.13: no Debian 13 package provides"):
        plan_for(tmp_path, [wheel])


def test_a_kernel_library_per_cuda_version_is_the_gpus(tmp_path: Path) -> None:
    """bitsandbytes' shape: one kernel library per CUDA version (curated in gpu.toml, and each
    links that CUDA's runtime) beside a CPU one its Python code opens on a CPU node."""
    cpu = compile_so(tmp_path, SOURCE, "libbitsandbytes_cpu.so", libs=["gomp"])
    cuda = compile_so(
        tmp_path, SOURCE, "libbitsandbytes_cuda126.so", libs=[":libcudart.so.12", "gomp"],
        libdirs=[_runtime(tmp_path, "libcudart.so.12")],
    )  # fmt: skip
    wheel = make_wheel(tmp_path, "bitsandbytes", "1.0", TAG, {
        "bitsandbytes/libbitsandbytes_cpu.so": cpu.read_bytes(),
        "bitsandbytes/libbitsandbytes_cuda126.so": cuda.read_bytes(),
    })  # fmt: skip
    plan = plan_for(tmp_path, [wheel])
    assert plan.apt_packages == ("libgomp1",)  # the CPU library's, required
    cudart = next(lib for lib in plan.libraries if lib.soname == "libcudart.so.12")
    assert cudart.optional and "for one CUDA version" in cudart.reason


@pytest.mark.parametrize(
    ("path", "needed", "named"),
    [
        ("ort/capi/libonnxruntime_providers_cuda.so", ("libcublasLt.so.12",), "libcublasLt"),
        ("x/libtrt.so", ("libc.so.6", "libnvinfer.so.10"), "libnvinfer.so.10"),
        ("x/librccl_net.so", ("librccl.so.1",), "librccl.so.1"),
        ("x/libkernels.so", ("libamdhip64.so.6",), "libamdhip64"),
        ("x/libxpu.so", ("libsycl.so.8",), "libsycl"),
        ("x/libze.so", ("libze_loader.so.1",), "libze_loader"),
        ("x/libdrv.so", ("libcuda.so.1",), "the NVIDIA driver's"),
    ],
)
def test_a_library_linking_a_gpu_runtime_is_a_gpu_plugin(
    path: str, needed: tuple[str, ...], named: str
) -> None:
    why = gpu_plugin(path, needed)
    assert why is not None and named in why


@pytest.mark.parametrize(
    "needed", [(), ("libgomp.so.1", "libstdc++.so.6"), ("libOpenCL.so.1",), ("librocksdb.so.9",)]
)
def test_a_library_linking_no_gpu_runtime_is_not_a_gpu_plugin(needed: tuple[str, ...]) -> None:
    assert gpu_plugin("x/libcpu.so", needed) is None


def test_a_library_whose_gpu_runtime_the_set_ships_loads_anywhere(tmp_path: Path) -> None:
    """A library opened by a computed path that links the CUDA runtime a wheel of the set
    ships loads on a CPU node too: no plugin, so what else it links stays required."""
    cudart = compile_so(tmp_path, SOURCE, "libcudart.so.12", soname="libcudart.so.12")
    runtime = make_wheel(tmp_path, "nvidia-cuda-runtime-cu12", "12.0", TAG, {
        "nvidia/cuda_runtime/lib/libcudart.so.12": cudart.read_bytes(),
    })  # fmt: skip
    library = compile_so(
        tmp_path, SOURCE, "libboost_model.so", libs=[":libcudart.so.12", "gomp"],
        libdirs=[cudart.parent],
    )  # fmt: skip
    wheel = make_wheel(tmp_path, "modelish", "1.0", TAG, {
        "modelish/lib/libboost_model.so": library.read_bytes(),
    })  # fmt: skip
    plan = plan_for(tmp_path, [wheel, runtime])
    assert plan.apt_packages == ("libgomp1",) and plan.optional_packages == ()
    alone = plan_for(tmp_path / "alone", [wheel])  # without the runtime: a GPU plugin
    assert alone.apt_packages == () and alone.optional_packages == ("libgomp1",)
