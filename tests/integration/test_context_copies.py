"""A build context shares nothing with the cache that an edit could reach (issue 59).

The context's layer tars used to be hard links into the cache: a user who edited one in place
edited the cache entry, and the next unrelated plan carried the edit under the old diff ID. Now
they are copies, and a cache entry that no longer hashes to its digest (edited through a link
an older context still holds) is dropped with a warning and written again. Plans of a small
local wheel set, offline (`--no-index -f`), with no engine (`--no-build`).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from support.wheelfactory import make_wheel

SKIPPED = {"report.json"}  # holds the run's timeline; its layers are compared on their own


def _house(root: Path) -> Path:
    house = root / "house"
    make_wheel(house, "bsi-one", "1.0", "py3-none-any", {"bsi_one/__init__.py": b"V = 1\n" * 500})
    make_wheel(house, "bsi-two", "2.0", "py3-none-any", {"bsi_two/__init__.py": b"W = 2\n"})
    (root / "requirements.txt").write_text("bsi-one\nbsi-two\n")
    return house


def _plan(root: Path, output: str, cache: str = "cache") -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "builder", "-r", "requirements.txt", "--no-index", "-f", "house",
         "--output", output, "--cache-dir", cache, "--no-build"],
        capture_output=True, text=True, cwd=root, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    return result


def _files(context: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in context.iterdir() if p.name not in SKIPPED}


def _tars(context: Path) -> list[Path]:
    return sorted(context.glob("deps-extra-*.tar"))


def _diff_ids(context: Path) -> list[str]:
    report = json.loads((context / "report.json").read_text())
    return [one["diff_id"] for one in report["architectures"]["amd64"]["extras_layers"]]


def _sha256(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def test_an_edited_context_leaves_the_next_plan_as_a_clean_one(tmp_path: Path) -> None:
    _house(tmp_path)
    _plan(tmp_path, "first")
    first = tmp_path / "first"
    clean = _files(first)
    assert len(_tars(first)) == 2 and all(t.stat().st_nlink == 1 for t in _tars(first))
    for tar in _tars(first):  # written over in place, as an editor or a script may
        with tar.open("r+b") as edit:
            edit.seek(600)
            edit.write(b"EDITED BY HAND")
    assert _files(first) != clean
    _plan(tmp_path, "second")
    _plan(tmp_path, "first")  # the edited context itself, planned again
    _plan(tmp_path, "fresh", cache="fresh-cache")  # from nothing: what a clean plan writes
    for context in ("second", "first", "fresh"):
        assert _files(tmp_path / context) == clean, context
        tars = _tars(tmp_path / context)
        assert [_sha256(tar) for tar in tars] == _diff_ids(tmp_path / context), context


def test_a_tampered_cache_entry_is_made_again_with_a_warning(tmp_path: Path) -> None:
    _house(tmp_path)
    _plan(tmp_path, "first")
    first = tmp_path / "first"
    diff_id = _diff_ids(first)[0].removeprefix("sha256:")
    entry = tmp_path / "cache" / "blobs" / diff_id[:2] / diff_id / "layer.tar"
    with entry.open("r+b") as edit:  # as through a hard link an older context still holds
        edit.seek(600)
        edit.write(b"TAMPERED")
    result = _plan(tmp_path, "second")
    said = [line for line in (result.stdout + result.stderr).splitlines() if "warning:" in line]
    assert (
        said
        == [
            f"warning: cache: {entry} no longer"  # a relative --cache-dir is made absolute
            f" hashes to {diff_id[:12]}; removed, made again"
        ]
    )
    assert _files(tmp_path / "second") == _files(first)
    assert _sha256(entry) == f"sha256:{diff_id}"  # made again, under its digest
    third = _plan(tmp_path, "third")
    assert "warning:" not in third.stdout + third.stderr
