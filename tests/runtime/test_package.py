"""The runtime server is a package directory that `python3 -I` runs as it is started in images.

What the single-file server got from being one file has to hold for the directory too: isolated
mode runs it, PYTHONPATH (the images' /app/deps) cannot shadow its modules, nothing in its
directory (``sys.path[0]``, ahead of the standard library) shadows a stdlib module, it imports
nothing but the standard library, and every module of it is small enough to read.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from support.sandboxserver import SERVER_PYTHON

from builder.runtime import SERVER, SERVER_ENTRY, SERVER_PACKAGE, copy_server

MAX_LINES = 450
MAX_MODULES = 12
PROBE = (
    "import sys; print(sys.path[0]); print(sys.flags.isolated);"
    " from sandbox_server import config; print(config.__file__)"
)


def test_the_directory_holds_the_entry_and_one_package_no_stdlib_name() -> None:
    names = {path.name for path in SERVER.iterdir() if path.name != "__pycache__"}
    assert names == {SERVER_ENTRY, SERVER_PACKAGE}
    assert SERVER_PACKAGE not in sys.stdlib_module_names
    assert (SERVER / SERVER_PACKAGE / "__init__.py").is_file()


def test_every_package_of_it_is_a_regular_one_that_says_what_it_holds() -> None:
    """Subpackages included: a directory without ``__init__.py`` would be a namespace package,
    which any directory of that name elsewhere on the path could join; each package is small
    enough to see what it holds (issue 44: at most 12 modules directly)."""
    below = (SERVER / SERVER_PACKAGE).rglob("*")
    packages = [SERVER / SERVER_PACKAGE]
    packages += [path for path in below if path.is_dir() and "__pycache__" not in path.parts]
    assert len(packages) > 1, "the server is split into subpackages by concept"
    for package in packages:
        init = package / "__init__.py"
        assert init.is_file(), f"{package} is no regular package"
        assert ast.get_docstring(ast.parse(init.read_text())), f"{init} says nothing"
        assert len(list(package.glob("*.py"))) <= MAX_MODULES, package


def test_python_isolated_runs_the_directory_and_pythonpath_cannot_shadow_it(tmp_path: Path) -> None:
    # A library directory (as /app/deps is) carrying the server's package name and a module
    # the server imports from the standard library: neither may be picked up.
    shadow = tmp_path / "deps"
    (shadow / SERVER_PACKAGE).mkdir(parents=True)
    (shadow / SERVER_PACKAGE / "__init__.py").write_text("raise SystemExit('shadowed package')\n")
    (shadow / "selectors.py").write_text("raise SystemExit('shadowed stdlib')\n")
    server = tmp_path / "server"
    copy_server(server)
    (server / SERVER_ENTRY).write_text(PROBE + "\n")  # the copy's entry, to see its path
    env = {"PYTHONPATH": str(shadow), "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [SERVER_PYTHON, "-I", str(server)], capture_output=True, text=True, env=env, check=False
    )
    assert result.returncode == 0, result.stderr
    first, isolated, config = result.stdout.splitlines()
    assert (first, isolated) == (str(server), "1")
    assert Path(config) == server / SERVER_PACKAGE / "config.py"


def test_the_real_entry_starts_the_server_with_pythonpath_set(tmp_path: Path) -> None:
    shadow = tmp_path / "deps"
    shadow.mkdir()
    for name in ("argparse.py", "socketserver.py", "json.py"):
        (shadow / name).write_text("raise SystemExit('shadowed stdlib')\n")
    result = subprocess.run(
        [SERVER_PYTHON, "-I", str(SERVER), "--help"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(shadow), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "--max-connections" in result.stdout


def test_copy_server_leaves_out_bytecode(tmp_path: Path) -> None:
    cache = SERVER / SERVER_PACKAGE / "__pycache__"
    cache.mkdir(exist_ok=True)
    (cache / "stray.cpython-311.pyc").write_bytes(b"")
    try:
        copy_server(tmp_path / "server")
    finally:
        (cache / "stray.cpython-311.pyc").unlink()
    copied = sorted(
        str(p.relative_to(tmp_path / "server")) for p in (tmp_path / "server").rglob("*")
    )
    expected = sorted(
        str(p.relative_to(SERVER)) for p in SERVER.rglob("*") if "__pycache__" not in p.parts
    )
    assert copied == expected and not any("pycache" in name for name in copied)


def test_every_module_is_small_and_imports_only_the_stdlib_or_itself() -> None:
    long, foreign = {}, set()
    for path in SERVER.rglob("*.py"):
        source = path.read_text()
        if (count := len(source.splitlines())) > MAX_LINES:
            long[str(path.relative_to(SERVER))] = count
        assert "fmt: skip" not in source, path
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                tops = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level:
                tops = {(node.module or "").split(".")[0]}
            else:
                continue
            foreign |= tops - set(sys.stdlib_module_names) - {SERVER_PACKAGE, "__future__"}
    assert not long, f"modules over {MAX_LINES} lines: {long}"
    assert not foreign, f"imports outside the standard library: {foreign}"
