"""Platform versions of a base, made on the engine as a platform team would ship them."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from packaging.utils import parse_wheel_filename
from packaging.version import Version

from builder.assemble.build import BuildSpec, build_image
from builder.cache import Cache
from builder.resolve.index import download, index_files


def newest_pure_wheel(cache: Cache, name: str, version: str | None = None) -> Path:
    """A py3-none-any wheel of `name` (the newest stable one unless `version`) from the index."""
    candidates = []
    for file in index_files([], name):
        if not file.filename.endswith("-py3-none-any.whl"):
            continue
        found = parse_wheel_filename(file.filename)[1]
        if (version is None and not found.is_prerelease) or found == Version(version or "0"):
            candidates.append((found, file))
    assert candidates, f"no pure wheel of {name} {version or ''} on the index"
    return download(max(candidates, key=lambda c: c[0])[1], cache)


def derived_base(reference: str, wheel: Path, tag: str, workdir: Path) -> None:
    """`reference` with `wheel` unpacked into /app/deps, as a platform team would ship it."""
    context = workdir / tag.rsplit(":", 1)[1]
    context.mkdir()
    shutil.copy(wheel, context / wheel.name)
    extract = f"import zipfile; zipfile.ZipFile('/tmp/{wheel.name}').extractall('/app/deps')"
    (context / "Dockerfile").write_text(
        f"FROM {reference}\n"
        "USER 0:0\n"
        f"COPY {wheel.name} /tmp/{wheel.name}\n"
        f'RUN python3 -I -c "{extract}" && rm /tmp/{wheel.name}\n'
        "USER 65532:65532\n"
    )
    with open(workdir / f"{context.name}.log", "w") as log:
        build_image(context, BuildSpec(tag=tag), log)


def patched_base(reference: str, tag: str, workdir: Path) -> None:
    """`reference` plus one small layer that changes nothing Python sees: a platform patch."""
    context = workdir / tag.rsplit(":", 1)[1]
    context.mkdir()
    (context / "Dockerfile").write_text(
        f"FROM {reference}\nUSER 0:0\nRUN echo patched > /etc/platform-patch\nUSER 65532:65532\n"
    )
    with open(workdir / f"{context.name}.log", "w") as log:
        build_image(context, BuildSpec(tag=tag), log)


def labelled_scratch(engine: Any, label: str, value: str, workdir: Path) -> str:
    """A `FROM scratch` image carrying one label, built by BuildKit on `engine`: the cheapest
    build that proves an engine builds. Its image id."""
    context = workdir / "context"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM scratch\nLABEL {label}={value}\n")
    with (workdir / "build.log").open("w") as log:
        return build_image(context, BuildSpec(engine=engine), log)
