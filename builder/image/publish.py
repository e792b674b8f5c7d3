"""Push the verified image and name it by digest, the only reference a cluster can trust.

Tags are for people and CI logs; the SandboxTemplate gets `repository@sha256:…`, read from the
engine's push stream and confirmed by asking the registry afterwards. The engine does the transfer,
with the login `builder.credentials` finds (the environment, else the Docker config and its
credential helpers), passed as the push's auth config.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

import docker
import docker.errors

from builder.credentials import AUTH_HINT
from builder.errors import UserError
from builder.imageref import DIGEST_RE, TAG_RE, ImageRef

TAG_MAX = 128
HASH_LENGTH = 12
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
    ImageRef.parse_repository(repository, "push target")
    if not re.fullmatch(rf"[0-9a-f]{{{HASH_LENGTH},}}", extras_hash):
        raise ValueError(f"extras hash {extras_hash!r} is not hex of {HASH_LENGTH}+ digits")
    suffix = f"-x{extras_hash[:HASH_LENGTH]}"
    version = re.sub(r"[^A-Za-z0-9_.-]", "-", platform_version).lstrip(".-")
    version = version[: TAG_MAX - len(suffix)]
    if not version:
        raise UserError(f"platform version {platform_version!r} has nothing usable in an image tag")
    return [f"{repository}:{version}{suffix}"]


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
    ImageRef.parse_repository(repository, "push target")
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
        hint = AUTH_HINT.format(host=ImageRef.parse_repository(repository).registry)
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
