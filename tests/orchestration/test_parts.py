"""The plan a runner is handed, read back whole, and the checks `merge` makes of the parts
before it writes anything (builder.orchestration.runners: document, parts)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from support.plans import reference_profile

from builder.attest.provenance import BuildParameters, InputFile
from builder.cache import Cache
from builder.config import RunSettings
from builder.engines.connection import EngineURL
from builder.errors import UserError
from builder.layers.extras import LAYER_FILE, ExtrasLayer, LayerKind
from builder.layers.layer import Layer
from builder.oci.name import ImageRef
from builder.oci.v1 import digest_of
from builder.orchestration.prepare import settle, unmasked
from builder.orchestration.runners.document import (
    FACTS_FILE,
    PlanDocument,
    PlanId,
    check_layers,
    read_document,
    write_document,
)
from builder.orchestration.runners.parts import (
    MergeJob,
    PartJob,
    PartRecord,
    Verified,
    check_apt_secrets,
    check_parts,
    check_plan,
    document_labels,
    finish_of,
    merge_settings,
    part_settings,
    plan_id_of,
    read_parts,
)
from builder.plan.gpu import GpuWeight
from builder.plan.plan import ArchPlan, How, NativeLibrary, NodeLibrary, Plan, PlannedWheel
from builder.plan.program_needs import ProgramNeed
from builder.publish.build_facts import FACTS_LABEL
from builder.publish.publisher import target_of
from builder.reporter import remember

REPO = ImageRef.parse_repository("127.0.0.1:5000/team/runtime")


def arch_plan(arch: str) -> ArchPlan:
    """An arch's plan with every kind of field filled: enums, tuples, optional values."""
    wheel = PlannedWheel(
        "lxml", "5.3.0", f"lxml-5.3.0-{arch}.whl", "ab" * 32, f"tag-{arch}", "https://x/l.whl",
        ("lxml",), 100, 400, 1_700_000_000, "https://pypi.org/simple/",
    )  # fmt: skip
    return ArchPlan(
        arch=arch,
        wheels=(wheel,),
        libraries=(NativeLibrary("libxslt.so.1", "libxslt1.1", ("lxml",), How.LINKED),),
        apt_packages=("libxslt1.1",),
        provided_by_base=("libc.so.6",),
        built_from_source=(),
        optional_packages=("libmagic1",),
        warnings=(f"a warning for {arch}",),
        programs=(ProgramNeed("git", "git", ("lxml==5.3.0: a.py:1",), optional=True),),
        apt_size=1234,
        gpu_node=(NodeLibrary("libcuda.so.1", ("torch",), How.LOADED, "compute", "driver"),),
        gpu_weight=GpuWeight(arch, ("nvidia-x==1",), 10, 20, ("cpu",)),
    )


def plan_of(*arches: str) -> Plan:
    base = replace(reference_profile(), digest="sha256:" + "c" * 64)
    return Plan(
        base=base,
        base_image=base.pinned.as_written,
        arches=tuple(arch_plan(arch) for arch in arches),
        import_modules=("lxml",),
        runtime_checks=("import lxml",),
        requested=("lxml",),
        bytecode="3.13.5 (main) [GCC 14]",
    )


def document_in(folder: Path, *arches: str) -> PlanDocument:
    """A plan of `arches` written to `folder`, each arch with one layer tar in the context."""
    plan = plan_of(*arches)
    layers = {}
    for arch in arches:
        path = folder / LAYER_FILE.format(arch=arch, index=1)
        path.write_bytes(f"the {arch} layer".encode() * 100)
        diff_id = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
        layer = Layer(path, diff_id, path.stat().st_size, 1_700_000_000)
        layers[arch] = (
            ExtrasLayer(LayerKind.DISTRIBUTION, ("lxml",), "lxml", layer, ("ab" * 32,)),
        )
    parameters = BuildParameters((InputFile("requirements.txt", "d" * 64),), arches=arches)
    asked = RunSettings(
        (folder / "requirements.txt",),
        plan.base_reference,
        output=folder,  # read back as of the folder it is read from
        push_repository=REPO,
        platform_version="1.0",
        skip_modules=("lxml.html.*",),
        apt_secrets={"apt-auth": folder / "auth.conf"},
        engines={"arm64": EngineURL("tcp://arm:2376", folder / "certs", "10.0.0.2")},
        soci=False,
        strict=True,
    )
    document = PlanDocument(PlanId("", ""), plan, layers, settle(asked, plan), parameters)
    document = replace(document, plan_id=plan_id_of(document))
    write_document(folder, document)
    return document


