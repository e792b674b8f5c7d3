"""GPUs, as a CPU-first plan must see them: the node's driver, and the weight nothing uses.

- The NVIDIA driver's user-space libraries (libcuda.so.1, libnvidia-ml.so.1, …) must match the
  node's kernel driver. On a GPU node the NVIDIA container toolkit mounts them into the
  container; an image never ships them, and on a CPU node PyTorch, JAX, ONNX Runtime and
  TensorFlow run their CPU paths without them. A need for one is the GPU node's: never an apt
  package, never a refusal (builder/data/gpu.toml's `driver` table, each with its reason).
- CUDA runtimes and compilers that popular distributions pull by default (torch → nvidia-*,
  triton; xgboost → nvidia-nccl) do nothing in a CPU-only sandbox. One warning names them with
  their bytes and a CPU route; it never advises dropping what the set's own code links.
- GPU plugins (an execution provider, a kernel library, a collective backend a package opens
  only on a GPU: onnxruntime's CUDA provider, bitsandbytes' per-CUDA kernels) are never loaded
  on a CPU node: what only they link is optional, never a refusal (`gpu_plugin` says which
  files are; builder.plan.natives follows their links), and the same warning names what no
  Debian package provides, with the way to a GPU image (docs/gpu.md#gpu-plugins).

Pure: the table is read once, and the rest are functions of what they are given.
"""

from __future__ import annotations

import fnmatch
import tomllib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from types import MappingProxyType

from builder.data import shipped_text
from builder.plan.sizes import Sized, human


@dataclass(frozen=True)
class DriverLibrary:
    """One of the NVIDIA driver's libraries: the container toolkit capability that mounts it
    into a container on a GPU node, and what it is."""

    pattern: str  # fnmatch pattern over sonames: libcuda.so*
    capability: str  # NVIDIA_DRIVER_CAPABILITIES: compute, utility, video, graphics, …
    reason: str


@dataclass(frozen=True)
class GpuTable:
    patterns: tuple[str, ...]  # GPU-only distributions
    replacements: Mapping[str, str]  # distribution -> its CPU route
    driver: tuple[DriverLibrary, ...]
    accelerators: Mapping[str, str]  # soname pattern -> why only that accelerator loads it
    plugins: Mapping[str, str]  # tree path pattern -> what opens it, and when


@cache
def gpu_table() -> GpuTable:
    """builder/data/gpu.toml, read once a process."""
    table = tomllib.loads(shipped_text("gpu.toml"))
    return GpuTable(
        patterns=tuple(table["patterns"]),
        replacements=MappingProxyType(dict(table.get("replacements", {}))),
        driver=tuple(
            DriverLibrary(pattern, entry["capability"], entry["reason"])
            for pattern, entry in table.get("driver", {}).items()
        ),
        accelerators=MappingProxyType(dict(table.get("accelerators", {}))),
        plugins=MappingProxyType(dict(table.get("plugins", {}))),
    )


def driver_library(soname: str) -> DriverLibrary | None:
    """The driver library `soname` (or a name a load tries: `cuda`, `nvidia-ml`) is, when the
    GPU node provides it."""
    base = soname.rsplit("/", 1)[-1]
    names = (base, f"lib{base.removeprefix('lib')}.so")
    return next(
        (d for d in gpu_table().driver for n in names if fnmatch.fnmatchcase(n, d.pattern)), None
    )


def on_demand_plugin(path: str) -> str | None:
    """Why the shared library at tree path `path` is opened only on demand by its own
    package's native code (NVSHMEM's transports, cuFile's RDMA plugin), or None."""
    plugins = gpu_table().plugins.items()
    return next((why for pattern, why in plugins if fnmatch.fnmatchcase(path, pattern)), None)


def gpu_plugin(path: str, needed: Sequence[str]) -> str | None:
    """Why the shared library at tree path `path`, which no file of the set links and Python
    cannot import, is loaded only on a GPU (an execution provider, a kernel library, a
    collective backend its package opens by name there), or None: a curated plugin, or one
    that links an accelerator's runtime or the NVIDIA driver (onnxruntime's
    libonnxruntime_providers_cuda.so links cuBLAS and cuDNN; bitsandbytes' kernel library for
    CUDA 12 links libcudart.so.12). Such a library could not load on a CPU node's image
    unless it carried that runtime: nothing there opens it."""
    if (curated := on_demand_plugin(path)) is not None:
        return curated
    for soname in needed:
        if driver_library(soname) is not None:
            return f"a GPU plugin: it links {soname}, the NVIDIA driver's"
        if (reason := accelerator_only(soname)) is not None:
            return f"a GPU plugin: it links {soname} ({reason})"
    return None


def accelerator_only(name: str) -> str | None:
    """Why a load of `name` happens only on an accelerator the node may lack (AMD's HIP, Intel's
    Level Zero, the CUDA runtime), or None. Tried as written and as `lib<name>.so`."""
    base = name.rsplit("/", 1)[-1]
    candidates = [base, f"lib{base.removeprefix('lib')}.so"]
    return next(
        (
            reason
            for pattern, reason in gpu_table().accelerators.items()
            for candidate in candidates
            if fnmatch.fnmatchcase(candidate, pattern)
        ),
        None,
    )


def is_gpu_only(name: str) -> bool:
    """A distribution that does nothing without a GPU (a CUDA runtime, Triton, …)."""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in gpu_table().patterns)


