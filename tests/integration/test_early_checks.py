"""What a run writes after its push is checked before anything is built or pushed, against the
real local registry.

Through the CLI: a template that is not YAML, not a SandboxTemplate, without the `--container`
named, or read-only, fails in one `error:` line naming it, before the base is even probed (so
these runs are quick), full run and plan-only (`--no-build`) alike, and `rebuild` too; the
registry never hears of the repository, the context is not written, the template is as it
was. Then the one delivery, with a tiny image: a template that turns read-only after the run's
check is found when its new text is rendered, before the push, so the registry holds nothing;
a good one is written only with the digest the push wrote.
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import urllib.error
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from support.machine import Registry
from support.plans import run_settings
from support.registryhelp import registry_get, registry_tags, tool

from builder.cache import Cache
from builder.engines.per_arch import Engines
from builder.errors import UserError
from builder.oci.name import ImageRef
from builder.oci.remote import Blobs, InMemory
from builder.oci.v1 import Descriptor, Image, canonical, digest_of
from builder.orchestration import delivery
from builder.publish import attachments, publisher
from builder.reporter import QUIET

pytestmark = pytest.mark.usefixtures("docker_client", "registry")

RUN = uuid.uuid4().hex[:8]
TEMPLATE = """\
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxTemplate
metadata:
  name: early
spec:
  podTemplate:
    spec:
      containers:
        - name: sandbox
          image: registry.example.com/old:1  # replaced by the tool
