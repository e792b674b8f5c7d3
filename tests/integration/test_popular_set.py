"""A code interpreter's popular set (examples/popular-requirements.txt: librosa on numba,
matplotlib, plotly exporting through kaleido and Chromium, scikit-learn, OpenCV, nltk, ...)
built for amd64 on the reference base and verified by the build itself: every module of every
requested distribution imported hardened (deep imports: librosa's submodules, which
`import librosa` leaves unloaded, among them) and each one's use checks run. None fails: what
fails is information (a backend for a toolkit the image lacks, a module asking for data it
would download), listed, and a check that cannot pass hardened says why.

Then plotly and kaleido without Chromium (--without-program chromium): every import passes,
kaleido's use check is listed as not run and why, and `verify -r` of that image, which expects
Chromium, fails the check, naming it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.images import Built, build, docker
from support.machine import SESSION

from builder.resolve.requirements import distribution_names

pytestmark = pytest.mark.usefixtures("docker_client", "package_index")

POPULAR = Path(__file__).resolve().parents[2] / "examples" / "popular-requirements.txt"
TAG = f"bsi-popular/set-{SESSION}:test"
USED = ("librosa", "soundfile", "matplotlib", "plotly", "kaleido", "scikit-learn", "scipy",
        "opencv-python-headless", "pillow", "lxml", "openpyxl", "python-docx", "pypdf")  # fmt: skip


@pytest.fixture(scope="module")
def popular(
    reference_image: str,
    shared_cache: Path,
    test_env: dict,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Built]:
    """One CLI run: plan, build (Chromium and libsndfile from Debian) and verify the set."""
    tmp_path = tmp_path_factory.mktemp("popular")
    result = build(
        tmp_path, shared_cache, reference_image, POPULAR.read_text(), TAG, "--arch", "amd64"
    )
    report_path = tmp_path / "context" / "report.json"
    yield Built(TAG, result, json.loads(report_path.read_text()) if report_path.exists() else {})
    docker(test_env, "rmi", "-f", TAG, check=False)


def statuses(built: Built) -> dict[str, str]:
    checks = built.report["image"]["verification"]["checks"]
    return {check["name"]: check["status"] for check in checks}


def test_every_module_of_the_set_imports_in_the_sandbox(popular: Built) -> None:
    assert popular.result.returncode == 0, popular.result.stdout[-4000:] + popular.result.stderr
    assert popular.report["image"]["verification"]["passed"] is True
    installed = {p["name"] for p in popular.report["architectures"]["amd64"]["packages"]}
    deep = {d["distribution"]: d for d in popular.report["image"]["verification"]["deep_imports"]}
    assert set(deep) == set(distribution_names(POPULAR)) & installed
    assert all(d["failed"] == 0 and d["unreached"] == 0 for d in deep.values()), deep
    # import librosa loads none of its submodules; the deep imports load them all
    assert deep["librosa"]["imported"] >= 30 and deep["plotly"]["imported"] >= 1000, deep
    summary = next(line for line in popular.result.stdout.splitlines() if "deep imports of" in line)
    assert f"deep imports of {len(deep)} distributions" in summary and " 0 failed" in summary


def test_each_librarys_use_check_passes_hardened(popular: Built) -> None:
    """librosa loads and analyses a generated WAV (numba compiling into HOME's cache),
    matplotlib saves a PNG, kaleido exports one through Chromium, ..."""
    found = statuses(popular)
    assert {name: found.get(f"use {name}") for name in USED} == dict.fromkeys(USED, "pass")
    assert found["use nltk #2"] == "info"  # word_tokenize needs data it would download
    assert not [line for line in popular.result.stdout.splitlines() if line.startswith("FAIL")]


def test_without_chromium_kaleidos_use_check_is_listed_and_fails_where_it_is_expected(
    reference_image: str, shared_cache: Path, test_env: dict, tmp_path: Path
) -> None:
    """Left out on purpose (--without-program chromium), kaleido's use check is not run and
    says why; the same image verified as if Chromium were in it fails that check, naming it."""
    tag = f"bsi-popular/no-chromium-{SESSION}:test"
    requirements = tmp_path / "requirements.txt"  # what `build` writes
    try:
        result = build(
            tmp_path, shared_cache, reference_image, "plotly\nkaleido\n", tag,
            "--arch", "amd64", "--without-program", "chromium",
        )  # fmt: skip
        verified = subprocess.run(
            [sys.executable, "-m", "builder", "verify", tag, "-r", str(requirements)],
            capture_output=True, text=True, timeout=900,
            env={**os.environ, "BSI_CACHE_DIR": str(shared_cache)},
        )  # fmt: skip
    finally:
        docker(test_env, "rmi", "-f", tag, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("PASS  import kaleido") for line in lines)
    (use,) = [line for line in lines if line.split()[1:3] == ["use", "kaleido"]]
    assert use.startswith("INFO") and "not run: it needs chromium, left out" in use, use
    assert verified.returncode == 1, verified.stdout[-3000:] + verified.stderr
    failed = [line for line in verified.stdout.splitlines() if line.startswith("FAIL")]
    assert any(line.split()[1:3] == ["use", "kaleido"] for line in failed), failed
    assert "use kaleido" in verified.stderr.strip().splitlines()[-1]
