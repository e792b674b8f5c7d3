"""Requirement files: nesting, options, markers, and clear refusals naming file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.analysis.requirements import read_requirements
from builder.errors import UserError


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_nested_files_comments_continuations_and_hashes(tmp_path: Path) -> None:
    write(tmp_path / "more.txt", "lightgbm>=4  # trees\n")
    write(tmp_path / "pins.txt", "scipy<2\n")
    top = write(
        tmp_path / "requirements.txt",
        "# extras for the sandbox\n"
        "beautifulsoup4 \\\n"
        "    >=4.12 --hash=sha256:00\n"
        "-r more.txt\n"
        "--constraint pins.txt\n"
        "pywin32; sys_platform == 'win32'\n",
    )
    result = read_requirements([top])
    assert [str(r) for r in result.requirements] == [
        "beautifulsoup4>=4.12",
        "lightgbm>=4",
        'pywin32; sys_platform == "win32"',
    ]
    assert [str(c) for c in result.constraints] == ["scipy<2"]
    assert result.requirements[1].origin == f"{tmp_path / 'more.txt'}:1"
    linux = {"sys_platform": "linux"}
    assert not result.requirements[2].applies(linux)
    assert result.requirements[0].applies(linux)


def test_index_options_expand_environment_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INDEX_TOKEN", "s3cret")
    top = write(
        tmp_path / "r.txt",
        "--index-url https://ci:${INDEX_TOKEN}@pypi.example/simple\n"
        "--extra-index-url https://mirror.example/simple\nrequests\n",
    )
    result = read_requirements([top])
    assert result.index_url == "https://ci:s3cret@pypi.example/simple"
    assert result.indexes() == (result.index_url, "https://mirror.example/simple")
    only_extra = read_requirements(
        [write(tmp_path / "e.txt", "--extra-index-url https://m.example/simple\nx\n")]
    )
    assert only_extra.indexes() == ("https://pypi.org/simple", "https://m.example/simple")


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ("-e ./local", "editable requirement"),
        ("./wheels/foo.whl", "local or URL requirement"),
        ("https://example.com/foo.whl", "local or URL requirement"),
        ("foo @ https://example.com/foo-1.0-py3-none-any.whl", "direct URL requirement"),
        ("foo===", "invalid requirement"),
        ("--find-links /tmp", "option --find-links is not supported"),
        ("--index-url https://${NOT_SET_ANYWHERE}@x/simple", "NOT_SET_ANYWHERE is not set"),
    ],
)
def test_refusals_name_file_and_line(tmp_path: Path, line: str, fragment: str) -> None:
    top = write(tmp_path / "requirements.txt", f"requests\n{line}\n")
    with pytest.raises(UserError) as caught:
        read_requirements([top])
    assert f"{top}:2" in str(caught.value)
    assert fragment in str(caught.value)


def test_missing_file_cycle_and_empty(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"nope\.txt: cannot read requirements file"):
        read_requirements([tmp_path / "nope.txt"])
    write(tmp_path / "a.txt", "-r b.txt\n")
    write(tmp_path / "b.txt", "-r a.txt\n")
    with pytest.raises(UserError, match="cycle"):
        read_requirements([tmp_path / "a.txt"])
    with pytest.raises(UserError, match="no requirements found"):
        read_requirements([write(tmp_path / "empty.txt", "# nothing\n")])
