"""Issue 20's three ratios in one run: a requirements change, a second template, container start.

(a) set A (scikit-learn, matplotlib, joblib 1.4.0; numpy and pandas are the base's) is built
    and pushed cold; then A' (joblib bumped to 1.4.2, tabulate added) is pushed to the same
    repository with the same tool cache: bytes uploaded against the image's bytes (target:
    5 % at most), and what a node holding A must download and unpack.
(b) set B (scikit-learn, sympy, joblib 1.4.2: scipy, scikit-learn and its deps shared with A') is
    pushed to another repository of the registry, same cache: bytes uploaded against the
    compressed size of B's own distinct distributions' layers (the distribution and bytecode
    layers of what A' does not hold) (target <= distinct + 5 %).
(c) container start (`docker run` of the hardened image to the first `GET /` 200) of A' as the
    tool pushed it (one layer per distribution, bytecode layers above) against the same image
    with every extras layer flattened into one (same base layers, same config otherwise),
    interleaved after a discarded warm-up round, medians (target <= 1.1x).

Every build is the CLI's (`--no-verify`: verification is not what is measured) on the given base
against the local test registry (.test-env.json). Needs the engine, the registry and the index.

    .venv/bin/python benchmarks/layers.py [--base-image bsi-reference:test] [--repeats 9]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import uuid
from pathlib import Path
from typing import Any

import docker

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
from import_time import start_seconds  # noqa: E402

from builder.credentials import Credentials  # noqa: E402
from builder.files import sha256_of  # noqa: E402
from builder.oci.client import RepositoryClient  # noqa: E402
from builder.oci.name import ImageRef  # noqa: E402
from builder.oci.remote import Blobs, LocalFile, resolve, write  # noqa: E402
from builder.oci.v1 import Descriptor, Image, Platform, canonical  # noqa: E402
from builder.publish.node_update import NodeUpdate, node_update  # noqa: E402

# The reference base holds numpy and pandas (/app/deps): the extras are the rest.
SET_A = "scikit-learn\nmatplotlib\njoblib==1.4.0\n"
SET_A2 = "scikit-learn\nmatplotlib\njoblib==1.4.2\ntabulate==0.9.0\n"
SET_B = "scikit-learn\nsympy\njoblib==1.4.2\n"
ENV = {**os.environ, "DOCKER_BUILDKIT": "1"}  # the CLI's; main adds the login and a uv cache


def cli(work: Path, name: str, requirements: str, base: str, push: str) -> dict[str, Any]:
    """One CLI build pushed to `push`; report.json's image and the extras layers of amd64."""
    (work / f"{name}.txt").write_text(requirements)
    command = [
        sys.executable, "-m", "builder", "-r", str(work / f"{name}.txt"), "--base-image", base,
        "--arch", "amd64", "--tag", f"{push.split('/', 1)[1]}-local:{name}",
        "--output", str(work / name), "--cache-dir", str(work / "cache"), "--push", push,
        "--no-verify",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=ENV)
    if result.returncode != 0:
        sys.exit(f"error: build {name} failed:\n{result.stdout[-3000:]}{result.stderr}")
    print(next(line for line in result.stdout.splitlines() if line.startswith("push: ")))
    report = json.loads((work / name / "report.json").read_text())
    return report["image"] | {"extras": report["architectures"]["amd64"]["extras_layers"]}


def named(layers: list[dict[str, Any]]) -> list[set[str]]:
    """Each extras layer's distributions; a bytecode layer holds its group's (same order)."""
    groups = [set(one["distributions"]) for one in layers if one["kind"] == "distribution"]
    found, bytecode = [], 0
    for one in layers:
        if one["kind"] == "bytecode" and not one["distributions"]:
            found.append(groups[bytecode] if bytecode < len(groups) else set())
            bytecode += 1
        else:
            found.append(set(one["distributions"]))
    return found


def flattened(login: Credentials, pushed: str, count: int, work: Path) -> str:
    """`pushed` with its top `count` layers merged into one, written beside it; its reference."""
    repository, digest = pushed.split("@")
    source = RepositoryClient(ImageRef.parse(repository), credentials=login)
    image = resolve(source, Platform.linux("amd64"), digest)
    merged, seen = work / "flat.tar", set()
    with tarfile.open(merged, "w", format=tarfile.PAX_FORMAT) as out:
        for descriptor in image.layers[-count:]:
            blob = work / "layer.tar.gz"
            with source.blob(descriptor.digest) as stream, blob.open("wb") as handle:
                shutil.copyfileobj(stream, handle)  # type: ignore[misc]
            with tarfile.open(blob, "r:gz") as unpacked:
                for member in unpacked:
                    if member.isdir() and member.name in seen:
                        continue
                    seen.add(member.name)
                    out.addfile(member, unpacked.extractfile(member) if member.isfile() else None)
    packed = work / "flat.tar.gz"
    with (
        merged.open("rb") as raw,
        packed.open("wb") as handle,
        gzip.GzipFile(fileobj=handle, mode="wb", compresslevel=6, mtime=0) as gz,
    ):
        shutil.copyfileobj(raw, gz)
    config = copy.deepcopy(dict(image.config))
    config["rootfs"]["diff_ids"] = [*image.diff_ids[:-count], f"sha256:{sha256_of(merged)}"]
    history, dropped = list(config.get("history") or []), 0
    for position in range(len(history) - 1, -1, -1):
        if dropped < count and not history[position].get("empty_layer"):
            del history[position]
            dropped += 1
    config["history"] = [*history, {"created_by": f"{count} extras layers flattened into one"}]
    layer = Descriptor(image.layers[-1].media_type, f"sha256:{sha256_of(packed)}",
                       packed.stat().st_size)  # fmt: skip
    flat = Image.build(canonical(config), [*image.layers[:-count], layer], docker=image.is_docker)
    target = RepositoryClient(ImageRef.parse(f"{repository}-flat"), credentials=login)
    write(target, [flat], Blobs({layer.digest: LocalFile(packed)}, (source,)), tags=["flat"])
    return f"{repository}-flat@{flat.digest}"


