"""Direct requirements (issue 45): each line form read, fetched from real parts (a loopback
server with Basic auth, a local git repository, a wheelhouse, a project directory), resolved
with no index at all, pinned, and named as its origin."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.plans import AMD64, reference_profile
from support.projects import commit_all, pure_project, tagged_repository
from support.wheelfactory import make_wheel
from support.wheelindex import serve_wheel

from builder.cache import Cache, sha256_of
from builder.errors import UserError
from builder.resolve.requirements import read_requirements
from builder.resolve.resolution import Source, SourceKind
from builder.resolve.target import Target
from builder.resolve.uv import resolve

TOKEN = "tok-" + "5ecret" * 4


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_every_line_form_reads_as_its_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BSI_TOKEN", TOKEN)
    vendored = make_wheel(tmp_path / "req" / "vendor", "acme-auth", "2.1", "py3-none-any", {})
    sdist = write(tmp_path / "req" / "acme_sdist-1.0.tar.gz", "")
    project = pure_project(tmp_path / "tools", "acme-tools", "0.1", "acme_tools", "")
    (tmp_path / "house").mkdir()
    top = write(
        tmp_path / "req" / "requirements.txt",
        "--no-index\n-f ../house\n"
        "./vendor/acme_auth-2.1-py3-none-any.whl\n"
        "acme_sdist-1.0.tar.gz ; sys_platform == 'linux'\n"
        "../tools\n"
        f"renamed @ file://{vendored}\n"
        "relative @ ./vendor/acme_auth-2.1-py3-none-any.whl\n"
        "acme-url[extra] @ https://ci:${BSI_TOKEN}@artifacts.example/acme_url-1.0-py3-none-any.whl"
        f" --hash=sha256:{'a' * 64}\n"
        "http://127.0.0.1:8080/files/acme_local-1.0-py3-none-any.whl\n"
        "acme-git @ git+https://ci:${BSI_TOKEN}@git.example/acme/git@v1.4.0#subdirectory=lib\n"
        "acme-ssh @ git+ssh://git@git.example/acme/ssh.git\n",
    )
    found = read_requirements([top])
    assert found.no_index and found.find_links == (str(tmp_path / "house"),)
    rows = [
        (str(r.requirement), r.direct.kind, r.direct.shown, r.direct.ref, r.direct.subdirectory)
        for r in found.requirements
        if r.direct
    ]
    assert rows == [
        ("acme-auth", SourceKind.PATH, str(vendored), "", ""),
        ('acme-sdist; sys_platform == "linux"', SourceKind.PATH, str(sdist), "", ""),
        ("acme-tools", SourceKind.PATH, str(project), "", ""),
        ("renamed", SourceKind.PATH, str(vendored), "", ""),
        ("relative", SourceKind.PATH, str(vendored), "", ""),
        (
            "acme-url[extra]",
            SourceKind.URL,
            "https://artifacts.example/acme_url-1.0-py3-none-any.whl",
            "",
            "",
        ),
        (
            "acme-local",
            SourceKind.URL,
            "http://127.0.0.1:8080/files/acme_local-1.0-py3-none-any.whl",
            "",
            "",
        ),
        ("acme-git", SourceKind.VCS, "https://git.example/acme/git", "v1.4.0", "lib"),
        ("acme-ssh", SourceKind.VCS, "ssh://git.example/acme/ssh.git", "", ""),
    ]
    by_name = {r.name: r for r in found.requirements}
    assert by_name["acme-url"].hashes == {"a" * 64}
    assert TOKEN in by_name["acme-url"].direct.target  # type: ignore[union-attr]
    assert TOKEN not in repr(found)  # what the URL is fetched with never shows
    assert not found.hash_checking  # a direct requirement's --hash checks its own file only


def _inputs(tmp_path: Path, port: int, served: Path, repository: Path) -> Path:
    """A requirements file naming one of each kind, with no index at all."""
    make_wheel(tmp_path / "house", "bsi-housed", "1.0", "py3-none-any", {"bsi_housed.py": b""})
    make_wheel(
        tmp_path / "req" / "vendor", "bsi-vendored", "2.1", "py3-none-any", {"bsi_v.py": b""}
    )
    pure_project(tmp_path / "localproj", "bsi-localproj", "0.5", "bsi_localproj", "X = 5\n")
    return write(
        tmp_path / "req" / "requirements.txt",
        "--index-url http://127.0.0.1:9/simple\n--no-index\n--find-links ../house\nbsi-housed\n"
        "./vendor/bsi_vendored-2.1-py3-none-any.whl\n../localproj\n"
        f"bsi-served @ http://ci:${{BSI_TOKEN}}@127.0.0.1:{port}/files/{served.name}"
        f" --hash=sha256:{sha256_of(served)}\n"
        f"bsi-gitpkg @ git+file://{repository}@v1.0#subdirectory=lib\n",
    )


def test_every_kind_resolves_with_no_index_pinned_and_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The index named is a closed port: --no-index keeps it out. Two resolutions (the second
    not from the cached one) pin the same files; the repository's tag pins its commit."""
    monkeypatch.setenv("BSI_TOKEN", TOKEN)
    served = make_wheel(tmp_path / "s", "bsi-served", "3.0", "py3-none-any", {"bsi_s.py": b""})
    repository, commit = tagged_repository(tmp_path / "repo", "lib")
    target = Target(reference_profile(), (AMD64,))
    cache = Cache(tmp_path / "cache")
    with serve_wheel(served, "bsi-served", credentials=f"ci:{TOKEN}") as port:
        top = _inputs(tmp_path, port, served, repository)
        first = resolve(read_requirements([top]), target, AMD64, cache)
        again = resolve(read_requirements([top]), target, AMD64, cache, refresh=True)
        reused = resolve(read_requirements([top]), target, AMD64, cache)  # the cached one
    pins = {p.name: (p.version, p.wheels[0].sha256) for p in first.packages}
    assert pins == {p.name: (p.version, p.wheels[0].sha256) for p in again.packages}
    assert reused.packages == first.packages and reused.pylock == again.pylock
    sources = {p.name: p.source for p in first.packages}
    assert sources == {
        "bsi-housed": Source(SourceKind.FIND_LINKS, str(tmp_path / "house")),
        "bsi-vendored": Source(
            SourceKind.PATH,
            str(tmp_path / "req" / "vendor" / "bsi_vendored-2.1-py3-none-any.whl"),
            sha256=pins["bsi-vendored"][1],
        ),
        "bsi-localproj": Source(SourceKind.PATH, str(tmp_path / "localproj")),
        "bsi-served": Source(
            SourceKind.URL,
            f"http://127.0.0.1:{port}/files/{served.name}",
            sha256=sha256_of(served),
        ),
        "bsi-gitpkg": Source(SourceKind.VCS, f"git+file://{repository}", "", commit, "v1.0", "lib"),
    }
    assert re.fullmatch(r"[0-9a-f]{40}", commit)
    assert all(p.index == "" for p in first.packages)
    for path in (tmp_path / "cache").rglob("*"):  # names and records on disk
        assert TOKEN not in str(path)
        assert path.is_dir() or TOKEN.encode() not in path.read_bytes(), path
    assert TOKEN not in first.pylock


