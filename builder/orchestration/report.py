"""report.json's `image`: what one delivery made, verified and wrote, as frozen records,
turned into JSON in this one place (the schema: docs/report.md).

A producer hands over its own fields with each arch's image (the build path: the engine's
image id and local tag; the rebase path: the digests of the extras layers it reused) and, on
the build path, the facts of the extras tars. The delivery adds the verification and, once the
images are written, each arch's `ArchWritten`. Nothing here changes after it is made. The
layout, key order included, is the one report.json has always had (with one arch, that arch's
fields also at the top), so readers of earlier reports read these the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from builder.oci.remote import Written
from builder.publish.node_update import NodeUpdate
from builder.publish.publisher import ArchWritten
from builder.verify.report import VerifyReport

if TYPE_CHECKING:  # flatbuffers (builder.oci.ztoc) only when a push writes an index
    pass


@dataclass(frozen=True)
class ArchRecord:
    """One arch's image: the producer's fields, its extras layers, its verification, its write."""

    arch: str
    made: Mapping[str, object]  # the producer's own fields
    extras_layers: Sequence[Mapping[str, object]] | None  # the tars' facts (the build path)
    verification: VerifyReport | None
    written: ArchWritten | None
    seconds: Mapping[str, float] = field(default_factory=dict)  # phase -> wall seconds

    def layers(self) -> list[dict[str, object]] | None:
        """The extras layers' facts, with their blobs' digests and sizes once written."""
        if self.extras_layers is None:
            return None
        blobs = self.written.layer_blobs if self.written else ()
        if not blobs:
            return [dict(facts) for facts in self.extras_layers]
        return [
            {**facts, "digest": blob.digest, "size": blob.size}
            for facts, blob in zip(self.extras_layers, blobs, strict=True)
        ]

    def to_dict(self) -> dict[str, object]:
        record = dict(self.made)
        if written := self.written:
            if written.attachments is not None:
                record["attachments"] = list(written.attachments)
            record["digest"] = written.digest
            record["image_size"] = written.image_size
            record["node_update"] = written.node_update.to_dict()
            if written.soci is not None:
                record["soci"] = written.soci.to_dict()
        if self.verification is not None:
            record["verification"] = self.verification.to_dict()
        layers = self.layers()
        if layers is not None:
            record["extras_layers"] = layers
        if self.seconds:
            record["seconds"] = {phase: round(spent, 2) for phase, spent in self.seconds.items()}
        return record


@dataclass(frozen=True)
class ImageRecord:
    """report.json's `image`: the path taken, each arch, the merged verification, the push."""

    path: str  # "build" or "rebase"
    label: str | None  # how the images are named: a local tag, or the repository
    arches: tuple[ArchRecord, ...]
    verification: VerifyReport | None  # every arch's checks, merged
    pushed: Written | None  # with several arches: the index
    node_update: NodeUpdate | None  # every arch's node figures added up
    template: Path | None  # the template pointed at the pushed digest
    push_seconds: float | None = None  # the write's wall time, when pushed

    def to_dict(self) -> dict[str, object]:
        record: dict[str, object] = {"path": self.path, "tag": self.label}
        arches = {one.arch: one.to_dict() for one in self.arches}
        if len(self.arches) == 1:
            record |= arches[self.arches[0].arch] | {"arch": self.arches[0].arch}
        if self.verification is not None:
            record["verification"] = self.verification.to_dict()
        if pushed := self.pushed:
            record |= {"pushed": pushed.reference, "tags": list(pushed.tags)}
            if self.push_seconds is not None:
                record["push_seconds"] = round(self.push_seconds, 2)
            record["bytes_pushed"] = pushed.bytes_uploaded
            record["bytes_mounted"] = pushed.bytes_mounted
            record["bytes_present"] = pushed.bytes_present
            record["node_update"] = self.node_update.to_dict() if self.node_update else None
            record["image_size"] = sum(one.written.image_size for one in self.arches if one.written)
            if len(self.arches) > 1:
                record["index"] = pushed.digest
            if self.template:
                record["template"] = str(self.template)
        record["arches"] = arches
        return record

    def pushed_layers(self) -> dict[str, list[dict[str, object]]]:
        """Each written arch's extras layers with their blobs: they replace the render's."""
        return {
            one.arch: layers
            for one in self.arches
            if one.extras_layers and one.written and (layers := one.layers()) is not None
        }
