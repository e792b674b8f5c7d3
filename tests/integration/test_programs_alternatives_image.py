"""A program only Debian's alternatives provide, in a real image: tabula-py runs `java`, which
no package ships under that name (openjdk links /usr/bin/java through update-alternatives); the
plan installs default-jre-headless for it, and the built image has `java` on PATH, verified and
started read-only as uid 65532. python-gnupg beside it runs gpg, a default stored on its GPG
object (`gpgbinary='gpg'`), and gets it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from support.images import build, run_hardened

pytestmark = pytest.mark.usefixtures("docker_client", "package_index")

TAG = "bsi-programs/java-gpg:test"


@pytest.fixture(scope="module")
def built(
    reference_image: str, shared_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> subprocess.CompletedProcess[str]:
    """One CLI run: plan, build (apt of default-jre-headless and gpg), verify."""
    tmp_path = tmp_path_factory.mktemp("alternatives")
    requirements = "tabula-py\npython-gnupg\n"
    return build(tmp_path, shared_cache, reference_image, requirements, TAG, "--arch", "amd64")


def test_java_an_alternatives_link_is_installed_and_verified(
    built: subprocess.CompletedProcess[str],
) -> None:
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr
    out = built.stdout
    assert "runs java -> default-jre-headless" in out and "runs gpg -> gpg" in out
    assert "apt packages: default-jre-headless gpg (with their dependencies: " in out
    assert "PASS  program java" in out and "PASS  program gpg" in out


def test_both_programs_run_hardened(
    built: subprocess.CompletedProcess[str], test_env: dict
) -> None:
    assert built.returncode == 0, built.stderr
    code = (
        "import os, shutil, subprocess, tempfile, gnupg\n"
        "java = subprocess.run(['java', '-version'], capture_output=True, text=True, check=True)\n"
        "gpg = gnupg.GPG(gnupghome=tempfile.mkdtemp())\n"
        "print(os.getuid(), os.path.realpath(shutil.which('java')), gpg.version is not None,"
        " java.stderr.split()[0])"
    )
    result = run_hardened(test_env, TAG, code)
    assert result.returncode == 0, result.stderr
    uid, java, gpg, vendor = result.stdout.split()
    assert uid == "65532" and java.startswith("/usr/lib/jvm/") and java.endswith("/bin/java")
    assert gpg == "True" and vendor == "openjdk", result.stdout
