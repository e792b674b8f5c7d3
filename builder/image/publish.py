"""Push the verified image and name it by digest, the only reference a cluster can trust.

Tags are for people and CI logs; the SandboxTemplate gets `repository@sha256:…`, read from the
engine's push stream and confirmed by asking the registry afterwards. The engine does the transfer,
so credentials work the way `docker push` does: the environment, else the Docker config file
(including credential helpers).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

import docker
import docker.errors

from builder.errors import UserError

TAG_MAX = 128
HASH_LENGTH = 12
DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
# distribution/reference grammar: optional registry host[:port], then lowercase path components.
_HOST = (
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
)
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
REPOSITORY_RE = re.compile(rf"(?:{_HOST}(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*")
# Pairs of environment variables holding registry credentials, first match wins.
CREDENTIAL_ENV = (
    ("BSI_REGISTRY_USER", "BSI_REGISTRY_PASSWORD"),
    ("REGISTRY_USERNAME", "REGISTRY_PASSWORD"),
)
AUTH_HINT = "log in (docker login {host}) or set BSI_REGISTRY_USER/BSI_REGISTRY_PASSWORD"
AUTH_WORDS = ("unauthorized", "authentication required", "no basic auth credentials", "denied")


class PushResult(NamedTuple):
    repository: str
    tags: tuple[str, ...]  # full references, repository:tag
    digest: str  # sha256:… of the manifest the registry holds

    @property
    def reference(self) -> str:
        """What a SandboxTemplate should name: immutable, unlike a tag."""
        return f"{self.repository}@{self.digest}"


def extras_hash(lock_texts: Iterable[str]) -> str:
    """Short, order-independent fingerprint of the resolved extras (locks and apt sets per arch).

    Part of the tag, so two different extension sets for one platform version never overwrite
    each other's tag. Each text is length-prefixed so no two different lists hash alike.
    """
    digest = hashlib.sha256()
    for text in sorted(lock_texts):
        data = text.encode("utf-8")
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()[:HASH_LENGTH]


def image_tags(repository: str, platform_version: str, extras_hash: str) -> list[str]:
    """Full references to push: `repository:<platform-version>-x<extras hash>`.

    The platform version is made tag-safe (other characters become `-`) and shortened so the tag
    stays within docker's 128 characters while the hash part is always kept whole.
    """
    check_repository(repository)
    if not re.fullmatch(rf"[0-9a-f]{{{HASH_LENGTH},}}", extras_hash):
        raise ValueError(f"extras hash {extras_hash!r} is not hex of {HASH_LENGTH}+ digits")
    suffix = f"-x{extras_hash[:HASH_LENGTH]}"
    version = re.sub(r"[^A-Za-z0-9_.-]", "-", platform_version).lstrip(".-")
    version = version[: TAG_MAX - len(suffix)]
    if not version:
        raise UserError(f"platform version {platform_version!r} has nothing usable in an image tag")
    return [f"{repository}:{version}{suffix}"]


def check_repository(repository: str) -> None:
    """Refuse a push target docker would reject, or one that already carries a tag or digest."""
    if "@" in repository or ":" in repository.rsplit("/", 1)[-1]:
        raise UserError(f"push target {repository!r}: give a repository without a tag or digest")
    if not REPOSITORY_RE.fullmatch(repository):
        raise UserError(
            f"push target {repository!r} is not a valid repository name"
            " (registry host[:port]/lowercase-path, e.g. registry.example.com/team/sandbox)"
        )


def registry_host(repository: str) -> str:
    """The registry a repository lives on, by docker's rule (first part names a host or not)."""
    first, _, rest = repository.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def registry_credentials(registry_host: str) -> dict | None:
    """Credentials from the environment, or None so the Docker config (and helpers) is used."""
    for user_var, password_var in CREDENTIAL_ENV:
        user, password = os.environ.get(user_var), os.environ.get(password_var)
        if user and password:
            return {"username": user, "password": password, "serveraddress": registry_host}
        if user or password:
            missing = password_var if user else user_var
            raise UserError(f"{user_var}/{password_var}: {missing} is not set; set both or neither")
    return None