def node_figures(login: Credentials, before: str, after: str) -> NodeUpdate:
    """What a node holding `before` downloads and unpacks for `after` (the CLI's own figure
    needs a state file; a plain build's tag changes with the extras)."""
    images = []
    for pushed in (before, after):
        repository, digest = pushed.split("@")
        source = RepositoryClient(ImageRef.parse(repository), credentials=login)
        images.append(resolve(source, Platform.linux("amd64"), digest))
    return node_update(images[1], images[0])


def pulled(client: docker.DockerClient, reference: str, login: Credentials) -> str:
    repository, digest = reference.split("@")
    auth = {"username": login.username, "password": login.secret}
    client.api.pull(repository, tag=digest, auth_config=auth, stream=False)
    return reference


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-image", default="bsi-reference:test")
    parser.add_argument("--repeats", type=int, default=9, help="container starts of each (c)")
    args = parser.parse_args()
    test_env = json.loads((REPO / ".test-env.json").read_text())
    host = test_env["registry"]
    login = Credentials(test_env["registry_user"], test_env["registry_password"], "bench")
    ENV.update(BSI_REGISTRY_USER=login.username, BSI_REGISTRY_PASSWORD=login.secret)
    run = f"bsi-bench-layers-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="bsi-bench-") as temp:
        work = Path(temp)
        ENV["UV_CACHE_DIR"] = str(work / "uv")
        a = cli(work, "a", SET_A, args.base_image, f"{host}/{run}/a")
        a2 = cli(work, "a2", SET_A2, args.base_image, f"{host}/{run}/a")
        b = cli(work, "b", SET_B, args.base_image, f"{host}/{run}/b")
        node = node_figures(login, a["pushed"], a2["pushed"])
        held = set().union(*named(a2["extras"]))
        distinct = [
            one for one, names in zip(b["extras"], named(b["extras"]), strict=True) if names - held
        ]
        distinct_bytes = sum(one["size"] for one in distinct)
        distinct_names = sorted(set().union(*named(distinct)) - held)

        client = docker.from_env()
        layered = pulled(client, a2["pushed"], login)
        flat = pulled(client, flattened(login, a2["pushed"], len(a2["extras"]), work), login)
        starts: dict[str, list[float]] = {layered: [], flat: []}
        for round_ in range(args.repeats + 1):
            for image in [layered, flat] if round_ % 2 else [flat, layered]:
                seconds = start_seconds(image)
                if round_:
                    starts[image].append(seconds)
        local = [f"{run}/a-local:a", f"{run}/a-local:a2", f"{run}/b-local:b"]
        for image in [*starts, *local]:
            with contextlib.suppress(docker.errors.ImageNotFound):  # gone under another name
                client.images.remove(image, force=True)
    print(f"(a) A ({a['image_size']} B) -> A' (joblib 1.4.0 -> 1.4.2, + tabulate): uploaded"
          f" {a2['bytes_pushed']} of image {a2['image_size']}:"
          f" {a2['bytes_pushed'] / a2['image_size']:6.2%} (target <= 5 %)")  # fmt: skip
    print(f"    a node holding A downloads {node.download} B ({node.download_layers} layers),"
          f" unpacks {node.unpack} B ({node.unpack_layers} layers); present"
          f" {a2['bytes_present']}, mounted {a2['bytes_mounted']}")  # fmt: skip
    print(f"(b) second template in another repository: uploaded {b['bytes_pushed']}, mounted"
          f" {b['bytes_mounted']}; its distinct distributions ({', '.join(distinct_names)}):"
          f" {distinct_bytes} in {len(distinct)} layers; uploaded / distinct"
          f" {b['bytes_pushed'] / distinct_bytes:5.3f} (target <= 1.05)")  # fmt: skip
    one, many = statistics.median(starts[flat]), statistics.median(starts[layered])
    print(
        f"(c) start -> GET / 200, medians of {args.repeats}: {len(a2['extras'])} extras layers"
        f" {many:.3f} s, one flattened {one:.3f} s: ratio {many / one:5.2f}x (target <= 1.1x)"
    )
    for label, image in (("layers", layered), ("flat", flat)):
        print(f"    {label}: " + " ".join(f"{s:.3f}" for s in starts[image]))


if __name__ == "__main__":
    main()