def part_file(folder: Path, record: PartRecord, name: str | None = None) -> None:
    (folder / "parts").mkdir(exist_ok=True)
    path = folder / "parts" / f"{name or record.arch}.json"
    path.write_text(json.dumps(record.to_dict()))


def passed(document: PlanDocument, arch: str) -> PartRecord:
    return PartRecord(
        str(document.plan_id), arch, str(REPO), Verified.PASSED, "sha256:" + arch[0] * 64, 10
    )


def test_the_plan_reads_back_equal_to_the_plan_written(tmp_path: Path) -> None:
    written = document_in(tmp_path, "amd64", "arm64")
    read = read_document(tmp_path)
    assert read.plan == written.plan
    assert read.layers == written.layers
    assert read.parameters == written.parameters
    assert read.plan_id == written.plan_id
    assert read.settings == written.settings  # the planning run's settings, whole
    assert (read.plan.requested, read.settings.asked.skip_modules) == (("lxml",), ("lxml.html.*",))
    assert read.apt_secrets == ("apt-auth",)
    assert read.settings.platform_version == "1.0"
    check_plan(read)  # the content is the plan its id names


def test_a_part_and_a_merge_lay_their_flags_over_the_planning_run_s_settings(
    tmp_path: Path,
) -> None:
    document = document_in(tmp_path, "amd64", "arm64")
    planned = replace(
        document.settings.asked, verify=False, template=tmp_path / "t.yaml", tag="mine:1"
    )
    document = replace(document, settings=replace(document.settings, asked=planned))
    elsewhere = ImageRef.parse_repository("127.0.0.1:5000/team/other")
    secrets = {"apt-auth": tmp_path / "runner-auth.conf"}
    job = PartJob(tmp_path / "plan", "arm64", elsewhere, strict=False, apt_secrets=secrets)
    part = part_settings(job, document)
    assert (part.asked.push_repository, part.asked.strict) == (elsewhere, False)  # its flags
    assert (part.asked.apt_secrets, part.asked.output) == (secrets, tmp_path / "plan")
    assert (part.asked.skip_modules, part.asked.soci) == (("lxml.html.*",), False)  # planned
    assert (part.asked.verify, part.asked.template) == (True, None)  # a part verifies, points none
    assert part.local_tag == f"sandbox-extension:x{document.plan_id.extras_hash}-arm64"
    target = target_of(part, {})
    assert target is not None and target.by_digest and not target.soci
    assert target.tag == f"1.0-x{document.plan_id.extras_hash}"
    merge_job = MergeJob(tmp_path, REPO, tmp_path / "m.yaml", "runtime", tmp_path / "s.json")
    merging = merge_settings(merge_job, document)
    assert (merging.asked.template, merging.asked.container) == (tmp_path / "m.yaml", "runtime")
    assert (merging.asked.state, merging.asked.warm_pools) == (tmp_path / "s.json", ())
    assert merging.platform_version == part.platform_version == "1.0"  # the plan's, whole


def test_a_plan_whose_content_is_not_its_id_is_refused(tmp_path: Path) -> None:
    document_in(tmp_path, "amd64")
    body = json.loads((tmp_path / "plan.json").read_text())
    body["plan"]["arches"][0]["apt_packages"] = ["libxslt1.1", "curl"]
    (tmp_path / "plan.json").write_text(json.dumps(body))
    with pytest.raises(UserError, match="its content is not the plan"):
        check_plan(read_document(tmp_path))


