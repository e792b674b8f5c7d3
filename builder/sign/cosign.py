"""cosign's classic signature and attestation manifests, as values the OCI core writes.

A signature (cosign's specs/SIGNATURE_SPEC.md) is a layer of an OCI manifest tagged
`sha256-<hex>.sig` beside the signed manifest: the layer's blob is the simple-signing payload
naming the manifest's digest, its media type `application/vnd.dev.cosign.simplesigning.v1+json`,
and the annotation `dev.cosignproject.cosign/signature` holds the base64 ECDSA signature of
the payload. An attestation is a layer of the manifest tagged `sha256-<hex>.att`: a DSSE
envelope (`application/vnd.dsse.envelope.v1+json`) around an in-toto statement, annotated with
its `predicateType`, as `cosign attest` writes it.

Several signatures share one manifest, so an existing `.sig` or `.att` is read and extended,
never replaced: a signature by another key stays, and a signature this key already made of the
same payload is not added twice. The manifests are values (builder.oci.remote.Tagged) that
builder.oci.remote.write puts after the images and the index and before the tags.

DSSE's pre-authentication encoding (PAE) is the spec's one line, written here: the maintained
implementation (securesystemslib's dsse) would bring its own key and signer abstractions for
those few bytes; the signature itself is `cryptography`'s ECDSA.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from builder.errors import RegistryError
from builder.oci.client import RepositoryClient
from builder.oci.referrers import Attachment
from builder.oci.remote import Tagged
from builder.oci.v1 import (
    OCI_CONFIG,
    OCI_MANIFEST,
    DescriptorRecord,
    ManifestDocument,
    artifact_config,
    canonical,
    digest_of,
)
from builder.sign.keys import PublicKey, SigningKey

SIMPLE_SIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"
DSSE_ENVELOPE = "application/vnd.dsse.envelope.v1+json"
IN_TOTO = "application/vnd.in-toto+json"
CYCLONEDX = "application/vnd.cyclonedx+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
PREDICATE_ANNOTATION = "predicateType"
SIGNATURE_TYPE = "cosign container image signature"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
CYCLONEDX_PREDICATE = "https://cyclonedx.org/bom"  # cosign's `--type cyclonedx`
ZERO_TIME = "0001-01-01T00:00:00Z"  # what cosign's signature images carry as creation time
MAX_SIGNATURE_LAYERS = 1000


@dataclass(frozen=True)
class Subject:
    """A manifest to sign, and the in-toto statements to attest about it (none for an index)."""

    digest: str
    statements: tuple[bytes, ...] = ()


def sig_tag(digest: str) -> str:
    """Where cosign looks for `digest`'s signatures: `sha256-<hex>.sig`."""
    return digest.replace(":", "-") + ".sig"


def att_tag(digest: str) -> str:
    """Where cosign looks for `digest`'s attestations: `sha256-<hex>.att`."""
    return digest.replace(":", "-") + ".att"


def simple_signing_payload(repository: str, digest: str) -> bytes:
    """What a signature signs: the manifest digest, in the simple-signing format."""
    return canonical(
        {
            "critical": {
                "identity": {"docker-reference": repository},
                "image": {"docker-manifest-digest": digest},
                "type": SIGNATURE_TYPE,
            },
            "optional": None,
        }
    )


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what an envelope's signature covers."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def dsse_envelope(key: SigningKey, statement: bytes) -> bytes:
    """`statement` in a DSSE envelope signed with `key` (no key id: cosign writes none)."""
    signature = key.sign(pae(IN_TOTO, statement))
    return canonical(
        {
            "payloadType": IN_TOTO,
            "payload": base64.b64encode(statement).decode(),
            "signatures": [{"keyid": "", "sig": base64.b64encode(signature).decode()}],
        }
    )


def statements(repository: str, digest: str, attached: Sequence[Attachment]) -> tuple[bytes, ...]:
    """The in-toto statements to attest for the documents attached to `repository@digest`.

    The provenance is already a statement: its very bytes are attested. The SBOM becomes the
    predicate of a statement about the same image (cosign's `--type cyclonedx`).
    """
    found = []
    for attachment in attached:
        if attachment.artifact_type == IN_TOTO:
            found.append(attachment.document)
        elif attachment.artifact_type == CYCLONEDX:
            subject = {"name": repository, "digest": {"sha256": digest.removeprefix("sha256:")}}
            statement = {
                "_type": STATEMENT_TYPE,
                "subject": [subject],
                "predicateType": CYCLONEDX_PREDICATE,
                "predicate": json.loads(attachment.document),
            }
            found.append(canonical(statement))
    return tuple(found)


