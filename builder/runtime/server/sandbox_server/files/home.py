"""The sandbox user's home, made and seeded before the server serves.

Images name a home on the writable /tmp (``HOME``, ``XDG_CACHE_HOME``, ``XDG_CONFIG_HOME``, and
``MPLCONFIGDIR`` with matplotlib) and ship caches built at image-build time, read-only, in a
seed directory (``--home-seed``). A library ignores a cache dir it cannot write even when it
holds a valid cache (matplotlib's issue 32246), so the seed is copied into the home: every
command the server runs, and any ``python3`` started beside it, finds the caches built and never
builds them again. A file already in the home (a container restarted on a kept /tmp) is left
as it is.

A sandbox run without a writable /tmp cannot have that home. Its commands then get one in
``--home-fallback`` (/dev/shm, a tmpfs Docker and Kubernetes give every container): the server
moves ``HOME`` and the directories named inside it there in its own environment, which its
commands inherit, rather than leave libraries to warn and put their caches in the current
directory, the user's workspace. A process started beside the server keeps the image's
environment (docs/contract.md). Standard library only.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import MutableMapping

# The variables that name directories inside the home: made with it, so each is writable.
DIRECTORIES = ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "MPLCONFIGDIR")


def prepare_home(environ: MutableMapping[str, str], seed: str, fallback: str = "") -> str:
    """Make ``$HOME`` (else ``fallback``, moving the home's variables in ``environ`` there) and
    the directories inside it, and copy in what ``seed`` holds; one line for the log saying what
    happened (a home that cannot be made is said, never fatal)."""
    home = environ.get("HOME", "")
    if not os.path.isabs(home) or home == "/":
        return f"home: HOME is {home or 'not set'}; nothing made"
    try:
        return f"home: {home}, {_made(environ, home, seed)} files seeded from {seed}"
    except OSError as error:
        why = f"home: {home} cannot be made ({error.strerror})"
    if fallback and fallback != home:
        moved = {
            name: fallback + value[len(home) :]
            for name, value in environ.items()
            if name == "HOME" or (name in DIRECTORIES and value.startswith(home + "/"))
        }
        try:
            copied = _made({**environ, **moved}, fallback, seed)
        except OSError as error:
            return f"{why}, nor {fallback} ({error.strerror}); libraries will warn (contract.md)"
        environ.update(moved)
        return f"{why}; commands get HOME={fallback}, {copied} files seeded from {seed}"
    return f"{why}; libraries that keep caches there will warn (docs/contract.md)"


def _made(environ: MutableMapping[str, str], home: str, seed: str) -> int:
    """Make ``home`` (0700), seed it, make the directories inside it; the files copied."""
    os.makedirs(home, mode=0o700, exist_ok=True)
    copied = _seed(seed, home) if os.path.isdir(seed) else 0
    for name in DIRECTORIES:
        inside = environ.get(name, "")
        if inside.startswith(home.rstrip("/") + "/"):
            os.makedirs(inside, mode=0o700, exist_ok=True)
    return copied


def _seed(seed: str, home: str) -> int:
    """Copy every regular file under ``seed`` that the home lacks; how many were copied."""
    copied = 0
    for root, _dirs, names in os.walk(seed):
        target = os.path.join(home, os.path.relpath(root, seed))
        os.makedirs(target, mode=0o700, exist_ok=True)
        for name in names:
            source, destination = os.path.join(root, name), os.path.join(target, name)
            if os.path.isfile(source) and not os.path.lexists(destination):
                shutil.copyfile(source, destination)
                copied += 1
    return copied
