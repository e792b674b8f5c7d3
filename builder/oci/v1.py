"""OCI values: media types, canonical JSON, digests, platforms, descriptors, images, indexes.

An `Image` or `Index` holds the exact manifest bytes it is known by (read from a registry, or
serialized here canonically), so its digest is always the digest of those bytes; the parsed
fields are views of them. Documents of the wrong shape are a `ValueError` naming the field:
the remote reader turns that into a RegistryError naming the image. One platform rule lives
here (`Platform.accepts`): amd64 is the plain image or an x86-64 level v1-v4 (plain or v1
preferred), arm64 is v8 (a missing variant counts as v8); `Index.pick` is the one function
that chooses a platform's entry out of an index.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any, NotRequired, TypedDict

from builder.digest import Sha256

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
DOCKER_INDEX = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"
INDEX_TYPES = frozenset({OCI_INDEX, DOCKER_INDEX})
MANIFEST_TYPES = (OCI_INDEX, DOCKER_INDEX, OCI_MANIFEST, DOCKER_MANIFEST)  # Accept, in order
GZIP_LAYERS = frozenset({DOCKER_LAYER, OCI_LAYER})
OCI_EMPTY = "application/vnd.oci.empty.v1+json"  # an artifact's config: the 2-byte `{}` blob
EMPTY_CONFIG = b"{}"

# uname -m (and wheel platform suffixes) -> the OCI architecture name
MACHINES = MappingProxyType({"x86_64": "amd64", "aarch64": "arm64"})
# the variants a platform's image may carry, best first; "" is "no variant given"
VARIANTS = MappingProxyType({"amd64": ("", "v1", "v2", "v3", "v4"), "arm64": ("v8", "")})
DEFAULT_VARIANT = MappingProxyType({"arm64": "v8"})  # what `docker manifest` and Hub write


class DescriptorRecord(TypedDict):
    """A descriptor as the tool writes it (the OCI image spec's field names)."""

    mediaType: str
    digest: str
    size: int
    platform: NotRequired[dict[str, str]]
    artifactType: NotRequired[str]  # an attached artifact's (a referrer's) type
    annotations: NotRequired[dict[str, str]]


class ManifestDocument(TypedDict):
    """An image manifest as the tool writes it: an image's, or an artifact's (with a subject)."""

    schemaVersion: int
    mediaType: str
    artifactType: NotRequired[str]
    config: DescriptorRecord
    layers: list[DescriptorRecord]
    subject: NotRequired[DescriptorRecord]
    annotations: NotRequired[dict[str, str]]


class IndexDocument(TypedDict):
    """An index (manifest list) as the tool writes it."""

    schemaVersion: int
    mediaType: str
    manifests: list[DescriptorRecord]
    annotations: NotRequired[dict[str, str]]


def canonical(document: Mapping[str, Any]) -> bytes:
    """The one serialization of manifests, indexes and configs the tool writes.

    Sorted keys, no whitespace: the same content always has the same digest.
    """
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def digest_of(data: bytes) -> str:
    """The OCI digest of a document (a manifest, an index, a config) held in memory."""
    return Sha256.of(data).digest


@dataclass(frozen=True)
class Platform:
    """os/architecture[/variant], as an index entry names an image."""

    architecture: str
    os: str = "linux"
    variant: str = ""

    @classmethod
    def linux(cls, architecture: str) -> Platform:
        """The platform an image of `architecture` is published as (arm64 with its v8)."""
        return cls(architecture, "linux", DEFAULT_VARIANT.get(architecture, ""))

    @classmethod
    def of_machine(cls, machine: str) -> Platform | None:
        """The platform of a `uname -m` name (x86_64, aarch64); None for any other."""
        arch = MACHINES.get(machine)
        return cls.linux(arch) if arch else None

    def accepts(self, other: Platform) -> bool:
        """Does an image published as `other` run where this platform is asked for?"""
        allowed = VARIANTS.get(self.architecture, ("",))
        return (other.os, other.architecture) == (
            self.os,
            self.architecture,
        ) and other.variant in allowed

    def preference(self, other: Platform) -> int:
        """Lower is better among the accepted: the plain (or v1) image first."""
        rank = VARIANTS.get(self.architecture, ("",)).index(other.variant)
        return 0 if other.variant in ("", "v1") else rank

    def to_dict(self) -> dict[str, str]:
        found = {"architecture": self.architecture, "os": self.os}
        return found | ({"variant": self.variant} if self.variant else {})

    @classmethod
    def from_dict(cls, document: Any) -> Platform:
        if not isinstance(document, Mapping):
            raise ValueError(f"platform {str(document)[:80]} is not an object")
        fields = [document.get(key) or "" for key in ("architecture", "os", "variant")]
        if not all(isinstance(value, str) for value in fields):
            raise ValueError(f"platform {str(document)[:80]} is not made of strings")
        return cls(*fields)

    def __str__(self) -> str:
        return "/".join(part for part in (self.os, self.architecture, self.variant) if part)


@dataclass(frozen=True)
class Descriptor:
    """What a manifest says of a blob or of another manifest: type, digest, size, platform."""

    media_type: str
    digest: str
    size: int
    platform: Platform | None = None

    def to_dict(self) -> DescriptorRecord:
        found = DescriptorRecord(mediaType=self.media_type, digest=self.digest, size=self.size)
        if self.platform:
            found["platform"] = self.platform.to_dict()
        return found

    @classmethod
    def from_dict(cls, document: Any) -> Descriptor:
        if not isinstance(document, Mapping):
            raise ValueError(f"descriptor {str(document)[:80]} is not an object")
        media_type, digest, size = (document.get(k) for k in ("mediaType", "digest", "size"))
        if not isinstance(digest, str) or not digest.startswith("sha256:"):
            raise ValueError(f"descriptor {str(document)[:80]} has no sha256 digest")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ValueError(f"descriptor {str(document)[:80]} has no size")
        platform = document.get("platform")
        return cls(
            media_type if isinstance(media_type, str) else "",
            digest,
            size,
            Platform.from_dict(platform) if platform is not None else None,
        )


@dataclass(frozen=True)
class History:
    """One entry of an image config's history: the step that made a layer (or an empty one)."""

    created_by: str
    empty_layer: bool


@dataclass(frozen=True)
class ConfigFile:
    """The fields of an image config the tool reads, typed (go-containerregistry's
    `ConfigFile`). The document itself stays as read (`Image.config`), so that writing it back
    keeps every field the tool does not know; `mutate` makes new documents."""

    env: tuple[str, ...]  # `KEY=value` entries, in order
    user: str
    labels: Mapping[str, str]
    history: tuple[History, ...]
    diff_ids: tuple[str, ...]
    architecture: str
    created: str  # RFC 3339; empty when the config has no date

    @classmethod
    def parse(cls, body: bytes) -> ConfigFile:
        """The config these bytes are; ValueError naming the field when one has the wrong shape."""
        return cls.of(json_object(body, "image config"))

    @classmethod
    def of(cls, document: Mapping[str, Any]) -> ConfigFile:
        """The fields of this config document; ValueError naming one of the wrong shape."""
        rootfs = document.get("rootfs", {"diff_ids": []})  # a probe needs none; a rebase checks
        diff_ids = rootfs.get("diff_ids") if isinstance(rootfs, Mapping) else None
        if not isinstance(diff_ids, list) or not all(isinstance(d, str) for d in diff_ids):
            raise ValueError("rootfs.diff_ids is not a list of digests")
        history = document.get("history") or []
        if not all(isinstance(h, Mapping) for h in history):
            raise ValueError("history is not a list of objects")
        settings = document.get("config") or {}
        return cls(
            env=tuple(settings.get("Env") or ()),
            user=str(settings.get("User") or ""),
            labels=MappingProxyType(dict(settings.get("Labels") or {})),
            history=tuple(
                History(str(h.get("created_by", "")), bool(h.get("empty_layer"))) for h in history
            ),
            diff_ids=tuple(diff_ids),
            architecture=str(document.get("architecture") or ""),
            created=str(document.get("created") or ""),
        )

    @property
    def environment(self) -> dict[str, str]:
        return dict(entry.partition("=")[::2] for entry in self.env)


@dataclass(frozen=True)
class Image:
    """A single-platform image: its manifest bytes and config bytes, and their parsed fields."""

    manifest_bytes: bytes = field(repr=False)
    config_bytes: bytes = field(repr=False)
    media_type: str
    config_descriptor: Descriptor
    layers: tuple[Descriptor, ...]
    config: Mapping[str, Any] = field(repr=False)  # the document; typed: `config_file`
    annotations: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        config_bytes: bytes,
        layers: Iterable[Descriptor],
        *,
        docker: bool = True,
        annotations: Mapping[str, str] | None = None,
    ) -> Image:
        """An image of these layers under this config, its manifest serialized canonically.

        A layer keeps its media type; one without gets the manifest's gzip layer type.
        Docker-typed (what the engine and `docker manifest` write) or OCI-typed, which alone
        carries `annotations`.
        """
        layer_type = DOCKER_LAYER if docker else OCI_LAYER
        typed = tuple(
            Descriptor(layer.media_type or layer_type, layer.digest, layer.size) for layer in layers
        )
        config = Descriptor(
            DOCKER_CONFIG if docker else OCI_CONFIG, digest_of(config_bytes), len(config_bytes)
        )
        media_type = DOCKER_MANIFEST if docker else OCI_MANIFEST
        manifest = ManifestDocument(
            schemaVersion=2,
            mediaType=media_type,
            config=config.to_dict(),
            layers=[layer.to_dict() for layer in typed],
        )
        kept = dict(sorted(annotations.items())) if annotations and not docker else {}
        if kept:
            manifest["annotations"] = kept
        return cls(
            canonical(manifest),
            config_bytes,
            media_type,
            config,
            typed,
            json_object(config_bytes, "image config"),
            MappingProxyType(kept),
        )

    @classmethod
    def parse(cls, manifest_bytes: bytes, config_bytes: bytes) -> Image:
        """The image these bytes are; ValueError naming the field when one has the wrong shape."""
        manifest = json_object(manifest_bytes, "manifest")
        if "manifests" in manifest:
            raise ValueError("an index where an image manifest was expected")
        document = json_object(config_bytes, "image config")
        descriptor = Descriptor.from_dict(manifest.get("config"))
        if descriptor.digest != digest_of(config_bytes):
            raise ValueError("the config is not the one the manifest names")
        layers = manifest.get("layers")
        if not isinstance(layers, list):
            raise ValueError("layers is not a list")
        ConfigFile.of(document)  # a field of the wrong shape is a ValueError
        annotations = manifest.get("annotations") or {}
        return cls(
            manifest_bytes,
            config_bytes,
            str(manifest.get("mediaType") or DOCKER_MANIFEST),
            descriptor,
            tuple(Descriptor.from_dict(layer) for layer in layers),
            document,
            MappingProxyType(dict(annotations)) if isinstance(annotations, dict) else {},
        )

    @property
    def digest(self) -> str:
        return digest_of(self.manifest_bytes)

    @property
    def is_docker(self) -> bool:
        return self.media_type == DOCKER_MANIFEST

    @cached_property
    def config_file(self) -> ConfigFile:
        """The config's fields the tool reads, typed."""
        return ConfigFile.of(self.config)

    @property
    def diff_ids(self) -> tuple[str, ...]:
        return self.config_file.diff_ids

    @property
    def architecture(self) -> str:
        return self.config_file.architecture

    @property
    def size(self) -> int:
        """Config plus every layer, compressed: what a pull transfers at most."""
        return len(self.config_bytes) + sum(layer.size for layer in self.layers)

    def descriptor(self, platform: Platform | None = None) -> Descriptor:
        return Descriptor(self.media_type, self.digest, len(self.manifest_bytes), platform)


