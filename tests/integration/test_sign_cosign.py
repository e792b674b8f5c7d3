"""What the tool signs, checked by the real cosign (Debian 13's 2.5.0) against the local registry.

One module-scoped delivery pushes a small two-arch image (built in-process: no engine, no
build) with its SBOM and provenance attached and a template to point, signed with a key pair
that `cosign generate-key-pair` made; cosign then checks the index, each arch image and the
attestations, and refuses an unsigned image and another key. The rest is read off the registry.
"""

from __future__ import annotations

import base64
import gzip
import io
import json
import os
import subprocess
import tarfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from support.plans import run_settings
from support.registryhelp import registry_get, registry_tags

from builder import credentials
from builder.attest import provenance, sbom
from builder.cache import Cache
from builder.engines.per_arch import Engines
from builder.errors import UserError
from builder.oci import remote
from builder.oci.client import RepositoryClient
from builder.oci.name import ImageRef
from builder.oci.referrers import Attachment, attached_document, referrers
from builder.oci.remote import Blobs, InMemory, write
from builder.oci.v1 import Descriptor, Image, canonical, digest_of
from builder.orchestration import delivery
from builder.publish import attachments, publisher
from builder.reporter import QUIET
from builder.sign.check import check_signed
from builder.sign.cosign import DSSE_ENVELOPE, att_tag, sig_tag, signed_push
from builder.sign.keys import load_public_key, load_signing_key

PASSPHRASE = "bsi-cosign-test-passphrase"
TEMPLATE = """\
# the team's sandbox template
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxTemplate
metadata:
  name: signed-sandbox
spec:
  podTemplate:
    spec:
      containers:
        - name: runtime
          image: registry.example/old@sha256:{old}
"""


@pytest.fixture(scope="module")
def cosign(test_env: dict) -> str:
    path = test_env.get("cosign")
    if not path or not Path(path).is_file():
        pytest.fail("no cosign in the test-env file: run scripts/setup-env.sh")
    return str(path)


@dataclass(frozen=True)
class Keys:
    private: Path
    public: Path
    other_public: Path  # a second pair's public half: signatures by the first must not pass


