"""The content-addressed cache and downloads into it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from builder.cache import Cache
from builder.errors import UserError
from builder.resolve.index import download
from builder.resolve.resolution import RemoteFile, redact


def test_download_checks_the_hash_and_keeps_nothing_on_mismatch(tmp_path: Path) -> None:
    source = tmp_path / "pkg-1.0-py3-none-any.whl"
    source.write_bytes(b"wheel bytes" * 100_000)
    good = hashlib.sha256(source.read_bytes()).hexdigest()
    cache = Cache(tmp_path / "cache")
    bad = RemoteFile(source.name, source.as_uri(), "f" * 64)
    with pytest.raises(UserError, match=r"pkg-1.0-py3-none-any.whl: sha256 .* does not match"):
        download(bad, cache)
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    path = download(RemoteFile(source.name, source.as_uri(), good), cache)
    assert path.read_bytes() == source.read_bytes()
    assert path.stat().st_mode & 0o777 == 0o644
    source.unlink()  # a cached blob is never fetched again
    assert download(RemoteFile(source.name, source.as_uri(), good), cache) == path


def test_download_failure_names_the_file_without_credentials(tmp_path: Path) -> None:
    missing = RemoteFile("x-1-py3-none-any.whl", "http://user:s3cret@127.0.0.1:9/x.whl", "0" * 64)
    with pytest.raises(UserError) as caught:
        download(missing, Cache(tmp_path))
    assert "x-1-py3-none-any.whl" in str(caught.value)
    assert "s3cret" not in str(caught.value)


def test_redact_removes_credentials() -> None:
    assert redact("https://u:p@host/simple/") == "https://host/simple/"
    assert redact("https://host/simple/") == "https://host/simple/"


def test_records(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    assert cache.get_record("inspect", "ab" * 32) is None
    cache.put_record("inspect", "ab" * 32, {"a": [1, 2]})
    assert cache.get_record("inspect", "ab" * 32) == {"a": [1, 2]}


def test_a_record_that_says_the_same_is_not_written_again(tmp_path: Path) -> None:
    """A rerun that changed nothing writes no record: the file stays the one written first."""
    cache = Cache(tmp_path)
    cache.put_record("inspect", "cd" * 32, {"b": 1, "a": 2})
    path = next((tmp_path / "inspect").rglob("*.json"))
    first = path.stat().st_ino
    cache.put_record("inspect", "cd" * 32, {"a": 2, "b": 1})  # the same, keys in another order
    assert path.stat().st_ino == first
    cache.put_record("inspect", "cd" * 32, {"a": 3})
    assert path.stat().st_ino != first
    assert cache.get_record("inspect", "cd" * 32) == {"a": 3}
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no partial file left
