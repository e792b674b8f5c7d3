"""Image references normalized by Docker's rules, and refused with the reference named."""

from __future__ import annotations

import pytest

from builder.errors import UserError
from builder.oci.name import ImageRef

D0 = "sha256:" + "0" * 64


@pytest.mark.parametrize(
    ("text", "registry", "repository", "tag", "digest"),
    [
        ("python", "docker.io", "library/python", None, None),
        ("python:3.13-slim-trixie", "docker.io", "library/python", "3.13-slim-trixie", None),
        ("team/app", "docker.io", "team/app", None, None),
        ("docker.io/python:3", "docker.io", "library/python", "3", None),
        ("index.docker.io/team/app:1", "docker.io", "team/app", "1", None),
        ("127.0.0.1:5000/a/b:t1", "127.0.0.1:5000", "a/b", "t1", None),
        ("localhost:5000/a@" + D0, "localhost:5000", "a", None, D0),
        ("localhost/a:1@" + D0, "localhost", "a", "1", D0),
        ("reg.example/team/py", "reg.example", "team/py", None, None),
        ("Reg/app", "Reg", "app", None, None),  # capitals: a host, as Docker reads it
        ("[::1]:5000/a:t", "[::1]:5000", "a", "t", None),
    ],
)
def test_normalization(text, registry, repository, tag, digest):
    ref = ImageRef.parse(text)
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == (
        registry,
        repository,
        tag,
        digest,
    )
    assert ImageRef.parse(str(ref)) == ref  # the full form parses to the same value
    assert ImageRef.parse(ref.familiar) == ref


def test_port_is_not_a_tag_and_familiar_form():
    ref = ImageRef.parse("host:5000/app")
    assert (ref.registry, ref.tag, ref.reference) == ("host:5000", None, "latest")
    assert ImageRef.parse("docker.io/library/python:3.13").familiar == "python:3.13"
    assert ImageRef.parse("docker.io/team/app").familiar == "team/app"
    assert ImageRef.parse("docker.io/library/a/b").familiar == "library/a/b"
    assert ImageRef.parse("reg.example/x:1").familiar == "reg.example/x:1"


def test_api_host_reference_and_pinning():
    hub = ImageRef.parse("python:3.13")
    assert hub.api_host == "registry-1.docker.io" and hub.is_hub
    pinned = hub.with_digest(D0)
    assert str(pinned) == f"docker.io/library/python:3.13@{D0}"
    assert pinned.reference == D0
    assert ImageRef.parse("reg.example:443/x").api_host == "reg.example:443"
    with pytest.raises(ValueError):
        hub.with_digest("sha256:short")


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "no repository"),
        ("python@sha256:abc", "not a sha256 digest"),
        ("python@md5:" + "0" * 32, "not a sha256 digest"),
        ("reg.example/Team/py", "is not a repository"),
        ("py:bad tag", "not a valid tag"),
        ("py:-lead", "not a valid tag"),
        ("a//b", "is not a repository"),
        ("bad_host.example/a", "not a registry host"),
        ("reg.example/" + "a" * 260, "longer than 255"),
    ],
)
def test_bad_references_name_themselves(text, why):
    with pytest.raises(UserError, match=why) as caught:
        ImageRef.parse(text, "base image")
    assert str(caught.value).startswith(f"base image {text!r}: ")


def test_repository_refuses_tag_and_digest():
    assert ImageRef.parse_repository("reg.example/team/py").repository == "team/py"
    for text in ("reg.example/py:1.0", "py@" + D0):
        with pytest.raises(UserError, match=r"push target .*without a tag or digest"):
            ImageRef.parse_repository(text, "push target")
