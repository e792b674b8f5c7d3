"""Deep imports on a real image: a probe package whose lazily imported submodules fail in
every way verification tells apart, installed on the reference base and run hardened.

`bsi_probe` imports nothing at `import bsi_probe`; its submodules:
  jitcache  writes beside its own code at import (as numba's cache=True does): fails hardened
            only, so verification fails naming it;
  optional  needs a module the image does not hold: information, grouped under that module;
  broken    raises the same error hardened and permissive: information, listed;
  native    opens a shared library the image lacks: fails (the plan missed a need);
  hangs     never ends: given up after the per-module timeout, in both runs: information;
  skipme    would fail, but --skip-module leaves it out; tests/ is never imported.
Then its use checks: one that does the package's job passes, one that writes beside the code
fails, one marked as unable to pass hardened is listed with why, one for 2.x is not run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from packaging.specifiers import SpecifierSet
from support.images import build, docker
from support.wheelfactory import make_wheel
from support.wheelindex import serve_wheel

from builder.engines.connection import Engine
from builder.verify.deep.imports import DeepOptions
from builder.verify.deep.use import UseCheck
from builder.verify.report import Status, VerifyReport
from builder.verify.run import Installed, verify_image

PROBE = {
    "bsi_probe/__init__.py": b'"""Nothing imported here: every submodule loads lazily."""\n',
    "bsi_probe/jitcache.py": (
        b"import os\n"
        b"with open(os.path.join(os.path.dirname(__file__), 'cache.nbi'), 'wb') as f:\n"
        b"    f.write(b'index')\n"
    ),
    "bsi_probe/optional.py": b"import bsi_absent_helper\n",
    "bsi_probe/broken.py": b"raise RuntimeError('bsi-probe: broken everywhere')\n",
    "bsi_probe/native.py": b"import ctypes\nctypes.CDLL('libbsi-absent.so.7')\n",
    "bsi_probe/skipme.py": b"raise RuntimeError('bsi-probe: should have been skipped')\n",
    "bsi_probe/fine.py": b"VALUE = 42\n",
    "bsi_probe/hangs.py": b"import time\ntime.sleep(3600)\n",
    "bsi_probe/tests/__init__.py": b"",
    "bsi_probe/tests/test_probe.py": b"raise RuntimeError('tests are never imported')\n",
}


@pytest.fixture(scope="module")
def probe_image(
    reference_image: str, test_env: dict, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The reference base with the probe wheel unpacked into /app/deps-extra (as installed:
    its dist-info and RECORD), read-only and root-owned, run as 65532."""
    root = tmp_path_factory.mktemp("deep")
    wheel = make_wheel(root / "wheels", "bsi-probe", "1.0", "py3-none-any", PROBE)
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(root / "context" / "extra")
    (root / "context" / "Dockerfile").write_text(
        f"FROM {reference_image}\n"
        "COPY extra /app/deps-extra\n"
        "ENV PYTHONPATH=/app/deps:/app/deps-extra\n"
        "USER 65532:65532\n"
    )
    tag = f"bsi-deep-probe-{uuid.uuid4().hex[:8]}:test"
    docker(test_env, "build", "-q", "-t", tag, str(root / "context"))
    yield tag
    docker(test_env, "rmi", "-f", tag, check=False)


USES = (
    UseCheck(
        "bsi-probe", SpecifierSet(">=1"), "its value",
        "import bsi_probe.fine as f; assert f.VALUE == 42",
    ),
    UseCheck(
        "bsi-probe", SpecifierSet(""), "its cache",
        "import bsi_probe, os; open(os.path.dirname(bsi_probe.__file__) + '/c', 'w')",
    ),
    UseCheck("bsi-probe", SpecifierSet(""), "its model", why_not_hardened="it downloads a model"),
    UseCheck("bsi-probe", SpecifierSet(">=2"), "a later API", "raise SystemExit(3)"),
    UseCheck("not-installed", SpecifierSet(""), "absent", "raise SystemExit(3)"),
)  # fmt: skip


@pytest.fixture(scope="module")
def probe_report(probe_image: str, docker_client: Any) -> VerifyReport:
    installed = Installed(
        distributions=["bsi-probe"],
        deep=DeepOptions(skip=("bsi_probe.skipme",), uses=USES, module_timeout=4),
    )
    return verify_image(probe_image, installed=installed, engine=Engine.local(docker_client))


def lines(report: VerifyReport) -> dict[str, tuple[Status, str]]:
    return {check.name: (report.status(check), check.detail) for check in report.checks}


