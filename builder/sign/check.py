"""Checking an image's cosign signatures and attestations against a public key.

What an admission policy would check, before `verify` runs anything: the reference's own
manifest (the index, or the one image) has a `.sig` layer whose payload names exactly that
digest and whose signature the key verifies; each arch image of an index too; and each arch
image has, under `.att`, a DSSE envelope signed by the key around an in-toto statement about
that digest for every predicate the tool attests (SLSA provenance v1, CycloneDX). The first
manifest that lacks one is a UserError naming it: an unsigned image, or one signed with another
key, fails the check.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from typing import Any

from builder.errors import UserError
from builder.oci.client import RepositoryClient
from builder.oci.remote import read
from builder.oci.v1 import Index
from builder.sign.cosign import (
    CYCLONEDX_PREDICATE,
    DSSE_ENVELOPE,
    IN_TOTO,
    SIGNATURE_TYPE,
    SIMPLE_SIGNING,
    att_tag,
    existing_layers,
    layer_signature,
    pae,
    sig_tag,
)
from builder.sign.keys import PublicKey

SLSA_PREDICATE = "https://slsa.dev/provenance/v1"
ATTESTED = (SLSA_PREDICATE, CYCLONEDX_PREDICATE)


def check_signed(
    registry: RepositoryClient, key: PublicKey, predicates: Sequence[str] = ATTESTED
) -> list[str]:
    """One line per manifest whose signature (and attestations) `key` verifies; raises a
    UserError at the first that has none."""
    found = read(registry)
    lines = [_signed(registry, key, found.digest, "index" if isinstance(found, Index) else "")]
    images = found.manifests if isinstance(found, Index) else (found.descriptor(),)
    for image in images:
        arch = image.platform.architecture if image.platform else ""
        if isinstance(found, Index):
            lines.append(_signed(registry, key, image.digest, arch))
        kinds = _attested(registry, key, image.digest)
        missing = [predicate for predicate in predicates if predicate not in kinds]
        if missing:
            raise UserError(
                f"{registry.ref.name}@{image.digest}{_of(arch)}: no attestation of {missing[0]}"
                f" signed by {key.source}"
            )
        lines.append(f"attested: {image.digest}{_of(arch)} ({', '.join(sorted(kinds))})")
    return lines


def _of(arch: str) -> str:
    return f" ({arch})" if arch else ""


def _signed(registry: RepositoryClient, key: PublicKey, digest: str, what: str) -> str:
    for layer in existing_layers(registry, sig_tag(digest)):
        if layer["mediaType"] != SIMPLE_SIGNING or (signature := layer_signature(layer)) is None:
            continue
        payload = registry.small_blob(layer["digest"])
        if key.verifies(signature, payload) and _names(payload, digest):
            return f"signed: {digest}{_of(what)} by {key.source}"
    raise UserError(f"{registry.ref.name}@{digest}{_of(what)}: not signed by {key.source}")


def _names(payload: bytes, digest: str) -> bool:
    """The simple-signing payload is a cosign signature of exactly `digest`."""
    try:
        critical = json.loads(payload)["critical"]
        return bool(
            critical["type"] == SIGNATURE_TYPE
            and critical["image"]["docker-manifest-digest"] == digest
        )
    except (ValueError, KeyError, TypeError):
        return False


def _attested(registry: RepositoryClient, key: PublicKey, digest: str) -> set[str]:
    """The predicate types of the statements about `digest` that `key` signed."""
    kinds = set()
    for layer in existing_layers(registry, att_tag(digest)):
        if layer["mediaType"] != DSSE_ENVELOPE:
            continue
        statement = _verified_statement(registry.small_blob(layer["digest"]), key)
        if statement is not None and _about(statement, digest):
            kinds.add(str(statement.get("predicateType")))
    return kinds


def _verified_statement(envelope: bytes, key: PublicKey) -> dict[str, Any] | None:
    """The in-toto statement in a DSSE envelope, if one of its signatures is `key`'s."""
    try:
        document = json.loads(envelope)
        if document["payloadType"] != IN_TOTO:
            return None
        payload = base64.b64decode(document["payload"], validate=True)
        signatures = [base64.b64decode(s["sig"], validate=True) for s in document["signatures"]]
        statement = json.loads(payload)
    except (ValueError, KeyError, TypeError, binascii.Error):
        return None
    signed = any(key.verifies(s, pae(IN_TOTO, payload)) for s in signatures)
    return statement if signed and isinstance(statement, dict) else None


def _about(statement: dict[str, Any], digest: str) -> bool:
    """The statement names `digest` among its subjects."""
    subjects = statement.get("subject")
    wanted = digest.removeprefix("sha256:")
    return isinstance(subjects, list) and any(
        isinstance(s, dict) and isinstance(d := s.get("digest"), dict) and d.get("sha256") == wanted
        for s in subjects
    )