def test_a_constraint_file_names_versions_not_files(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "v", "bsi-v", "1.0", "py3-none-any", {})
    constraints = write(tmp_path / "c.txt", f"./v/{wheel.name}\n")
    with pytest.raises(UserError) as caught:
        read_requirements([write(tmp_path / "r.txt", "bsi-v\n")], [constraints])
    assert str(caught.value) == (
        f"{constraints}:1: a constraint names versions, not a file or repository:"
        " give bsi-v @ … in a requirements file"
    )


def test_hash_checking_mode_asks_a_url_for_its_hash_not_a_path_or_a_repository(
    tmp_path: Path,
) -> None:
    wheel = make_wheel(tmp_path / "v", "bsi-v", "1.0", "py3-none-any", {})
    url = "bsi-u @ https://files.example/bsi_u-1.0-py3-none-any.whl"
    top = write(
        tmp_path / "r.txt",
        f"--require-hashes\n./v/{wheel.name}\nbsi-g @ git+https://git.example/g@v1\n{url}\n",
    )
    with pytest.raises(UserError) as caught:
        read_requirements([top])
    assert str(caught.value) == (
        f"{top}:4: bsi-u @ https://files.example/bsi_u-1.0-py3-none-any.whl needs a --hash:"
        f" hash-checking mode is on (--require-hashes at {top}:1)"
    )
    top.write_text(top.read_text().replace(f"{url}\n", f"{url} --hash=sha256:{'a' * 64}\n"))
    assert read_requirements([top]).hash_checking


