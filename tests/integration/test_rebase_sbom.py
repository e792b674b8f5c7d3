"""A rebase's SBOM names, for every extra, the layer that holds its files, as a build's does.

The rebase reuses the previous image's extras layers as they are; which distributions each
holds is read back from their history lines (builder.layers.extras.holding_layers): a
distribution's own layer names it, a bucket holds the names its hash sends there, a bytecode
layer holds none, and an image of before layers by distribution has one layer holding all.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import docker
import docker.errors
import pytest
from support.plans import run_settings
from support.rebasing import own_base, rebase_plan
from support.wheelfactory import make_wheel

from builder import credentials
from builder.attest import sbom
from builder.cache import Cache
from builder.engines.per_arch import Engines
from builder.files import sha256_of
from builder.layers.extras import (
    ExtrasLayer,
    LayerKind,
    created_by,
    distribution_layers,
    holding_layers,
)
from builder.layers.gzipped import gzipped
from builder.layers.layer import Layer
from builder.oci.mutate import ConfigChange, NewLayer, append
from builder.oci.name import ImageRef
from builder.oci.referrers import attached_document, referrers
from builder.oci.remote import Blobs, write
from builder.orchestration.delivery import Delivery, Run, deliver
from builder.orchestration.prepare import Finish
from builder.orchestration.produce_rebase import Previous, RebaseProducer
from builder.plan.layering import bucket_of
from builder.publish.publisher import Target
from builder.reporter import QUIET

ROOT = "/app/deps-extra"
NAMES = ("alpha-big", "b-one", "c-two", "d-three", "e-four", "f-five")  # alpha: the largest
BUDGET = 5  # six distributions in five layers: alpha's own, the rest in buckets


def _layer(name: str) -> Layer:
    return Layer(Path(f"/nonexistent/{name}"), f"sha256:{name:0>64}", 0, 0)


def _line(kind: str, label: str, names: tuple[str, ...], index: int) -> str:
    return created_by("amd64", index, ExtrasLayer(kind, names, label, _layer(label)), ROOT)


def test_each_name_is_placed_by_its_own_layer_or_its_bucket_never_by_bytecode() -> None:
    bucket = bucket_of("small-one")
    added = [
        ("sha256:own", _line(LayerKind.DISTRIBUTION, "big-one", ("big-one",), 0)),
        ("sha256:bucket", _line(LayerKind.DISTRIBUTION, f"bucket {bucket}", ("small-one",), 1)),
        ("sha256:bytecode", _line(LayerKind.BYTECODE, "big-one", ("big-one",), 2)),
    ]
    assert holding_layers(added, ["Big_One", "small-one"]) == {
        "big-one": "sha256:own",
        "small-one": "sha256:bucket",
    }
    other = next(n for n in ("x1", "x2", "x3", "x4", "x5") if bucket_of(n) != bucket)
    assert holding_layers(added, [other]) == {}  # no layer holds it: none is claimed
    # before layers by distribution: one extras layer, whose line names no kind
    old = [("sha256:one", "/bin/sh -c #(nop) COPY dir:abc in /app/deps-extra")]
    assert holding_layers(old, ["big-one", "small-one"]) == {
        "big-one": "sha256:one",
        "small-one": "sha256:one",
    }


def _marker_layer(tmp_path: Path, cache: Cache) -> Layer:
    """A small layer standing for the bytecode layer: a file under the root, no distribution."""
    path = tmp_path / "marker.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as archive:
        info = tarfile.TarInfo("app/deps-extra/bsi_h5_marker.txt")
        info.size, info.mode, info.mtime = 1, 0o644, 1_700_000_000
        archive.addfile(info, io.BytesIO(b"x"))
    diff_id = f"sha256:{hashlib.sha256(path.read_bytes()).hexdigest()}"
    with cache.writing_blob(diff_id.removeprefix("sha256:"), "layer.tar") as out:
        out.write(path.read_bytes())
    found = cache.find_blob(diff_id.removeprefix("sha256:"), "layer.tar")
    assert found is not None
    return Layer(found, diff_id, path.stat().st_size, 1_700_000_000)


CHANGE = ConfigChange(
    env={"PYTHONPATH": "$PYTHONPATH:/app/deps-extra"},
    user="65532:65532",
    labels={"org.opencontainers.image.version": "v2-xabc"},
    created="2024-06-01T12:00:00Z",
)


@dataclass
class Stacked:
    """A previous image whose extras are layers by distribution (and a bytecode layer on top)."""

    image: str
    base_digest: str
    base_tag: str
    cache: Cache
    labels: dict[str, str]
    output: Path
    wheels: list[Any]  # as the plan has them: name, filename, url, sha256
    holding: dict[str, str]  # what the build path would say: name -> diff ID
    bytecode: str  # the top layer's diff ID, which holds no distribution


def _make_wheels(folder: Path) -> dict[str, Path]:
    """A wheel per name in NAMES, alpha-big's large enough to fill a layer of its own."""
    files = {}
    for name in NAMES:
        module = name.replace("-", "_")
        body = b"X = 1\n" + (b"#" * 100_000 if name == "alpha-big" else b"")
        files[name] = make_wheel(folder, name, "1.0", "py3-none-any", {f"{module}.py": body})
    return files


