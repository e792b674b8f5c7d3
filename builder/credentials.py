"""Registry credentials, found where `docker` finds them, for every path that talks to a registry.

Order: BSI_REGISTRY_USER/BSI_REGISTRY_PASSWORD (or REGISTRY_USERNAME/REGISTRY_PASSWORD) in the
environment, for the registry BSI_REGISTRY names, or without it for every registry but Docker
Hub (a private registry's password must not go to Docker Hub when a base is pulled from there);
then the Docker config ($DOCKER_CONFIG/config.json, else ~/.docker/config.json):
the registry's `credHelpers` entry, the default `credsStore`, and last an inline `auths` entry
(base64 `auth`, `username`/`password`, or `identitytoken`). A helper runs as Docker runs it:
`docker-credential-<name> get` with the server URL on stdin, answering {"Username", "Secret"};
a `<token>` username means the secret is an identity token; a failing helper (or one answering
garbage) means "none"; one printing more than 1 MiB is an error, as is a helper name that is not
a plain word (it would run a path).
Docker Hub is keyed `https://index.docker.io/v1/`. The engine pull and the registry client
(`registry`, a `builder.oci` client with the login found here) all use `lookup`; the OCI core
defines `Credentials` and never reads a Docker config itself.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import selectors
import subprocess
import time
from pathlib import Path
from typing import Any

from builder.errors import UserError
from builder.oci.auth import Credentials
from builder.oci.client import RepositoryClient
from builder.oci.name import DOCKER_HUB, DOCKER_HUB_API, HUB_ALIASES, ImageRef
from builder.reporter import remember
from builder.retry import Retries

CREDENTIAL_ENV = (
    ("BSI_REGISTRY_USER", "BSI_REGISTRY_PASSWORD"),
    ("REGISTRY_USERNAME", "REGISTRY_PASSWORD"),
)
SCOPE_ENV = "BSI_REGISTRY"  # the registry the environment's credentials belong to
HUB_SERVER = "https://index.docker.io/v1/"
TOKEN_USER = "<token>"  # a helper's username for "the secret is an identity token"
HELPER_TIMEOUT = 30  # seconds; a helper that hangs (a locked keychain) must not stall a plan
HELPER_OUTPUT_LIMIT = 1 << 20  # bytes a helper may print; a login is a few KiB
HELPER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # no path: docker-credential-<word>


def registry(
    ref: ImageRef, label: str | None = None, retries: Retries | None = None
) -> RepositoryClient:
    """A registry client on `ref`'s repository, with the login docker would use there, trying
    again on faults as the run's `retries` say (None: the real policy, said to no one)."""
    return RepositoryClient(ref, label, lookup(ref.registry), retries)


def engine_config(credentials: Credentials, registry: str) -> dict[str, str]:
    """The auth_config the engine API takes for a pull or push."""
    server = server_url(registry)
    if credentials.identity_token:
        return {"identitytoken": credentials.secret, "serveraddress": server}
    return {
        "username": credentials.username,
        "password": credentials.secret,
        "serveraddress": server,
    }


def server_url(registry: str) -> str:
    """The key Docker files a registry's login under (and passes to credential helpers)."""
    return HUB_SERVER if registry == DOCKER_HUB else registry


def lookup(registry: str) -> Credentials | None:
    """Credentials for `registry` (as an ImageRef names it), or None for anonymous access."""
    return _remembered(from_environment(registry) or from_docker_config(registry))


def engine_auth(registry: str) -> dict[str, str] | None:
    """`lookup` in the engine's shape; None lets the engine go anonymous."""
    found = lookup(registry)
    return engine_config(found, registry) if found else None


def from_environment(registry: str | None = None) -> Credentials | None:
    """The environment's login, if it is meant for `registry` (None: for any but Docker Hub).

    BSI_REGISTRY (`host[:port]`, `docker.io`) names the one registry it is for; unset, it goes
    to every registry but Docker Hub, so a base pulled from Hub is pulled anonymously.
    """
    scope = os.environ.get(SCOPE_ENV, "").strip()
    if scope:
        scope = DOCKER_HUB if scope in HUB_ALIASES or scope == DOCKER_HUB_API else scope
        if registry is not None and registry != scope:
            return None
    elif registry == DOCKER_HUB:
        return None
    for user_var, password_var in CREDENTIAL_ENV:
        user, password = os.environ.get(user_var), os.environ.get(password_var)
        if user and password:
            return _remembered(Credentials(user, password, source=user_var))
        if user or password:
            missing = password_var if user else user_var
            raise UserError(f"{user_var}/{password_var}: {missing} is not set; set both or neither")
    return None


