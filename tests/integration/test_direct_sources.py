"""Requirement inputs operators actually have (issue 45), built into one verified image.

One image holds a distribution of each kind: a wheel from a wheelhouse (`-f`, a flag), a
vendored wheel by path, a project directory built here, a wheel from a URL behind Basic auth
(the token from `${VAR}`), and a tagged pure project from a local git repository
(`git+file://…@v1.0`, in a subdirectory). The index the file names is a closed port and
`--no-index` keeps it out: the build is air-gapped from any index. The image is built, verified
hardened and imported as uid 65532; the token appears in nothing the tool wrote or printed, in
its cache, or in the image; two plans pin the same files; the refusals are one line each. A
repository is also resolved over `git+ssh://`, against a real sshd on loopback.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from support.images import build, docker, inspect, run_hardened
from support.projects import pure_project, tagged_repository
from support.wheelfactory import make_wheel
from support.wheelindex import serve_wheel

from builder.cache import sha256_of

pytestmark = pytest.mark.usefixtures("docker_client")

TOKEN = f"tok-{uuid.uuid4().hex}"
CLOSED_INDEX = "http://127.0.0.1:9/simple"  # nothing listens: any index request fails


class Inputs(NamedTuple):
    root: Path
    requirements: str  # the file's text
    house: Path
    commit: str  # what the repository's tag names
    port: int
    served_sha256: str


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Inputs]:
    """One of each kind, the URL's server running for the module."""
    root = tmp_path_factory.mktemp("direct")
    house = root / "house"
    make_wheel(house, "bsi-housed", "1.0", "py3-none-any", {"bsi_housed/__init__.py": b"V = 1\n"})
    vendored = {"bsi_vendored/__init__.py": b"V = 2\n"}
    make_wheel(root / "vendor", "bsi-vendored", "2.1", "py3-none-any", vendored)
    pure_project(root / "localproj", "bsi-localproj", "0.5", "bsi_localproj", "V = 5\n")
    served = make_wheel(
        root / "served", "bsi-served", "3.0", "py3-none-any", {"bsi_served/__init__.py": b"V=3\n"}
    )
    repository, commit = tagged_repository(root / "repo", "lib")
    with serve_wheel(served, "bsi-served", credentials=f"ci:{TOKEN}") as port:
        text = (
            f"--index-url {CLOSED_INDEX}\nbsi-housed\n"
            "./vendor/bsi_vendored-2.1-py3-none-any.whl\n./localproj\n"
            f"bsi-served @ http://ci:${{BSI_TOKEN}}@127.0.0.1:{port}/files/{served.name}\n"
            f"bsi-gitpkg @ git+file://{repository}@v1.0#subdirectory=lib\n"
        )
        yield Inputs(root, text, house, commit, port, sha256_of(served))


def _environment() -> dict[str, str]:
    return {**os.environ, "BSI_TOKEN": TOKEN}