def _as_planned(files: dict[str, Path], shas: dict[str, str]) -> list[Any]:
    """The wheels as the plan has them: name, filename, url, sha256, index and source."""
    return [
        SimpleNamespace(
            name=name,
            filename=files[name].name,
            url=f"https://x/{files[name].name}",
            sha256=sha,
            index="",  # PyPI's (PlannedWheel.index)
            source=None,  # from an index, not a direct requirement (PlannedWheel.source)
        )
        for name, sha in shas.items()
    ]


@pytest.fixture
def stacked(
    tmp_path: Path,
    registry: Any,
    pushed_reference: str,
    docker_client: docker.DockerClient,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Stacked]:
    own = own_base(registry, pushed_reference, "bsi-h5-sbom", monkeypatch)
    run, runtime, bases, base_digest, base = own.run, own.runtime, own.client, own.digest, own.image
    labels = {**CHANGE.labels, "org.example.test-run": run}
    cache = Cache(tmp_path / "cache")
    files = _make_wheels(tmp_path / "wheels")
    shas = {name: sha256_of(path) for name, path in files.items()}
    pins = [(name, "1.0", shas[name]) for name in NAMES]
    stack = distribution_layers(pins, {shas[n]: p for n, p in files.items()}, ROOT, cache, BUDGET)
    assert stack[0].label == "alpha-big" and len(stack) > 1
    assert all(one.label.startswith("bucket ") for one in stack[1:])
    top = ExtrasLayer(
        LayerKind.BYTECODE, stack[0].names, stack[0].label, _marker_layer(tmp_path, cache)
    )
    layers = []
    for index, one in enumerate([*stack, top]):
        blob = gzipped(one.layer.path, one.layer.diff_id, cache)
        bases.upload_blob(blob.path, blob.digest)
        line = created_by("amd64", index, one, ROOT)
        layers.append(NewLayer(blob.digest, one.layer.diff_id, blob.size, line))
    old = append(base, layers, replace(CHANGE, labels=labels))
    write(bases, [old], Blobs())
    output = tmp_path / "context"
    output.mkdir()
    (output / "report.json").write_text("{}")
    wheels = _as_planned(files, shas)
    holding = {name: one.layer.diff_id for one in stack for name in one.names}
    yield Stacked(
        f"{runtime}@{old.digest}",
        base_digest,
        f"{runtime}:v1",
        cache,
        labels,
        output,
        wheels,
        holding,
        top.layer.diff_id,
    )
    for image in docker_client.images.list(filters={"label": f"org.example.test-run={run}"}):
        with contextlib.suppress(docker.errors.APIError):
            docker_client.images.remove(str(image.id))


@pytest.mark.usefixtures("docker_client")
@pytest.mark.usefixtures("registry")
def test_a_rebased_image_s_sbom_names_each_extra_s_own_layer(
    stacked: Stacked, registry: Any, docker_client: docker.DockerClient
) -> None:
    plan = rebase_plan(
        stacked.base_tag, stacked.base_digest, ("alpha_big", "f_five"), tuple(stacked.wheels)
    )
    target = f"{registry.host}/{stacked.image.split('/')[1]}/sandbox"
    finished = Finish({}, stacked.labels, "2024-07-01T00:00:00Z", stacked.cache)
    run = Run(Engines.local(docker_client), stacked.cache, QUIET)
    repository = ImageRef.parse_repository(target)
    start = Previous(ImageRef.parse(stacked.image), stacked.base_digest)
    with RebaseProducer(start, plan, finished, repository, run) as producer:
        outcome = deliver(
            producer,
            plan,
            Delivery(run_settings(output=stacked.output), push=Target(repository, "v1")),
            run,
        )
    assert outcome.verification is not None and outcome.verification.passed
    assert outcome.pushed is not None
    pushed = credentials.registry(ImageRef.parse(f"{target}@{outcome.pushed.digest}"))
    (found,) = [
        r for r in referrers(pushed, outcome.pushed.digest) if r.artifact_type == sbom.MEDIA_TYPE
    ]
    components = json.loads(attached_document(pushed, found))["components"]
    layer_of = {
        c["name"]: p["value"]
        for c in components
        for p in c.get("properties", ())
        if p["name"] == "build-sandbox-image:layer" and c.get("purl", "").startswith("pkg:pypi/")
    }
    assert {name: layer_of.get(name) for name in NAMES} == stacked.holding
    assert stacked.bytecode not in layer_of.values()
    assert len(set(stacked.holding.values())) > 2  # alpha's own layer and at least two buckets
