"""Signature manifests read, extended and checked, against a loopback fake registry (fast tier).

The real registry and the real cosign check the same layout in
tests/integration/test_sign_cosign.py; here the cases that need a registry to hold something odd:
another key's signature already there, a malformed `.sig`, a genuine signature replayed from
another image, an image with signatures but no attestations.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from support.fakeregistry import MANIFEST, Content, Server

from builder.errors import RegistryError, UserError
from builder.oci.client import RepositoryClient
from builder.oci.name import ImageRef
from builder.oci.remote import Tagged
from builder.oci.v1 import digest_of
from builder.sign.check import check_signed
from builder.sign.cosign import (
    SIGNATURE_ANNOTATION,
    SIMPLE_SIGNING,
    Subject,
    sig_tag,
    signatures,
    simple_signing_payload,
)
from builder.sign.keys import PublicKey, SigningKey

REPOSITORY = "team/app"


@pytest.fixture
def served() -> Iterator[tuple[Content, RepositoryClient]]:
    content = Content()
    server = Server(content.route)
    try:
        ref = ImageRef.parse_repository(f"127.0.0.1:{server.port}/{REPOSITORY}")
        yield content, RepositoryClient(ref)
    finally:
        server.close()


def key(name: str) -> SigningKey:
    return SigningKey(Path(name), ec.generate_private_key(ec.SECP256R1()))


def image(content: Content, marker: str) -> str:
    """A small image manifest in the fake registry, tagged `marker`; its digest."""
    config = content.blob(json.dumps({"architecture": "amd64", "os": "linux"}).encode())
    layer = content.blob(marker.encode())
    return content.manifest(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": {"mediaType": "application/json", "digest": config, "size": 1},
            "layers": [{"mediaType": "application/octet-stream", "digest": layer, "size": 1}],
        },
        tag=marker,
    )


def serve(content: Content, tagged: Tagged) -> None:
    """What the OCI core would write: the blobs, the manifest under its tag."""
    for blob in tagged.blobs.values():
        content.blob(blob)
    content.manifest(json.loads(tagged.manifest), tag=tagged.tag)


def layers(tagged: Tagged) -> list[dict]:
    return json.loads(tagged.manifest)["layers"]


def test_another_key_s_signature_stays_and_this_key_signs_once(
    served: tuple[Content, RepositoryClient],
) -> None:
    content, registry = served
    digest = image(content, "one")
    theirs, ours = key("theirs.key"), key("ours.key")
    (first,) = signatures(registry, theirs, REPOSITORY, [Subject(digest)])
    assert first.tag == sig_tag(digest)
    serve(content, first)
    (second,) = signatures(registry, ours, REPOSITORY, [Subject(digest)])
    kept, added = layers(second)
    assert kept == layers(first)[0]
    payload = simple_signing_payload(REPOSITORY, digest)
    assert added["mediaType"] == SIMPLE_SIGNING and added["digest"] == digest_of(payload)
    signature = base64.b64decode(added["annotations"][SIGNATURE_ANNOTATION])
    assert ours.public.verifies(signature, payload)
    assert not theirs.public.verifies(signature, payload)
    serve(content, second)
    assert signatures(registry, ours, REPOSITORY, [Subject(digest)]) == []
    assert signatures(registry, theirs, REPOSITORY, [Subject(digest)]) == []


def test_a_malformed_signature_manifest_is_refused_not_replaced(
    served: tuple[Content, RepositoryClient],
) -> None:
    content, registry = served
    digest = image(content, "one")
    content.manifest({"schemaVersion": 2, "mediaType": MANIFEST, "layers": "x"}, sig_tag(digest))
    with pytest.raises(RegistryError, match=r"\.sig is not a signature manifest"):
        signatures(registry, key("k.key"), REPOSITORY, [Subject(digest)])


def public(signing: SigningKey) -> PublicKey:
    return PublicKey(Path("cosign.pub"), signing.private.public_key())


def test_a_signature_replayed_from_another_image_does_not_pass(
    served: tuple[Content, RepositoryClient],
) -> None:
    """A genuine signature of image one, copied under image two's `.sig` tag, signs image
    one's digest, not two's."""
    content, registry = served
    one, two = image(content, "one"), image(content, "two")
    signing = key("k.key")
    (signed,) = signatures(registry, signing, REPOSITORY, [Subject(one)])
    serve(content, signed)
    replayed = Tagged(sig_tag(two), signed.manifest, signed.media_type, signed.blobs)
    serve(content, replayed)
    with pytest.raises(UserError, match=f"{two}: not signed by cosign.pub"):
        check_signed(registry_at(registry, "two"), public(signing))


def registry_at(registry: RepositoryClient, tag: str) -> RepositoryClient:
    return RepositoryClient(ImageRef.parse(f"{registry.ref.name}:{tag}"))


def test_a_signed_image_without_attestations_fails_the_check(
    served: tuple[Content, RepositoryClient],
) -> None:
    content, registry = served
    digest = image(content, "one")
    signing = key("k.key")
    for tagged in signatures(registry, signing, REPOSITORY, [Subject(digest)]):
        serve(content, tagged)
    with pytest.raises(
        UserError, match=re.escape("no attestation of https://slsa.dev/provenance/v1")
    ):
        check_signed(registry_at(registry, "one"), public(signing))
    statement = {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": REPOSITORY, "digest": {"sha256": digest.removeprefix("sha256:")}}],
        "predicateType": "https://slsa.dev/provenance/v1",
        "predicate": {},
    }
    about = Subject(digest, (json.dumps(statement).encode(),))
    for tagged in signatures(registry, signing, REPOSITORY, [about]):
        serve(content, tagged)
    with pytest.raises(UserError, match=re.escape("no attestation of https://cyclonedx.org/bom")):
        check_signed(registry_at(registry, "one"), public(signing))
