"""Build a rendered context with BuildKit on the local engine.

Uses the docker CLI because the engine API's build endpoint is the legacy builder, which
has no secrets and no RUN --mount. Progress streams to the terminal as it happens; on
failure the build's own error is raised and nothing is tagged (docker tags only on success).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from builder.errors import UserError

# Debian's docker.io CLI builds with BuildKit via DOCKER_BUILDKIT=1; a newer standalone
# CLI earlier on PATH may insist on buildx instead, so prefer the engine's own.
PREFERRED_CLI = Path("/usr/bin/docker")


def docker_cli() -> str:
    explicit = os.environ.get("BSI_DOCKER")
    if explicit:
        return explicit
    if PREFERRED_CLI.exists():
        return str(PREFERRED_CLI)
    found = shutil.which("docker")
    if not found:
        raise UserError("docker: no docker CLI found (set BSI_DOCKER to its path)")
    return found


def build_image(
    context: Path,
    *,
    tag: str | None = None,
    platform: str | None = None,
    dockerfile: Path | None = None,
    build_args: Mapping[str, str] | None = None,
    secrets: Mapping[str, Path] | None = None,
    log: TextIO = sys.stderr,
) -> str:
    """Build `context` and return the image id; secrets are BuildKit secrets (id -> file)."""
    command = [docker_cli(), "build", "--progress=plain"]
    if tag:
        command += ["--tag", tag]
    if platform:
        command += ["--platform", platform]
    if dockerfile:
        command += ["--file", str(dockerfile)]
    for key, value in (build_args or {}).items():
        command += ["--build-arg", f"{key}={value}"]
    for secret_id, path in (secrets or {}).items():
        if not path.is_file():
            raise UserError(f"{path}: secret {secret_id!r} is not a readable file")
        command += ["--secret", f"id={secret_id},src={path}"]
    with tempfile.TemporaryDirectory(prefix="bsi-build-") as temp:
        iidfile = Path(temp) / "iid"
        command += ["--iidfile", str(iidfile), str(context)]
        tail: deque[str] = deque(maxlen=15)
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "DOCKER_BUILDKIT": "1"},
        )
        assert process.stdout is not None
        for line in process.stdout:
            log.write(line)
            tail.append(line.rstrip())
        if process.wait() != 0 or not iidfile.exists():
            errors = [line for line in tail if "error" in line.lower()] or list(tail)[-3:]
            raise UserError(f"docker build of {context} failed: {errors[-1] if errors else '?'}")
        return iidfile.read_text().strip()
