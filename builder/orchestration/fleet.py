"""Fleet rebuilds: every template of a platform onto its new version in one run.

A platform upgrade is not one template but each team's: run one `rebuild` per config and the
same new base is probed N times and the shared distributions resolved and fetched N times,
with no single answer to "did it go through everywhere?". Here the templates share what they
can (the one Cache: wheels, resolutions, layers, bytecode; the engine's BuildKit cache and its
apt lists; the new base's profile, probed once per distinct reference), run `--jobs` at a time,
and each stays all-or-nothing as a lone `rebuild` is: a failure in one (any exception) becomes
that template's one-line reason and neither stops nor undoes the others. The answer is one
table (template, path taken, new digest or the reason) and one verdict.
"""

from __future__ import annotations

import os
import threading
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import docker

from builder.cache import Cache
from builder.config import PipelineConfig, load_config
from builder.errors import DEBUG_VARIABLE, UserError, failure_message
from builder.oci.name import ImageRef
from builder.orchestration import DEFAULT_JOBS
from builder.orchestration.commands import rebuild
from builder.publish.state import Route, load_state
from builder.reporter import Reporter, mask
from builder.resolve.target import BaseProfile

REASON_CHARS = 300  # a failed template's reason in the table is cut here


@dataclass(frozen=True)
class Fleet:
    """One fleet run: the configs as given, where to, and how many templates at a time."""

    configs: Sequence[Path]
    new_version: str
    jobs: int = DEFAULT_JOBS
    check_only: bool = False


@dataclass(frozen=True)
class Shared:
    """What every template of the run uses: the engine, the cache, the (unprefixed) reporter."""

    client: docker.DockerClient
    cache: Cache
    reporter: Reporter


class Took(StrEnum):
    """The path a template took, as its row names it: a `Route`, or no new image."""

    BUILD = Route.BUILD.value
    REBASE = Route.REBASE.value
    UNCHANGED = "unchanged"
    FAILED = "failed"
    NEEDS_REBUILD = "needs rebuild"  # with --check
    UP_TO_DATE = "up to date"  # with --check


@dataclass(frozen=True)
class TemplateResult:
    """One row of the table: the template, the path it took, its new digest or the reason."""

    name: str  # the config path as given
    path: Took
    detail: str  # the pushed reference, the recorded one (unchanged), or the one-line reason

    @property
    def failed(self) -> bool:
        return self.path == Took.FAILED

    @property
    def needs_rebuild(self) -> bool:
        return self.path == Took.NEEDS_REBUILD


@dataclass
class FleetResult:
    """Every template's row, in the order given."""

    rows: list[TemplateResult] = field(default_factory=list)

    @property
    def failed(self) -> list[str]:
        return [row.name for row in self.rows if row.failed]

    @property
    def needing_rebuild(self) -> list[str]:
        return [row.name for row in self.rows if row.needs_rebuild]

    def table(self) -> str:
        """The fleet's answer, one aligned row per template."""
        header = ("TEMPLATE", "PATH", "NEW DIGEST OR REASON")
        rows = [header, *((row.name, row.path, row.detail) for row in self.rows)]
        widths = [max(len(row[column]) for row in rows) for column in (0, 1)]
        return "\n".join(
            f"  {name:<{widths[0]}}  {path:<{widths[1]}}  {detail}".rstrip()
            for name, path, detail in rows
        )


class SharedBases:
    """The new base's profile, probed once per distinct reference for the whole fleet.

    The first template to need a reference probes it; the others wait for that probe (or its
    failure, which each of them then reports as its own reason).
    """

    def __init__(self, reporter: Reporter, users: dict[str, int]) -> None:
        self.reporter = reporter
        self.users = users  # reference -> how many templates need it, for the line said
        self.lock = threading.Lock()
        self.found: dict[str, Future[BaseProfile]] = {}

    def __call__(self, reference: ImageRef, probe: Callable[[], BaseProfile]) -> BaseProfile:
        image = reference.as_written  # as each config writes it, as report.json shows it
        with self.lock:
            future = self.found.get(image)
            mine = future is None
            if future is None:
                future = self.found[image] = Future()
        if mine:
            count = self.users.get(image, 1)
            self.reporter.say(f"probing base {image} (once, for {count} template(s)) ...")
            try:
                future.set_result(probe())
            except BaseException as error:
                future.set_exception(error)
        return future.result()