def test_a_submodule_writing_beside_its_code_fails_verification_naming_it(
    probe_report: VerifyReport,
) -> None:
    found = lines(probe_report)
    status, detail = found["deep-import bsi_probe.jitcache"]
    assert status is Status.FAIL
    assert detail.startswith("fails only in the hardened sandbox: ")
    assert "Read-only file system" in detail and "as root, writable, it imports" in detail
    assert not probe_report.passed
    failed = {check.name for check in probe_report.failed}
    assert failed == {
        "deep-imports",
        "deep-import bsi_probe.jitcache",
        "deep-import bsi_probe.native",
        "use bsi-probe #2",
    }


def test_a_missing_native_library_fails_as_a_need_the_plan_missed(
    probe_report: VerifyReport,
) -> None:
    status, detail = lines(probe_report)["deep-import bsi_probe.native"]
    assert status is Status.FAIL
    assert detail.startswith("a native library cannot be opened (the plan missed a need): ")
    assert "libbsi-absent.so.7" in detail


def test_an_absent_module_and_a_failure_everywhere_are_information(
    probe_report: VerifyReport,
) -> None:
    found = lines(probe_report)
    assert found["absent bsi_absent_helper"] == (
        Status.INFO,
        "not in the image; needed by 1: bsi_probe.optional",
    )
    status, detail = found["deep-import bsi_probe.broken"]
    assert status is Status.INFO
    assert detail == (
        "fails the same way hardened and permissive: RuntimeError: bsi-probe: broken everywhere"
    )
    assert "deep-import bsi_probe.optional" not in found
    assert found["deep-import bsi_probe.hangs"] == (
        Status.INFO,
        "fails the same way hardened and permissive: the import did not end within 4 s",
    )


def test_the_report_counts_per_distribution_and_says_what_was_skipped(
    probe_report: VerifyReport,
) -> None:
    (figures,) = probe_report.deep
    # bsi_probe, fine imported; jitcache, native failed; optional, broken, hangs for information
    assert (figures.distribution, figures.imported, figures.failed) == ("bsi-probe", 2, 2)
    assert (figures.informational, figures.unreached, figures.skipped) == (3, 0, 1)
    status, detail = lines(probe_report)["deep-imports"]
    assert status is Status.FAIL
    assert detail.startswith("2 of 7 modules of 1 distributions imported, 2 failed, 3 info")
    assert "1 skipped by --skip-module bsi_probe.skipme" in detail
    record = probe_report.to_dict()
    assert record["deep_imports"][0]["failed"] == 2
    assert (
        "deep imports of 1 distributions: 2 modules imported, 2 failed, 3 informational"
        in (probe_report.table().splitlines()[-1])
    )


def test_strict_turns_information_into_failures(probe_report: VerifyReport) -> None:
    strict = VerifyReport(probe_report.image, probe_report.checks, strict=True)
    failed = {check.name for check in strict.failed}
    assert {"absent bsi_absent_helper", "deep-import bsi_probe.broken"} <= failed


def test_use_checks_run_for_the_release_installed_and_say_why_one_cannot(
    probe_report: VerifyReport,
) -> None:
    found = {name: line for name, line in lines(probe_report).items() if name.startswith("use")}
    assert found["use bsi-probe #1"] == (Status.PASS, "1.0: its value: done")
    status, detail = found["use bsi-probe #2"]
    assert status is Status.FAIL and detail.startswith("1.0: its cache; it failed (exit 1): ")
    assert "Read-only file system" in detail
    assert found["use bsi-probe #3"] == (
        Status.INFO,
        "1.0: not run: cannot pass in a hardened sandbox: it downloads a model",
    )
    assert len(found) == 3  # the 2.x check and the absent distribution's are not run


