"""Build a rendered context with BuildKit, on the local engine or an arch's own.

Uses the docker CLI because the engine API's build endpoint is the legacy builder, which
has no secrets and no RUN --mount. Progress streams to the terminal as it happens; on
failure the build's own error is raised and nothing is tagged (docker tags only on success).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from builder.credentials import Credentials, config_path, from_environment, server_url
from builder.engines.connection import Engine
from builder.errors import UserError
from builder.oci.name import ImageRef

# Debian's docker.io CLI builds with BuildKit via DOCKER_BUILDKIT=1; a newer standalone
# CLI earlier on PATH may insist on buildx instead, so prefer the engine's own.
PREFERRED_CLI = Path("/usr/bin/docker")
# What selects the CLI's engine: replaced as a whole when a build runs on an arch's engine.
ENGINE_VARIABLES = ("DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH")


class Log(Protocol):
    """Where build progress goes: a text stream, or anything with `write`. The CLI passes its
    stderr; nothing below it picks a stream itself."""

    def write(self, text: str, /) -> int: ...


class Discard:
    """A `Log` that keeps nothing: for a library caller that gave no log."""

    def write(self, text: str, /) -> int:
        return len(text)


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


def base_logins(base: ImageRef) -> dict[str, Credentials] | None:
    """The environment's login for BuildKit's pull of `base`, only if it is meant for its registry.

    BSI_REGISTRY scopes the environment's login (unset: any registry but Docker Hub); a login
    for another registry must never reach the base's.
    """
    login = from_environment(base.registry)
    return {base.registry: login} if login else None


@dataclass(frozen=True)
class BuildSpec:
    """What one `docker build` makes: the tag, platform, Dockerfile and stage, and what it may
    use (build args, BuildKit secrets as id -> file, logins for its own pulls of the FROMs)."""

    tag: str | None = None
    platform: str | None = None
    dockerfile: Path | None = None
    target: str | None = None
    build_args: Mapping[str, str] = field(default_factory=dict)
    secrets: Mapping[str, Path] = field(default_factory=dict)
    logins: Mapping[str, Credentials] | None = None
    engine: Engine | None = None  # the engine that builds; None: the local one (DOCKER_HOST)


def build_image(
    context: Path,
    spec: BuildSpec,
    log: Log,
    started: Callable[[subprocess.Popen[str]], object] | None = None,
) -> str:
    """Build `context` as `spec` says and return the image id.

    `spec.logins` (registry -> credentials) are for BuildKit's own pulls of the FROM images: it
    asks the CLI, which only reads a Docker config, so they go into a private copy of it.
    `started` gets the `docker build` process, for a caller that may have to stop it.
    """
    with tempfile.TemporaryDirectory(prefix="bsi-build-") as temp:
        iidfile = Path(temp) / "iid"
        command = [*_build_command(spec), "--iidfile", str(iidfile), str(context)]
        passed, tail = _run_build(command, _build_environment(spec, Path(temp)), log, started)
        if not passed or not iidfile.exists():
            errors = [line for line in tail if "error" in line.lower()] or tail[-3:]
            raise UserError(f"docker build of {context} failed: {errors[-1] if errors else '?'}")
        return iidfile.read_text().strip()


def _build_command(spec: BuildSpec) -> list[str]:
    """`docker build`'s arguments for `spec`, but where the image id goes and the context."""
    command = [docker_cli(), "build", "--progress=plain"]
    if spec.tag:
        command += ["--tag", spec.tag]
    if spec.platform:
        command += ["--platform", spec.platform]
    if spec.dockerfile:
        command += ["--file", str(spec.dockerfile)]
    if spec.target:
        command += ["--target", spec.target]
    for key, value in spec.build_args.items():
        command += ["--build-arg", f"{key}={value}"]
    return command + secret_arguments(spec.secrets)


def _build_environment(spec: BuildSpec, temp: Path) -> dict[str, str]:
    """The CLI's environment: BuildKit on, the engine `spec` names (not the local one's
    settings), and a private Docker config under `temp` holding its logins."""
    env = {**os.environ, "DOCKER_BUILDKIT": "1"}
    if spec.engine is not None and spec.engine.environment:
        for name in ENGINE_VARIABLES:  # the local engine's settings must not leak into it
            env.pop(name, None)
        env |= spec.engine.environment
    if spec.logins:
        env["DOCKER_CONFIG"] = str(_docker_config_with(temp / "config", spec.logins))
    return env


def _run_build(
    command: list[str],
    env: dict[str, str],
    log: Log,
    started: Callable[[subprocess.Popen[str]], object] | None,
) -> tuple[bool, list[str]]:
    """Run `docker build`, its output to `log`: whether it succeeded, and its last lines."""
    tail: deque[str] = deque(maxlen=15)
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    if started is not None:
        started(process)
    assert process.stdout is not None
    for line in process.stdout:
        log.write(line)
        tail.append(line.rstrip())
    return process.wait() == 0, list(tail)


def secret_arguments(secrets: Mapping[str, Path]) -> list[str]:
    """BuildKit's `--secret` flags; a secret that is not a readable file is the user's error,
    raised before anything builds, and before a kept stage is reused (the same check either way)."""
    arguments = []
    for secret_id, path in secrets.items():
        if not path.is_file():
            raise UserError(f"{path}: secret {secret_id!r} is not a readable file")
        arguments += ["--secret", f"id={secret_id},src={path}"]
    return arguments


def _docker_config_with(directory: Path, logins: Mapping[str, Credentials]) -> Path:
    """A copy of the user's Docker config with `logins` as inline `auths` (mode 0700)."""
    try:
        config = json.loads(config_path().read_text())
    except (OSError, ValueError):
        config = {}
    if not isinstance(config, dict):
        config = {}
    auths = dict(config.get("auths") or {})
    for registry, login in logins.items():
        if login.identity_token:
            auths[server_url(registry)] = {"identitytoken": login.secret}
        else:
            token = base64.b64encode(f"{login.username}:{login.secret}".encode()).decode()
            auths[server_url(registry)] = {"auth": token}
    # A store or helper would shadow inline auths; our builds pull from these registries only.
    config.pop("credsStore", None)
    helpers = {k: v for k, v in (config.get("credHelpers") or {}).items() if k not in logins}
    directory.mkdir(mode=0o700)
    (directory / "config.json").write_text(
        json.dumps({**config, "auths": auths, "credHelpers": helpers})
    )
    return directory
