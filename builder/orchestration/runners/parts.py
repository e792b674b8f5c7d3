"""One arch per runner, one job to publish (issue 46): `part` and `merge` over a written plan.

`build … --push REPO --no-build --output PLAN` writes the context and PLAN/plan.json
(builder.orchestration.runners.document). A runner handed PLAN runs `part`: that arch's image from
the plan alone (the context's Dockerfile for the system stage, the context's extras layer tars,
checked against the plan before use; nothing resolved, no index asked), verified hardened on
its engine, pushed **by digest** (no tag moves) with its SBOM, provenance, SOCI index and, with
a key, signatures, by the same delivery a one-job run uses
(builder.orchestration.delivery.deliver with `Target.by_digest`: the `ByDigest` publisher);
then PLAN/parts/ARCH.json records it. `merge` reads the parts and, only when every planned
arch has one part of this plan that passed, whose image the repository holds with the plan's
extras layers, writes the index, signs it, moves the tag, points the template and records the
state, as a one-job run does (builder.publish.publisher.publish_index: the same index path).
Anything else is one UserError naming the part or the arch, before any write.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from builder import credentials
from builder.assemble.assemble import plan_epoch
from builder.cache import Cache
from builder.config import APT_SECRETS, Settings
from builder.context.labels import created
from builder.engines.per_arch import Engines
from builder.errors import RegistryError, RegistryUnreachable, UserError
from builder.files import refuse_link
from builder.oci.client import RepositoryClient
from builder.oci.name import ImageRef
from builder.oci.remote import Written, read
from builder.oci.v1 import Image, digest_of
from builder.orchestration.commands import OnePart, deliver_part
from builder.orchestration.delivery import Outcome, Run
from builder.orchestration.prepare import Finish, extras_hash_of, labels_of
from builder.orchestration.runners.document import PlanDocument, PlanId, check_layers
from builder.publish.build_facts import FACTS_LABEL
from builder.publish.publisher import (
    Publishing,
    pointing_of,
    publish_index,
    record_state,
    state_record,
    target_of,
)
from builder.publish.state import check_state, write_json_whole
from builder.reporter import Reporter
from builder.retry import Retries

if TYPE_CHECKING:
    from builder.publish.template import TemplateChange
    from builder.sign.keys import SigningKey

PARTS = "parts"  # PLAN/parts/ARCH.json


class Verified(StrEnum):
    """A part's verification, as its record says."""

    PASSED = "passed"
    FAILED = "failed"


@dataclass(frozen=True)
class PartRecord:
    """PLAN/parts/ARCH.json: what one runner built and pushed of one plan."""

    plan_id: str
    arch: str
    repository: str
    verification: Verified
    digest: str | None = None  # None: not pushed (its verification failed)
    size: int = 0  # the manifest's, the config's and the layers' bytes
    bytes_pushed: int = 0
    emulated: bool = False  # the runner's engine is not of this arch

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "verification": self.verification.value}

    @classmethod
    def read(cls, path: Path) -> PartRecord:
        """A part's record; one UserError naming the file when it is not one."""
        try:
            data = json.loads(path.read_text())
            return cls(**{**data, "verification": Verified(data["verification"])})
        except (OSError, ValueError, TypeError, KeyError) as error:
            raise UserError(f"part {path}: not a part record ({error!r})") from None


def plan_id_of(document: PlanDocument) -> PlanId:
    """The plan's id recomputed from its content: a plan.json edited by hand, or its plan
    swapped, does not carry the id it claims."""
    return PlanId(extras_hash_of(document.plan), document.plan.base.digest or "")