@dataclass(frozen=True)
class Index:
    """Several platforms' manifests under one digest (an OCI index or Docker manifest list)."""

    manifest_bytes: bytes = field(repr=False)
    media_type: str
    manifests: tuple[Descriptor, ...]

    @classmethod
    def build(
        cls,
        images: Iterable[tuple[Platform, Image]],
        annotations: Mapping[str, str] | None = None,
    ) -> Index:
        """A Docker manifest list naming each image with its platform.

        `annotations` (the images' OCI labels) are the OCI index field; registries keep the
        bytes as sent, and tools that read OCI indexes (crane, a registry UI) see them.
        """
        document = IndexDocument(
            schemaVersion=2,
            mediaType=DOCKER_INDEX,
            manifests=[image.descriptor(platform).to_dict() for platform, image in images],
        )
        if annotations:
            document["annotations"] = dict(sorted(annotations.items()))
        return cls.parse(canonical(document))

    @classmethod
    def parse(cls, manifest_bytes: bytes) -> Index:
        document = json_object(manifest_bytes, "index")
        entries = document.get("manifests")
        if not isinstance(entries, list):
            raise ValueError("manifests is not a list")
        return cls(
            manifest_bytes,
            str(document.get("mediaType") or OCI_INDEX),
            tuple(Descriptor.from_dict(entry) for entry in entries),
        )

    @property
    def digest(self) -> str:
        return digest_of(self.manifest_bytes)

    def pick(self, platform: Platform) -> Descriptor | None:
        """The entry for `platform`, by the one variant rule; None when the index has none.

        Of the accepted entries the plain (or v1) one wins, then the lowest level, then the
        first listed: the image a baseline CPU of the arch can run.
        """
        accepted = [
            (platform.preference(entry.platform), position, entry)
            for position, entry in enumerate(self.manifests)
            if entry.platform is not None and platform.accepts(entry.platform)
        ]
        return min(accepted, key=lambda found: found[:2])[2] if accepted else None


def artifact_config(diff_ids: Iterable[str], created: str) -> bytes:
    """The config of an image that only carries documents as layers (cosign's signature and
    attestation images): no platform, no settings, one history entry and one diff ID a layer,
    as they are (the layers are not compressed). Canonical JSON, so equal inputs give equal
    bytes."""
    ids = list(diff_ids)
    return canonical(
        {
            "architecture": "",
            "config": {},
            "created": created,
            "history": [{"created": created} for _ in ids],
            "os": "",
            "rootfs": {"type": "layers", "diff_ids": ids},
        }
    )


def is_index(manifest_bytes: bytes) -> bool:
    """Is this manifest an index (by its media type, or a `manifests` list)?"""
    document = json_object(manifest_bytes, "manifest")
    return document.get("mediaType") in INDEX_TYPES or "manifests" in document


def json_object(body: bytes, what: str) -> dict[str, Any]:
    """The JSON object `body` holds; ValueError naming `what` for anything else. The one reading
    of a document that must be an object (a manifest, an index, a config, a saved config): each
    caller turns the ValueError into its own error where it knows what the document was."""
    try:
        document = json.loads(body)
    except ValueError:
        document = None
    if not isinstance(document, dict):
        raise ValueError(f"{what} is not a JSON object")
    return document