"""
BAD = [
    ("spec: [unclosed\n", (), "not valid YAML"),
    ("apiVersion: v1\nkind: ConfigMap\n", (), "is not a SandboxTemplate"),
    (TEMPLATE, ("--container", "nosuch"), "no container named 'nosuch'"),
    (TEMPLATE, ("read-only",), "is read-only (mode 0444)"),
]
IDS = ["not-yaml", "wrong-kind", "no-container", "read-only"]


def repository_unknown(registry: Registry, repository: str) -> bool:
    """The registry has never stored a blob or a manifest under `repository`."""
    try:
        with registry_get(registry, f"/v2/{repository}/tags/list"):
            return False
    except urllib.error.HTTPError as error:
        return error.code == 404 and b"NAME_UNKNOWN" in error.read()


def template_in(work: Path, text: str, flags: tuple[str, ...]) -> tuple[Path, list[str]]:
    """The template file, and the flags left once `read-only` (a chmod 0444) is taken out."""
    path = work / "template.yaml"
    path.write_text(text)
    if "read-only" in flags:
        path.chmod(0o444)
    return path, [flag for flag in flags if flag != "read-only"]


def assert_refused(result: Any, template: Path, culprit: str) -> None:
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {template}"), result.stderr
    assert culprit in lines[0] and "Traceback" not in result.stderr


@pytest.mark.parametrize("plan_only", [False, True], ids=["build", "no-build"])
@pytest.mark.parametrize(("text", "flags", "culprit"), BAD, ids=IDS)
def test_a_bad_template_fails_the_build_before_anything_is_pushed(
    registry: Registry,
    test_env: dict[str, str],
    tmp_path: Path,
    plan_only: bool,
    text: str,
    flags: tuple[str, ...],
    culprit: str,
) -> None:
    """Everything else is right (the stand-in base on the engine, a requirement on the index):
    only the template stops the run, before the base is read."""
    template, extra = template_in(tmp_path, text, flags)
    (tmp_path / "requirements.txt").write_text("six==1.16.0\n")
    repository = f"bsi-early-{RUN}/{uuid.uuid4().hex[:8]}"
    result = tool(
        registry,
        "-r", str(tmp_path / "requirements.txt"), "--output", str(tmp_path / "out"),
        "--cache-dir", str(tmp_path / "cache"), "--push", f"{registry.host}/{repository}",
        "--base-image", test_env["base_image"], "--arch", "amd64",
        "--template", str(template), *extra, *(["--no-build"] if plan_only else []),
    )  # fmt: skip
    assert_refused(result, template, culprit)
    assert repository_unknown(registry, repository)
    assert not (tmp_path / "out").exists()
    assert template.read_text() == text


@pytest.mark.parametrize(("text", "flags", "culprit"), BAD, ids=IDS)
def test_a_bad_template_fails_a_rebuild_before_the_base_is_probed(
    registry: Registry, tmp_path: Path, text: str, flags: tuple[str, ...], culprit: str
) -> None:
    template, extra = template_in(tmp_path, text, flags)
    container = f'container = "{extra[1]}"\n' if extra else ""
    repository = f"bsi-early-{RUN}/{uuid.uuid4().hex[:8]}"
    config = tmp_path / "bsi.toml"
    config.write_text(
        'requirements = ["requirements.txt"]\n'
        f'base-repository = "{registry.host}/bsi-early-{RUN}/no-such-base"\n'
        f'platform-version = "1.0"\nrepository = "{registry.host}/{repository}"\n'
        f'template = "template.yaml"\n{container}'
    )
    result = tool(
        registry, "rebuild", "--config", str(config), "--platform-version", "1.1",
        "--cache-dir", str(tmp_path / "cache"),
    )  # fmt: skip
    assert_refused(result, template, culprit)
    assert "probing" not in result.stdout + result.stderr
    assert repository_unknown(registry, repository)
    assert 'platform-version = "1.0"' in config.read_text()
    assert not (tmp_path / "bsi.state.json").exists()


def test_a_platform_version_written_as_a_number_is_refused_in_one_line(
    registry: Registry, tmp_path: Path
) -> None:
    config = tmp_path / "bsi.toml"
    config.write_text(
        'requirements = ["requirements.txt"]\nbase-repository = "reg.example/runtime"\n'
        "platform-version = 1.10\n"
    )
    result = tool(registry, "--config", str(config), "--no-build")
    assert result.returncode == 1
    assert result.stderr == (
        f"error: {config}: 'platform-version' must be a string, not a number (1.10):"
        ' write it quoted, platform-version = "1.10"\n'
    )


# -- the one delivery: the template rendered before the push ------------------------------------


class TinyProducer:
    """One amd64 image of one small layer, as a producer hands it to the delivery."""

    path = "build"
    label = "tiny"

    def announce(self, arch: str, emulated: bool) -> str:
        return arch

    def produce(self, arch: str) -> delivery.Produced:
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w") as archive:
            data = f"{RUN} {uuid.uuid4().hex}\n".encode()
            info = tarfile.TarInfo("marker")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        layer = gzip.compress(raw.getvalue(), mtime=0)
        config = {
            "architecture": arch,
            "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": [digest_of(raw.getvalue())]},
        }
        descriptor = Descriptor("", digest_of(layer), len(layer))
        image = Image.build(canonical(config), [descriptor])
        blobs = Blobs({descriptor.digest: InMemory(layer)})
        return delivery.Produced(arch, "tiny", image.config_bytes, lambda *_: (image, blobs), {})


def deliver_tiny(
    registry: Registry, repository: str, tmp_path: Path, template: Path
) -> delivery.Outcome:
    """The delivery of a tiny image to `repository`, pointing `template`."""
    output = tmp_path / "out"
    output.mkdir()
    (output / "report.json").write_text("{}")
    client: Any = SimpleNamespace(info=lambda: {"Architecture": "x86_64"})
    run = delivery.Run(Engines.local(client), Cache(tmp_path / "cache"), QUIET)
    plan: Any = SimpleNamespace(arches=(SimpleNamespace(arch="amd64"),))
    asked = delivery.Delivery(
        run_settings(verify=False, template=template, output=output),
        push=publisher.Target(ImageRef.parse_repository(f"{registry.host}/{repository}"), "v1"),
    )
    return delivery.deliver(TinyProducer(), plan, asked, run)


@pytest.fixture
def tiny(registry: Registry, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new repository to push to, logged in from the environment; no SBOM or provenance (the
    facts would be read from an engine image)."""
    monkeypatch.setenv("BSI_REGISTRY_USER", registry.user)
    monkeypatch.setenv("BSI_REGISTRY_PASSWORD", registry.password)
    monkeypatch.setattr(attachments, "plan_facts", lambda *_: None)
    monkeypatch.setattr(attachments, "attestable", lambda *_: None)
    return f"bsi-early-{RUN}/{uuid.uuid4().hex[:8]}"


def test_a_template_that_cannot_take_the_digest_stops_the_push(
    registry: Registry, tiny: str, tmp_path: Path
) -> None:
    """Read-only since the run's check: found when the new text is rendered, before any
    blob, manifest or tag is written."""
    template, _ = template_in(tmp_path, TEMPLATE, ("read-only",))
    with pytest.raises(UserError, match=r"template\.yaml: is read-only"):
        deliver_tiny(registry, tiny, tmp_path, template)
    assert repository_unknown(registry, tiny)
    assert template.read_text() == TEMPLATE
    assert json.loads((tmp_path / "out" / "report.json").read_text())["registry_retries"] == []


def test_a_good_template_names_the_digest_the_push_wrote(
    registry: Registry, tiny: str, tmp_path: Path
) -> None:
    """The control: the same delivery with a writable template pushes, and the template names
    exactly the reference the push wrote."""
    template, _ = template_in(tmp_path, TEMPLATE, ())
    outcome = deliver_tiny(registry, tiny, tmp_path, template)
    repository = tiny
    assert outcome.pushed is not None and registry_tags(registry, repository) == ["v1"]
    assert template.read_text() == TEMPLATE.replace(
        "registry.example.com/old:1", outcome.pushed.reference
    )
    assert outcome.template_change is not None
    assert outcome.notes[0].endswith(f"kubectl apply -f {template}")
