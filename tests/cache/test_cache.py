"""The content-addressed cache and downloads into it."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

import builder.cache as cache_module
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


def _layer_blob(cache: Cache) -> tuple[Path, str]:
    data = b"a layer tar" * 1000
    digest = hashlib.sha256(data).hexdigest()
    with cache.writing_blob(digest, "layer.tar") as out:
        out.write(data)
    return cache.blob_path(digest, "layer.tar"), digest


def _edit(path: Path) -> None:
    with path.open("r+b") as edit:  # written over in place: the same inode, the same size
        edit.seek(100)
        edit.write(b"EDITED")


def test_a_checked_blob_that_no_longer_hashes_to_its_digest_is_removed_with_a_warning(
    tmp_path: Path,
) -> None:
    """An entry edited in place is a miss, made again; said once, as a warning."""
    said: list[str] = []
    cache = Cache(tmp_path / "cache", warn=said.append)
    path, digest = _layer_blob(cache)
    assert cache.checked_blob(digest, "layer.tar") == path and said == []
    _edit(path)
    assert cache.find_blob(digest, "layer.tar") == path  # found, as before: not checked
    assert cache.checked_blob(digest, "layer.tar") is None
    assert said == [f"cache: {path} no longer hashes to {digest[:12]}; removed, made again"]
    assert not path.exists()
    assert cache.checked_blob("0" * 64, "layer.tar") is None and len(said) == 1  # a plain miss


def test_an_entry_edited_through_a_link_since_removed_is_found_out(tmp_path: Path) -> None:
    """An older tool's context held a hard link: edited, then deleted, it leaves the entry
    unshared again, with the same inode and size, but not the same change time."""
    said: list[str] = []
    path, digest = _layer_blob(Cache(tmp_path / "cache"))
    assert Cache(tmp_path / "cache").checked_blob(digest, "layer.tar") == path
    old_context = tmp_path / "deps-extra-amd64-01.tar"
    os.link(path, old_context)
    _edit(old_context)
    old_context.unlink()
    assert path.stat().st_nlink == 1
    assert Cache(tmp_path / "cache", warn=said.append).checked_blob(digest, "layer.tar") is None
    assert len(said) == 1 and not path.exists()


def test_an_unchanged_entry_is_hashed_once_not_at_every_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, digest = _layer_blob(Cache(tmp_path / "cache"))
    hashed: list[Path] = []
    real = cache_module.sha256_of
    monkeypatch.setattr(cache_module, "sha256_of", lambda p: hashed.append(p) or real(p))
    for _ in range(3):  # three runs, each its own Cache, and again in the last
        assert Cache(tmp_path / "cache").checked_blob(digest, "layer.tar") == path
    cache = Cache(tmp_path / "cache")
    assert cache.checked_blob(digest, "layer.tar") == cache.checked_blob(digest, "layer.tar")
    assert hashed == [path]