def generate(cosign: str, where: Path) -> tuple[Path, Path]:
    where.mkdir(parents=True)
    env = {**os.environ, "COSIGN_PASSWORD": PASSPHRASE}
    done = subprocess.run(
        [cosign, "generate-key-pair"], cwd=where, env=env, capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return where / "cosign.key", where / "cosign.pub"


@pytest.fixture(scope="module")
def keys(cosign: str, tmp_path_factory: pytest.TempPathFactory) -> Keys:
    root = tmp_path_factory.mktemp("keys")
    private, public = generate(cosign, root / "signer")
    _, other = generate(cosign, root / "other")
    return Keys(private, public, other)


@pytest.fixture(scope="module")
def logged_in(registry: Any) -> Iterator[None]:
    """The builder's registry client logs in from the environment, as in CI."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BSI_REGISTRY_USER", registry.user)
        patch.setenv("BSI_REGISTRY_PASSWORD", registry.password)
        patch.setenv("BSI_REGISTRY", registry.host)
        yield


@pytest.fixture(scope="module")
def cosign_env(registry: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """cosign's login: a Docker config of the test's own (never the user's ~/.docker)."""
    config = tmp_path_factory.mktemp("docker-config")
    auth = base64.b64encode(f"{registry.user}:{registry.password}".encode()).decode()
    (config / "config.json").write_text(json.dumps({"auths": {registry.host: {"auth": auth}}}))
    home = tmp_path_factory.mktemp("cosign-home")
    return {**os.environ, "DOCKER_CONFIG": str(config), "HOME": str(home), "TUF_ROOT": str(home)}


def run_cosign(cosign: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    flags = ("--insecure-ignore-tlog", "--allow-insecure-registry", "--allow-http-registry")
    return subprocess.run(
        [cosign, *args, *flags], env=env, capture_output=True, text=True, timeout=120
    )


def tiny_image(arch: str, marker: str) -> tuple[Image, Blobs]:
    """A one-layer image of `arch` whose file is `marker`: unique per test run, pushed as is."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as archive:
        info = tarfile.TarInfo("marker")
        data = f"{arch} {marker}\n".encode()
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    layer = gzip.compress(raw.getvalue(), mtime=0)
    config = {
        "architecture": arch,
        "os": "linux",
        "config": {"User": "65532:65532"},
        "rootfs": {"type": "layers", "diff_ids": [digest_of(raw.getvalue())]},
        "history": [{"created_by": "ADD marker /"}],
    }
    descriptor = Descriptor("", digest_of(layer), len(layer))
    return Image.build(canonical(config), [descriptor]), Blobs({descriptor.digest: InMemory(layer)})


@dataclass
class FakeAttestable:
    """The SBOM and provenance a delivery attaches, without reading an engine image."""

    arch: str
    documents: dict[str, bytes] = field(default_factory=dict)

    def sbom(self) -> bytes:
        return b"{}"

    def attachments(self, repository: str, digest: str) -> tuple[Attachment, ...]:
        bom = {"bomFormat": "CycloneDX", "specVersion": "1.6", "version": 1}
        bom["metadata"] = {
            "component": {"name": repository, "version": digest, "type": "container"}
        }
        statement = {
            "_type": provenance.STATEMENT_TYPE,
            "subject": [{"name": repository, "digest": {"sha256": digest.removeprefix("sha256:")}}],
            "predicateType": provenance.PREDICATE_TYPE,
            "predicate": {"buildDefinition": {"buildType": provenance.BUILD_TYPE}},
        }
        documents = (canonical(bom), canonical(statement))
        self.documents = {
            f"sbom-{self.arch}.cdx.json": documents[0],
            f"provenance-{self.arch}.intoto.json": documents[1],
        }
        return (
            Attachment(sbom.MEDIA_TYPE, documents[0]),
            Attachment(provenance.MEDIA_TYPE, documents[1]),
        )


class TinyProducer:
    """Two arches of tiny images, as a producer hands them to the one delivery."""

    path = "build"
    label = "tiny"

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def announce(self, arch: str, emulated: bool) -> str:
        return arch

    def produce(self, arch: str) -> delivery.Produced:
        image, blobs = tiny_image(arch, self.marker)

        def value(*_: object) -> tuple[Image, Blobs]:
            return image, blobs

        return delivery.Produced(arch, f"tiny-{arch}", image.config_bytes, value, {})


@dataclass(frozen=True)
class Pushed:
    repository: str
    tag: str
    outcome: delivery.Outcome
    template: Path
    output: Path
    digests: dict[str, str]  # arch -> its image's digest


def fake_attestations(patch: pytest.MonkeyPatch) -> None:
    """Each arch's facts are its name; its attachments a FakeAttestable's."""
    patch.setattr(attachments, "plan_facts", lambda plan, made, *_: made[0])
    patch.setattr(attachments, "attestable", lambda client, arch, *_: FakeAttestable(arch))


def deliver_tiny(
    repository: str, output: Path, template: Path, key: Any, marker: str
) -> delivery.Outcome:
    plan: Any = SimpleNamespace(
        arches=(SimpleNamespace(arch="amd64"), SimpleNamespace(arch="arm64"))
    )
    client: Any = SimpleNamespace(info=lambda: {"Architecture": "x86_64"})
    output.mkdir(exist_ok=True)
    (output / "report.json").write_text("{}")
    run = delivery.Run(Engines.local(client), Cache(output.parent / "cache"), QUIET)
    asked = delivery.Delivery(
        run_settings(verify=False, template=template, output=output),
        push=publisher.Target(ImageRef.parse_repository(repository), "v1"),
        sign=key,
    )
    return delivery.deliver(TinyProducer(marker), plan, asked, run)


@pytest.fixture(scope="module")
def pushed(
    registry: Any, logged_in: None, keys: Keys, tmp_path_factory: pytest.TempPathFactory
) -> Pushed:
    root = tmp_path_factory.mktemp("signed")
    repository = f"{registry.host}/sign-test/{uuid.uuid4().hex[:12]}"
    template = root / "template.yaml"
    template.write_text(TEMPLATE.format(old="0" * 64))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COSIGN_PASSWORD", PASSPHRASE)
        key = load_signing_key(keys.private)
    with pytest.MonkeyPatch.context() as patch:
        fake_attestations(patch)
        outcome = deliver_tiny(repository, root / "out", template, key, uuid.uuid4().hex)
    digests = {arch: written.digest for arch, written in outcome.written.items()}
    return Pushed(repository, "v1", outcome, template, root / "out", digests)


def client_for(reference: str) -> RepositoryClient:
    return credentials.registry(ImageRef.parse(reference), reference)


def test_cosign_verifies_the_index_each_arch_image_and_the_tag(
    cosign: str, cosign_env: dict[str, str], keys: Keys, pushed: Pushed
) -> None:
    assert pushed.outcome.pushed is not None
    index = pushed.outcome.pushed.digest
    references = {
        f"{pushed.repository}@{index}": index,
        f"{pushed.repository}:{pushed.tag}": index,
        **{f"{pushed.repository}@{d}": d for d in pushed.digests.values()},
    }
    for reference, digest in references.items():
        found = run_cosign(cosign, cosign_env, "verify", "--key", str(keys.public), reference)
        assert found.returncode == 0, found.stderr
        (claim,) = json.loads(found.stdout)
        assert claim["critical"]["image"]["docker-manifest-digest"] == digest


def test_cosign_refuses_another_key_and_an_unsigned_image(
    cosign: str, cosign_env: dict[str, str], keys: Keys, pushed: Pushed
) -> None:
    signed = f"{pushed.repository}@{pushed.digests['amd64']}"
    found = run_cosign(cosign, cosign_env, "verify", "--key", str(keys.other_public), signed)
    assert found.returncode != 0 and "no matching signatures" in found.stderr, found.stderr
    image, blobs = tiny_image("amd64", uuid.uuid4().hex)
    unsigned = write(client_for(pushed.repository), [image], blobs)
    found = run_cosign(cosign, cosign_env, "verify", "--key", str(keys.public), unsigned.reference)
    assert found.returncode != 0 and "no signatures found" in found.stderr, found.stderr


@pytest.mark.parametrize("kind", ["slsaprovenance1", "cyclonedx"])
def test_cosign_verifies_the_attestations_of_each_arch_image(
    cosign: str, cosign_env: dict[str, str], keys: Keys, pushed: Pushed, kind: str
) -> None:
    for digest in pushed.digests.values():
        reference = f"{pushed.repository}@{digest}"
        args = ("verify-attestation", "--type", kind, "--key", str(keys.public), reference)
        found = run_cosign(cosign, cosign_env, *args)
        assert found.returncode == 0, found.stderr
        wrong = run_cosign(
            cosign, cosign_env, *args[:3], "--key", str(keys.other_public), reference
        )
        assert wrong.returncode != 0


def test_the_attestations_are_exactly_the_attached_documents(pushed: Pushed) -> None:
    registry = client_for(pushed.repository)
    for digest in pushed.digests.values():
        attached = {
            one.artifact_type: attached_document(registry, one)
            for one in referrers(registry, digest)
        }
        body, _ = registry.manifest(att_tag(digest))
        layers = json.loads(body)["layers"]
        assert {layer["mediaType"] for layer in layers} == {DSSE_ENVELOPE}
        payloads = {}
        for layer in layers:
            envelope = json.loads(registry.small_blob(layer["digest"]))
            payloads[layer["annotations"]["predicateType"]] = base64.b64decode(envelope["payload"])
        assert payloads[provenance.PREDICATE_TYPE] == attached[provenance.MEDIA_TYPE]
        statement = json.loads(payloads["https://cyclonedx.org/bom"])
        assert statement["predicate"] == json.loads(attached[sbom.MEDIA_TYPE])
        assert statement["subject"][0]["digest"] == {"sha256": digest.removeprefix("sha256:")}


def test_verify_key_accepts_the_signed_push_and_names_what_it_checked(
    pushed: Pushed, keys: Keys
) -> None:
    lines = check_signed(
        client_for(f"{pushed.repository}:{pushed.tag}"), load_public_key(keys.public)
    )
    assert lines[0].startswith("signed: ") and "(index)" in lines[0]
    for arch, digest in pushed.digests.items():
        assert f"signed: {digest} ({arch}) by {keys.public}" in lines
        assert any(line.startswith(f"attested: {digest} ({arch})") for line in lines)


def test_verify_key_refuses_another_key_and_an_unsigned_image(pushed: Pushed, keys: Keys) -> None:
    reference = f"{pushed.repository}:{pushed.tag}"
    with pytest.raises(UserError, match=r"not signed by .*other"):
        check_signed(client_for(reference), load_public_key(keys.other_public))
    image, blobs = tiny_image("arm64", uuid.uuid4().hex)
    unsigned = write(client_for(pushed.repository), [image], blobs)
    with pytest.raises(UserError, match=f"{unsigned.digest}: not signed by"):
        check_signed(client_for(unsigned.reference), load_public_key(keys.public))


def test_the_template_names_the_signed_index(pushed: Pushed) -> None:
    assert pushed.outcome.pushed is not None
    text = pushed.template.read_text()
    assert f"image: {pushed.outcome.pushed.reference}" in text
    assert text.startswith("# the team's sandbox template")


def test_a_signing_failure_midway_moves_no_tag_and_leaves_the_template(
    pushed: Pushed, keys: Keys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new push to the same tag whose second signature write fails: the tag still names
    the index it named, the template is byte for byte what it was."""
    before_template = pushed.template.read_text()
    registry = client_for(f"{pushed.repository}:{pushed.tag}")
    before_tag = registry.head_manifest(pushed.tag)
    calls = []

    def failing(target: RepositoryClient, tagged: remote.Tagged) -> int:
        calls.append(tagged.tag)
        if len(calls) == 2:
            raise UserError("registry refused the signature (test)")
        return put_tagged(target, tagged)

    put_tagged = remote.put_tagged
    monkeypatch.setattr(remote, "put_tagged", failing)
    fake_attestations(monkeypatch)
    monkeypatch.setenv("COSIGN_PASSWORD", PASSPHRASE)
    key = load_signing_key(keys.private)
    with pytest.raises(UserError, match="refused the signature"):
        deliver_tiny(pushed.repository, tmp_path / "out", pushed.template, key, uuid.uuid4().hex)
    assert len(calls) == 2
    assert registry.head_manifest(pushed.tag) == before_tag
    assert pushed.template.read_text() == before_template


def test_signing_again_adds_nothing_and_another_key_adds_its_own(
    pushed: Pushed, keys: Keys, cosign: str, cosign_env: dict[str, str], tmp_path: Path
) -> None:
    """One `.sig` manifest holds every key's signature; the same key's is not written twice.
    A plain PKCS#8 P-256 PEM signs too, and cosign accepts it with its public half."""
    registry = client_for(pushed.repository)
    digest = pushed.digests["amd64"]
    before, _ = registry.manifest(sig_tag(digest))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COSIGN_PASSWORD", PASSPHRASE)
        same = load_signing_key(keys.private)
    assert signed_push(registry, same, pushed.repository, [digest], None, {}) == []
    pem = tmp_path / "plain.pem"
    private = ec.generate_private_key(ec.SECP256R1())
    pem.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    plain = load_signing_key(pem)
    (tmp_path / "plain.pub").write_bytes(plain.public.pem())
    for tagged in signed_push(registry, plain, pushed.repository, [digest], None, {}):
        remote.put_tagged(registry, tagged)
    after, _ = registry.manifest(sig_tag(digest))
    assert len(json.loads(after)["layers"]) == len(json.loads(before)["layers"]) + 1
    reference = f"{pushed.repository}@{digest}"
    for public in (keys.public, tmp_path / "plain.pub"):
        found = run_cosign(cosign, cosign_env, "verify", "--key", str(public), reference)
        assert found.returncode == 0, found.stderr


def test_the_key_and_passphrase_reach_no_output(pushed: Pushed, keys: Keys, registry: Any) -> None:
    """Not in report.json, the documents beside it, the template, nor any manifest or blob
    the push left under the repository's tags."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COSIGN_PASSWORD", PASSPHRASE)
        private = load_signing_key(keys.private).private
    der = private.private_bytes(
        serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    scalar = private.private_numbers().private_value
    secrets = [
        PASSPHRASE.encode(),
        keys.private.read_bytes().split(b"\n")[1],  # the encrypted key's first PEM line
        base64.b64encode(der)[:40],
        der[-40:],
        scalar.to_bytes(32, "big"),
        format(scalar, "x").encode(),
        str(scalar).encode(),
    ]
    written = [p.read_bytes() for p in pushed.output.rglob("*") if p.is_file()]
    written.append(pushed.template.read_bytes())
    repository = pushed.repository.split("/", 1)[1]
    tags = registry_tags(registry, repository, referrers=True)
    assert any(tag.endswith(".sig") for tag in tags) and any(tag.endswith(".att") for tag in tags)
    reader = client_for(pushed.repository)
    for tag in tags:
        with registry_get(registry, f"/v2/{repository}/manifests/{tag}") as response:
            body = response.read()
        written.append(body)
        document = json.loads(body)
        for blob in [document.get("config"), *document.get("layers", [])]:
            if blob and blob.get("size", 0) < 1 << 20:
                written.append(reader.small_blob(blob["digest"]))
    assert len(written) > 10
    for secret in secrets:
        assert not any(secret in one for one in written), secret[:8]