def check_apt_secrets(document: PlanDocument, given: Mapping[str, Path]) -> None:
    """Each apt secret the plan's apt step mounts is given, and none it does not mount: the
    Dockerfile was written by the planning run, with the secrets it was given."""
    flags = {secret: f"--{key}" for key, secret in APT_SECRETS.items()}
    missing = [secret for secret in document.apt_secrets if secret not in given]
    if missing:
        asked = " ".join(f"{flags[secret]} FILE" for secret in missing)
        raise UserError(f"the plan's apt step mounts {', '.join(missing)}: give {asked}")
    unused = [secret for secret in given if secret not in document.apt_secrets]
    if unused:
        named = ", ".join(flags[secret] for secret in unused)
        raise UserError(f"{named}: the plan's apt step mounts no such secret (planned without it)")


def check_plan(document: PlanDocument) -> str:
    """The plan's id, once its content is checked to be the plan that id names, and its
    settings to be resolved against that plan."""
    if plan_id_of(document) != document.plan_id:
        raise UserError(f"plan.json: its content is not the plan {document.plan_id}")
    planned = (document.plan_id.extras_hash, document.plan.base_reference)
    if (document.settings.extras_hash, document.settings.base) != planned:
        raise UserError(
            f"plan.json: its settings are not resolved against the plan {document.plan_id}"
        )
    if not document.plan_id.base_digest:
        raise UserError("plan.json: the base has no digest (plan with a reachable registry)")
    return str(document.plan_id)


def document_labels(document: PlanDocument) -> dict[str, str]:
    """The labels a one-job run of the plan gives each arch's image (and its index): the
    extras hash covers every arch, so every part carries the same."""
    plan = document.plan
    return labels_of(plan, document.settings, plan.bytecode or "none")


def finish_of(document: PlanDocument, arch: str, cache: Cache) -> Finish:
    """What a one-job run's `finish` gives `arch`, from the document alone: the whole plan's
    labels and `created`, and the arch's layers (their tars in the context)."""
    layers = {arch: document.layers[arch]}
    labels = document_labels(document)
    if document.facts:  # an image's label, not the index's (as a one-job run's `finish`)
        labels = dict(sorted({**labels, FACTS_LABEL: digest_of(document.facts)}.items()))
    epoch = created(plan_epoch(document.plan))
    return Finish(layers, labels, epoch, cache, document.facts)


@dataclass(frozen=True)
class PartJob:
    """What one `part` is asked (its flags): the plan's directory, the arch, where to push,
    how. Laid over the planning run's settings (`part_settings`)."""

    plan_dir: Path
    arch: str
    repository: ImageRef
    sign: SigningKey | None = None
    strict: bool = False
    apt_secrets: Mapping[str, Path] = field(default_factory=dict)  # BuildKit secret id -> file


def part_settings(job: PartJob, document: PlanDocument) -> Settings:
    """A part's settings: the planning run's (its --skip-module patterns, --no-soci, platform
    version), with the part's flags over them (where it pushes, --strict, this runner's files
    for the apt secrets the plan mounts), built into the plan's directory; `part` names the
    arch its images are built and tagged for. A part always verifies (it takes no
    --no-verify) and points no template (the merge does)."""
    asked = replace(
        document.settings.asked,
        push_repository=job.repository,
        strict=job.strict,
        apt_secrets=job.apt_secrets,
        output=job.plan_dir,
        tag=None,
        verify=True,
        template=None,
    )
    return replace(document.settings, asked=asked, part=job.arch)


