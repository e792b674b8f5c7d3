"""The index's cheap paths: uv is given this interpreter (`uv_python`) instead of looking through
PATH, which must not change the lock; a PEP 691 listing is read by the names it gives, relative
URLs still joined to the page. And its bad day: uv retries an index's 503s as the tool sets it.
"""

from __future__ import annotations

import http.server
import json
import subprocess
import threading
import urllib.error
from collections.abc import Mapping
from dataclasses import replace
from email.message import Message
from pathlib import Path

import pytest
from support.wheelfactory import make_wheel
from support.wheelindex import serve_wheel

from builder.cache import Cache
from builder.errors import UserError
from builder.files import sha256_of
from builder.reporter import Reporter
from builder.resolve.index import (
    INDEX_FAULTS,
    SIMPLE_JSON,
    UV,
    UV_HTTP_RETRIES,
    download,
    index_files,
    retried,
    uv_environment,
    uv_python,
)
from builder.resolve.requirements import RequirementSet
from builder.resolve.resolution import RemoteFile
from builder.resolve.target import ARCHES, Target, shipped_facts
from builder.resolve.unresolvable import unresolvable
from builder.retry import POLICY, Retries

AMD64 = ARCHES["amd64"]


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
            [*command, *extra],
            capture_output=True,
            text=True,
            env=uv_environment(tmp_path / "uv-cache"),
            check=True,
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


def _compile_from(port: int, tmp_path: Path, environment: Mapping[str, str]) -> str:
    (tmp_path / "requirements.in").write_text("bsi-flaky\n")
    command = [
        UV, "pip", "compile", str(tmp_path / "requirements.in"), "--index-url",
        f"http://127.0.0.1:{port}/simple", "--python-platform", AMD64.uv_platform,
        "--python-version", "3.13", "--only-binary", ":all:", "--no-header", "--no-annotate",
        "--quiet", "--no-cache", *uv_python(),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=environment)
    return result.stdout if result.returncode == 0 else f"exit {result.returncode}"


def test_uv_resolves_through_an_index_s_503s_with_the_tool_s_retries(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "w", "bsi-flaky", "1.0", "py3-none-any", {"bsi_flaky.py": b""})
    seen: list[str] = []
    with serve_wheel(wheel, "bsi-flaky", failing=2, seen=seen) as port:
        assert (
            _compile_from(port, tmp_path, uv_environment(tmp_path / "uv-cache"))
            == "bsi-flaky==1.0\n"
        )
    assert [line.split()[-1] for line in seen[:3]] == ["503", "503", "200"]
    assert uv_environment(tmp_path)["UV_HTTP_RETRIES"] == UV_HTTP_RETRIES


def test_an_operator_s_own_uv_retry_setting_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UV_HTTP_RETRIES", "0")
    wheel = make_wheel(tmp_path / "w", "bsi-flaky", "1.0", "py3-none-any", {"bsi_flaky.py": b""})
    with serve_wheel(wheel, "bsi-flaky", failing=1) as port:
        assert _compile_from(port, tmp_path, uv_environment(tmp_path / "uv-cache")) == "exit 2"


def test_the_tool_s_own_listing_and_download_weather_an_index_s_503s(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "w", "bsi-flaky", "1.0", "py3-none-any", {"bsi_flaky.py": b"x"})
    seen: list[str] = []
    lines: list[str] = []
    retries = Retries(Reporter(lines.append), sleep=lambda seconds: None)
    with serve_wheel(wheel, "bsi-flaky", failing=2, seen=seen) as port:
        index = f"http://127.0.0.1:{port}/simple"
        (listed,) = index_files([index], "bsi-flaky", retries)
        seen.append("-- listed")
        with serve_wheel(wheel, "bsi-flaky", failing=1, seen=seen) as second:
            moved = RemoteFile(
                listed.filename, listed.url.replace(str(port), str(second)), listed.sha256
            )
            path = download(moved, Cache(tmp_path / "cache"), [index], retries)
    assert sha256_of(path) == listed.sha256
    statuses = [line.split()[-1] for line in seen]
    assert statuses == ["503", "503", "200", "listed", "503", "200"]
    # said and recorded as the run's registry retries are, as an index's, in the same budget
    assert [line.split(" (try")[0] for line in lines] == [
        f"note: index 127.0.0.1:{port} answered 503 to GET /simple/bsi-flaky/",
        f"note: index 127.0.0.1:{port} answered 503 to GET /simple/bsi-flaky/",
        f"note: index 127.0.0.1:{second} answered 503 to GET /files/{wheel.name}",
    ]
    assert [(one["service"], one["try"]) for one in retries.to_list()] == [
        ("index", 1),
        ("index", 2),
        ("index", 1),
    ]
    assert retries.spent == 0  # an index's faults are bounded by their tries, not the budget


def test_a_file_that_never_matches_its_lock_is_fetched_again_then_refused(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "w", "bsi-flaky", "1.0", "py3-none-any", {"bsi_flaky.py": b"x"})
    seen: list[str] = []
    with serve_wheel(wheel, "bsi-flaky", seen=seen) as port:
        url = f"http://127.0.0.1:{port}/files/{wheel.name}"
        wrong = RemoteFile(wheel.name, url, "0" * 64)
        with pytest.raises(UserError, match=f"{wheel.name}: sha256 .* does not match the lock"):
            download(wrong, Cache(tmp_path / "cache"))
    assert len(seen) == POLICY.tries


