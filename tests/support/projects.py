"""Small pure-Python projects and git repositories holding them, for direct-requirement tests.

Each project carries its own in-tree PEP 517 backend (no build requirement), so building it
needs no index: a test with `--no-index` builds it as it would with one.
"""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

BACKEND = '''"""A PEP 517 backend in the tree: zips the packages beside it into a pure wheel."""
import base64, hashlib, pathlib, tomllib, zipfile

def _record(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    root = pathlib.Path(".")
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    name, version = project["name"].replace("-", "_"), project["version"]
    info = f"{name}-{version}.dist-info"
    files = {
        str(path): path.read_bytes()
        for package in sorted(root.iterdir())
        if (package / "__init__.py").is_file()
        for path in sorted(package.rglob("*.py"))
    }
    files[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\\nName: {project['name']}\\nVersion: {version}\\n"
    ).encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"
    record = "".join(f"{p},{_record(d)},{len(d)}\\n" for p, d in files.items())
    files[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\\n").encode()
    filename = f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(pathlib.Path(wheel_directory) / filename, "w") as wheel:
        for path, data in files.items():
            wheel.writestr(zipfile.ZipInfo(path, (1980, 1, 1, 0, 0, 0)), data)
    return filename
'''


def pure_project(root: Path, name: str, version: str, module: str, body: str) -> Path:
    """A project directory building the wheel `name`-`version` with the package `module`."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text(
        f'[project]\nname = "{name}"\nversion = "{version}"\n\n[build-system]\nrequires = []\n'
        'build-backend = "tinybackend"\nbackend-path = ["."]\n'
    )
    (root / "tinybackend.py").write_text(BACKEND)
    (root / module).mkdir(exist_ok=True)
    (root / module / "__init__.py").write_text(body)
    return root


def git(repository: Path, *arguments: str) -> str:
    """Run git in `repository` as a test author; its output."""
    author = ("-c", "user.name=test", "-c", "user.email=test@example.invalid")
    command = ["git", *author, "-C", str(repository), *arguments]
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip()


def commit_all(repository: Path, message: str) -> str:
    """Commit everything in `repository`; the new commit's id."""
    git(repository, "add", "-A")
    git(repository, "commit", "--quiet", "-m", message)
    return git(repository, "rev-parse", "HEAD")


def tagged_repository(root: Path, subdirectory: str = "") -> tuple[Path, str]:
    """A repository holding the pure project `bsi-gitpkg` 1.0 (in `subdirectory`) tagged
    `v1.0` on the branch `main`; the repository and the tagged commit."""
    root.mkdir(parents=True)
    subprocess.run(["git", "init", "--quiet", "-b", "main", str(root)], check=True)
    pure_project(root / subdirectory, "bsi-gitpkg", "1.0", "bsi_gitpkg", "ORIGIN = 'git'\n")
    commit = commit_all(root, "bsi-gitpkg 1.0")
    git(root, "tag", "-a", "v1.0", "-m", "release 1.0")  # annotated: ls-remote peels it
    return root, commit


def pure_sdist(directory: Path, name: str, version: str, module: str, body: str) -> Path:
    """An sdist (`<name>-<version>.tar.gz`) of a `pure_project`, as an index or a wheelhouse
    would hold it."""
    stem = f"{name.replace('-', '_')}-{version}"
    project = pure_project(directory / "src" / stem, name, version, module, body)
    (project / "PKG-INFO").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    sdist = directory / f"{stem}.tar.gz"
    with tarfile.open(sdist, "w:gz") as archive:
        archive.add(project, arcname=stem)
    return sdist