def part(
    job: PartJob, document: PlanDocument, engines: Engines, cache: Cache, reporter: Reporter
) -> PartRecord:
    """Build, verify and push by digest `job.arch`'s image of the plan; record it.

    A record of this plan whose image the repository holds already is kept (a rerun does only
    what is missing). A failed verification is recorded too (merge refuses it), then raised.
    """
    plan_id = check_plan(document)
    arches = [one.arch for one in document.plan.arches]
    if job.arch not in arches:
        raise UserError(f"--arch {job.arch}: the plan is for {', '.join(arches)} only")
    retries = Retries(reporter)
    done = _done_before(job, plan_id, retries)
    if done is not None:
        reporter.say(f"part {job.arch} of plan {plan_id} already pushed: {done.digest}")
        return done
    check_apt_secrets(document, job.apt_secrets)
    check_layers(document, job.arch)
    outcome = _deliver_part(job, document, engines, cache, reporter)
    passed = outcome.verification is None or outcome.verification.passed
    written = outcome.written.get(job.arch)
    record = PartRecord(
        plan_id,
        job.arch,
        str(job.repository),
        Verified.PASSED if passed else Verified.FAILED,
        written.digest if written else None,
        written.image_size if written else 0,
        outcome.pushed.bytes_uploaded if outcome.pushed else 0,
        any(one.emulated for one in outcome.produced),
    )
    _save(job.plan_dir, record)
    if outcome.verification is not None:
        reporter.say(outcome.verification.table())
    if not passed:
        assert outcome.verification is not None
        failed = outcome.verification.failed_names()
        raise UserError(f"part {job.arch}: verification failed ({failed}); nothing pushed")
    return record


def _deliver_part(
    job: PartJob, document: PlanDocument, engines: Engines, cache: Cache, reporter: Reporter
) -> Outcome:
    """The one-job run's delivery of one arch, pushed by digest."""
    arches = tuple(a for a in document.plan.arches if a.arch == job.arch)
    plan = replace(document.plan, arches=arches)
    finished = finish_of(document, job.arch, cache)
    settings = part_settings(job, document)
    one = OnePart(plan, finished, document.parameters, settings, job.sign)
    return deliver_part(one, Run(engines, cache, reporter, Retries(reporter)))


def _done_before(job: PartJob, plan_id: str, retries: Retries) -> PartRecord | None:
    """This arch's record of this plan, passed, whose image `job.repository` holds: a rerun
    keeps it."""
    path = job.plan_dir / PARTS / f"{job.arch}.json"
    if not path.is_file():
        return None
    record = PartRecord.read(path)
    if record.plan_id != plan_id or record.verification is not Verified.PASSED or not record.digest:
        return None
    if record.repository != str(job.repository):
        return None
    registry = credentials.registry(job.repository, str(job.repository), retries)
    return record if _held(registry, record.digest) is not None else None


def _held(registry: RepositoryClient, digest: str) -> Image | None:
    """The image `digest` names in the repository; None when it holds none (an unreachable
    registry is the run's error, not an answer)."""
    try:
        found = read(registry, digest, expected=digest)
    except RegistryUnreachable:
        raise
    except RegistryError:
        return None
    return found if isinstance(found, Image) else None


def _save(plan_dir: Path, record: PartRecord) -> Path:
    folder = plan_dir / PARTS
    refuse_link(folder)  # a folder planted as a link would take the record elsewhere
    folder.mkdir(exist_ok=True)
    path = folder / f"{record.arch}.json"
    write_json_whole(path, record.to_dict())
    return path


@dataclass(frozen=True)
class MergeJob:
    """What one `merge` is asked (its flags): the plan's directory, where the parts went, what
    to point. Laid over the planning run's settings (`merge_settings`)."""

    plan_dir: Path
    repository: ImageRef
    template: Path | None = None
    container: str | None = None
    state: Path | None = None
    sign: SigningKey | None = None


def merge_settings(job: MergeJob, document: PlanDocument) -> Settings:
    """A merge's settings: the planning run's, with the merge's flags over them (where the
    parts went, the template and its container, the state); no warm pools (a merge names
    none)."""
    asked = replace(
        document.settings.asked,
        push_repository=job.repository,
        template=job.template,
        container=job.container,
        warm_pools=(),
        state=job.state,
    )
    return replace(document.settings, asked=asked)


@dataclass(frozen=True)
class Merged:
    """What a merge wrote: the index (or the one image), and the template's change."""

    written: Written
    parts: tuple[PartRecord, ...]
    template_change: TemplateChange | None = None


def read_parts(plan_dir: Path) -> list[tuple[Path, PartRecord]]:
    """Every PLAN/parts/*.json, in name order."""
    folder = plan_dir / PARTS
    paths = sorted(folder.glob("*.json")) if folder.is_dir() else []
    return [(path, PartRecord.read(path)) for path in paths]


