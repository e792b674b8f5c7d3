"""pip's hash-checking mode for a distribution that has only an sdist.

The sdist is built into a wheel on the host, but `--hash` names the file the index serves: the
sdist. Its hash must pass (the built wheel stays pinned by its own sha256 in the lock), and a
wrong one must fail in one line naming the requirement and both hashes, also when the
resolution is reused from the cache.
"""

from __future__ import annotations

import hashlib
import io
import re
import tarfile
from pathlib import Path

import pytest
from support.clirun import assert_one_error_line, requirements, run
from support.wheelindex import serve_wheel

from builder.errors import UserError
from builder.resolve.requirements import read_requirements
from builder.resolve.resolution import RemoteFile

PROJECT = "bsi-sdist-only"
SDIST_FILES = {
    "pyproject.toml": (
        '[build-system]\nrequires = ["flit_core>=3.4,<4"]\n'
        'build-backend = "flit_core.buildapi"\n\n'
        f'[project]\nname = "{PROJECT}"\nversion = "1.0"\ndescription = "sdist only"\n'
    ),
    "bsi_sdist_only/__init__.py": "VALUE = 1\n",
    "PKG-INFO": f"Metadata-Version: 2.1\nName: {PROJECT}\nVersion: 1.0\n",
}


def make_sdist(directory: Path) -> Path:
    """A pure-Python sdist (flit_core builds it), deterministic so its sha256 is stable."""
    path = directory / "bsi_sdist_only-1.0.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for name, text in SDIST_FILES.items():
            data = text.encode()
            info = tarfile.TarInfo(f"bsi_sdist_only-1.0/{name}")
            info.size, info.mtime = len(data), 1_700_000_000
            archive.addfile(info, io.BytesIO(data))
    return path


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_built_wheel_is_checked_by_its_sdist(tmp_path: Path) -> None:
    sdist_sha, wheel_sha, wrong = "a" * 64, "b" * 64, "c" * 64
    sdist = RemoteFile("bsi_sdist_only-1.0.tar.gz", "https://x/s.tar.gz", sdist_sha)
    built = RemoteFile(
        "bsi_sdist_only-1.0-py3-none-any.whl", "file:///w.whl", wheel_sha, built_from=sdist
    )
    good = tmp_path / "good.txt"
    good.write_text(f"{PROJECT}==1.0 --hash=sha256:{sdist_sha}\n")
    read_requirements([good]).check_hashes([built])
    bad = tmp_path / "bad.txt"
    bad.write_text(f"{PROJECT}==1.0 --hash=sha256:{wrong}\n")
    for files in ([built], [sdist]):  # after resolving, and before building
        with pytest.raises(UserError) as caught:
            read_requirements([bad]).check_hashes(files)
        message = str(caught.value)
        assert message.startswith(f"{PROJECT}==1.0: the sdist bsi_sdist_only-1.0.tar.gz")
        assert f"sha256:{sdist_sha}" in message and f"sha256:{wrong}" in message


@pytest.mark.usefixtures("package_index")  # uv fetches the sdist's build backend (flit_core)
def test_sdist_hash_through_the_cli(tmp_path: Path) -> None:
    sdist = make_sdist(tmp_path)
    sdist_sha, wrong = _sha256(sdist), "0" * 64
    with serve_wheel(sdist, PROJECT) as port:
        index = f"--index-url http://127.0.0.1:{port}/simple\n"

        def hashed(digest: str) -> str:
            """The requirements file asking for the sdist-only project with `digest`."""
            return requirements(
                tmp_path, f"{index}{PROJECT}==1.0 --hash=sha256:{digest}\n".encode()
            )

        # A wrong hash is refused before the sdist is downloaded and its build backend runs.
        line = assert_one_error_line(run(tmp_path, "-r", hashed(wrong), "--output", "out"))
        assert line.startswith(f"error: {PROJECT}==1.0:")
        assert {sdist_sha, wrong} <= set(re.findall(r"sha256:([0-9a-f]{64})", line))
        fetched = [p.name for p in (tmp_path / "cache").rglob("*") if p.suffix in {".gz", ".whl"}]
        assert fetched == [], f"a refused sdist was fetched or built: {fetched}"

        result = run(tmp_path, "-r", hashed(sdist_sha), "--output", "out")
        assert result.returncode == 0, result.stderr
        lock = (tmp_path / "out" / "requirements-amd64.lock").read_text()
        pinned = re.findall(rf"^{PROJECT}==1\.0 --hash=sha256:([0-9a-f]{{64}})", lock, re.M)
        assert pinned and pinned[0] != sdist_sha  # the lock pins the wheel built here
        built = list((tmp_path / "cache" / "blobs").glob(f"*/{pinned[0]}/*.whl"))
        assert len(built) == 1 and _sha256(built[0]) == pinned[0]

        # The resolution is reused from the cache now: the sdist's hash is still the one checked.
        line = assert_one_error_line(run(tmp_path, "-r", hashed(wrong), "--output", "out"))
        digests = set(re.findall(r"sha256:([0-9a-f]{64})", line))
        assert {sdist_sha, wrong, pinned[0]} == digests
