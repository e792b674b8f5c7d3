"""The one orchestrating function: requirements in, plan and build context out.

Each step is its own module; this file only sequences them and fans out per architecture.
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from builder.cache import Cache
from builder.errors import UserError
from builder.fetch import RemoteFile, download, download_all, index_files
from builder.inspect import inspect_wheels
from builder.plan import Plan, choose_wheel, import_modules, plan_arch, runtime_checks
from builder.render import Secrets, render
from builder.requirements import read_requirements
from builder.resolve import Resolution, resolve
from builder.target import BaseProfile, Target, arch_named


@dataclass(frozen=True)
class Request:
    requirement_files: tuple[Path, ...]
    constraint_files: tuple[Path, ...]
    arches: tuple[str, ...]
    base: BaseProfile
    output: Path
    cache: Cache
    secrets: Secrets = field(default_factory=Secrets)


def builder_pip(cache: Cache, indexes: Sequence[str]) -> Path:
    """The pinned pip wheel the builder stage runs, from the cache or the index."""
    pinned = tomllib.loads(
        resources.files("builder.data").joinpath("builder-tools.toml").read_text()
    )["pip"]
    found = cache.find_blob(pinned["sha256"], pinned["filename"])
    if found:
        return found
    listed = {f.filename: f for f in index_files(indexes, "pip")}
    if pinned["filename"] not in listed:
        raise UserError(f"{pinned['filename']}: the builder's pinned pip is not on the index")
    url = listed[pinned["filename"]].url
    return download(RemoteFile(pinned["filename"], url, pinned["sha256"]), cache, indexes)


def base_reference(base: BaseProfile) -> str:
    """FROM value: the operator's tag (the platform version) pinned by the probed digest."""
    if base.digest and "@" not in base.image:
        return f"{base.image}@{base.digest}"
    return base.image


def prepare(request: Request) -> Plan:
    """Resolve, fetch, inspect and plan for every arch, then render the context."""
    requirements = read_requirements(request.requirement_files, request.constraint_files)
    target = Target(request.base, tuple(arch_named(a) for a in dict.fromkeys(request.arches)))
    indexes = requirements.indexes()
    with ThreadPoolExecutor(max_workers=len(target.arches) + 1) as pool:
        pip_future = pool.submit(builder_pip, request.cache, indexes)
        resolutions: list[Resolution] = list(
            pool.map(lambda arch: resolve(requirements, target, arch, request.cache), target.arches)
        )
        pip_wheel = pip_future.result()
    chosen = {
        resolution.arch.name: {
            package.name: choose_wheel(package, target, resolution.arch)
            for package in resolution.packages
        }
        for resolution in resolutions
    }
    files = [file for per_arch in chosen.values() for file, _ in per_arch.values()]
    paths = download_all(files, request.cache, indexes)
    inspected = inspect_wheels([(path, sha) for sha, path in paths.items()], request.cache)
    inspections = {inspection.sha256: inspection for inspection in inspected}
    arch_plans = tuple(
        plan_arch(resolution, chosen[resolution.arch.name], inspections, target)
        for resolution in resolutions
    )
    direct = tuple(r.name for r in requirements.requirements)
    plan = Plan(
        base=request.base,
        base_image=base_reference(request.base),
        arches=arch_plans,
        import_modules=import_modules(direct, arch_plans),
        runtime_checks=runtime_checks(arch_plans),
    )
    render(
        plan,
        request.output,
        paths,
        pip_wheel,
        {r.arch.name: r.pylock for r in resolutions},
        request.secrets,
    )
    return plan
