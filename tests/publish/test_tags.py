"""What is published is named: the tag of a platform version and an extras set."""

from __future__ import annotations

import re

import pytest

from builder.errors import UserError
from builder.publish.tags import extras_hash, image_tag

# --- naming -------------------------------------------------------------------------------------


def test_extras_hash_is_short_stable_and_order_independent() -> None:
    locks = ["requests==2.32.3 --hash=sha256:aa\n", "libgomp1\n"]
    value = extras_hash(locks)
    assert re.fullmatch(r"[0-9a-f]{12}", value)
    assert extras_hash(reversed(locks)) == value
    assert extras_hash(["requests==2.32.4 --hash=sha256:bb\n", "libgomp1\n"]) != value
    assert extras_hash(["ab", "c"]) != extras_hash(["a", "bc"])


def test_two_extension_sets_get_different_tags() -> None:
    one = image_tag("1.4.0", extras_hash(["bs4==4.12.3"]))
    two = image_tag("1.4.0", extras_hash(["lightgbm==4.5.0", "libgomp1"]))
    assert one != two
    for tag in (one, two):
        assert re.fullmatch(r"1\.4\.0-x[0-9a-f]{12}", tag)


@pytest.mark.parametrize(
    ("version", "tag_start"),
    [
        ("3.13-slim-trixie", "3.13-slim-trixie-x"),
        ("1.2.3+build/7", "1.2.3-build-7-x"),
        ("..v2", "v2-x"),
    ],
)
def test_platform_version_is_made_tag_safe(version: str, tag_start: str) -> None:
    tag = image_tag(version, "0123456789abcdef")
    assert tag == f"{tag_start}0123456789ab"
    assert re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", tag)


def test_long_platform_version_keeps_the_hash() -> None:
    tag = image_tag("v" * 300, "0123456789ab")
    assert len(tag) == 128 and tag.endswith("-x0123456789ab")


def test_unusable_platform_version_is_refused() -> None:
    with pytest.raises(UserError, match="platform version"):
        image_tag("...", "0123456789ab")
