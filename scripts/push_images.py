"""Push engine images as one multi-arch index: `python scripts/push_images.py`.

    python scripts/push_images.py REGISTRY/REPO:TAG ARCH=IMAGE [ARCH=IMAGE ...]

Each image goes up by digest (the tool's own path: builder.assemble.from_engine and
builder.oci.remote.write), the index names each with its platform under TAG, and each image is
also tagged TAG-ARCH. Nothing is pushed when TAG already names an index of exactly these
images (their configs are the engine's image ids) and each TAG-ARCH names its image, so a
second run asks the registry a few HEADs and GETs only. Prints the digests of the index and of
each image, in the order given, on one line. scripts/setup-env.sh pushes its stand-in base
images with it; credentials come from builder.credentials (BSI_REGISTRY_USER/PASSWORD).
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import docker
import docker.errors

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a plain script

from builder import credentials
from builder.assemble.from_engine import push_engine_images
from builder.cache import Cache
from builder.engines.connection import engine_client
from builder.errors import UserError
from builder.oci.client import RepositoryClient
from builder.oci.name import ImageRef
from builder.oci.remote import Blobs, read, resolve, write
from builder.oci.v1 import Index, Platform


def present(
    target: RepositoryClient, tag: str, images: Mapping[str, str]
) -> tuple[str, dict[str, str]] | None:
    """The index digest and each arch's image digest, if `tag` already names these images."""
    try:
        found = read(target, tag)
        if not isinstance(found, Index) or len(found.manifests) != len(images):
            return None
        digests = {}
        for arch, image_id in images.items():
            image = resolve(target, Platform.linux(arch), found.digest)
            if image.config_descriptor.digest != image_id:
                return None
            if target.head_manifest(f"{tag}-{arch}") != image.digest:
                return None
            digests[arch] = image.digest
    except UserError:  # not there yet, or not what we would push
        return None
    return found.digest, digests


def push(
    client: docker.DockerClient, reference: ImageRef, images: Mapping[str, str]
) -> tuple[str, dict[str, str]]:
    """Push `images` (arch -> engine image) as one index under the reference's tag, and each
    image under TAG-ARCH; nothing when they are there already."""
    if not reference.tag or reference.digest:
        raise UserError(f"{reference}: give REGISTRY/REPO:TAG (a tag, no digest)")
    tag = reference.tag
    repository = reference.with_tag(None)
    target = credentials.registry(repository, str(repository))
    try:
        ids = {arch: str(client.images.get(image).id) for arch, image in images.items()}
    except docker.errors.DockerException as error:
        raise UserError(f"engine image: {error}") from None
    found = present(target, tag, ids)
    if found is not None:
        print(f"{reference} already names {', '.join(images)}", file=sys.stderr)
        return found
    with tempfile.TemporaryDirectory(prefix="bsi-push-images-") as scratch:  # pushed once: no
        cache = Cache(Path(scratch))  # cache of its gzipped layers outlives the run
        written, pushed = push_engine_images(client, ids, target, [tag], cache)
    for arch, image in pushed.items():
        write(target, [image], Blobs(), tags=[f"{tag}-{arch}"])
    print(f"pushed {reference} ({', '.join(images)})", file=sys.stderr)
    return written.digest, {arch: image.digest for arch, image in pushed.items()}


def main(argv: Sequence[str]) -> int:
    if len(argv) < 2 or not all("=" in pair for pair in argv[1:]):
        print(__doc__, file=sys.stderr)
        return 2
    client = engine_client()
    try:
        if client is None:
            raise UserError("no Docker engine answers (DOCKER_HOST)")
        reference = ImageRef.parse(argv[0], "index reference")
        images = dict(pair.split("=", 1) for pair in argv[1:])
        index, digests = push(client, reference, images)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(" ".join([index, *(digests[arch] for arch in images)]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
