"""What runs inside every image: the sandbox runtime server and the reference base's Dockerfile.

The server (``server/``) is a package directory, copied as one unit to /opt/sandbox/server and
started as ``python3 -I /opt/sandbox/server``. Python runs a directory holding ``__main__.py``
with that directory as ``sys.path[0]``, even in isolated mode, so the server can be a package of
small modules (the protocol, admission, the execution of commands, files, the routes) and still
be started with ``-I``: PYTHONPATH (/app/deps, /app/deps-extra) and the user's site-packages
stay off its path, so no library can shadow its modules, while the commands it runs still
inherit PYTHONPATH. Because ``sys.path[0]`` comes before the standard library, the directory
holds ``__main__.py`` and one uniquely named package (``sandbox_server``) and nothing else: no
file there can shadow a stdlib module (tests/runtime/test_package.py checks both).

A directory rather than a zipapp: the image stores it as plain root-owned read-only files that
an operator can read with ``cat`` in a running sandbox, the base's build context needs no zip
made reproducibly (fixed timestamps and order), and nothing is lost: neither form can cache
bytecode where the sandbox user cannot write, so both compile the modules at start-up, as the
single-file server always did.
"""

from __future__ import annotations

import shutil
from pathlib import Path

SERVER = Path(__file__).resolve().parent / "server"
SERVER_ENTRY = "__main__.py"
SERVER_PACKAGE = "sandbox_server"


def copy_server(destination: Path, source: Path = SERVER) -> None:
    """Copy the server's source files (no bytecode caches) to `destination`, a new directory:
    the one unit a Dockerfile copies to /opt/sandbox/server. `source` is another server
    directory to copy the same way (the tests may run an older one)."""
    shutil.copytree(
        source,
        destination,
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
        copy_function=shutil.copyfile,
    )