def test_an_index_s_timeouts_do_not_spend_the_registry_s_budget() -> None:
    """Eight downloads timing out together must not leave the registry no budget: an index's
    faults are bounded by their tries; the same faults of a registry by the budget."""
    clock = [0.0]
    retries = Retries(clock=lambda: clock[0], sleep=lambda seconds: None)
    tries: list[int] = []

    def times_out() -> None:
        tries.append(1)
        clock[0] += 60.0  # a read timeout
        raise TimeoutError("timed out")

    with pytest.raises(TimeoutError):
        retried(times_out, "https://pypi.example/simple/six/", retries)
    assert len(tries) == POLICY.tries and retries.spent == 0
    assert [one.service for one in retries.record] == ["index"] * (POLICY.tries - 1)
    started = clock[0]
    clock[0] += 3 * 60.0  # a registry's tries of as long spend the budget (120 s) at once
    assert not retries.again("registry.example", "GET x/blobs/y", "timed out", 1, started)


def test_what_an_index_answers_for_good_is_not_tried_again() -> None:
    calls: list[int] = []

    def missing() -> None:
        calls.append(1)
        raise urllib.error.HTTPError("http://127.0.0.1/x", 404, "Not Found", Message(), None)

    with pytest.raises(urllib.error.HTTPError):
        retried(missing, "http://127.0.0.1/x", Retries(sleep=lambda seconds: None))
    assert calls == [1]
    waits: list[float] = []

    def reset() -> None:
        calls.append(1)
        raise ConnectionResetError("reset by peer")

    with pytest.raises(INDEX_FAULTS):
        retried(reset, "http://127.0.0.1/x", Retries(sleep=waits.append))
    assert len(calls) == 1 + POLICY.tries and len(waits) == POLICY.tries - 1
    assert all(0 < wait <= POLICY.longest for wait in waits)


def test_a_dependency_against_a_base_pin_is_named_with_the_pin(tmp_path: Path) -> None:
    """uv explains such a failure release by release (hundreds of lines for boto3, whose
    botocore wants python-dateutil<3 while the base pins 4.0.0); the error is one line naming
    the dependency, what it wants and the base's pin."""
    links = tmp_path / "links"
    make_wheel(links, "bsi-dep", "4.0", "py3-none-any", {"bsi_dep.py": b""})
    for version in ("1.0", "2.0"):
        make_wheel(
            links, "bsi-app", version, "py3-none-any", {"bsi_app.py": b""}, requires=["bsi-dep<3"]
        )
    (tmp_path / "requirements.in").write_text("bsi-app\n")
    (tmp_path / "constraints.txt").write_text("bsi-dep==4.0\n")
    command = [
        UV, "pip", "compile", str(tmp_path / "requirements.in"), "--no-index",
        "--find-links", str(links), "--python-platform", AMD64.uv_platform,
        "--python-version", "3.13", "--only-binary", ":all:", "--no-header", "--quiet",
        "--constraint", str(tmp_path / "constraints.txt"), *uv_python(),
    ]  # fmt: skip
    failed = subprocess.run(
        command, capture_output=True, text=True, env=uv_environment(tmp_path / "uv-cache")
    )
    assert failed.returncode != 0
    facts = replace(shipped_facts(), distributions={"bsi-dep": "4.0"})
    error = unresolvable(failed.stderr, RequirementSet((), ()), Target(facts, (AMD64,)), AMD64)
    assert str(error) == (
        "cannot resolve for amd64: all versions of bsi-app depend on bsi-dep<3, but the base"
        " image pins"
        " bsi-dep==4.0 (its /app/deps comes first on PYTHONPATH)"
    ), failed.stderr


def test_a_uv_toml_in_the_working_directory_is_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A team's folder may hold a uv.toml (or a [tool.uv] table) that swaps the index: uv runs
    with the tool's options as its only settings. The planted config names an index that
    cannot answer; read, it would fail the compile."""
    links = tmp_path / "links"
    make_wheel(links, "bsi-a", "1.0", "py3-none-any", {"bsi_a/__init__.py": b""})
    (tmp_path / "uv.toml").write_text('[pip]\nno-index = false\nfind-links = ["/nonexistent"]\n')
    (tmp_path / "requirements.in").write_text("bsi-a\n")
    monkeypatch.chdir(tmp_path)
    command = [
        UV, "pip", "compile", "requirements.in", "--no-index", "--find-links", str(links),
        "--python-platform", AMD64.uv_platform, "--python-version", "3.13",
        "--only-binary", ":all:", "--no-header", "--no-annotate", "--quiet", *uv_python(),
    ]  # fmt: skip
    planted = {**uv_environment(tmp_path / "uv-cache")}
    planted.pop("UV_NO_CONFIG")
    read = subprocess.run(command, capture_output=True, text=True, env=planted)
    assert read.returncode != 0 and "/nonexistent" in read.stderr  # the planted file counts
    ours = subprocess.run(
        command, capture_output=True, text=True, env=uv_environment(tmp_path / "uv-cache")
    )
    assert ours.returncode == 0 and ours.stdout == "bsi-a==1.0\n", ours.stderr
