"""No surprise at first use (issue 55), plan-only for amd64 against the real index: the programs
popular projects run get their packages (openai-whisper's and python-ffmpeg's ffmpeg,
ocrmypdf 16.x's Ghostscript), and GPU plugins are the GPU node's (onnxruntime-gpu's CUDA
execution provider is no refusal, one GPU warning; sglang's NCCL wrapper gets no ROCm package).

Plans are made as the CLI makes them (resolution, wheels, inspection, plan) without writing
layers, in a cache of the module's own whose wheels are deleted once inspected. Where the point
is the project's own code, the dependencies over 50 MB (torch and its CUDA wheels, 2.5 GB for
whisper) are left out of the plan: what the project's code runs or loads is read the same.
sglang resolves for CPython 3.13 to 0.5.2, which pulls no torch: nothing in the set ships
libnccl, the case that made ROCm's RCCL a required apt package (542 MB); were torch's NCCL wheel
in the set, the load would be satisfied by it.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import replace

import pytest
from support.plans import reference_profile

from builder.cache import Cache
from builder.inspect.wheel_reader import cached_inspection, inspect_wheel
from builder.inspect.wheels import WheelInspection
from builder.plan.plan import ArchPlan, Plan, choose_wheel, plan_arch
from builder.resolve.index import download_all
from builder.resolve.requirements import read_requirements
from builder.resolve.resolution import RemoteFile
from builder.resolve.target import ARCHES, Target
from builder.resolve.uv import resolve

pytestmark = pytest.mark.usefixtures("package_index")

AMD64 = ARCHES["amd64"]
HEAVY = 50_000_000  # bytes: a dependency past this is left out where `light` is asked


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cache]:
    root = tmp_path_factory.mktemp("popular-needs-cache")
    yield Cache(root)
    shutil.rmtree(root, ignore_errors=True)


def plan(cache: Cache, requirements: list[str], light: bool = False) -> ArchPlan:
    """amd64's plan of `requirements` on the reference base; with `light`, without the
    dependencies whose wheel is over HEAVY bytes (never a requested distribution)."""
    path = cache.root / f"requirements-{len(list(cache.root.glob('requirements-*')))}.txt"
    path.write_text("".join(f"{line}\n" for line in requirements))
    target = Target(reference_profile(), (AMD64,))
    resolution = resolve(read_requirements((path,), ()), target, AMD64, cache)
    chosen = {p.name: choose_wheel(p, target, AMD64) for p in resolution.packages}
    requested = {line.split(">")[0].split("<")[0].split("=")[0] for line in requirements}
    kept = [
        package
        for package in resolution.packages
        if not light or package.name in requested or (chosen[package.name][0].size or 0) <= HEAVY
    ]
    resolution = replace(resolution, packages=tuple(kept))
    chosen = {p.name: chosen[p.name] for p in kept}
    inspections = _inspect_once([file for file, _ in chosen.values()], cache)
    return plan_arch(resolution, chosen, inspections, target)


def _inspect_once(files: list[RemoteFile], cache: Cache) -> dict[str, WheelInspection]:
    found = {f.sha256: cached_inspection(cache, f.filename, f.sha256) for f in files}
    missing = [f for f in files if found[f.sha256] is None]
    for sha256, path in download_all(missing, cache).items():
        found[sha256] = inspect_wheel(path, sha256, cache)
        path.unlink()
    return {sha256: inspection for sha256, inspection in found.items() if inspection is not None}


def test_whisper_and_python_ffmpeg_get_ffmpeg(cache: Cache) -> None:
    """whisper's `cmd = ["ffmpeg", ...]; run(cmd)` (curated: one module of fourteen) and
    python-ffmpeg's `FFmpeg(executable="ffmpeg")`, read through a property and a helper handing
    `*args` to Popen."""
    planned = plan(cache, ["openai-whisper", "python-ffmpeg"], light=True)
    assert "ffmpeg" in planned.apt_packages
    (ffmpeg,) = [need for need in planned.programs if need.program == "ffmpeg"]
    assert not ffmpeg.optional and ffmpeg.package == "ffmpeg"
    users = {pin.partition("==")[0] for pin in ffmpeg.distributions}
    assert {"openai-whisper", "python-ffmpeg"} <= users
    assert any(label.startswith("python-ffmpeg==") and "ffmpeg/ffmpeg.py:" in label
               for label in ffmpeg.needed_by)  # fmt: skip


def test_ocrmypdf_16_gets_ghostscript(cache: Cache) -> None:
    """Its default output, PDF/A, is made by Ghostscript (a curated entry for 16.x)."""
    planned = plan(cache, ["ocrmypdf>=16,<17"])
    assert {"ghostscript", "tesseract-ocr"} <= set(planned.apt_packages)
    (gs,) = [need for need in planned.programs if need.program == "gs"]
    assert not gs.optional and gs.why.startswith("curated: ")


def test_onnxruntime_gpu_requires_no_cuda_library_and_warns_once(cache: Cache) -> None:
    planned = plan(cache, ["onnxruntime-gpu"])
    gpu_only = [lib for lib in planned.libraries if lib.reason.startswith("a GPU plugin")]
    assert {"libcublas.so.13", "libcudnn.so.9"} <= {lib.soname for lib in gpu_only}, gpu_only
    assert all(lib.optional for lib in gpu_only)
    assert any("libonnxruntime_providers_cuda.so" in by for lib in gpu_only for by in lib.needed_by)
    assert not any(name.startswith(("libcu", "libnvinfer")) for name in planned.apt_packages)
    warnings = Plan(reference_profile(), "base", (planned,), (), ()).warnings
    gpu = [line for line in warnings if "GPU" in line]
    assert len(gpu) == 1 and "docs/gpu.md#gpu-plugins" in gpu[0], warnings
    assert "onnxruntime-gpu → onnxruntime" in gpu[0]


def test_sglang_gets_no_rocm_package_as_required(cache: Cache) -> None:
    """Its NCCL wrapper loads libnccl, ROCm's librccl or MCCL by name: each an accelerator's,
    so optional (see the module)."""
    planned = plan(cache, ["sglang"], light=True)
    rocm = {"librccl1", "libamdhip64-6", "libamdhip64-5", "librocblas0", "libhipblas2"}
    assert not rocm & set(planned.apt_packages), planned.apt_packages
    loaded = {lib.soname: lib for lib in planned.libraries if lib.how == "loaded at run time"}
    collective = [lib for name, lib in loaded.items() if name.startswith(("libnccl", "librccl"))]
    assert collective and all(lib.optional and lib.reason for lib in collective), collective


def test_a_fallback_and_a_helper_of_small_dependencies_stay_optional(cache: Cache) -> None:
    """Found by benchmarks/popular.py: keyring pulled git (jaraco-context's repo_context) and
    typer procps (shellingham's `ps`, a fallback after /proc); both are curated optional."""
    planned = plan(cache, ["keyring", "typer"])
    assert not {"git", "procps"} & set(planned.apt_packages), planned.programs
    assert {"git", "procps"} <= set(planned.optional_packages)
