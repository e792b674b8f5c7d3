"""The cache's paths come from index listings (file names, hashes): none may leave the cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.cache import Cache
from builder.errors import UserError
from builder.resolve.index import download
from builder.resolve.resolution import RemoteFile

SHA = "ab" * 32


@pytest.mark.parametrize("name", ["../../evil-1.0.tar.gz", "sub/x-1.0-py3-none-any.whl", "..", ""])
def test_a_listed_file_name_that_names_a_path_is_refused(tmp_path: Path, name: str) -> None:
    source = tmp_path / "source.whl"
    source.write_bytes(b"x")
    listed = RemoteFile(name, source.as_uri(), SHA)
    with pytest.raises(UserError, match="not a plain file name"):
        download(listed, Cache(tmp_path / "cache"))
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p != source]
    assert written == []


@pytest.mark.parametrize("sha", ["../../../../tmp", "AB" * 32, "ab" * 31, ""])
def test_a_listed_hash_that_is_not_a_sha256_is_refused(tmp_path: Path, sha: str) -> None:
    with pytest.raises(UserError, match="is not a sha256 hex digest"):
        Cache(tmp_path / "cache").blob_path(sha, "x-1.0-py3-none-any.whl")


def test_a_plain_name_and_hash_stay_under_the_cache(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "cache")
    assert cache.blob_path(SHA, "x-1.0-py3-none-any.whl").is_relative_to(cache.root / "blobs")