def test_a_branch_that_moved_is_a_new_pin(tmp_path: Path) -> None:
    """`@main` pins the commit main names at plan time: a new commit there is a new pin (and
    a new wheel); the same commit again is the same wheel."""
    repository, first_commit = tagged_repository(tmp_path / "repo")
    top = write(tmp_path / "r.txt", f"bsi-gitpkg @ git+file://{repository}@main\n")
    target = Target(reference_profile(), (AMD64,))
    cache = Cache(tmp_path / "cache")
    before = resolve(read_requirements([top]), target, AMD64, cache).packages[0]
    (repository / "bsi_gitpkg" / "__init__.py").write_text("ORIGIN = 'moved'\n")
    moved = commit_all(repository, "a change on main")
    after = resolve(read_requirements([top]), target, AMD64, cache).packages[0]
    assert before.source is not None and after.source is not None
    assert (before.source.commit, after.source.commit) == (first_commit, moved)
    assert before.wheels[0].sha256 != after.wheels[0].sha256
    pinned = write(tmp_path / "p.txt", f"bsi-gitpkg @ git+file://{repository}@{first_commit}\n")
    again = resolve(read_requirements([pinned]), target, AMD64, Cache(tmp_path / "c2"))
    assert again.packages[0].wheels[0].sha256 == before.wheels[0].sha256  # built reproducibly


def _refusal(tmp_path: Path, line: str) -> str:
    top = write(tmp_path / "r.txt", f"{line}\n")
    target = Target(reference_profile(), (AMD64,))
    with pytest.raises(UserError) as caught:
        resolve(read_requirements([top]), target, AMD64, Cache(tmp_path / "cache"))
    message = str(caught.value)
    assert message.startswith(f"{top}:1: ") and "\n" not in message
    return message


def test_refusals_name_the_file_and_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BSI_TOKEN", TOKEN)
    repository, _ = tagged_repository(tmp_path / "repo")
    served = make_wheel(tmp_path / "s", "bsi-served", "3.0", "py3-none-any", {"bsi_s.py": b""})
    native = pure_project(tmp_path / "native", "bsi-native", "1.0", "bsi_native", "")
    (native / "bsi_native" / "fast.c").write_text("int f(void) { return 1; }\n")
    with serve_wheel(served, "bsi-served", credentials=f"ci:{TOKEN}") as port:
        url = f"http://ci:${{BSI_TOKEN}}@127.0.0.1:{port}/files/{served.name}"
        wrong = _refusal(tmp_path, f"bsi-served @ {url} --hash=sha256:{'0' * 64}")
        denied = _refusal(tmp_path, f"bsi-served @ {url.replace('ci:', 'other:')}")
    assert f"has sha256:{sha256_of(served)}, not the --hash given" in wrong
    assert "download of" in denied and "401" in denied
    assert TOKEN not in wrong + denied
    no_ref = _refusal(tmp_path, f"bsi-gitpkg @ git+file://{repository}@v9.9")
    assert "no tag, branch or commit 'v9.9' in the repository" in no_ref
    no_commit = _refusal(tmp_path, f"bsi-gitpkg @ git+file://{repository}@{'e' * 40}")
    assert f"commit {'e' * 40} cannot be fetched" in no_commit
    assert "compiles native code (bsi_native/fast.c)" in _refusal(tmp_path, str(native))
    other = _refusal(tmp_path, f"acme @ git+file://{repository}@v1.0")
    assert "is the project bsi-gitpkg, not acme" in other
    missing = _refusal(tmp_path, "./vendor/nope-1.0-py3-none-any.whl")
    assert "local path './vendor/nope-1.0-py3-none-any.whl' does not exist" in missing


