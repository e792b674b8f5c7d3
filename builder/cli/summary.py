"""The main command's summary of a plan (what it installs, what it costs, what it needs) and
of a push (what moved, and what a node holding the previous image fetches again).

Formatting only, apart from builder/cli/app.py (which prints it) so that module stays small.
"""

from __future__ import annotations

from typing import TypedDict

from builder.layers.extras import BytecodeRecord, ExtrasLayerFacts
from builder.oci.remote import Written
from builder.plan.plan import ArchPlan, Plan, PlannedWheel
from builder.plan.sizes import human, size_figures
from builder.publish.node_update import NodeUpdate
from builder.resolve.origins import is_default


class ArchReport(TypedDict, total=False):
    """What the summary reads of one arch in report.json (docs/report.md), when it is there."""

    extras_layers: list[ExtrasLayerFacts]
    bytecode: BytecodeRecord


class CacheFromReport(TypedDict):
    """report.json's `cache_from` (builder.publish.cache_from.Seeded.record)."""

    sources: list[str]
    reused: int
    distributions: int
    compiled: int


class Report(TypedDict, total=False):
    """What the summary reads of the context's report.json."""

    architectures: dict[str, ArchReport]
    bytecode_step: str  # the Dockerfile compiles the bytecode (a --no-build context)
    cache_from: CacheFromReport


def summary(plan: Plan, report: Report | None = None) -> str:
    """The human table: distribution, version, wheel tag, sizes, the index it came from (when
    not PyPI alone), native needs -> Debian package; then the extras' layers and bytecode,
    from the context's report.json."""
    lines = [f"base: {plan.base_image} (python {plan.base.python_version}, {plan.base.source})"]
    for arch in plan.arches:
        rows = _wheel_rows(arch)
        fixed = len(rows[0]) - 1  # the last column (native needs) takes what it needs
        widths = [max(len(row[i]) for row in rows) for i in range(fixed)]
        lines.append(f"\n{arch.arch}:")
        lines += [
            "  "
            + "  ".join(
                cell.rjust(width) if i in (3, 4) else cell.ljust(width)
                for i, (cell, width) in enumerate(zip(row[:fixed], widths, strict=True))
            )
            + "  "
            + row[fixed]
            for row in rows
        ]
        if arch.provided_by_base:
            lines.append(
                f"  provided by the base (not installed again): {', '.join(arch.provided_by_base)}"
            )
        if arch.gpu_node:
            driver = ", ".join(f"{lib.soname} ({lib.capability})" for lib in arch.gpu_node)
            lines.append(
                "  provided by the GPU node (the NVIDIA driver's, mounted by its container"
                f" toolkit; never installed): {driver}"
            )
        apt = " ".join(arch.apt_packages) or "none"
        if arch.apt_packages and arch.apt_size is not None:
            apt += f" (with their dependencies: {human(arch.apt_size)} installed)"
        lines.append(f"  apt packages: {apt}")
        if arch.optional_packages:
            lines.append(
                "  optional (on-demand plugins, loads the code can do without, programs side"
                f" features run; --with-optional installs them): {' '.join(arch.optional_packages)}"
            )
        lines += _extras_lines(arch.arch, report or {})
    if report and (cached := report.get("cache_from")):
        lines.append(
            f"reused {cached['reused']} of {cached['distributions']} distributions from"
            f" {', '.join(cached['sources'])} (inspections and layers)"
        )
    return "\n".join(lines)


def _wheel_rows(arch: ArchPlan) -> list[list[str]]:
    """The table's header, a row a wheel and the totals; with an `index` column when a
    distribution came from another index than PyPI (a CPU build of PyTorch, a private one)."""
    indexed = any(
        wheel.source or (wheel.index and not is_default(wheel.index)) for wheel in arch.wheels
    )
    header = ["distribution", "version", "wheel tag", "download", "installed"]
    rows = [[*header, *(["index"] * indexed), "native needs"]]
    for wheel in arch.wheels:
        pin = f"{wheel.name}=={wheel.version}"
        needs = [
            f"{lib.soname or '(run time)'} -> {lib.package or 'no Debian 13 package'}"
            f"{' (optional)' * lib.optional}"
            for lib in arch.libraries
            if any(by.startswith(pin) for by in lib.needed_by)
        ]
        needs += [
            f"runs {need.program} -> {need.package or 'no Debian 13 package'}"
            f"{' (left out)' * need.left_out}"
            for need in arch.programs
            if pin in need.distributions and (not need.optional or need.left_out)
        ]
        row = [wheel.name, wheel.version, wheel.tag, human(wheel.size), human(wheel.installed_size)]
        if indexed:
            row.append(_origin(wheel))
        rows.append([*row, ", ".join(needs) or "-"])
    total = size_figures(arch.wheels)
    rows.append(["total", "", "", human(total["download"]), human(total["installed"])])
    rows[-1] += [""] * (len(rows[0]) - len(rows[-1]))
    return rows


def _origin(wheel: PlannedWheel) -> str:
    """A wheel's index as the table says it: PyPI by name, another by its URL; a wheelhouse,
    a path, a URL (with its sha256) or a repository at its commit when it came from one."""
    if wheel.source:
        return wheel.source.describe()
    if wheel.index:
        return "PyPI" if is_default(wheel.index) else wheel.index
    return wheel.url if wheel.url == "built from source" else "unknown"


def _extras_lines(arch: str, report: Report) -> list[str]:
    """How the extras are laid out in layers, and what bytecode adds, as report.json has it."""
    record = (report.get("architectures") or {}).get(arch) or ArchReport()
    layers = record.get("extras_layers") or []
    if not layers:
        return []
    kinds = [layer.get("kind") for layer in layers]
    line = f"  extras layers: {kinds.count('distribution')} distribution"
    bytecode = record.get("bytecode")
    if kinds.count("bytecode"):
        compiled = bytecode.get("compiled", 0) if bytecode else 0
        size = human(int(bytecode.get("size") or 0) if bytecode else 0)
        line += f" + {kinds.count('bytecode')} bytecode ({compiled} modules compiled, {size})"
    elif report.get("bytecode_step"):
        line += "; bytecode compiled by the Dockerfile's own step (no engine compiled it here)"
    else:
        line += "; no bytecode (modules compile at every sandbox start)"
    return [line]


def pushed_lines(pushed: Written, node: NodeUpdate | None) -> str:
    """What was pushed, and one line of what it moved.

    Uploaded, mounted from another repository of the registry, already there; then what a node
    holding the image the tag named before downloads and unpacks
    (builder.publish.node_update).
    """
    moved = (
        f"push: {human(pushed.bytes_uploaded)} uploaded, {human(pushed.bytes_mounted)} mounted,"
        f" {human(pushed.bytes_present)} already there"
    )
    if not node or not node.previous:
        return f"pushed: {pushed.reference}\n{moved}; the tag named no image before"
    return (
        f"pushed: {pushed.reference}\n{moved}; a node with the previous image downloads"
        f" {human(node.download)} ({node.download_layers} layers), unpacks"
        f" {node.unpack_layers} layers ({human(node.unpack)})"
    )