def check_parts(
    document: PlanDocument, found: Sequence[tuple[Path, PartRecord]], repository: ImageRef
) -> tuple[PartRecord, ...]:
    """Each planned arch's one part, in plan order, when every part is of this plan, passed
    and pushed to `repository`; else one UserError naming the part or the missing arch."""
    plan_id = str(document.plan_id)
    arches = [one.arch for one in document.plan.arches]
    by_arch: dict[str, PartRecord] = {}
    for path, record in found:
        if record.plan_id != plan_id:
            raise UserError(f"part {path.name}: of plan {record.plan_id}, not this plan {plan_id}")
        if record.arch not in arches or path.stem != record.arch:
            raise UserError(
                f"part {path.name}: arch {record.arch} is not one of {', '.join(arches)}"
            )
        if record.verification is not Verified.PASSED or not record.digest:
            raise UserError(f"part {path.name}: its verification {record.verification.value}")
        if record.repository != str(repository):
            raise UserError(f"part {path.name}: pushed to {record.repository}, not {repository}")
        by_arch[record.arch] = record
    if missing := [arch for arch in arches if arch not in by_arch]:
        raise UserError(f"no part for {', '.join(missing)} in {PARTS}/ (run `part --arch` for it)")
    return tuple(by_arch[arch] for arch in arches)


def pushed_images(
    document: PlanDocument, parts: Sequence[PartRecord], registry: RepositoryClient
) -> list[Image]:
    """Each part's image as the repository holds it: of its arch, ending in the plan's extras
    layers (a home seed may sit above them); one UserError naming the part otherwise."""
    images = []
    for record in parts:
        assert record.digest is not None  # check_parts let only pushed parts through
        image = _held(registry, record.digest)
        if image is None:
            raise UserError(f"part {record.arch}: {record.digest} is not in {registry.label}")
        planned = [one.layer.diff_id for one in document.layers.get(record.arch, ())]
        if image.architecture != record.arch or not _holds_in_order(image.diff_ids, planned):
            raise UserError(
                f"part {record.arch}: {record.digest} is not this plan's {record.arch} image"
            )
        images.append(image)
    return images


def _holds_in_order(diff_ids: Sequence[str], planned: Sequence[str]) -> bool:
    """`planned` appear in `diff_ids` one after the other, in order."""
    width = len(planned)
    return any(list(diff_ids[at : at + width]) == list(planned) for at in range(len(diff_ids)))


def merge(job: MergeJob, document: PlanDocument, reporter: Reporter) -> Merged:
    """Every part checked, then the index (one arch: its image), the signatures, the tag, the
    template and the state, as a one-job run writes them; nothing when a check fails. The
    template and the state are checked first (one that is a symlink is refused, builder.files),
    and the template's new text is rendered before the push."""
    for path in (job.template, job.state):
        if path is not None:
            refuse_link(path)
    settings = merge_settings(job, document)
    pointing = pointing_of(settings.asked)
    if pointing is not None:
        pointing.check()
    if job.state is not None:
        check_state(job.state)
    check_plan(document)
    parts = check_parts(document, read_parts(job.plan_dir), job.repository)
    retries = Retries(reporter)
    registry = credentials.registry(job.repository, str(job.repository), retries)
    images = pushed_images(document, parts, registry)
    target = target_of(settings, document_labels(document))
    assert target is not None, "a merge is asked where the parts went"
    reporter.say(f"merging {len(parts)} part(s) of plan {document.plan_id} ...")
    pushed = [(record.arch, image) for record, image in zip(parts, images, strict=True)]
    publishing = Publishing(target, reporter, retries, job.sign, pointing)
    published = publish_index(publishing, registry, pushed)
    if (state := state_record(settings)) is not None:
        record_state(state, document.plan, published.written.reference, "build")
    return Merged(published.written, parts, published.template_change)