def test_git_credentials_stay_off_the_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A token in an https repository URL goes to git as a header scoped to that URL, in its
    environment: never in its arguments, where the machine's other users could read it. The
    operator's own GIT_CONFIG_* entries stay; an ssh URL keeps its user for ssh."""
    from builder.resolve.direct.lines import from_url
    from builder.resolve.direct.vcs import _git_environment

    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "http.proxy")
    source = from_url("x", f"git+https://ci:{TOKEN}@git.example/acme/x@v1", "r.txt:1", tmp_path)
    url, environment = _git_environment(source.target)
    assert url == "https://git.example/acme/x" and TOKEN not in url
    assert environment["GIT_CONFIG_COUNT"] == "2"
    assert environment["GIT_CONFIG_KEY_0"] == "http.proxy"
    assert environment["GIT_CONFIG_KEY_1"] == "http.https://git.example/acme/x.extraHeader"
    assert environment["GIT_CONFIG_VALUE_1"].startswith("Authorization: Basic ")
    assert environment["GIT_TERMINAL_PROMPT"] == "0"
    ssh = from_url("x", "git+ssh://git@git.example/acme/x.git@v1", "r.txt:1", tmp_path)
    assert _git_environment(ssh.target)[0] == "ssh://git@git.example/acme/x.git"


def test_a_page_of_links_behind_auth_is_a_wheelhouse_and_its_token_stays_out(
    tmp_path: Path,
) -> None:
    """`-f https://…/` with credentials: uv reads the page, the origin is the page (no token),
    and the download of its wheel sends them to that host (what `prepare` passes)."""
    from builder.resolve.index import download

    wheel = make_wheel(tmp_path / "w", "bsi-paged", "1.0", "py3-none-any", {"bsi_paged.py": b""})
    with serve_wheel(wheel, "bsi-paged", credentials=f"ci:{TOKEN}") as port:
        page = f"http://ci:{TOKEN}@127.0.0.1:{port}/simple/bsi-paged/"
        top = write(tmp_path / "r.txt", f"--no-index\n-f {page}\nbsi-paged\n")
        requirements = read_requirements([top])
        target = Target(reference_profile(), (AMD64,))
        found = resolve(requirements, target, AMD64, Cache(tmp_path / "cache"))
        file = found.packages[0].wheels[0]
        fetched = download(
            file, Cache(tmp_path / "c2"), (*requirements.indexes(), *requirements.find_links)
        )
    assert found.packages[0].source == Source(
        SourceKind.FIND_LINKS, f"http://127.0.0.1:{port}/simple/bsi-paged/"
    )
    assert sha256_of(fetched) == sha256_of(wheel) == file.sha256
    assert TOKEN not in found.pylock + file.url