def _remembered(found: Credentials | None) -> Credentials | None:
    """`found`, its secret masked in every line and record from now on (builder.reporter)."""
    if found is not None:
        remember(found.secret)
    return found


def config_path() -> Path:
    directory = os.environ.get("DOCKER_CONFIG") or str(Path.home() / ".docker")
    return Path(directory) / "config.json"


def from_docker_config(registry: str) -> Credentials | None:
    path = config_path()
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise UserError(f"Docker config {path}: unreadable: {exc}") from None
    if not isinstance(config, dict):
        raise UserError(f"Docker config {path}: not a JSON object")
    helpers = config.get("credHelpers") or {}
    for key, helper in helpers.items() if isinstance(helpers, dict) else ():
        if _same_registry(key, registry) and isinstance(helper, str):
            found = run_helper(helper, server_url(registry))
            if found:
                return found
    store = config.get("credsStore")
    if isinstance(store, str) and store:
        found = run_helper(store, server_url(registry))
        if found:
            return found
    auths = config.get("auths") or {}
    for key, entry in auths.items() if isinstance(auths, dict) else ():
        if _same_registry(key, registry) and isinstance(entry, dict):
            found = _inline(entry, f"{path} auths")
            if found:
                return found
    return None


def run_helper(name: str, server: str) -> Credentials | None:
    """Ask `docker-credential-<name>` for `server`'s login; None if it has none or fails."""
    if not HELPER_NAME.fullmatch(name):
        raise UserError(
            f"Docker config {config_path()}: credential helper {name!r} is not a helper name"
            " (docker-credential-<name> on PATH; no path separators)"
        )
    program = f"docker-credential-{name}"
    output = _helper_output(program, server)
    if output is None:  # "credentials not found in native keychain" included
        return None
    try:
        answer: Any = json.loads(output)  # bytes: UTF-8/16/32 detected, else ValueError
    except ValueError:  # UnicodeDecodeError included
        return None
    if not isinstance(answer, dict) or not answer.get("Secret"):
        return None
    user = str(answer.get("Username") or "")
    return Credentials(
        user, str(answer["Secret"]), source=program, identity_token=user == TOKEN_USER
    )


def _helper_output(program: str, server: str) -> bytes | None:
    """`program get`'s stdout if it exits 0 within HELPER_TIMEOUT, else None.

    Read in chunks and cut off past HELPER_OUTPUT_LIMIT (an error naming the helper), so a
    broken or hostile helper printing without end cannot exhaust memory; stderr is not kept.
    """
    try:
        proc = subprocess.Popen(
            [program, "get"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
    except OSError:
        return None
    assert proc.stdin is not None and proc.stdout is not None
    deadline = time.monotonic() + HELPER_TIMEOUT
    output = bytearray()
    with proc, selectors.DefaultSelector() as selector:
        try:
            try:
                proc.stdin.write(server.encode())
                proc.stdin.close()
            except BrokenPipeError:  # it answered without reading its input
                pass
            selector.register(proc.stdout, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    return None  # it hangs: a locked keychain waiting for a prompt
                chunk = os.read(proc.stdout.fileno(), 1 << 16)
                if not chunk:
                    break
                output += chunk
                if len(output) > HELPER_OUTPUT_LIMIT:
                    raise UserError(
                        f"credential helper {program}: printed more than"
                        f" {HELPER_OUTPUT_LIMIT >> 20} MiB for {server}; a login is a few KiB"
                    )
            returncode = proc.wait(max(deadline - time.monotonic(), 0))
        except subprocess.TimeoutExpired:
            return None
        finally:
            if proc.poll() is None:
                proc.kill()
    return bytes(output) if returncode == 0 else None


def _inline(entry: dict[str, Any], source: str) -> Credentials | None:
    """An `auths` entry's login: identity token, base64 `auth`, or username and password."""
    user, password = entry.get("username") or "", entry.get("password") or ""
    if entry.get("auth"):
        try:
            user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
        except (binascii.Error, ValueError, TypeError):  # not base64 text, not UTF-8
            return None
    if entry.get("identitytoken"):
        return Credentials(user, str(entry["identitytoken"]), source, identity_token=True)
    if user and password:
        return Credentials(user, password, source)
    return None


def _same_registry(key: str, registry: str) -> bool:
    """Does a config key (`https://host/v1/`, `host`, `host:port`) name `registry`?"""
    host = key.split("://", 1)[-1].split("/", 1)[0]
    if registry == DOCKER_HUB:
        return host in HUB_ALIASES or host == DOCKER_HUB_API
    return host == registry
