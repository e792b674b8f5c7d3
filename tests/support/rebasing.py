"""The reference base in a repository of a test's own, read back as the rebase producer reads it."""

from __future__ import annotations

import contextlib
import hashlib
import io
import tarfile
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import docker.errors
import pytest

from builder import credentials
from builder.cache import Cache
from builder.layers.gzipped import gzipped
from builder.oci.client import RepositoryClient
from builder.oci.mutate import ConfigChange, NewLayer, append
from builder.oci.name import ImageRef
from builder.oci.remote import Blobs, LocalFile, resolve, write
from builder.oci.v1 import Image, Platform
from builder.plan.browsers import BrowserWiring
from support.registryhelp import mount_image


@dataclass(frozen=True)
class OwnBase:
    run: str  # unique to the test: in the repository's name and in the labels of its images
    runtime: str  # host/namespace/runtime, holding the base as v1
    client: RepositoryClient  # on that repository, with the test registry's login
    digest: str  # v1's manifest digest
    image: Image  # v1 for amd64, as remote.resolve reads it


def own_base(
    registry: Any, pushed_reference: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> OwnBase:
    """The session's pushed reference base mounted as `<prefix>-<run>/runtime:v1`, with the test
    registry's login in the environment (where the tool looks for it) for the rest of the test."""
    monkeypatch.setenv("BSI_REGISTRY_USER", registry.user)
    monkeypatch.setenv("BSI_REGISTRY_PASSWORD", registry.password)
    monkeypatch.delenv("BSI_REGISTRY", raising=False)
    run = uuid.uuid4().hex[:8]
    runtime = f"{registry.host}/{prefix}-{run}/runtime"
    mount_image(registry, pushed_reference, f"{runtime}:v1")
    client = credentials.registry(ImageRef.parse_repository(runtime))
    digest = client.manifest("v1")[1]
    return OwnBase(run, runtime, client, digest, resolve(client, Platform.linux("amd64"), digest))


def deps_tar(path: Path, module: str) -> str:
    """A deps-extra layer tar holding `module` (root-owned, read-only to the sandbox user); its
    diff ID."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as archive:
        for name, data in (("app/deps-extra", None), (f"app/deps-extra/{module}.py", b"X = 1\n")):
            info = tarfile.TarInfo(name)
            info.mtime, info.uid, info.gid = 1_700_000_000, 0, 0
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                archive.addfile(info)
            else:
                info.size, info.mode = len(data), 0o644
                archive.addfile(info, io.BytesIO(data))
    return f"sha256:{hashlib.sha256(path.read_bytes()).hexdigest()}"


@dataclass
class Previous:
    """A previous image (the base plus a deps-extra layer) in the registry, and its inputs."""

    image: str  # repository@digest
    base_digest: str
    base_tag: str
    cache: Cache
    labels: dict[str, str]  # one of them unique to the run: the images it loaded carry it
    output: Path  # where the delivery's report.json goes
    module: str  # what the deps-extra layer holds: the verification imports it


def previous_image(own: OwnBase, workdir: Path, module: str, change: ConfigChange) -> Previous:
    """An image on `own`'s base whose top layer is deps-extra with `module`, written by digest.

    The deps tar is in the cache, as on the machine that built it: a rebase docker-loads it.
    Its labels carry the run, so that the images a rebase loads can be found and removed."""
    labels = {**change.labels, "org.example.test-run": own.run}
    cache = Cache(workdir / "cache")
    diff_id = deps_tar(workdir / "deps.tar", module)
    with cache.writing_blob(diff_id.removeprefix("sha256:"), "layer.tar") as out:
        out.write((workdir / "deps.tar").read_bytes())
    blob = gzipped(workdir / "deps.tar", diff_id, cache)
    deps = NewLayer(blob.digest, diff_id, blob.size, "COPY /app/deps-extra")
    old = append(own.image, [deps], replace(change, labels=labels))
    write(own.client, [old], Blobs({blob.digest: LocalFile(blob.path)}))
    output = workdir / "context"
    output.mkdir()
    (output / "report.json").write_text("{}")
    return Previous(
        f"{own.runtime}@{old.digest}",
        own.digest,
        f"{own.runtime}:v1",
        cache,
        labels,
        output,
        module,
    )


def remove_loaded(client: Any, previous: Previous) -> None:
    """The images the rebases of `previous` loaded into the engine (untagged, labelled)."""
    run = previous.labels["org.example.test-run"]
    for image in client.images.list(filters={"label": f"org.example.test-run={run}"}):
        with contextlib.suppress(docker.errors.APIError):
            client.images.remove(image.id)


def rebase_plan(
    base_tag: str, base_digest: str, modules: tuple[str, ...], wheels: tuple[Any, ...] = ()
) -> Any:
    """The little of a plan the rebase producer and the delivery read: the previous image's own
    base (`base_tag` at `base_digest`), amd64, no apt layer, the modules to import."""
    base = f"{base_tag}@{base_digest}"
    return SimpleNamespace(
        base=SimpleNamespace(
            image=base_tag,
            reference=ImageRef.parse(base_tag),
            digest=base_digest,
            python_version="3.13.5",
            packages={},
        ),
        base_image=base,
        base_reference=ImageRef.parse(base),
        arches=(
            SimpleNamespace(
                arch="amd64",
                apt_packages=(),
                wheels=wheels,
                installed_programs=lambda: (),
                browsers=BrowserWiring(),  # no browser: no wiring
            ),
        ),
        import_modules=modules,
        runtime_checks=(),
        requested=(),  # no deep imports: what a rebase verifies beyond them is under test
        pythonpath_entry="/app/deps-extra",
        browser_env={},  # no browser installed: the image's environment is its home's alone
    )
