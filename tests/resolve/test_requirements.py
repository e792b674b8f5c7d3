"""Requirement files: nesting, options, markers, and clear refusals naming file and line."""

from __future__ import annotations

import codecs
import locale
from pathlib import Path
from types import SimpleNamespace

import pytest

from builder.errors import UserError
from builder.resolve.requirements import MAX_NESTING, read_requirements


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_nested_files_comments_and_continuations(tmp_path: Path) -> None:
    write(tmp_path / "more.txt", "lightgbm>=4  # trees\n")
    write(tmp_path / "pins.txt", "scipy<2\n")
    top = write(
        tmp_path / "requirements.txt",
        "# extras for the sandbox\n"
        "beautifulsoup4 \\\n"
        "    >=4.12\n"
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
        ("--editable=git+https://h.example/x/y#egg=y", "editable requirement"),
        ("./wheels/foo.whl", "local path './wheels/foo.whl' does not exist"),
        ("https://example.com/foo.whl", "'foo.whl' is not a valid wheel or sdist name"),
        ("foo @ ftp://example.com/foo-1.0-py3-none-any.whl", "URL scheme 'ftp' is not supported"),
        ("foo @ http://example.com/foo-1.0.tar.gz", "plain http is allowed only to this"),
        ("foo @ git+https://example.com/x@--upload-pack=x", "is not a tag, branch or commit"),
        ("foo @ git+https://example.com/x#subdirectory=../up", "is not a relative path"),
        ("git+https://example.com/x@v1", "a repository needs a name"),
        ("foo @ https://example.com/x.whl#md5=1", "unknown URL fragment 'md5'"),
        ("foo @ https://example.com/x.tar.gz#subdirectory=a", "is for git repositories only"),
        ("foo===", "invalid requirement"),
        ("--find-links ./no-such-dir", "--find-links directory './no-such-dir' does not exist"),
        ("-f ftp://example.com/wheels", "--find-links takes a directory or an http(s) URL"),
        ("--no-index yes", "option --no-index takes no value"),
        ("--trusted-host example.com", "option --trusted-host is not supported"),
        ("--hashfoo=bar", "option --hashfoo is not supported"),
        ("soupsieve==2.6 --hashfoo=bar", "per-requirement option --hashfoo is unknown"),
        ("soupsieve==2.6 --global-option=x", "option --global-option is not supported"),
        ("soupsieve==2.6 --hash=md5:abc", "only sha256 hashes are supported"),
        ("soupsieve==2.6 --hash", "--hash takes sha256:<64 hex digits>"),
        ("--require-hashes=yes", "--require-hashes takes no value"),
        ("-r a.txt b.txt", "option -r takes one value"),
        ('-r "a.txt', "no closing quotation"),
        ("rtdemo; python_version >= 'x'", "invalid marker"),
        ("rtdemo; python_full_version < '3.x'", "invalid marker"),
        ("rtdemo; platform_machine ~= 'x86'", "invalid marker"),
        ("x.whl", "local path 'x.whl' does not exist"),
        ("x.tar.gz", "local path 'x.tar.gz' does not exist"),
        ("x.zip", "local path 'x.zip' does not exist"),
        ("X.WHL; python_version > '3'", "local path 'X.WHL' does not exist"),
        ("sub/project", "local path 'sub/project' does not exist"),
        (".hidden", "local path '.hidden' does not exist"),
        ("~/no-such-project-here", "local path '~/no-such-project-here' does not exist"),
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


HASH_A, HASH_B, HASH_C = "a" * 64, "B" * 64, "c" * 64


def wheel(filename: str, sha256: str) -> SimpleNamespace:
    return SimpleNamespace(filename=filename, sha256=sha256)


def test_hashes_are_kept_and_the_chosen_wheel_must_match(tmp_path: Path) -> None:
    top = write(
        tmp_path / "r.txt",
        f"SoupSieve==2.6 --hash=sha256:{HASH_A} \\\n    --hash sha256:{HASH_B}\n",
    )
    result = read_requirements([top])
    assert result.hash_checking
    assert result.hashes_for("soupsieve") == {HASH_A, HASH_B.lower()}
    assert str(result.requirements[0]) == "SoupSieve==2.6"
    result.check_hashes([wheel("soupsieve-2.6-py3-none-any.whl", HASH_B.lower())])
    with pytest.raises(UserError) as caught:
        result.check_hashes([wheel("soupsieve-2.6-py3-none-any.whl", HASH_C)])
    message = str(caught.value)
    assert message.startswith("soupsieve==2.6:")
    assert f"sha256:{HASH_C}" in message and f"sha256:{HASH_A}" in message
    with pytest.raises(UserError, match=r"beautifulsoup4==4\.13\.0: no --hash given"):
        result.check_hashes([wheel("beautifulsoup4-4.13.0-py3-none-any.whl", HASH_A)])


def test_require_hashes_flag_needs_a_pin_and_a_hash_on_every_line(tmp_path: Path) -> None:
    ok = write(tmp_path / "ok.txt", f"--require-hashes\nsoupsieve==2.6 --hash=sha256:{HASH_A}\n")
    assert read_requirements([ok]).hash_checking
    for line in ("soupsieve==2.6", f"soupsieve>=2 --hash=sha256:{HASH_A}"):
        bad = write(tmp_path / "bad.txt", f"--require-hashes\n{line}\n")
        with pytest.raises(UserError, match=r"bad\.txt:2: soupsieve needs an == pin and a --hash"):
            read_requirements([bad])
    # one --hash turns the mode on for every line, as in pip
    mixed = write(tmp_path / "mixed.txt", f"soupsieve==2.6 --hash=sha256:{HASH_A}\nrequests\n")
    with pytest.raises(UserError, match=r"mixed\.txt:2: requests needs .* \(a --hash at"):
        read_requirements([mixed])
    plain = read_requirements([write(tmp_path / "plain.txt", "soupsieve\n")])
    assert not plain.hash_checking
    plain.check_hashes([wheel("soupsieve-2.6-py3-none-any.whl", HASH_C)])


BAD_SPECIFIERS = [
    "foo==",
    "foo>=1.0,",
    "foo===",
    "foo@",
    "foo[bar",
    "foo (>=1",
    "foo~=1",
    "foo>=",
    "foo<>1",
    "foo=1",
    "foo==1.0.*.1",
    "foo>=1 <2",
    "foo;",
    "foo[bar]]",
    "foo; python_version",
]


@pytest.mark.parametrize("line", BAD_SPECIFIERS)
def test_bad_specifiers_are_one_line_naming_file_and_line(tmp_path: Path, line: str) -> None:
    top = write(tmp_path / "r.txt", f"requests\n{line}\n")
    with pytest.raises(UserError) as caught:
        read_requirements([top])
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{top}:2: invalid requirement")


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be", "utf-32", "utf-8-sig"])
def test_files_with_a_byte_order_mark_are_decoded(tmp_path: Path, encoding: str) -> None:
    data = "# caf\u00e9\nsoupsieve==2.6\n".encode(encoding)
    if encoding == "utf-16-be":
        data = codecs.BOM_UTF16_BE + data
    top = tmp_path / "r.txt"
    top.write_bytes(data)
    assert [str(r) for r in read_requirements([top]).requirements] == ["soupsieve==2.6"]


def test_undecodable_and_binary_files_are_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"soupsieve\n# caf\xe9\n")
    with pytest.raises(UserError, match=r"latin\.txt:2: not UTF-8 text \(byte 0xe9\)"):
        read_requirements([latin])
    png = tmp_path / "logo.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x10")
    with pytest.raises(UserError, match=r"logo\.png: binary data"):
        read_requirements([png])
    # a non-UTF-8 locale is the fallback, as in pip
    monkeypatch.setattr(locale, "getpreferredencoding", lambda do_setlocale=True: "latin-1")
    assert [r.name for r in read_requirements([latin]).requirements] == ["soupsieve"]