def push_image(
    client: docker.DockerClient,
    image_id: str,
    repository: str,
    tags: Sequence[str],
    credentials: dict | None,
    progress: Callable[[str], None] | None = None,
) -> PushResult:
    """Tag `image_id` and push every tag; returns the digest the registry confirms.

    `tags` are tag names or full `repository:tag` references (as image_tags gives them). With
    `credentials` None the engine client's Docker config supplies the login. On any failure the
    local tags this call created are removed again (a tag it moved goes back to its old image),
    so nothing looks pushed that is not; the registry itself never gets a tag for an incomplete
    push, since a manifest is only written after all its blobs. Note that docker deletes an
    untagged image with its last tag: tag the image locally first to keep it after a failure.
    """
    check_repository(repository)
    names = [_tag_name(repository, tag) for tag in tags]
    if not names:
        raise ValueError("push_image needs at least one tag")
    try:
        image = client.images.get(image_id)
    except docker.errors.ImageNotFound:
        raise UserError(f"image {image_id} to push is not in the engine") from None
    moved: dict[str, str | None] = {}  # reference -> image it named before, None if new
    try:
        for name in names:
            ref = f"{repository}:{name}"
            before = _image_named(client, ref)
            if before != image.id:
                moved[ref] = before
                client.api.tag(image.id, repository, name)
        digests = {_push_tag(client, repository, name, credentials, progress) for name in names}
        if len(digests) != 1:
            raise UserError(f"push to {repository}: tags got different digests {sorted(digests)}")
        digest = digests.pop()
        for name in names:
            _confirm(client, f"{repository}:{name}", digest, credentials)
    except BaseException:
        _restore_tags(client, moved)
        raise
    return PushResult(repository, tuple(f"{repository}:{name}" for name in names), digest)


def _tag_name(repository: str, tag: str) -> str:
    """The tag part of `tag`, which may be a bare tag or `repository:tag`."""
    if "/" in tag or ":" in tag:
        repo, _, tag_part = tag.rpartition(":")
        if repo != repository:
            raise UserError(f"tag {tag!r} is not in the push repository {repository}")
        tag = tag_part
    if not TAG_RE.fullmatch(tag):
        raise UserError(f"{tag!r} is not a valid image tag")
    return tag


def _image_named(client: docker.DockerClient, ref: str) -> str | None:
    try:
        return client.images.get(ref).id
    except docker.errors.ImageNotFound:
        return None


def _push_tag(
    client: docker.DockerClient,
    repository: str,
    tag: str,
    credentials: dict | None,
    progress: Callable[[str], None] | None,
) -> str:
    """Push one tag, following the engine's JSON stream; returns the manifest digest it reports."""
    ref = f"{repository}:{tag}"
    digest = None
    try:
        stream = client.api.push(
            repository, tag=tag, auth_config=credentials, stream=True, decode=True
        )
        for event in stream:
            if "error" in event or "errorDetail" in event:
                message = (event.get("errorDetail") or {}).get("message") or event.get("error")
                raise UserError(_push_error(repository, ref, str(message)))
            found = (event.get("aux") or {}).get("Digest")
            if found:
                digest = found
            status = event.get("status")
            if progress and status and status not in {"Pushing", "Preparing", "Waiting"}:
                progress(f"{event['id']}: {status}" if event.get("id") else status)
    except docker.errors.APIError as exc:
        raise UserError(_push_error(repository, ref, exc.explanation or str(exc))) from None
    if not digest or not DIGEST_RE.fullmatch(digest):
        raise UserError(f"push to {ref}: the engine reported no manifest digest (got {digest!r})")
    return digest


def _push_error(repository: str, ref: str, message: str) -> str:
    message = " ".join(message.split())
    if any(word in message.lower() for word in AUTH_WORDS):
        hint = AUTH_HINT.format(host=registry_host(repository))
        return f"push to {ref} denied: {message} — {hint}"
    return f"push to {ref} failed: {message}"


def _confirm(client: docker.DockerClient, ref: str, digest: str, credentials: dict | None) -> None:
    """Ask the registry what the tag names now, so the reported digest is the one it serves."""
    try:
        served = client.api.inspect_distribution(ref, auth_config=credentials)["Descriptor"]
    except docker.errors.APIError as exc:
        raise UserError(f"pushed {ref} but the registry cannot be asked for it: {exc}") from None
    if served.get("digest") != digest:
        raise UserError(
            f"pushed {ref} as {digest} but the registry serves {served.get('digest')} for it"
        )


def _restore_tags(client: docker.DockerClient, moved: dict[str, str | None]) -> None:
    """Undo this push's local tagging: drop new tags, point moved ones back."""
    for ref, before in moved.items():
        repository, _, tag = ref.rpartition(":")
        try:
            if before:
                client.api.tag(before, repository, tag)
            else:
                client.api.remove_image(ref, noprune=True)
        except docker.errors.APIError:
            continue  # best effort: the push's own error is the one the operator must see