def test_a_wheel_for_one_arch_is_that_arch_s(tmp_path: Path) -> None:
    """A vendored x86_64 wheel serves amd64; for arm64 its line is refused, naming it, unless a
    marker keeps it to its arch. In a wheelhouse, it is simply not a candidate on arm64."""
    from builder.resolve.target import ARCHES

    arm64 = ARCHES["arm64"]
    tag = "cp313-cp313-manylinux_2_17_x86_64.manylinux2014_x86_64"
    wheel = make_wheel(tmp_path / "v", "bsi-x86", "1.0", tag, {"bsi_x86/__init__.py": b""})
    make_wheel(tmp_path / "v", "bsi-x86", "1.0", "py3-none-any", {"bsi_x86/__init__.py": b""})
    target = Target(reference_profile(), (AMD64, arm64))
    cache = Cache(tmp_path / "cache")
    bare = write(tmp_path / "bare.txt", f"./v/{wheel.name}\n")
    assert [p.name for p in resolve(read_requirements([bare]), target, AMD64, cache).packages] == [
        "bsi-x86"
    ]
    with pytest.raises(UserError) as caught:
        resolve(read_requirements([bare]), target, arm64, cache)
    assert str(caught.value).startswith(f"{bare}:1: {wheel.name} does not install on CPython")
    marked = write(tmp_path / "m.txt", f"./v/{wheel.name} ; platform_machine == 'x86_64'\n")
    assert resolve(read_requirements([marked]), target, arm64, cache).packages == ()
    house = write(tmp_path / "h.txt", "--no-index\n-f v\nbsi-x86\n")
    chosen = {
        arch.name: resolve(read_requirements([house]), target, arch, cache).packages[0].wheels
        for arch in (AMD64, arm64)
    }
    assert {w.filename for w in chosen["amd64"]} == {wheel.name, "bsi_x86-1.0-py3-none-any.whl"}
    assert [w.filename for w in chosen["arm64"]] == ["bsi_x86-1.0-py3-none-any.whl"]


def test_a_run_fetches_each_direct_requirement_once_for_all_its_arches(tmp_path: Path) -> None:
    """Both arches of one requirement set get the same file: the URL is read once."""
    from builder.resolve.target import ARCHES

    served = make_wheel(tmp_path / "s", "bsi-served", "3.0", "py3-none-any", {"bsi_s.py": b""})
    seen: list[str] = []
    with serve_wheel(served, "bsi-served", seen=seen) as port:
        top = write(tmp_path / "r.txt", f"http://127.0.0.1:{port}/files/{served.name}\n")
        requirements = read_requirements([top])
        target = Target(reference_profile(), (AMD64, ARCHES["arm64"]))
        pins = {
            arch.name: resolve(requirements, target, arch, Cache(tmp_path / "c")).packages[0]
            for arch in target.arches
        }
    assert seen == [f"GET /files/{served.name} 200"]
    assert pins["amd64"].wheels == pins["arm64"].wheels


def test_an_sdist_in_a_wheelhouse_is_built_with_no_index(tmp_path: Path) -> None:
    """Air-gapped: uv finds only a source release in the wheelhouse; it is built from there
    (its build backend from the wheelhouse too), never looked up on an index."""
    from support.projects import pure_sdist

    sdist = pure_sdist(tmp_path / "house", "bsi-sourced", "1.2", "bsi_sourced", "V = 12\n")
    top = write(tmp_path / "r.txt", "--index-url http://127.0.0.1:9/simple\n--no-index\n"
                "-f house\nbsi-sourced\n")  # fmt: skip
    target = Target(reference_profile(), (AMD64,))
    found = resolve(read_requirements([top]), target, AMD64, Cache(tmp_path / "cache"))
    assert [(p.name, p.version) for p in found.packages] == [("bsi-sourced", "1.2")]
    assert found.built_from_source == ("bsi-sourced==1.2",)
    wheel = found.packages[0].wheels[0]
    assert wheel.filename == "bsi_sourced-1.2-py3-none-any.whl"
    assert wheel.built_from is not None and wheel.built_from.sha256 == sha256_of(sdist)


def test_a_project_linking_outside_its_tree_is_refused(tmp_path: Path) -> None:
    """A symlink in the commit pointing out of the project would let its build read the host's
    files into a wheel: refused in one line naming the link."""
    repository, _ = tagged_repository(tmp_path / "repo")
    (repository / "bsi_gitpkg" / "secrets.txt").symlink_to("/etc/hostname")
    commit = commit_all(repository, "a link out")
    message = _refusal(tmp_path, f"bsi-gitpkg @ git+file://{repository}@{commit}")
    assert "'bsi_gitpkg/secrets.txt' links outside the project" in message