def test_deep_chains_and_symlink_loops_are_one_line(tmp_path: Path) -> None:
    for depth in range(1200):
        write(tmp_path / f"r{depth}.txt", f"-r r{depth + 1}.txt\n")
    write(tmp_path / "r1200.txt", "soupsieve\n")
    with pytest.raises(UserError) as caught:
        read_requirements([tmp_path / "r0.txt"])
    assert str(caught.value) == (
        f"{tmp_path / f'r{MAX_NESTING}.txt'}: -r/-c files nested more than {MAX_NESTING} deep"
    )
    (tmp_path / "loop1").symlink_to("loop2")
    (tmp_path / "loop2").symlink_to("loop1")
    with pytest.raises(UserError, match=r"loop1: cannot read requirements file .*symbolic links"):
        read_requirements([write(tmp_path / "top.txt", "-r loop1\n")])


@pytest.mark.parametrize(
    ("line", "secret"),
    [
        ("AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI", "wJalrXUtnFEMI"),
        ("foo==1 --hash=sha256:hunter2", "hunter2"),
        ("https://ci:hunter2@pypi.example/x.whl", "hunter2"),
        ("foo @ ftp://ci:hunter2@pypi.example/foo-1.0.tar.gz", "hunter2"),
        ("foo @ http://ci:hunter2@pypi.example/foo-1.0.tar.gz", "hunter2"),
        ("foo @ git+https://ci:hunter2@h.example/x@-x", "hunter2"),
        ("--find-links http://ci:hunter2@pypi.example/wheels", "hunter2"),
        ("-e git+https://tok:hunter2@github.com/x/y", "hunter2"),
        ("token ghp_0123456789abcdefghijABCDEFGHIJ", "0123456789abcdefghij"),
        ("token: " + "x" * 200, "x" * 41),
    ],
)
def test_error_lines_quote_a_short_redacted_excerpt(tmp_path: Path, line: str, secret: str) -> None:
    top = write(tmp_path / "r.txt", f"{line}\n")
    with pytest.raises(UserError) as caught:
        read_requirements([top])
    assert f"{top}:1:" in str(caught.value)
    assert secret not in str(caught.value)


def test_environ_file_values_are_never_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BSI_TEST_SECRET", "s3cr3t-value-not-for-logs")
    with pytest.raises(UserError) as caught:
        read_requirements([Path("/proc/self/environ")])
    assert "s3cr3t" not in str(caught.value)
    assert str(caught.value).startswith("/proc/self/environ: binary data")