def predicate_type(statement: bytes) -> str:
    value = json.loads(statement).get("predicateType")
    return value if isinstance(value, str) else ""


def signatures(
    registry: RepositoryClient, key: SigningKey, repository: str, subjects: Sequence[Subject]
) -> list[Tagged]:
    """The `.sig` (and `.att`) manifests that sign each subject with `key`, existing ones
    extended; a subject this key already signed the same way needs no new `.sig`."""
    found = []
    for subject in subjects:
        payload = simple_signing_payload(repository, subject.digest)
        layers = existing_layers(registry, sig_tag(subject.digest))
        if not any(_signs(layer, payload, key.public) for layer in layers):
            signature = base64.b64encode(key.sign(payload)).decode()
            layer = _descriptor(SIMPLE_SIGNING, payload, {SIGNATURE_ANNOTATION: signature})
            blobs = {digest_of(payload): payload}
            found.append(_tagged(sig_tag(subject.digest), [*layers, layer], blobs))
        if subject.statements:
            layers = existing_layers(registry, att_tag(subject.digest))
            blobs = {}
            for statement in subject.statements:
                envelope = dsse_envelope(key, statement)
                annotations = {
                    SIGNATURE_ANNOTATION: "",  # the signature is in the envelope
                    PREDICATE_ANNOTATION: predicate_type(statement),
                }
                layers.append(_descriptor(DSSE_ENVELOPE, envelope, annotations))
                blobs[digest_of(envelope)] = envelope
            found.append(_tagged(att_tag(subject.digest), layers, blobs))
    return found


def existing_layers(registry: RepositoryClient, tag: str) -> list[DescriptorRecord]:
    """The layers of the manifest under `tag` ([] when there is none), as written: a rewrite
    keeps every field of them, those this tool does not read too."""
    url = registry.url("manifests", tag)
    head = registry.open(url, "HEAD", accept=OCI_MANIFEST, missing_ok=True)
    if head is None:
        return []
    head.close()
    body, _ = registry.manifest(tag)
    try:
        layers = json.loads(body)["layers"]
        if not isinstance(layers, list) or len(layers) > MAX_SIGNATURE_LAYERS:
            raise ValueError(tag)
        for layer in layers:
            if not isinstance(layer["digest"], str) or not isinstance(layer["mediaType"], str):
                raise ValueError(tag)
    except (ValueError, KeyError, TypeError):
        raise RegistryError(f"{registry.ref.name}:{tag} is not a signature manifest") from None
    return layers


def layer_signature(layer: DescriptorRecord) -> bytes | None:
    """The signature a layer's annotation holds, decoded; None when it holds none."""
    annotations = layer.get("annotations")
    value = annotations.get(SIGNATURE_ANNOTATION) if isinstance(annotations, dict) else None
    if not isinstance(value, str) or not value:
        return None
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error:
        return None


def _signs(layer: DescriptorRecord, payload: bytes, public: PublicKey) -> bool:
    """`layer` is a signature of exactly `payload` made with `public`'s key."""
    if layer.get("mediaType") != SIMPLE_SIGNING or layer.get("digest") != digest_of(payload):
        return False
    signature = layer_signature(layer)
    return signature is not None and public.verifies(signature, payload)


def _descriptor(media_type: str, blob: bytes, annotations: dict[str, str]) -> DescriptorRecord:
    return DescriptorRecord(
        mediaType=media_type, digest=digest_of(blob), size=len(blob), annotations=annotations
    )


def _tagged(tag: str, layers: list[DescriptorRecord], blobs: dict[str, bytes]) -> Tagged:
    """The manifest over `layers` (cosign's: an OCI image whose config lists them as its
    uncompressed layers), with the new blobs and that config to upload."""
    config = artifact_config([layer["digest"] for layer in layers], ZERO_TIME)
    manifest = canonical(
        ManifestDocument(
            schemaVersion=2,
            mediaType=OCI_MANIFEST,
            config=DescriptorRecord(
                mediaType=OCI_CONFIG, digest=digest_of(config), size=len(config)
            ),
            layers=layers,
        )
    )
    return Tagged(tag, manifest, OCI_MANIFEST, {**blobs, digest_of(config): config})


def signed_push(
    registry: RepositoryClient,
    key: SigningKey,
    repository: str,
    images: Sequence[str],
    index: str | None,
    attached: Mapping[str, Sequence[Attachment]],
) -> list[Tagged]:
    """What signs one push: every image manifest (attesting its attached SBOM and
    provenance), then the index naming them, if any."""
    subjects = [Subject(d, statements(repository, d, attached.get(d, ()))) for d in images]
    return signatures(registry, key, repository, [*subjects, *([Subject(index)] if index else [])])
