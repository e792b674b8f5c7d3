"""The build facts document and what of it a run may reuse (builder.publish.build_facts)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from builder.inspect.wheels import SCHEMA, WheelInspection
from builder.publish.build_facts import (
    Formats,
    LaidOut,
    facts_of,
    parse_facts,
    reusable,
)

FORMATS = Formats(SCHEMA, "deps-extra-layer/4", "/app/deps-extra")
A, B, C = ("a" * 64, "b" * 64, "c" * 64)


def inspection(sha: str, name: str) -> WheelInspection:
    return WheelInspection(
        filename=f"{name}-1.0-py3-none-any.whl",
        sha256=sha,
        name=name,
        version="1.0",
        tags=("py3-none-any",),
        top_level=(name,),
        elf_files=(),
    )


def layer(*wheels: str, diff: str) -> LaidOut:
    return LaidOut(wheels, (), f"sha256:{diff * 64}", 10240, 315532800)


FACTS = facts_of(
    FORMATS,
    [inspection(A, "alpha"), inspection(B, "beta")],
    [layer(A, diff="1"), layer(B, diff="2"), layer(A, diff="1")],
)
HELD = (f"sha256:{'0' * 64}", f"sha256:{'1' * 64}", f"sha256:{'2' * 64}")
LOCK = {A: "alpha-1.0-py3-none-any.whl", B: "beta-1.0-py3-none-any.whl", C: "gamma.whl"}


def test_the_document_reads_back_as_written_and_is_canonical() -> None:
    document = FACTS.document()
    assert parse_facts(document) == FACTS
    assert parse_facts(document).document() == document
    assert len(FACTS.layers) == 2  # a layer named twice (by two arches) once


def test_the_lock_s_wheels_are_reused_and_no_others() -> None:
    found = reusable(FACTS, FORMATS, LOCK, HELD)
    assert found.distributions == {A, B}
    assert set(found.inspections) == {A, B}
    assert found.inspections[A] == inspection(A, "alpha")
    only_b = reusable(FACTS, FORMATS, {B: LOCK[B], C: LOCK[C]}, HELD)
    assert only_b.distributions == {B}
    assert [one.wheels for one in only_b.layers] == [(B,)]


def test_a_record_of_another_file_name_or_schema_is_not_reused() -> None:
    renamed = reusable(FACTS, FORMATS, {**LOCK, A: "alpha-1.0-cp313-none-any.whl"}, HELD)
    assert set(renamed.inspections) == {B}
    assert renamed.distributions == {B}
    newer = reusable(FACTS, replace(FORMATS, inspection=SCHEMA + 1), LOCK, HELD)
    assert not newer.inspections and not newer.distributions
    assert len(newer.layers) == 2  # the layers' format is theirs


def test_a_record_that_lies_about_its_wheel_is_not_reused() -> None:
    lying = dict(FACTS.inspections)
    lying[A] = {**lying[A], "sha256": B}
    found = reusable(replace(FACTS, inspections=lying), FORMATS, LOCK, HELD)
    assert set(found.inspections) == {B}
    broken = dict(FACTS.inspections)
    broken[B] = {**broken[B], "elf_files": "not a list"}  # type: ignore[typeddict-item]
    assert set(reusable(replace(FACTS, inspections=broken), FORMATS, LOCK, HELD).inspections) == {A}


def test_layers_of_another_format_or_root_are_not_reused() -> None:
    for other in (replace(FORMATS, layer="deps-extra-layer/5"), replace(FORMATS, root="/opt")):
        found = reusable(FACTS, other, LOCK, HELD)
        assert not found.layers and not found.distributions
        assert set(found.inspections) == {A, B}


def test_a_layer_holding_a_wheel_the_lock_lacks_is_not_reused() -> None:
    facts = facts_of(FORMATS, [inspection(A, "alpha")], [layer(A, C, diff="1")])
    found = reusable(facts, FORMATS, {A: LOCK[A]}, HELD)
    assert not found.layers and not found.distributions


def test_another_arch_s_layer_the_images_read_lack_is_ignored() -> None:
    """A multi-arch REF: its facts name the arm64 image's layer of an arm64 wheel (D), which
    an amd64 run neither locks nor read the image of: no warning, the rest is reused."""
    d = "d" * 64
    facts = facts_of(
        FORMATS,
        [inspection(A, "alpha"), inspection(d, "delta")],
        [layer(A, diff="1"), layer(d, diff="9"), layer(A, d, diff="8")],
    )
    found = reusable(facts, FORMATS, {A: LOCK[A]}, HELD)
    assert found.layers == (layer(A, diff="1"),)
    assert found.distributions == {A}


def test_a_document_naming_a_layer_the_image_lacks_is_refused_whole() -> None:
    with pytest.raises(ValueError, match="does not hold"):
        reusable(FACTS, FORMATS, LOCK, HELD[:2])


@pytest.mark.parametrize(
    "document",
    [b"[]", b'{"format": "build-facts/0"}', b'{"format": "build-facts/2", "formats": {}}'],
)
def test_a_document_of_another_shape_is_a_value_error(document: bytes) -> None:
    with pytest.raises(ValueError):
        parse_facts(document)


def test_the_document_is_json_with_sorted_keys() -> None:
    document = json.loads(FACTS.document())
    assert list(document) == sorted(document)
    assert document["formats"] == {
        "inspection": SCHEMA,
        "layer": "deps-extra-layer/4",
        "root": "/app/deps-extra",
    }
    assert "bytecode" not in document  # never: a .pyc cannot be checked against its source


@pytest.mark.parametrize(
    "document",
    [
        b"[" * 100000 + b"]" * 100000,  # deeper than the parser recurses
        b'{"format": "build-facts/2", "formats": {"inspection": 1e400, "layer": "", "root": ""}}',
        b'{"format": "build-facts/2", "formats": {"inspection": true, "layer": "", "root": ""}}',
    ],
)
def test_a_crafted_document_is_a_value_error_never_a_crash(document: bytes) -> None:
    with pytest.raises(ValueError):
        parse_facts(document)


def test_a_crafted_record_or_layer_is_a_value_error() -> None:
    good = json.loads(FACTS.document())
    assert parse_facts(json.dumps(good).encode()) == FACTS
    forged: list[dict[str, object]] = []
    for key, value in (
        ("wheels", {A: ["a", "list"]}),  # a record that is a list
        ("wheels", {"A" * 64: good["wheels"][A]}),  # not a sha256
        ("layers", [{**good["layers"][0], "size": -1}]),
        ("layers", [{**good["layers"][0], "size": 1e400}]),
        ("layers", [{**good["layers"][0], "wheels": [[A]]}]),
        ("layers", [{**good["layers"][0], "diff_id": "sha256:../x"}]),
        ("layers", {"not": "a list"}),
    ):
        forged.append({**good, key: value})
    for document in forged:
        with pytest.raises(ValueError):
            parse_facts(json.dumps(document).encode())


def test_a_record_whose_fields_are_of_another_type_is_not_used() -> None:
    record = dict(FACTS.inspections[A])
    for key, value in (("name", ["alpha"]), ("top_level", [1]), ("newest", 1.5), ("size", -3)):
        lying = {**FACTS.inspections, A: {**record, key: value}}
        found = reusable(replace(FACTS, inspections=lying), FORMATS, LOCK, HELD)  # type: ignore[arg-type]
        assert A not in found.inspections, key
    assert A in reusable(FACTS, FORMATS, LOCK, HELD).inspections


def test_a_record_not_of_its_file_name_is_refused_with_a_reason() -> None:
    """What a cold inspection reads of the file name first (name, version, tags) must agree."""
    for key, value in (("name", "other"), ("version", "2.0"), ("tags", ["cp313-none-any"])):
        lying = {**FACTS.inspections, A: {**FACTS.inspections[A], key: value}}
        found = reusable(replace(FACTS, inspections=lying), FORMATS, LOCK, HELD)  # type: ignore[arg-type]
        assert A not in found.inspections and A not in found.distributions, key
        assert found.refused and LOCK[A] in found.refused[0]
    assert not reusable(FACTS, FORMATS, LOCK, HELD).refused
