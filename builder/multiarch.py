"""Every arch of a plan: which to build, building them at once, verifying each, publishing.

ko-style: one loop fans out per platform. The engine's own arch is started first and verified
while an emulated arch still builds, so a native build never waits on emulation. With several
arches each image is pushed by digest and the tags name one index of them (builder.image.index).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker

from builder import credentials
from builder.analysis.plan import Plan
from builder.analysis.target import ARCHES, BaseProfile
from builder.base.platforms import offered_arches, select_arches
from builder.cache import Cache
from builder.credentials import Credentials
from builder.image.assemble import Assembled, assemble
from builder.image.build import Log, base_logins, build_image
from builder.image.from_engine import assembled_image, base_layers
from builder.image.layer import Layer
from builder.image.render import Secrets, dockerfile
from builder.oci.name import ImageRef
from builder.oci.remote import Blobs, Written, write
from builder.oci.v1 import Index, Platform
from builder.verify import Check, VerifyReport, verify_image

Say = Callable[[str], None]
SYSTEM_STAGE = "system"  # the Dockerfile stage BuildKit builds: the base and the apt layer


def target_arches(
    requested: Sequence[str], base: BaseProfile, client: docker.DockerClient | None
) -> tuple[str, ...]:
    """The arches to build: those the base offers, narrowed by `requested` (which it must offer)."""
    return select_arches(requested, offered_arches(base.image, client), base.image)


@dataclass
class ArchBuild:
    """One arch's image: built, verified, and pushed by digest."""

    arch: str
    image: Assembled
    tag: str
    verification: VerifyReport | None = None
    digest: str | None = None  # its manifest, as pushed
    pushed_layer: Mapping[str, Any] | None = None  # the deps-extra blob's descriptor, as pushed

    @property
    def image_id(self) -> str:
        return self.image.image_id

    def deps_extra_layer(self) -> dict[str, Any]:
        """The layer's tar, and once pushed its blob's digest and size."""
        pushed = self.pushed_layer or {}
        return self.image.deps.to_dict() | {k: v for k, v in pushed.items() if k != "mediaType"}

    def to_dict(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "id": self.image_id,
            "tag": self.tag,
            "deps_extra_layer": self.deps_extra_layer(),
        }
        if self.verification is not None:
            record["verification"] = self.verification.to_dict()
        if self.digest:
            record["digest"] = self.digest
        return record


@dataclass(frozen=True)
class Finish:
    """What the tool puts on top of each arch's system stage: its layer, labels, created."""

    layers: Mapping[str, Layer]
    labels: Mapping[str, str]
    created: str
    cache: Cache


class SystemStages:
    """Each arch's system stage (base + apt), built while the deps-extra layers are written.

    `prepare` hands over the plan as soon as the apt sets are known (`start`); BuildKit builds
    the very stage the context's Dockerfile holds, from a context with only that Dockerfile,
    so the stage never waits for the gigabyte of wheels being laid out. Its log is shown, and
    a failure raised, when build_and_verify asks for the stage; a build nobody asked for by the
    end (planning failed, or nothing needed building) is stopped, not waited for.
    """

    def __init__(self, secret_files: Mapping[str, Path]) -> None:
        self.secret_files = secret_files  # BuildKit secret id -> file, as the build mounts them
        self.pool = ThreadPoolExecutor(max_workers=len(ARCHES))
        self.temp = tempfile.TemporaryDirectory(prefix="bsi-system-")
        self.started: dict[str, Future[str]] = {}
        self.processes: dict[str, subprocess.Popen[str]] = {}

    def start(self, plan: Plan) -> None:
        context = Path(self.temp.name) / "context"
        context.mkdir()
        (context / "Dockerfile").write_text(dockerfile(plan, Secrets.of(self.secret_files)))
        logins = base_logins(ImageRef.parse(plan.base_image, "base image"))
        for arch in (a.arch for a in plan.arches):
            self.started[arch] = self.pool.submit(self._build, context, arch, logins)

    def _build(self, context: Path, arch: str, logins: Mapping[str, Credentials] | None) -> str:
        with self._log(arch).open("w") as log:
            return build_image(
                context, target=SYSTEM_STAGE, platform=f"linux/{arch}",
                secrets=self.secret_files, logins=logins, log=log,
                started=lambda process: self.processes.__setitem__(arch, process),
            )  # fmt: skip

    def _log(self, arch: str) -> Path:
        return Path(self.temp.name) / f"{arch}.log"

    def built(self, arch: str, log: Log) -> str | None:
        """The stage's image id once its build ends, its log written to `log`; None: not started."""
        future = self.started.pop(arch, None)
        if future is None:
            return None
        try:
            return future.result()
        finally:
            if self._log(arch).exists():
                for line in self._log(arch).read_text().splitlines(keepends=True):
                    log.write(line)

    def __enter__(self) -> SystemStages:
        return self

    def __exit__(self, *exc: object) -> None:
        for arch in self.started:  # never asked for: stop it rather than wait minutes for it
            if arch in self.processes:
                self.processes[arch].terminate()
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.temp.cleanup()