def _plan(inputs: Inputs, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    requirements = inputs.root / "requirements.txt"
    requirements.write_text(inputs.requirements)
    return subprocess.run(
        [sys.executable, "-m", "builder", "-r", str(requirements), "--no-index",
         "-f", str(inputs.house), "--output", str(out), "--cache-dir", str(inputs.root / "cache"),
         "--no-build", *extra],
        capture_output=True, text=True, env=_environment(), cwd=inputs.root, timeout=600,
    )  # fmt: skip


def _written(*roots: Path) -> Iterator[Path]:
    for root in roots:
        yield from (path for path in root.rglob("*") if path.is_file())


def test_two_plans_pin_the_same_files_and_name_each_origin(inputs: Inputs) -> None:
    first = _plan(inputs, inputs.root / "plan1")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr
    again = _plan(inputs, inputs.root / "plan2", "--refresh")  # resolved afresh, not reused
    assert again.returncode == 0, again.stderr
    lock = (inputs.root / "plan1" / "requirements-amd64.lock").read_text()
    assert lock == (inputs.root / "plan2" / "requirements-amd64.lock").read_text()
    assert f"# from git+file://{inputs.root / 'repo'}@{inputs.commit}#subdirectory=lib" in lock
    wheels = json.loads((inputs.root / "plan1" / "report.json").read_text())["architectures"]
    sources = {w["name"]: w["source"] for w in wheels["amd64"]["wheels"]}
    assert {name: source["kind"] for name, source in sources.items()} == {
        "bsi-housed": "find-links",
        "bsi-vendored": "path",
        "bsi-localproj": "path",
        "bsi-served": "url",
        "bsi-gitpkg": "vcs",
    }
    assert re.fullmatch(r"[0-9a-f]{40}", sources["bsi-gitpkg"]["commit"])
    assert sources["bsi-gitpkg"]["commit"] == inputs.commit
    assert sources["bsi-served"] == {
        "kind": "url",
        "location": f"http://127.0.0.1:{inputs.port}/files/bsi_served-3.0-py3-none-any.whl",
        "sha256": inputs.served_sha256,
        "commit": "",
        "ref": "",
        "subdirectory": "",
    }
    assert f"find-links {inputs.house}" in first.stdout  # the plan's table names each origin
    assert f"@{inputs.commit}" in first.stdout
    for path in _written(inputs.root / "plan1", inputs.root / "cache"):
        assert TOKEN.encode() not in path.read_bytes(), path
        assert TOKEN not in str(path)
    assert TOKEN not in first.stdout + first.stderr


def test_one_image_of_every_kind_built_verified_and_imported_hardened(
    inputs: Inputs, reference_image: str, test_env: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole command on the real engine, the token in its environment as CI gives it."""
    monkeypatch.setenv("BSI_TOKEN", TOKEN)
    tag = f"bsi-e2e/direct-{uuid.uuid4().hex[:8]}:test"
    workdir = inputs.root / "build"
    workdir.mkdir()
    (workdir / "vendor").symlink_to(inputs.root / "vendor")  # the file's relative paths
    (workdir / "localproj").symlink_to(inputs.root / "localproj")
    try:
        result = build(
            workdir, inputs.root / "cache", reference_image, inputs.requirements, tag,
            "--no-index", "-f", str(inputs.house),
        )  # fmt: skip
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
        for name in ("bsi_housed", "bsi_vendored", "bsi_localproj", "bsi_served", "bsi_gitpkg"):
            assert f"PASS  import {name}" in result.stdout
        code = (
            "import os, bsi_housed, bsi_vendored, bsi_localproj, bsi_served, bsi_gitpkg;"
            " print(bsi_housed.V, bsi_vendored.V, bsi_localproj.V, bsi_served.V,"
            " bsi_gitpkg.ORIGIN, os.getuid());"
            " print(any('.git' in d for _, d, _ in os.walk('/app/deps-extra')))"
        )
        run = run_hardened(test_env, tag, code)
        assert run.returncode == 0, run.stderr
        assert run.stdout.split() == ["1", "2", "5", "3", "git", "65532", "False"]
        _assert_no_token(inputs, result, tag, test_env)
    finally:
        docker(test_env, "rmi", "-f", tag, check=False)


def _assert_no_token(
    inputs: Inputs, result: subprocess.CompletedProcess[str], tag: str, test_env: dict
) -> None:
    """Not in the output, the context, the cache, the labels, the history or any layer."""
    assert TOKEN not in result.stdout + result.stderr
    for path in _written(inputs.root / "build" / "context", inputs.root / "cache"):
        assert TOKEN.encode() not in path.read_bytes(), path
    assert TOKEN not in json.dumps(inspect(test_env, tag))
    assert TOKEN not in docker(test_env, "history", "--no-trunc", tag).stdout
    saved = subprocess.run(
        [test_env["docker"], "save", tag], capture_output=True, check=True, timeout=600
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(saved)) as outer:
        for member in outer.getmembers():
            if member.isfile():
                blob = outer.extractfile(member).read()  # type: ignore[union-attr]
                assert TOKEN.encode() not in blob, member.name


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("-e ./localproj", "editable requirement './localproj' is not supported"),
        ("bsi-gitpkg @ git+file://{repo}@v9", "no tag, branch or commit 'v9' in the repository"),
        ("{served} --hash=sha256:" + "0" * 64, "not the --hash given"),
        ("./vendor/bsi_missing-1.0-py3-none-any.whl", "local path"),
    ],
)
def test_refusals_are_one_line_naming_file_and_line(inputs: Inputs, line: str, says: str) -> None:
    served = next(x for x in inputs.requirements.splitlines() if x.startswith("bsi-served"))
    text = line.format(repo=inputs.root / "repo", served=served)
    requirements = inputs.root / "refused.txt"
    requirements.write_text(f"bsi-housed\n{text}\n")
    out = inputs.root / f"refused-{uuid.uuid4().hex[:6]}"
    result = subprocess.run(
        [sys.executable, "-m", "builder", "-r", str(requirements), "--no-index",
         "-f", str(inputs.house), "--output", str(out), "--no-build",
         "--cache-dir", str(inputs.root / "cache")],
        capture_output=True, text=True, env=_environment(), cwd=inputs.root, timeout=600,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {requirements}:2: "), lines
    assert says in lines[0] and TOKEN not in result.stderr + result.stdout
    assert not out.exists()


def test_a_repository_over_ssh_resolves_to_its_commit_through_the_caller_s_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`git+ssh://` goes through the caller's ssh (its config and key: a wrapper first on PATH,
    as ~/.ssh/config would be), against a real sshd on loopback."""
    from support.plans import AMD64, reference_profile
    from support.sshengine import SshEngine

    from builder.cache import Cache
    from builder.resolve.requirements import read_requirements
    from builder.resolve.target import Target
    from builder.resolve.uv import resolve

    repository, commit = tagged_repository(tmp_path / "repo")
    server = SshEngine(tmp_path / "sshd").start()
    try:
        monkeypatch.setenv("PATH", server.ssh_on_path())
        url = f"git+ssh://root@127.0.0.1:{server.port}{repository}@v1.0"
        requirements = tmp_path / "r.txt"
        requirements.write_text(f"bsi-gitpkg @ {url}\n")
        target = Target(reference_profile(), (AMD64,))
        found = resolve(read_requirements([requirements]), target, AMD64, Cache(tmp_path / "c"))
    finally:
        server.stop()
    source = found.packages[0].source
    assert source is not None
    assert (source.location, source.commit) == (
        f"git+ssh://127.0.0.1:{server.port}{repository}",
        commit,
    )
