"""The apt builds start as soon as the plan names the apt set, and the delivery uses them."""

from __future__ import annotations

import io
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from support.images import provisional_holding
from support.waiting import wait_for

from builder.assemble import assemble as assemble_module
from builder.assemble.build import BuildSpec
from builder.base.probe import probe_base
from builder.cache import Cache
from builder.config import RunSettings
from builder.contract import BYTECODE_LABEL
from builder.engines.per_arch import Engines
from builder.errors import UserError
from builder.oci.name import ImageRef
from builder.orchestration import produce_build
from builder.orchestration.prepare import Grounds, finish, prepare, settle
from builder.orchestration.produce_build import BuildProducer, SystemStages
from builder.reporter import Reporter

pytestmark = pytest.mark.usefixtures("docker_client", "package_index")

RUN = uuid.uuid4().hex[:8]


def asked(tmp_path: Path, base: Any, requirements: str) -> tuple[RunSettings, Grounds]:
    """A run's settings for `requirements` over `base`, and its grounds (amd64, no compiler)."""
    (tmp_path / "requirements.txt").write_text(requirements)
    settings = RunSettings((tmp_path / "requirements.txt",), base.pinned, output=tmp_path / "out")
    return settings, Grounds(base, ("amd64",), Cache(tmp_path / "cache"))


def test_the_system_stage_starts_before_the_context_exists_and_is_built_once(
    tmp_path: Path,
    docker_client: Any,
    reference_image: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    base = probe_base(ImageRef.parse(reference_image), docker_client, Cache(tmp_path / "probe"))
    settings, grounds = asked(tmp_path, base, "python-magic==0.4.27\n")
    grounds = replace(grounds, compiler=docker_client)
    targets: list[str | None] = []
    real_build = produce_build.build_image

    systems: list[str] = []

    def counted(context: Path, spec: BuildSpec, *args: Any) -> str:
        targets.append(spec.target)
        systems.append(real_build(context, spec, *args))
        return systems[-1]

    monkeypatch.setattr(produce_build, "build_image", counted)
    context_when_planned: list[bool] = []
    tag = f"bsi-stages-{RUN}:test"
    saves, sent = _spy_saves_and_sends(monkeypatch)
    engines = Engines.local(docker_client)
    with SystemStages({}, engines, grounds.cache) as stages:

        def planned(plan: Any) -> None:
            stages.start(plan)
            context_when_planned.append(settings.output.exists())

        plan = prepare(settings, grounds, planned=planned, laid_out=stages.preload)
        assert plan.arches[0].apt_packages == ("libmagic1t64",)
        said: list[str] = []
        fleet = Reporter(said.append).prefixed("tmpl")  # one template of a fleet
        producer = BuildProducer(
            plan,
            settings.output,
            finish(plan, settle(settings, plan), grounds.cache),
            tag,
            engines,
            stages,
            fleet,
        )
        built = producer.produce("amd64")
    assert context_when_planned == [False], "the apt build waited for the context"
    assert targets == ["system"], "the producer built the system stage a second time"
    shown = "\n".join(said)
    assert "apt-get" in shown and "libmagic1t64" in shown, "the early build's log is not shown"
    assert said and all(line.startswith("[tmpl] ") for line in said), "a line without its template"
    system = docker_client.images.get(systems[0]).attrs["RootFS"]["Layers"]
    image = docker_client.images.get(built.engine_name).attrs["RootFS"]["Layers"]
    assert built.extras_layers, "no extras layer reported"
    extras = [one["diff_id"] for one in built.extras_layers]
    assert image == [*system, *extras]
    kinds = [one["kind"] for one in built.extras_layers]  # distributions first, then bytecode
    assert kinds == ["distribution"] * (len(kinds) // 2) + ["bytecode"] * (len(kinds) // 2)
    labels = docker_client.images.get(built.engine_name).attrs["Config"]["Labels"]
    assert labels[BYTECODE_LABEL] not in ("", "none")
    # the distribution layers were loaded, and the stage saved, while the bytecode compiled:
    # the image's own load sent only the bytecode layers, and nothing was saved twice
    layers = {one["diff_id"]: one["kind"] for one in built.extras_layers}
    assert saves == ["stages"]
    apt = system[-1].removeprefix("sha256:")  # a run that does not push keeps no apt tar
    assert grounds.cache.find_blob(apt, "layer.tar") is None
    assert "preload" in built.seconds
    image_sends = [tops for provisional, tops in sent if not provisional]
    assert [layers[diff_id] for diff_id in image_sends[-1]] == ["bytecode"] * (len(kinds) // 2)
    early = [diff_id for provisional, tops in sent if provisional for diff_id in tops]
    assert [layers[diff_id] for diff_id in early] == ["distribution"] * (len(kinds) // 2)
    assert provisional_holding(docker_client, image) == []
    docker_client.images.remove(tag, force=True)


def _spy_saves_and_sends(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[list[str], list[tuple[bool, list[str]]]]:
    """Who read a docker save (the stages early, or the assembly), and each docker load's layer
    tars as diff IDs, with whether it was a provisional image's."""
    saves: list[str] = []
    sent: list[tuple[bool, list[str]]] = []
    for module, who in ((produce_build, "stages"), (assemble_module, "assembly")):
        real_save = module.read_save

        def spied_save(*args: Any, _who: str = who, _real: Any = real_save, **kwargs: Any) -> Any:
            saves.append(_who)
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, "read_save", spied_save)
    real_send = assemble_module._send

    def spied_send(client: Any, image_id: str, config: bytes, tops: Any) -> None:
        if tops or b"bsi.provisional" not in config:
            hashes = [f"sha256:{Path(top).parent.name}" for top in tops]
            sent.append((b"bsi.provisional" in config, hashes))
        real_send(client, image_id, config, tops)

    monkeypatch.setattr(assemble_module, "_send", spied_send)
    return saves, sent


def test_a_failing_early_apt_build_raises_with_its_log_when_the_stage_is_asked_for(
    tmp_path: Path, docker_client: Any, reference_image: str
) -> None:
    base = probe_base(ImageRef.parse(reference_image), docker_client, Cache(tmp_path / "probe"))
    plan = prepare(*asked(tmp_path, base, "python-magic==0.4.27\n"))
    missing = "bsi-no-such-package"
    broken = replace(plan, arches=tuple(replace(a, apt_packages=(missing,)) for a in plan.arches))
    log = io.StringIO()
    with SystemStages({}) as stages:
        stages.start(broken)
        with pytest.raises(UserError, match=r"docker build of .* failed"):
            stages.built("amd64", log)
    assert f"Unable to locate package {missing}" in log.getvalue()


def test_a_stage_nobody_asks_for_is_stopped_not_waited_for(
    tmp_path: Path, docker_client: Any, reference_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = probe_base(ImageRef.parse(reference_image), docker_client, Cache(tmp_path / "probe"))
    plan = prepare(*asked(tmp_path, base, "python-magic==0.4.27\n"))
    slow = f"FROM {reference_image} AS system\nRUN sleep 120 && echo {RUN}\n"
    monkeypatch.setattr(produce_build, "dockerfile", lambda *_: slow)  # a stage that takes minutes
    with SystemStages({}) as stages:
        stages.start(plan)
        wait_for(lambda: "amd64" in stages.processes, deadline_s=120, what="`docker build`")
        stopping = time.monotonic()  # the build runs; now planning "fails"
    assert time.monotonic() - stopping < 60, "the exit waited for the two-minute build"
    assert stages.processes["amd64"].returncode not in (None, 0)