def build_and_verify(
    plan: Plan,
    context: Path,
    client: docker.DockerClient,
    tag: str,
    finish: Finish,
    *,
    verify: bool,
    secret_files: Mapping[str, Path],
    say: Say,
    stages: SystemStages | None = None,
) -> list[ArchBuild]:
    """Build every arch at once, the engine's own first; verify each as soon as it is built.

    BuildKit builds the system stage; builder.image.assemble puts the deps-extra layer on it.
    Any build failure raises (once the others end), so nothing is pushed.
    """
    machine = client.info().get("Architecture")
    native = next((a.name for a in ARCHES.values() if a.machine == machine), None)
    arches = sorted((a.arch for a in plan.arches), key=lambda arch: arch != native)
    multi = len(arches) > 1
    base = ImageRef.parse(plan.base_image, "base image")
    logins = base_logins(base)  # BuildKit pulls the base itself, as the CLI's config allows
    tags = {arch: arch_tag(tag, arch) if multi else tag for arch in arches}

    def one(arch: str) -> Assembled:
        log = _Prefixed(sys.stdout, f"[{arch}] " if multi else "")
        system = (stages.built(arch, log) if stages else None) or build_image(
            context, target=SYSTEM_STAGE, platform=f"linux/{arch}", secrets=secret_files,
            logins=logins, log=log,
        )  # fmt: skip
        return assemble(
            client, system, arch, finish.layers[arch], root=plan.pythonpath_entry,
            labels=finish.labels, created=finish.created, tag=tags[arch], cache=finish.cache,
            apt_layer=bool(next(a.apt_packages for a in plan.arches if a.arch == arch)),
        )  # fmt: skip

    builds: list[ArchBuild] = []
    with ThreadPoolExecutor(max_workers=len(arches)) as pool:
        futures = {}
        for arch in arches:
            emulated = "" if arch == native else " (emulated)"
            say(f"building {arch} image {tags[arch]} with BuildKit{emulated} ...")
            futures[pool.submit(one, arch)] = arch
        for future in as_completed(futures):
            arch = futures[future]
            built = ArchBuild(arch, future.result(), tags[arch])
            if verify:
                say(f"verifying {arch} image {built.tag} hardened ...")
                built.verification = verify_image(
                    built.image_id,
                    modules=plan.import_modules,
                    checks=plan.runtime_checks,
                    client=client,
                )
            builds.append(built)
    return sorted(builds, key=lambda b: arches.index(b.arch))


def push(
    builds: list[ArchBuild],
    client: docker.DockerClient,
    repository: str,
    tags: Sequence[str],
    base_image: str,
    annotations: Mapping[str, str],
    cache: Cache,
    say: Say,
) -> Written:
    """Each arch's exact blobs by digest; then the tags name it, or an index of several.

    All or nothing: no tag moves until every arch's manifest is in the registry.
    """
    target = credentials.registry(ImageRef.parse_repository(repository, "push target"), repository)
    base = ImageRef.parse(base_image, "base image")
    say(f"pushing {', '.join(tags)} ...")
    with tempfile.TemporaryDirectory(prefix="bsi-push-") as scratch:
        images, blobs = [], Blobs()
        for built in builds:
            say(f"pushing {built.arch} image {built.image_id[:19]} to {repository} by digest ...")
            found = base_layers(base, built.arch, target)
            image, sources = assembled_image(client, built.image, found, cache, Path(scratch))
            images.append(image)
            blobs |= sources
            built.digest, built.pushed_layer = image.digest, image.layers[-1].to_dict()
        index = (
            Index.build(
                [(Platform.linux(b.arch), i) for b, i in zip(builds, images, strict=True)],
                annotations,
            )
            if len(images) > 1
            else None
        )
        return write(target, images, blobs, index=index, tags=tags)


def arch_tag(tag: str, arch: str) -> str:
    """The local tag of one arch's image: `name:tag-arm64`, or `name:arm64` without a tag."""
    if ":" in tag.rsplit("/", 1)[-1]:
        return f"{tag}-{arch}"
    return f"{tag}:{arch}"


def combined(tag: str, builds: Sequence[ArchBuild]) -> VerifyReport | None:
    """One verification table; with several arches each line is led by the arch it is for."""
    reports = [(b.arch, b.verification) for b in builds if b.verification is not None]
    if len(reports) == 1:
        return reports[0][1]
    if not reports:
        return None
    return VerifyReport(
        f"{tag} ({', '.join(arch for arch, _ in reports)})",
        [
            Check(f"[{arch}] {check.name}", check.passed, check.detail)
            for arch, report in reports
            for check in report.checks
        ],
    )


class _Prefixed:
    """A log that leads each line with its arch, so concurrent builds stay readable."""

    def __init__(self, stream: Log, prefix: str) -> None:
        self.stream, self.prefix = stream, prefix

    def write(self, text: str) -> int:
        return self.stream.write(self.prefix + text)
