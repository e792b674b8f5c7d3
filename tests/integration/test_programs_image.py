"""Programs the code runs, in a real image: pdf2image + pytesseract built and verified by the
tool get poppler-utils and tesseract-ocr, and work read-only as uid 65532; the same set without
poppler-utils (a hand-written image) fails `verify -r` naming pdf2image, pdftoppm, poppler-utils.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.images import build, docker, run_hardened

from builder.plan.debian import program_table

pytestmark = pytest.mark.usefixtures("docker_client", "package_index")

REQUIREMENTS = "pdf2image\npytesseract\n"
TAG = "bsi-programs/ocr:test"
CONTROL = "bsi-programs/no-poppler:test"


@pytest.fixture(scope="module")
def built(
    reference_image: str, shared_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> subprocess.CompletedProcess[str]:
    """One CLI run: plan, build (apt of poppler-utils and tesseract-ocr), verify."""
    tmp_path = tmp_path_factory.mktemp("programs")
    return build(tmp_path, shared_cache, reference_image, REQUIREMENTS, TAG, "--arch", "amd64")


def test_the_build_installs_and_verifies_both_programs(
    built: subprocess.CompletedProcess[str],
) -> None:
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr
    out = built.stdout
    assert "runs pdftoppm -> poppler-utils" in out and "runs tesseract -> tesseract-ocr" in out
    assert "apt packages: poppler-utils tesseract-ocr (with their dependencies: " in out
    (sbom,) = [line for line in out.splitlines() if line.startswith(("PASS  sbom", "FAIL  sbom"))]
    assert sbom.startswith("PASS") and "not compared" not in sbom  # every dpkg package in it
    for program in ("pdftoppm", "pdfinfo", "tesseract"):
        assert f"PASS  program {program}" in out
    checks = [line for line in out.splitlines() if line.startswith("PASS  check ")]
    assert len(checks) == 2, out  # the curated pdf2image and pytesseract lines


def test_the_planned_apt_size_is_the_apt_layers(
    built: subprocess.CompletedProcess[str],
    test_env: dict,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The plan's Installed-Size sum against the size of the layer apt wrote (dpkg's own files
    and the ld.so cache on top, nothing removed)."""
    assert built.returncode == 0, built.stderr
    report = next(tmp_path_factory.getbasetemp().glob("programs*/context/report.json"))
    planned = json.loads(report.read_text())["architectures"]["amd64"]["apt_installed_size"]
    history = docker(test_env, "history", "--no-trunc", "--human=false", "--format",
                     "{{.Size}}\t{{.CreatedBy}}", TAG).stdout  # fmt: skip
    (layer,) = [
        int(line.split("\t")[0]) for line in history.splitlines() if "poppler-utils" in line
    ]
    assert 0.8 < layer / planned < 1.25, (layer, planned)


def test_converts_a_pdf_and_answers_the_tesseract_version_hardened(
    built: subprocess.CompletedProcess[str], test_env: dict
) -> None:
    assert built.returncode == 0, built.stderr
    convert = program_table().entries["pdf2image"].check
    assert convert is not None
    code = (
        f"{convert}\nimport os, pytesseract\n"
        "print(os.getuid(), pages[0].size, pytesseract.get_tesseract_version())"
    )
    result = run_hardened(test_env, TAG, code)
    assert result.returncode == 0, result.stderr
    uid, rest = result.stdout.split(" ", 1)
    assert uid == "65532" and rest.startswith("(72, 72) ")


def test_verify_of_an_image_without_poppler_names_who_needs_it(
    built: subprocess.CompletedProcess[str], test_env: dict, tmp_path: Path
) -> None:
    """The control: the same image with poppler-utils removed by a hand-written Dockerfile."""
    assert built.returncode == 0, built.stderr
    (tmp_path / "Dockerfile").write_text(
        f"FROM {TAG}\nUSER 0:0\nRUN dpkg --purge poppler-utils\nUSER 65532:65532\n"
    )
    docker(test_env, "build", "-q", "-t", CONTROL, str(tmp_path))
    requirements = tmp_path / "requirements.txt"
    requirements.write_text(REQUIREMENTS)
    result = subprocess.run(
        [sys.executable, "-m", "builder", "verify", CONTROL, "-r", str(requirements)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 1
    failed = [line for line in result.stdout.splitlines() if line.startswith("FAIL  program ")]
    assert any(
        "pdf2image==" in line and "pdftoppm" in line and "poppler-utils" in line for line in failed
    ), result.stdout
    assert "PASS  program tesseract" in result.stdout
    assert "program pdftoppm" in result.stderr  # the one error line names the failed checks
    left_out = subprocess.run(
        [sys.executable, "-m", "builder", "verify", CONTROL, "-r", str(requirements),
         "--without-program", "poppler-utils"],
        capture_output=True,
        text=True,
        timeout=900,
    )  # fmt: skip
    assert "left out (without-programs): pdf2image==" in left_out.stdout
    assert not any(line.startswith("FAIL  program ") for line in left_out.stdout.splitlines())