def test_the_plan_carries_no_wheelhouse_token_nor_the_planning_machine_s_cache(
    tmp_path: Path,
) -> None:
    document = document_in(tmp_path, "amd64")
    wheelhouses = ("https://ci:s3cret@mirror.example/w/", str(tmp_path / "wheels"))
    asked = replace(
        document.settings.asked, find_links=wheelhouses, cache_dir=tmp_path / "planning-cache"
    )
    write_document(tmp_path, replace(document, settings=replace(document.settings, asked=asked)))
    text = (tmp_path / "plan.json").read_text()
    assert "s3cret" not in text and "planning-cache" not in text
    read = read_document(tmp_path).settings.asked
    assert read.find_links == ("https://mirror.example/w/", str(tmp_path / "wheels"))
    assert (read.cache_dir, read.output) == (None, tmp_path)  # the runner's own; the plan's dir


def test_settings_not_of_the_plan_or_a_plan_of_another_version_are_refused(
    tmp_path: Path,
) -> None:
    document_in(tmp_path, "amd64")
    written = json.loads((tmp_path / "plan.json").read_text())

    def edited(change: Callable[[dict[str, Any]], None]) -> None:
        body = json.loads(json.dumps(written))
        change(body)
        (tmp_path / "plan.json").write_text(json.dumps(body))

    edited(lambda body: body["settings"].update(extras_hash="0" * 12))
    with pytest.raises(UserError, match="its settings are not resolved against the plan"):
        check_plan(read_document(tmp_path))
    edited(lambda body: body.update(platform_version="9.9"))
    with pytest.raises(UserError, match=r"its platform version '9.9' is not its settings'"):
        read_document(tmp_path)
    edited(lambda body: body.update(version=3))  # before the settings travelled whole
    with pytest.raises(UserError, match=r"plan.json: not a plan of this tool's version 4$"):
        read_document(tmp_path)


def test_a_layer_tar_changed_after_planning_is_refused(tmp_path: Path) -> None:
    document = document_in(tmp_path, "amd64")
    check_layers(document, "amd64")
    tar = tmp_path / LAYER_FILE.format(arch="amd64", index=1)
    tar.write_bytes(tar.read_bytes()[:-1] + b"!")
    with pytest.raises(UserError, match=r"deps-extra-amd64-01.tar: its content is not"):
        check_layers(document, "amd64")


def test_every_planned_arch_with_one_passed_part_is_merged_in_plan_order(tmp_path: Path) -> None:
    document = document_in(tmp_path, "amd64", "arm64")
    part_file(tmp_path, passed(document, "arm64"))
    part_file(tmp_path, passed(document, "amd64"))
    parts = check_parts(document, read_parts(tmp_path), REPO)
    assert [p.arch for p in parts] == ["amd64", "arm64"]


def test_a_missing_arch_is_named(tmp_path: Path) -> None:
    document = document_in(tmp_path, "amd64", "arm64")
    part_file(tmp_path, passed(document, "amd64"))
    with pytest.raises(UserError, match=r"^no part for arm64 in parts/"):
        check_parts(document, read_parts(tmp_path), REPO)


def test_a_part_of_another_plan_is_named(tmp_path: Path) -> None:
    document = document_in(tmp_path, "amd64")
    other = replace(passed(document, "amd64"), plan_id="0123abcd@sha256:" + "e" * 64)
    part_file(tmp_path, other)
    with pytest.raises(UserError, match=r"^part amd64.json: of plan 0123abcd@"):
        check_parts(document, read_parts(tmp_path), REPO)


def test_a_failed_part_is_named(tmp_path: Path) -> None:
    document = document_in(tmp_path, "amd64")
    part_file(tmp_path, replace(passed(document, "amd64"), verification=Verified.FAILED))
    with pytest.raises(UserError, match=r"^part amd64.json: its verification failed"):
        check_parts(document, read_parts(tmp_path), REPO)