def rebuild_fleet(fleet: Fleet, shared: Shared) -> FleetResult:
    """Every config rebuilt (or checked) onto `fleet.new_version`, `fleet.jobs` at a time.

    Configs that do not load are that template's failure; two configs writing the same
    output, state or template would trample each other, so that is refused before anything.
    """
    names = [str(path) for path in fleet.configs]
    if len(set(names)) != len(names):
        twice = sorted({name for name in names if names.count(name) > 1})
        raise UserError(f"rebuild: config {twice[0]} given twice")
    configs: dict[str, PipelineConfig] = {}
    unloaded: dict[str, TemplateResult] = {}
    for name, path in zip(names, fleet.configs, strict=True):
        try:
            configs[name] = load_config(path)
        except Exception as error:  # that template fails; the others go on
            unloaded[name] = _failed(name, error)
    _refuse_overlaps(configs)
    users: dict[str, int] = {}
    for config in configs.values():
        try:
            image = config.base_image_for(fleet.new_version).as_written
        except UserError:
            continue  # not a valid tag: each template fails with that as its own reason
        users[image] = users.get(image, 0) + 1
    bases = SharedBases(shared.reporter, users)
    with ThreadPoolExecutor(max_workers=max(1, fleet.jobs), thread_name_prefix="fleet") as pool:
        started = {
            name: pool.submit(_one, name, config, fleet, shared, bases)
            for name, config in configs.items()
        }
        rows = [started[name].result() if name in started else unloaded[name] for name in names]
    return FleetResult(rows)


def _refuse_overlaps(configs: dict[str, PipelineConfig]) -> None:
    """Two templates may share nothing they write: the context, the state, the template."""
    for what in ("output", "state", "template", "path"):
        owners: dict[Path, str] = {}
        for name, config in configs.items():
            written = getattr(config, what)
            if written is None:
                continue
            key = written.resolve()
            if key in owners:
                raise UserError(
                    f"rebuild: {owners[key]} and {name} both write {written}"
                    f" ({what}); give each template its own"
                )
            owners[key] = name


def _one(
    name: str, config: PipelineConfig, fleet: Fleet, shared: Shared, bases: SharedBases
) -> TemplateResult:
    """One template, all-or-nothing as a lone `rebuild`; any failure is its row's reason."""
    reporter = shared.reporter.prefixed(name)
    try:
        found = rebuild(
            config,
            fleet.new_version,
            shared.client,
            shared.cache,
            reporter,
            check_only=fleet.check_only,
            bases=bases,
        )
    except Exception as error:
        if os.environ.get(DEBUG_VARIABLE) and not isinstance(error, UserError):
            for line in traceback.format_exc().splitlines():
                reporter.say(line)
        row = _failed(name, error)
        reporter.say(f"failed: {row.detail}")
        return row
    changes = tuple(found.changes)
    for line in changes:
        reporter.say(f"change: {line}")
    if fleet.check_only:
        took = Took.NEEDS_REBUILD if changes else Took.UP_TO_DATE
        return TemplateResult(name, took, _changes_summary(changes))  # each said above
    outcome = found.outcome
    if outcome is None:
        previous = load_state(config.state)
        recorded = previous.image if previous is not None else None
        return TemplateResult(name, Took.UNCHANGED, recorded or "up to date")
    if outcome.verification is not None and not outcome.verification.passed:
        for line in outcome.verification.table().splitlines():  # as a lone rebuild shows it
            reporter.say(line)
        reason = f"verification of {outcome.label} failed: {outcome.verification.failed_names()}"
        reporter.say(f"failed: {reason}")
        return TemplateResult(name, Took.FAILED, reason)
    for line in outcome.notes:
        reporter.say(line)
    took = Took(found.path or Route.BUILD)
    if outcome.pushed is None:
        return TemplateResult(name, took, "built (no repository to push to)")
    reporter.say(f"pushed: {outcome.pushed.reference}")
    if change := outcome.template_change:
        reporter.say(f"template {change.template_name}: {change.old_image} -> {change.new_image}")
    return TemplateResult(name, took, outcome.pushed.reference)


def _failed(name: str, error: Exception) -> TemplateResult:
    return TemplateResult(name, Took.FAILED, _reason(error))


def _reason(error: Exception) -> str:
    """A failure as one bounded line, as the CLI's error line says it; credentials masked."""
    line = mask(" ".join(failure_message(error).split()))
    return line if len(line) <= REASON_CHARS else line[:REASON_CHARS] + "…"


def _changes_summary(changes: Sequence[str]) -> str:
    if not changes:
        return "no changes"
    more = f" (+{len(changes) - 1} more)" if len(changes) > 1 else ""
    return f"{changes[0]}{more}"
