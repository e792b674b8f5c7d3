"""report.json's `image` from the delivery's frozen records: the same fields, in the same
order, as the delivery wrote when it built the record as a dict it changed step by step."""

from __future__ import annotations

from pathlib import Path

from builder.oci.remote import Written
from builder.oci.v1 import Descriptor
from builder.orchestration.report import ArchRecord, ArchWritten, ImageRecord
from builder.publish.node_update import NodeUpdate
from builder.verify.report import Check, VerifyReport

LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
UPDATE = NodeUpdate("sha256:" + "0" * 64, 10, 1, 20, 2)
TOTAL = NodeUpdate(None, 10, 1, 20, 2)
FACTS = ({"kind": "distribution", "distributions": ["a"], "diff_id": "sha256:d", "tar_size": 5},)


def verification(name: str) -> VerifyReport:
    return VerifyReport(name, [Check("smoke", True, "ok")])


def built(arch: str, written: ArchWritten | None) -> ArchRecord:
    made = {"id": f"sha256:{arch}", "tag": f"app:{arch}"}
    return ArchRecord(arch, made, FACTS, verification(arch), written)


def test_one_pushed_arch_is_also_at_the_top_in_the_old_order() -> None:
    written = ArchWritten("sha256:m", 99, UPDATE, (Descriptor(LAYER, "sha256:b", 3),), ("s.json",))
    push = Written("reg/app", "sha256:m", ("reg/app:1",), 7, 2, 1)
    record = ImageRecord(
        "build", "reg/app", (built("amd64", written),), verification("all"), push, TOTAL, Path("t")
    ).to_dict()
    assert list(record) == [
        *("path", "tag", "id", "attachments", "digest", "image_size", "node_update"),
        *("verification", "extras_layers", "arch", "pushed", "tags", "bytes_pushed"),
        *("bytes_mounted", "bytes_present", "template", "arches"),
    ]
    layers = [FACTS[0] | {"digest": "sha256:b", "size": 3}]
    assert record["tag"] == "app:amd64"  # the arch's local tag over the label, as before
    assert record["verification"] == verification("all").to_dict()
    assert record["extras_layers"] == layers
    assert record["node_update"] == TOTAL.to_dict() and record["image_size"] == 99
    assert record["arches"] == {
        "amd64": {
            "id": "sha256:amd64",
            "tag": "app:amd64",
            "attachments": ["s.json"],
            "digest": "sha256:m",
            "image_size": 99,
            "node_update": UPDATE.to_dict(),
            "verification": verification("amd64").to_dict(),
            "extras_layers": layers,
        }
    }


def test_a_rebase_keeps_its_reused_layers_first_and_two_arches_name_the_index() -> None:
    def rebased(arch: str) -> ArchRecord:
        written = ArchWritten(f"sha256:{arch}", 5, UPDATE)
        return ArchRecord(arch, {"extras_layers": ["sha256:x"]}, None, None, written)

    push = Written("reg/app", "sha256:i", ("reg/app:1",), 7)
    record = ImageRecord(
        "rebase", "reg/app", (rebased("amd64"), rebased("arm64")), None, push, TOTAL, None
    )
    as_dict = record.to_dict()
    arm64 = as_dict["arches"]["arm64"]  # type: ignore[index]
    assert list(arm64) == ["extras_layers", "digest", "image_size", "node_update"]
    assert as_dict["index"] == "sha256:i" and as_dict["image_size"] == 10
    assert "template" not in as_dict and record.pushed_layers() == {}


def test_an_unpushed_build_keeps_the_tars_facts() -> None:
    record = ImageRecord("build", "app", (built("amd64", None),), None, None, None, None)
    as_dict = record.to_dict()
    assert as_dict["extras_layers"] == list(FACTS) and "digest" not in as_dict
    assert record.pushed_layers() == {}


def test_where_the_time_went_is_recorded_per_arch_and_for_the_push() -> None:
    seconds = {"build": 12.3456, "load": 2.0, "facts": 0.5, "verify": 10.987}
    made = ArchRecord("amd64", {"id": "sha256:a"}, None, verification("amd64"), None, seconds)
    push = Written("reg/app", "sha256:m", ("reg/app:1",), 7, 2, 1)
    record = ImageRecord("build", "reg/app", (made,), None, push, TOTAL, None, 3.14159).to_dict()
    assert record["seconds"] == {"build": 12.35, "load": 2.0, "facts": 0.5, "verify": 10.99}
    assert record["arches"]["amd64"]["seconds"] == record["seconds"]
    assert record["push_seconds"] == 3.14
    unpushed = ImageRecord("build", "app", (built("amd64", None),), None, None, None, None)
    assert "push_seconds" not in unpushed.to_dict() and "seconds" not in unpushed.to_dict()