def test_a_part_pushed_elsewhere_or_of_an_unplanned_arch_is_named(tmp_path: Path) -> None:
    document = document_in(tmp_path, "amd64")
    elsewhere = replace(passed(document, "amd64"), repository="127.0.0.1:5000/other/x")
    part_file(tmp_path, elsewhere)
    with pytest.raises(UserError, match=r"pushed to 127.0.0.1:5000/other/x, not"):
        check_parts(document, read_parts(tmp_path), REPO)
    part_file(tmp_path, passed(document, "amd64"))
    part_file(tmp_path, passed(document, "arm64"))
    with pytest.raises(UserError, match=r"^part arm64.json: arch arm64 is not one of amd64"):
        check_parts(document, read_parts(tmp_path), REPO)


def test_a_file_that_is_no_part_record_is_named(tmp_path: Path) -> None:
    document = document_in(tmp_path, "amd64")
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "amd64.json").write_text('{"arch": "amd64"}')
    with pytest.raises(UserError, match=r"^part .*amd64.json: not a part record"):
        check_parts(document, read_parts(tmp_path), REPO)


def test_no_plan_json_is_one_error_naming_the_directory(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"plan.json: no plan here"):
        read_document(tmp_path)


def run_cli(*args: str) -> Any:
    from click.testing import CliRunner

    from builder.cli.app import main

    return CliRunner().invoke(main, list(args))


TEMPLATE = """\
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxTemplate
metadata: {name: py}
spec:
  podTemplate:
    spec:
      containers:
      - name: runtime
        image: old.example/runtime:1
"""


def test_merge_refuses_before_asking_the_registry_and_touches_nothing(tmp_path: Path) -> None:
    """The CLI end to end, up to the first check: one line naming the missing arch, exit 1;
    the template and the state as they were; the check comes before any registry request."""
    document = document_in(tmp_path, "amd64", "arm64")
    part_file(tmp_path, passed(document, "amd64"))
    template, state = tmp_path / "template.yaml", tmp_path / "state.json"
    template.write_text(TEMPLATE)
    result = run_cli(
        "merge", str(tmp_path), "--push", str(REPO), "--template", str(template),
        "--state", str(state),
    )  # fmt: skip
    assert result.exit_code == 1
    assert result.stderr == "error: no part for arm64 in parts/ (run `part --arch` for it)\n"
    assert template.read_text() == TEMPLATE and not state.exists()


@pytest.mark.parametrize(
    ("template_text", "state_text", "args", "culprit"),
    [
        ("kind: SandboxTemplate\n", None, (), "template.yaml is not a SandboxTemplate"),
        (TEMPLATE, None, ("--container", "nosuch"), "template.yaml: no container named 'nosuch'"),
        (TEMPLATE, "[1, 2]\n", (), "state.json: unreadable build state"),
    ],
)
def test_merge_checks_its_template_and_state_before_the_parts(
    tmp_path: Path,
    template_text: str,
    state_text: str | None,
    args: tuple[str, ...],
    culprit: str,
) -> None:
    """A merge whose template or state cannot be written is refused before its parts are
    even read (here they are missing too): the push would move the tag, then fail."""
    document_in(tmp_path, "amd64")
    template, state = tmp_path / "template.yaml", tmp_path / "state.json"
    template.write_text(template_text)
    if state_text is not None:
        state.write_text(state_text)
    result = run_cli(
        "merge", str(tmp_path), "--push", str(REPO), "--template", str(template),
        "--state", str(state), *args,
    )  # fmt: skip
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: {tmp_path}/{culprit}")
    assert result.stderr.count("\n") == 1
    assert template.read_text() == template_text
    assert (state.read_text() if state.exists() else None) == state_text


