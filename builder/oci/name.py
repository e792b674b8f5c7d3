"""Image references, parsed once by Docker's normalization rules and then passed as values.

`python:3.13` is `docker.io/library/python:3.13`; a first path component is a registry host only
when it has a `.` or `:`, is `localhost`, or has capitals; `index.docker.io` is Docker Hub; a `:`
after the last `/` starts a tag (before it, a port); `@` starts a digest, which must be a sha256.
Everything that names an image (base, push target, a RepoDigests entry) goes through `parse`,
once, where the text enters (CLI, config, state); inside, references travel as `ImageRef`.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from dataclasses import dataclass, field, replace

from builder.errors import UserError

DOCKER_HUB = "docker.io"  # how references and the Docker config name Docker Hub
DOCKER_HUB_API = "registry-1.docker.io"  # where its distribution API answers
HUB_ALIASES = frozenset({DOCKER_HUB, "index.docker.io"})
NAME_MAX = 255  # registry host + repository, as Docker limits it

DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
HOST_RE = re.compile(rf"(?:{_LABEL}(?:\.{_LABEL})*|\[[0-9A-Fa-f:.]+\])(?::[0-9]+)?")
COMPONENT_RE = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")


@dataclass(frozen=True)
class ImageRef:
    """One normalized reference: `registry/repository[:tag][@digest]`."""

    registry: str  # as users and the Docker config name it: docker.io, 127.0.0.1:5000
    repository: str  # path on the registry: library/python
    tag: str | None = None
    digest: str | None = None  # sha256:<64 hex>
    # What the user wrote, for what must show it as written (report.json, the engine's image
    # names); not part of the reference's identity.
    text: str = field(default="", compare=False, repr=False)

    @classmethod
    def parse(cls, text: str, what: str = "image reference") -> ImageRef:
        """Normalize `text`; a malformed one is a UserError naming `what` and the text."""
        name, at, digest = text.partition("@")
        if not name:
            raise UserError(f"{what} {text!r}: no repository in the reference")
        if at and not DIGEST_RE.fullmatch(digest):
            raise UserError(f"{what} {text!r}: {digest!r} is not a sha256 digest")
        head, slash, last = name.rpartition("/")
        last, colon, tag = last.partition(":")
        name = head + slash + last
        if colon and not TAG_RE.fullmatch(tag):
            raise UserError(f"{what} {text!r}: {tag!r} is not a valid tag")
        first, slash, rest = name.partition("/")
        if slash and (
            "." in first or ":" in first or first == "localhost" or first != first.lower()
        ):
            registry, repository = first, rest
            if not HOST_RE.fullmatch(registry):
                raise UserError(f"{what} {text!r}: {registry!r} is not a registry host")
        else:
            registry, repository = DOCKER_HUB, name
        if registry in HUB_ALIASES:
            registry = DOCKER_HUB
            if "/" not in repository:
                repository = f"library/{repository}"
        if not all(COMPONENT_RE.fullmatch(part) for part in repository.split("/")):
            raise UserError(
                f"{what} {text!r}: {repository!r} is not a repository"
                " (lowercase letters, digits and . _ - between /)"
            )
        if len(registry) + 1 + len(repository) > NAME_MAX:
            raise UserError(f"{what} {text!r}: the name is longer than {NAME_MAX} characters")
        return cls(registry, repository, tag or None, digest or None, text)

    @classmethod
    def parse_repository(cls, text: str, what: str = "repository") -> ImageRef:
        """A repository to push to: a reference with neither tag nor digest."""
        ref = cls.parse(text, what)
        if ref.tag or ref.digest:
            raise UserError(f"{what} {text!r}: give a repository without a tag or digest")
        return ref

    def __str__(self) -> str:
        return self.name + self._suffix()

    def _suffix(self) -> str:
        return (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")

    @property
    def as_written(self) -> str:
        """The text this reference was parsed from; its normalized form if it was not."""
        return self.text or str(self)

    @property
    def name(self) -> str:
        """`registry/repository`, fully qualified."""
        return f"{self.registry}/{self.repository}"

    @property
    def familiar(self) -> str:
        """Docker's short form: `python:3.13` for `docker.io/library/python:3.13`."""
        name = self.name
        if self.is_hub:
            library = self.repository.count("/") == 1 and self.repository.startswith("library/")
            name = self.repository.removeprefix("library/") if library else self.repository
        return name + self._suffix()

    @property
    def is_hub(self) -> bool:
        return self.registry == DOCKER_HUB

    @property
    def api_host(self) -> str:
        """Host of the distribution API: Docker Hub's is not the name users write."""
        return DOCKER_HUB_API if self.is_hub else self.registry

    @property
    def reference(self) -> str:
        """What to ask the registry for: the digest when there is one, else the tag."""
        return self.digest or self.tag or "latest"

    def with_digest(self, digest: str) -> ImageRef:
        """The same name and tag pinned to `digest` (what a FROM line or a cluster trusts)."""
        if not DIGEST_RE.fullmatch(digest):
            raise ValueError(f"{digest!r} is not a sha256 digest")
        written = f"{self.text.partition('@')[0]}@{digest}" if self.text else ""
        return replace(self, digest=digest, text=written)

    def with_tag(self, tag: str | None) -> ImageRef:
        """The same name with `tag` instead (None: none), written as the name was written: a
        config's `base-repository` with a platform version is the base as the operator names
        it (report.json shows it)."""
        if tag is not None and not TAG_RE.fullmatch(tag):
            raise UserError(f"{tag!r} is not a valid image tag")
        head, slash, last = self.text.partition("@")[0].rpartition("/")
        name = head + slash + last.partition(":")[0]
        written = name + (f":{tag}" if tag else "") + (f"@{self.digest}" if self.digest else "")
        return replace(self, tag=tag, text=written if self.text else "")


def is_loopback(host: str) -> bool:
    """Is `host` (a name or an address, with or without a port) this machine's loopback?
    Loopback registries and indexes speak plain HTTP and never go through a proxy."""
    try:
        return ipaddress.ip_address(host).is_loopback  # a bare address, IPv6 unbracketed too
    except ValueError:
        pass
    name = urllib.parse.urlsplit(f"//{host}").hostname or ""
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
