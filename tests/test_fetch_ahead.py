"""Downloads start before the stale-pick check, and only when every arch's first pins are good.

The resolver hands its first pins to `early` before it lists each of them on the index, so the
large downloads overlap those listings; `Fetches` starts them only once every party (arch) has
named its files and they pass the hash check, so a failing arch or a refused hash still stops
the run before anything is fetched. uv is given this interpreter (`uv_python`) instead of
looking through PATH, which must not change the lock. A PEP 691 listing is read by the names
it gives, relative URLs still joined to the page.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
from wheelfactory import make_wheel
from wheelindex import serve_wheel

from builder.analysis import resolve as resolve_module
from builder.analysis.index import (
    SIMPLE_JSON,
    UV,
    Fetches,
    RemoteFile,
    index_files,
    uv_environment,
    uv_python,
)
from builder.analysis.requirements import read_requirements
from builder.analysis.resolve import LockedPackage, resolve
from builder.analysis.target import ARCHES, Arch, Target, shipped_profile
from builder.cache import Cache
from builder.errors import UserError

AMD64 = ARCHES["amd64"]


def local_file(directory: Path, name: str) -> RemoteFile:
    path = directory / name
    path.write_bytes(name.encode() * 1000)
    sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
    return RemoteFile(name, path.as_uri(), sha256)


def refuse(files: Sequence[RemoteFile]) -> None:
    raise UserError("refused")


def test_nothing_starts_until_every_party_has_named_its_files(tmp_path: Path) -> None:
    one, two = local_file(tmp_path, "one.whl"), local_file(tmp_path, "two.whl")
    cache = Cache(tmp_path / "cache")
    with Fetches(cache, (), workers=2, parties=2) as fetches:
        fetches.ahead(lambda: [one], lambda files: None)
        assert fetches.started == {}  # the other arch may still fail to resolve
        fetches.ahead(lambda: [two, one], lambda files: None)
        early = dict(fetches.started)
        final = fetches.start([one, two])
        assert set(final) == {one.sha256, two.sha256}
        assert all(final[sha] is early[sha] for sha in final)  # reused, not fetched again
        paths = {sha: future.result() for sha, future in final.items()}
    assert paths[one.sha256].read_bytes() == b"one.whl" * 1000


@pytest.mark.parametrize("failing", ["check", "files"])
def test_a_refused_guess_fetches_nothing(tmp_path: Path, failing: str) -> None:
    one, two = local_file(tmp_path, "one.whl"), local_file(tmp_path, "two.whl")

    def named() -> list[RemoteFile]:
        if failing == "files":
            raise UserError("no wheel for the target")
        return [two]

    cache = Cache(tmp_path / "cache")
    with Fetches(cache, (), workers=2, parties=2) as fetches:
        fetches.ahead(lambda: [one], lambda files: None)
        fetches.ahead(named, refuse if failing == "check" else lambda files: None)
        assert fetches.started == {}
    assert cache.find_blob(one.sha256, one.filename) is None


def test_first_pins_are_handed_over_before_the_index_listings(tmp_path: Path) -> None:
    wheel = make_wheel(
        tmp_path / "wheels", "bsi-early", "1.0", "py3-none-any", {"bsi_early/__init__.py": b""}
    )
    events: list[str] = []
    listings = resolve_module.index_listings

    def listed(names: Sequence[str], indexes: Sequence[str]) -> dict:
        events.append("listings")
        return listings(names, indexes)

    def early(arch: Arch, packages: Sequence[LockedPackage]) -> None:
        events.append(f"early {arch.name} " + " ".join(f"{p.name}=={p.version}" for p in packages))

    with serve_wheel(wheel, "bsi-early") as port, pytest.MonkeyPatch.context() as patch:
        patch.setattr(resolve_module, "index_listings", listed)
        requirements_file = tmp_path / "requirements.txt"
        requirements_file.write_text(f"--index-url http://127.0.0.1:{port}/simple\nbsi-early\n")
        requirements = read_requirements((requirements_file,), ())
        target = Target(shipped_profile(), (AMD64,))
        resolution = resolve(requirements, target, AMD64, Cache(tmp_path / "c"), early=early)
    assert events == ["early amd64 bsi-early==1.0", "listings"]
    assert [(p.name, p.version) for p in resolution.packages] == [("bsi-early", "1.0")]


def test_naming_the_interpreter_does_not_change_the_lock(tmp_path: Path) -> None:
    links = tmp_path / "links"
    make_wheel(links, "bsi-a", "1.0", "py3-none-any", {"bsi_a/__init__.py": b""})
    make_wheel(links, "bsi-a", "2.0", "cp313-cp313-manylinux_2_17_x86_64", {"bsi_a/x.py": b""})
    make_wheel(links, "bsi-a", "3.0", "cp312-cp312-manylinux_2_17_x86_64", {"bsi_a/x.py": b""})
    make_wheel(links, "bsi-b", "1.0", "py3-none-any", {"bsi_b/__init__.py": b""})
    # the host interpreter is older: only the target's markers may decide this line
    (tmp_path / "requirements.in").write_text('bsi-a\nbsi-b ; python_version < "3.13"\n')
    command = [
        UV, "pip", "compile", str(tmp_path / "requirements.in"), "--no-index",
        "--find-links", str(links), "--python-platform", AMD64.uv_platform,
        "--python-version", "3.13", "--only-binary", ":all:", "--no-header", "--no-annotate",
        "--quiet",
    ]  # fmt: skip
    locks = [
        subprocess.run(
            [*command, *extra], capture_output=True, text=True, env=uv_environment(), check=True
        ).stdout
        for extra in ([], uv_python())
    ]
    assert uv_python()[0] == "--python"
    assert locks[0] == locks[1] == "bsi-a==2.0\n"


class JsonListing(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        files = [
            {"filename": "a-1.0-py3-none-any.whl", "url": "https://files.invalid/x/a-1.0-py3-none-any.whl",
             "hashes": {"sha256": "1" * 64}, "upload-time": "2025-01-02T00:00:00Z"},
            {"filename": "a-2.0.tar.gz", "url": "../../files/a-2.0.tar.gz",
             "hashes": {"sha256": "2" * 64}, "yanked": "broken"},
            {"filename": "a-3.0.tar.gz", "url": "https://files.invalid/a-3.0.tar.gz", "hashes": {}},
        ]  # fmt: skip
        body = json.dumps({"meta": {"api-version": "1.0"}, "name": "a", "files": files}).encode()
        self.send_response(200)
        self.send_header("Content-Type", SIMPLE_JSON)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_json_listing_keeps_names_joins_relative_urls_and_drops_unhashed() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), JsonListing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        index = f"http://127.0.0.1:{server.server_address[1]}/simple"
        files = index_files([index], "a")
    finally:
        server.shutdown()
    assert files == [
        RemoteFile(
            "a-1.0-py3-none-any.whl", "https://files.invalid/x/a-1.0-py3-none-any.whl", "1" * 64,
            None, "2025-01-02T00:00:00Z", False,
        ),
        RemoteFile(
            "a-2.0.tar.gz", f"http://127.0.0.1:{server.server_address[1]}/files/a-2.0.tar.gz",
            "2" * 64, None, None, True,
        ),
    ]  # fmt: skip