@pytest.mark.parametrize("which", ["template", "state"])
def test_merge_refuses_a_symlinked_template_or_state_first(tmp_path: Path, which: str) -> None:
    """Either is replaced at the end, after the index is pushed: a link is refused before."""
    document = document_in(tmp_path, "amd64")
    part_file(tmp_path, passed(document, "amd64"))
    outside = tmp_path / "outside.txt"
    outside.write_text("the runner's\n")
    link = tmp_path / f"{which}.link"
    link.symlink_to(outside)
    result = run_cli("merge", str(tmp_path), "--push", str(REPO), f"--{which}", str(link))
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: {link}: is a symbolic link;")
    assert outside.read_text() == "the runner's\n"


@pytest.mark.parametrize("command", ["part", "merge"])
def test_a_directory_without_a_plan_is_one_line(tmp_path: Path, command: str) -> None:
    arch = ["--arch", "amd64"] if command == "part" else []
    result = run_cli(command, str(tmp_path), *arch, "--push", str(REPO))
    assert result.exit_code == 1
    assert result.stderr == (
        f"error: {tmp_path}/plan.json: no plan here"
        " (write one with --push REPO --no-build --output PLAN)\n"
    )


def test_a_part_is_given_exactly_the_apt_secrets_the_plan_mounts(tmp_path: Path) -> None:
    """The plan's Dockerfile was written with the planning run's secrets: one missing would
    fail apt mid-build, one the plan does not mount would be silently unused."""
    document = document_in(tmp_path, "amd64")  # planned with --apt-auth
    check_apt_secrets(document, {"apt-auth": tmp_path / "auth.conf"})
    with pytest.raises(UserError) as missing:
        check_apt_secrets(document, {})
    assert str(missing.value) == "the plan's apt step mounts apt-auth: give --apt-auth FILE"
    with pytest.raises(UserError) as unused:
        check_apt_secrets(document, {"apt-auth": Path("a"), "apt-ca": Path("ca.pem")})
    assert str(unused.value) == (
        "--apt-ca-bundle: the plan's apt step mounts no such secret (planned without it)"
    )


def test_build_facts_holding_a_remembered_secret_are_dropped_not_masked(tmp_path: Path) -> None:
    """Masked, they would not be the bytes plan.json names: no facts and no label instead."""
    remember("s3cr3t-token-value")
    facts = b'{"format":"build-facts/2","wheels":{"x":"s3cr3t-token-value"}}'
    written = replace(document_in(tmp_path, "amd64"), facts=facts)
    write_document(tmp_path, written)
    assert not (tmp_path / FACTS_FILE).exists()
    read = read_document(tmp_path)
    assert read.facts is None
    assert FACTS_LABEL not in finish_of(read, "amd64", Cache(tmp_path / "cache")).labels
    assert unmasked(b'{"format":"build-facts/2"}') == b'{"format":"build-facts/2"}'
    assert unmasked(facts) is None


def test_the_build_facts_travel_beside_the_plan_to_each_part_s_image(tmp_path: Path) -> None:
    facts = b'{"format":"build-facts/1"}'
    (tmp_path / "with").mkdir()
    written = replace(document_in(tmp_path / "with", "amd64"), facts=facts)
    write_document(tmp_path / "with", written)
    read = read_document(tmp_path / "with")
    assert read.facts == facts
    finished = finish_of(read, "amd64", Cache(tmp_path / "cache"))
    assert finished.facts == facts
    assert finished.labels[FACTS_LABEL] == digest_of(facts)  # as a one-job run labels it
    assert FACTS_LABEL not in document_labels(read)  # the index's annotations: none, as a one-job's
    (tmp_path / "with" / FACTS_FILE).write_bytes(facts + b" ")
    with pytest.raises(UserError, match="not the build facts the plan names"):
        read_document(tmp_path / "with")
    (tmp_path / "without").mkdir()
    document_in(tmp_path / "without", "amd64")
    without = read_document(tmp_path / "without")
    assert without.facts is None
    assert FACTS_LABEL not in finish_of(without, "amd64", Cache(tmp_path / "cache")).labels