def test_verify_r_runs_deep_imports_and_skips_what_it_is_told(
    probe_image: str, shared_cache: Path, package_index: str, tmp_path: Path
) -> None:
    """The command line: `verify -r FILE --skip-module PATTERN --json` on the probe image."""
    wheel = make_wheel(tmp_path / "wheels", "bsi-probe", "1.0", "py3-none-any", PROBE)
    with serve_wheel(wheel, "bsi-probe") as port:
        requirements = tmp_path / "requirements.txt"
        requirements.write_text(f"--extra-index-url http://127.0.0.1:{port}/simple\nbsi-probe\n")
        result = subprocess.run(
            [sys.executable, "-m", "builder", "verify", probe_image, "-r", str(requirements),
             "--skip-module", "bsi_probe.skipme", "--skip-module", "bsi_probe.nat*",
             "--skip-module", "bsi_probe.hangs", "--json"],
            capture_output=True, text=True, timeout=900,
            env={**os.environ, "BSI_CACHE_DIR": str(shared_cache)},
        )  # fmt: skip
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    record = json.loads(result.stdout)
    statuses = {check["name"]: check["status"] for check in record["checks"]}
    assert statuses["deep-import bsi_probe.jitcache"] == "fail"
    assert "deep-import bsi_probe.native" not in statuses
    assert statuses["absent bsi_absent_helper"] == "info"
    assert record["deep_imports"] == [
        {"distribution": "bsi-probe", "imported": 2, "failed": 1, "informational": 2,
         "unreached": 0, "skipped": 3, "seconds": record["deep_imports"][0]["seconds"]}
    ]  # fmt: skip
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: verification of {probe_image} failed: deep-imports, deep-import bsi_probe.jitcache"
    )


def test_verify_r_reads_a_private_distribution_from_the_image(
    probe_image: str, shared_cache: Path, package_index: str, tmp_path: Path
) -> None:
    """`bsi-probe` is on no index (nothing serves it here): the image holds it, and its modules
    are read from the image's own dist-info and deep-imported all the same."""
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("bsi-probe\n")
    result = subprocess.run(
        [sys.executable, "-m", "builder", "verify", probe_image, "-r", str(requirements),
         "--skip-module", "bsi_probe.skipme", "--skip-module", "bsi_probe.nat*",
         "--skip-module", "bsi_probe.hangs", "--json"],
        capture_output=True, text=True, timeout=900,
        env={**os.environ, "BSI_CACHE_DIR": str(shared_cache)},
    )  # fmt: skip
    assert "no such distribution" not in result.stderr, result.stderr[-2000:]
    record = json.loads(result.stdout)
    statuses = {check["name"]: check["status"] for check in record["checks"]}
    assert statuses["deep-import bsi_probe.jitcache"] == "fail"
    assert record["deep_imports"] == [
        {"distribution": "bsi-probe", "imported": 2, "failed": 1, "informational": 2,
         "unreached": 0, "skipped": 3, "seconds": record["deep_imports"][0]["seconds"]}
    ]  # fmt: skip


def test_skip_module_without_requirements_is_refused(probe_image: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "builder", "verify", probe_image, "--skip-module", "x.*"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        "error: --skip-module needs -r FILE: deep imports follow its distributions"
    ]
    assert result.stdout == ""


def test_a_build_verifies_every_module_of_what_it_was_asked_for(
    reference_image: str, shared_cache: Path, package_index: str, test_env: dict, tmp_path: Path
) -> None:
    """The build's own verification imports every module of the requested distributions: the
    probe's image fails it naming the submodules the sandbox breaks; skipping them (as an
    operator who accepts them would) passes it, the skips on record in report.json."""
    wheel = make_wheel(tmp_path / "wheels", "bsi-probe", "1.0", "py3-none-any", PROBE)
    tag = f"bsi-deep-build-{uuid.uuid4().hex[:8]}:test"
    skips = ("--skip-module", "bsi_probe.hangs", "--skip-module", "bsi_probe.skipme")
    accepted = ("--skip-module", "bsi_probe.jitcache", "--skip-module", "bsi_probe.nat*")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    try:
        with serve_wheel(wheel, "bsi-probe") as port:
            index = f"--extra-index-url http://127.0.0.1:{port}/simple\nbsi-probe\n"
            failed = build(tmp_path / "a", shared_cache, reference_image, index, tag, *skips)
            passed = build(
                tmp_path / "b", shared_cache, reference_image, index, tag, *skips, *accepted
            )
    finally:
        docker(test_env, "rmi", "-f", tag, check=False)
    assert failed.returncode == 1, failed.stdout[-3000:] + failed.stderr[-2000:]
    failures = [line for line in failed.stdout.splitlines() if line.startswith("FAIL")]
    assert any("deep-import bsi_probe.jitcache" in line for line in failures), failures
    assert any("deep-import bsi_probe.native" in line for line in failures), failures
    assert "deep-import bsi_probe.jitcache" in failed.stderr.strip().splitlines()[-1]
    assert passed.returncode == 0, passed.stdout[-3000:] + passed.stderr[-2000:]
    report = json.loads((tmp_path / "b" / "context" / "report.json").read_text())
    deep = report["image"]["verification"]["deep_imports"]
    assert [(d["distribution"], d["imported"], d["failed"], d["skipped"]) for d in deep] == [
        ("bsi-probe", 2, 0, 4)
    ]