@dataclass(frozen=True)
class GpuWeight:
    """One arch's GPU-only distributions, their bytes, and the ways to a CPU-only image."""

    arch: str
    pins: tuple[str, ...]  # name==version, sorted
    download: int
    installed: int
    routes: tuple[str, ...]  # CPU builds to ask for, and what --override may drop
    plugins: tuple[str, ...] = ()  # sonames only GPU plugins link, which no Debian package has

    def sizes(self) -> str:
        return f"{human(self.download)} download, {human(self.installed)} installed"


def gpu_weight(
    arch: str,
    wheels: Sequence[Sized],
    requires: Mapping[str, Collection[str]],
    links: Collection[tuple[str, str]],
    plugins: Sequence[str] = (),
) -> GpuWeight | None:
    """The GPU-only distributions of one arch's set, with the CPU routes known for what pulls
    them, and --override lines for those `droppable` says can go without breaking an import;
    and `plugins`, the libraries only GPU plugins link that the image does not carry. None
    when the set has neither."""
    gpu = sorted((w for w in wheels if is_gpu_only(w.name)), key=lambda w: w.name)
    if not gpu:
        return GpuWeight(arch, (), 0, 0, (), tuple(plugins)) if plugins else None
    present = {w.name for w in wheels}
    replacements = gpu_table().replacements
    routes = [f"{name} → {replacements[name]}" for name in sorted(present & set(replacements))]
    if dropped := droppable([w.name for w in gpu], requires, links):
        lines = "; ".join(f"`{name} ; python_version < '0'`" for name in dropped)
        routes.append(
            f"drop {', '.join(dropped)} with --override"
            f" ({'a line' if len(dropped) == 1 else 'lines'} {lines})"
        )
    return GpuWeight(
        arch=arch,
        pins=tuple(f"{w.name}=={w.version}" for w in gpu),
        download=sum(w.size for w in gpu),
        installed=sum(w.installed_size for w in gpu),
        routes=tuple(routes),
        plugins=tuple(plugins),
    )


def droppable(
    gpu: Sequence[str],
    requires: Mapping[str, Collection[str]],
    links: Collection[tuple[str, str]],
) -> list[str]:
    """The GPU-only distributions an override may drop without breaking an import.

    Dropping one also drops what only it requires, so none of that may be linked by the set's
    code (torch links cuBLAS, which it gets through the metapackage cuda-toolkit); and what a
    GPU distribution or a framework that links GPU libraries itself requires stays, since its
    Python code may import it (torch requires triton). xgboost's NCCL, which xgboost requires
    but opens only on a GPU, may go. `requires`: each distribution of the set -> the names its
    metadata requires; `links`: (linker, provider) pairs from DT_NEEDED.
    """
    linked = {provider for _, provider in links}
    gpu_linkers = {linker for linker, provider in links if is_gpu_only(provider)}
    requirers: dict[str, set[str]] = {}
    for name, wanted in requires.items():
        for dependency in wanted:
            requirers.setdefault(dependency, set()).add(name)
    return [
        name
        for name in gpu
        if not _closure(name, requires) & linked
        and not any(is_gpu_only(r) or r in gpu_linkers for r in requirers.get(name, ()))
    ]


def _closure(name: str, requires: Mapping[str, Collection[str]]) -> set[str]:
    """`name` and what it requires within the set, transitively."""
    found, pending = set(), [name]
    while pending:
        current = pending.pop()
        if current in requires and current not in found:
            found.add(current)
            pending += requires[current]
    return found


def weight_warnings(weights: Sequence[GpuWeight]) -> list[str]:
    """The GPU warning, once for the arches whose GPU-only set, routes and GPU plugins' left-out
    libraries agree (their bytes differ: each arch's are named)."""
    groups: dict[tuple[tuple[str, ...], ...], list[GpuWeight]] = {}
    for weight in weights:
        groups.setdefault((weight.pins, weight.routes, weight.plugins), []).append(weight)
    return [
        _weight_line(pins, routes, plugins, same)
        for (pins, routes, plugins), same in groups.items()
    ]


# Where the warning sends a GPU image's builder: what the plugins need comes from the wheels.
GPU_IMAGE = "a GPU image brings them as wheels (docs/gpu.md#gpu-plugins)"
NAMED_PLUGINS = 4  # left-out libraries the warning names; the rest are counted


def _weight_line(
    pins: Sequence[str],
    routes: Sequence[str],
    plugins: Sequence[str],
    weights: Sequence[GpuWeight],
) -> str:
    parts = [_pins_part(pins, routes, weights)] if pins else []
    if plugins:
        named = ", ".join(plugins[:NAMED_PLUGINS])
        if len(plugins) > NAMED_PLUGINS:
            named += f" and {len(plugins) - NAMED_PLUGINS} more"
        parts.append(
            f"what only GPU plugins load is left out ({named}: no Debian 13 package; the"
            f" plugins load only on a GPU); {GPU_IMAGE}"
        )
    return "warning: " + "; ".join(parts)


def _pins_part(pins: Sequence[str], routes: Sequence[str], weights: Sequence[GpuWeight]) -> str:
    if len(weights) == 1:
        sizes = weights[0].sizes()
    else:
        sizes = "; ".join(f"{w.arch}: {w.sizes()}" for w in weights)
    names = ", ".join(pins)
    if len(pins) == 1:
        what = f"{names} only works on a GPU, useless in a CPU-only sandbox ({sizes})"
    else:
        what = f"{len(pins)} distributions only work on a GPU ({sizes}): {names}; useless"
        what += " in a CPU-only sandbox"
    return what + (f"; instead: {'; or '.join(routes)}" if routes else "")
