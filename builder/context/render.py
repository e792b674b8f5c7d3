"""Render a plan into a build context: Dockerfile, locks, wheels, report.json.

The context is assembled in a temporary sibling directory and swapped into place at the
end, so a failure never leaves a half-written output directory behind. Each context holds a
marker file listing what the tool wrote there; an existing directory is replaced only if it
is empty or holds nothing but what its marker lists, so no user file is ever deleted. An
output that is a symlink is refused, and every file is written whole through builder.files,
never through a symlink found there. The layer tars are copies of the cache's (reflinks where
the file system has them), never hard links: an edit of the context is not an edit of the
cache.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from builder.contract import BYTECODE_BY_STEP, BYTECODE_LABEL, HOME, HOME_SEED, SANDBOX_USER
from builder.data import shipped_text
from builder.errors import UserError
from builder.files import copy_whole, refuse_link, write_whole
from builder.layers.extras import LAYER_FILE, ExtrasLayer
from builder.layers.home import SEEDS, distribution_names, image_env, seeds_of
from builder.plan.plan import Plan
from builder.reporter import mask
from builder.resolve.resolution import SourceKind

TOOL = "build-sandbox-image"
MARKER = f".{TOOL}"  # first line "build-sandbox-image <version>", then every path written
SHOWN_ENTRIES = 5


@dataclass(frozen=True)
class Secrets:
    """Names of BuildKit secrets the Dockerfile mounts; the values never enter the context."""

    apt_ca: bool = False  # id "apt-ca": a CA bundle for apt behind a TLS-intercepting proxy
    apt_auth: bool = False  # id "apt-auth": an apt auth.conf for a private mirror

    @classmethod
    def of(cls, files: Mapping[str, Path]) -> Secrets:
        """The secrets a BuildKit secret-file mapping (id -> file) provides."""
        return cls(apt_ca="apt-ca" in files, apt_auth="apt-auth" in files)

    def apt_mounts(self) -> tuple[str, str]:
        """The RUN mounts and the apt-get options that use these secrets (both may be empty)."""
        mounts, options = "", ""
        if self.apt_ca:
            mounts += " --mount=type=secret,id=apt-ca"
            options += " -o Acquire::https::CAInfo=/run/secrets/apt-ca"
        if self.apt_auth:
            mounts += " --mount=type=secret,id=apt-auth,target=/etc/apt/auth.conf.d/bsi.conf"
        return mounts, options


def dockerfile(
    plan: Plan,
    secrets: Secrets = Secrets(),
    labels: Mapping[str, str] | None = None,
    stacks: Mapping[str, int] | None = None,
    compile_step: bool = False,
) -> str:
    """The Dockerfile of the recipe in DESIGN.md, for every arch of the plan.

    `compile_step`: no engine compiled the extras' bytecode for this context (`--no-build`), so
    a step of the final stage compiles it as the tool does, and the image built from it is the
    tool's in what it holds (its layers' bytes differ: a RUN step's files carry its clock).

    The tool builds only the `system` stage with BuildKit and puts the very layer files the
    final stage ADDs on top of it itself (builder.assemble.assemble), so the layers' bytes never
    depend on a build's clock; by hand, `docker build` gives the same files and config.

    Many layers: each arch has a stage `extras-<arch>` on the system stage with one `ADD` per
    layer file (`deps-extra-<arch>-01.tar`, `-02.tar` ..., bottom to top; `stacks` gives each
    arch's count, one when not known yet, as for the system stage's own build), since arches
    may have different counts; the final stage is `FROM extras-${TARGETARCH}`, so BuildKit
    builds only the target's stage and each ADD is one layer, as in the tool's image.
    """
    extra = plan.pythonpath_entry
    lines = _header_lines(plan)
    apt_sets = {arch.arch: tuple(sorted(arch.apt_packages)) for arch in plan.arches}
    if any(apt_sets.values()):
        lines += _apt_lines(plan, apt_sets, secrets)
    lines += _extras_stages(plan, stacks or {})
    lines += [
        "",
        "# the stage of the arch being built (an alias, not an image: nothing to tag)",
        "# hadolint ignore=DL3006",
        "FROM extras-${TARGETARCH}",
        f"ENV PYTHONPATH=${{PYTHONPATH:+${{PYTHONPATH}}:}}{extra}",
        *_home_lines(plan),
    ]
    steps = (_compile_lines(extra) if compile_step else []) + _seed_lines(plan)
    if steps:
        lines += ["USER 0:0", *steps]
    if labels:
        lines += _label_lines(labels)
    lines += [f"USER {SANDBOX_USER}", ""]
    return "\n".join(lines)


def _header_lines(plan: Plan) -> list[str]:
    """What the file is and how it is built, and the system stage's base."""
    extra, first = plan.pythonpath_entry, LAYER_FILE.format(arch="<arch>", index=1)
    return [
        "# Generated by build-sandbox-image. Change the requirements and re-run; do not edit.",
        "# The system stage is the platform's base plus the Debian libraries the extras' native",
        "# code needs. Each extras-<arch> stage adds the locked wheels, installed by",
        f"# build-sandbox-image as {extra} in one layer per distribution ({first} and",
        "# on: sorted, root-owned, mtimes from the lock: the same wheel gives the same layer).",
        "# The final stage ends as the sandbox user. build-sandbox-image builds the system",
        "# stage with BuildKit and appends those layer files itself;",
        "# `docker build --platform linux/<arch> .` builds the same image by hand.",
        f"ARG BASE_IMAGE={plan.base_image}",
        "",
        "FROM ${BASE_IMAGE} AS system",
    ]


def _extras_stages(plan: Plan, stacks: Mapping[str, int]) -> list[str]:
    """Each arch's `extras-<arch>` stage: one ADD per layer file, bottom to top."""
    lines: list[str] = []
    for arch in plan.arches:
        count = stacks.get(arch.arch, 1)
        lines += ["", f"FROM system AS extras-{arch.arch}"]
        files = (LAYER_FILE.format(arch=arch.arch, index=i) for i in range(1, count + 1))
        lines += [f"ADD {name} /" for name in files]
    return lines


def _label_lines(labels: Mapping[str, str]) -> list[str]:
    """One LABEL instruction, a label a line, sorted."""
    entries = [f'{key}="{value}"' for key, value in sorted(labels.items())]
    lines = [f"LABEL {entries[0]}" + (" \\" if len(entries) > 1 else "")]
    lines += [
        f"      {entry}" + (" \\" if i < len(entries) - 2 else "")
        for i, entry in enumerate(entries[1:])
    ]
    return lines


def _home_lines(plan: Plan) -> list[str]:
    """The image's environment: its home's and its browsers' (builder.layers.home)."""
    env = image_env(plan)
    return ["ENV " + " \\\n    ".join(f"{key}={value}" for key, value in env.items())]


def _seed_lines(plan: Plan) -> list[str]:
    """A root step that builds the caches the tool builds into its image (builder.layers.home),
    which the server copies into the home at start; none when no arch installs a seed."""
    seeds = seeds_of(set.intersection(*(set(distribution_names(a)) for a in plan.arches)))
    if not seeds:
        return []
    code = "; ".join(SEEDS[name] for name in seeds)
    return [
        f"# {', '.join(seeds)}: caches built now, copied into $HOME by the server at start",
        "RUN --mount=type=tmpfs,target=/tmp \\",
        f'    MPLBACKEND=Agg PYTHONHASHSEED=0 PYTHONDONTWRITEBYTECODE=1 python3 -c "{code}" \\',
        f"    && mkdir -p {HOME_SEED} && cp -R {HOME}/. {HOME_SEED}/ \\",
        f"    && chmod -R u=rwX,go=rX {HOME_SEED}",
    ]


def _compile_lines(root: str) -> list[str]:
    """A root step compiling every module under `root` as builder.layers.bytecode does (hash-
    based .pyc never checked against the read-only sources; one that does not compile is
    skipped, as pip skips it), by an interpreter whose PYTHONPATH cannot shadow the stdlib."""
    mode = "py_compile.PycInvalidationMode.UNCHECKED_HASH"
    return [
        "# the extras' bytecode: no engine compiled it for this context (--no-build)",
        "RUN PYTHONPATH='' PYTHONHASHSEED=0 python3 -s -P -c \"import compileall, py_compile; \\",
        f"    compileall.compile_dir('{root}', quiet=2, invalidation_mode={mode})\"",
    ]


# The archive's indexes, kept between builds and never in a layer. One id for every arch (this
# BuildKit does not expand ARGs in mount options): "private" gives builds running at once their
# own copies instead of queueing one arch's apt step behind another's emulated one.
APT_LISTS = "--mount=type=cache,id=bsi-apt-lists,target=/var/lib/apt/lists,sharing=private"
APT_UPDATE = "-o APT::Get::List-Cleanup=0 update"  # keep the other arch's lists in the mount
# Each failed download (a mirror's 5xx, a dropped connection, a short read) is tried again this
# many times, apt waiting longer each time (Acquire::Retries::Delay, on by default since apt 2.3;
# trixie's apt 3.0 starts at 1 s and caps at 30 s): a minute and more of a mirror's bad day
# before the build fails, where Debian's default of 3 gives about 7 s.
APT_RETRIES = 5
# apt's binary cache, the downloaded .debs and a config of the tool's own live in a tmpfs: never
# in the layer. Under arm64 emulation (measured: one libgomp1 install) parsing the package
# lists takes 25 s each time and debconf's preconfiguration, a Perl start, 20 s. So the binary
# cache the base's docker-clean turns off is kept for the RUN (`install` reuses what `update`
# parsed), and preconfiguration is skipped: with no terminal, every question takes its default
# at configure time all the same. Only when debconf's is the sole pre-install hook: a base's
# own (a policy check on the .debs) keeps running.
APT_SCRATCH = "--mount=type=tmpfs,target=/var/cache/apt"
APT_CONFIG = "/var/cache/apt/bsi-build.conf"
DEBCONF_HOOK = 'DPkg::Pre-Install-Pkgs:: "/usr/sbin/dpkg-preconfigure --apt || true";'
APT_SETUP = (
    f"echo 'Dir::Cache::pkgcache \"pkgcache.bin\";' > {APT_CONFIG}"
    " && apt-config dump DPkg::Pre-Install-Pkgs > /var/cache/apt/bsi-hooks"
    f" && {{ grep -qvxF -e 'DPkg::Pre-Install-Pkgs \"\";' -e '{DEBCONF_HOOK}'"
    " /var/cache/apt/bsi-hooks"
    f" || echo '#clear DPkg::Pre-Install-Pkgs;' >> {APT_CONFIG}; }}"
)


def apt_steps(secrets: Secrets) -> tuple[str, list[str]]:
    """The apt RUN's mounts, and its commands: the last is the install (packages follow).

    One home for the system stage's apt step and the rebase's one-step apt build. Every
    download is retried (APT_RETRIES) so that a mirror's blip does not fail the build.
    """
    secret_mounts, secret_options = secrets.apt_mounts()
    options = f" -c {APT_CONFIG} -o Acquire::Retries={APT_RETRIES}{secret_options}"
    return f" {APT_LISTS} {APT_SCRATCH}{secret_mounts}", [
        APT_SETUP,
        f"apt-get{options} {APT_UPDATE}",
        f"DEBIAN_FRONTEND=noninteractive apt-get{options} install -y --no-install-recommends",
    ]


def _apt_lines(plan: Plan, apt_sets: Mapping[str, tuple[str, ...]], secrets: Secrets) -> list[str]:
    """The system stage's root-only apt step (back to the sandbox user after); per-arch sets.

    The package lists live in a BuildKit cache mount, so `apt-get update` only revalidates them
    on the next build (a platform upgrade's) and they never need deleting from the layer.
    """
    mounts, (setup, update_command, install) = apt_steps(secrets)
    wiring = _wiring_lines(plan)
    lines = [
        "# Debian 13 libraries the extras' native code links or loads, programs their code runs:",
        *(f"#   {arch}: {' '.join(packages) or '-'}" for arch, packages in apt_sets.items()),
    ]
    update = f"RUN{mounts} \\\n    {setup} \\\n    && {update_command} \\"
    distinct = set(apt_sets.values())
    if len(distinct) == 1:
        packages = distinct.pop()
        return [
            *lines,
            *(["ARG TARGETARCH"] if wiring else []),
            "USER 0:0",
            update,
            f"    && {install} \\",
            *(
                f"        {package}" + (" \\" if i < len(packages) - 1 or wiring else "")
                for i, package in enumerate(packages)
            ),
            *wiring,
            f"USER {SANDBOX_USER}",
        ]
    cases = []
    for arch, packages in apt_sets.items():
        command = f"{install} {' '.join(packages)}" if packages else "true"
        cases.append(f"        {arch}) {command} ;; \\")
    return [
        *lines,
        "ARG TARGETARCH",
        "USER 0:0",
        update,
        '    && case "${TARGETARCH}" in \\',
        *cases,
        "    esac" + (" \\" if wiring else ""),
        *wiring,
        f"USER {SANDBOX_USER}",
    ]


def _wiring_lines(plan: Plan) -> list[str]:
    """What lays out each arch's browser wiring (builder.plan.browsers) after the install, as
    the apt RUN's last command; none when no arch has any."""
    by_arch = {arch.arch: arch.browsers.commands() for arch in plan.arches if arch.browsers}
    if not by_arch:
        return []
    return [
        '    && case "${TARGETARCH}" in \\',
        *(f"        {arch}) {commands} ;; \\" for arch, commands in by_arch.items()),
        "    esac",
    ]


def lock_text(plan: Plan, arch: str) -> str:
    """A pip requirements lock pinning exactly the chosen wheel of each distribution."""
    chosen = next(a for a in plan.arches if a.arch == arch)
    lock = lock_of((wheel.name, wheel.version, wheel.sha256) for wheel in chosen.wheels)
    sources = {
        w.name: w.source.pin()
        for w in chosen.wheels
        if w.source is not None and w.source.kind is not SourceKind.FIND_LINKS  # like an index
    }
    # A distribution from no index says where it came from (a moved branch: a new commit here)
    return "".join(
        f"{line}  # from {sources[line.split('==', 1)[0]]}\n"
        if line.split("==", 1)[0] in sources
        else f"{line}\n"
        for line in lock.splitlines()
    )


def lock_of(pins: Iterable[tuple[str, str, str]]) -> str:
    """The lock of (name, version, sha256) pins, in order: known before the plan is."""
    return "".join(f"{name}=={version} --hash=sha256:{sha}\n" for name, version, sha in pins)


def place(source: Path, destination: Path) -> None:
    """A copy of a cache entry (a reflink where the file system has them: no space, instant),
    never a hard link, which would make an edit of the copy an edit of the cache."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    copy_whole(source, destination)


def render(
    plan: Plan,
    output: Path,
    layers: Mapping[str, Sequence[ExtrasLayer]],
    pylocks: Mapping[str, str],
    secrets: Secrets = Secrets(),
    labels: Mapping[str, str] | None = None,
    bytecode: Mapping[str, Mapping[str, object]] | None = None,
    timeline: Mapping[str, object] | None = None,
) -> None:
    """Write the build context to `output`, replacing it only once it is complete.

    `bytecode`: each arch's bytecode facts (interpreter, modules compiled, sources skipped, the
    bytes it adds), for report.json; `timeline`: when the steps so far happened, for it too.
    When `labels` say no engine compiled the bytecode (BYTECODE_BY_STEP), the Dockerfile
    compiles it (see `dockerfile`), and report.json says so (`bytecode_step`).

    Each arch's extras layers are copied from the cache (`place`): the tool builds from the
    cache's own tars, BuildKit reads the context's only for a hand build, and a `part` runner
    checks them against their diff IDs. An arch missing from `layers` (the rebase path reuses
    the pushed layers) gets no file.
    """
    output = check_output(output)
    staging = _staging(output)
    try:
        stacks = {arch: len(stack) for arch, stack in layers.items()}
        compile_step = (labels or {}).get(BYTECODE_LABEL) == BYTECODE_BY_STEP
        write_whole(
            staging / "Dockerfile",
            dockerfile(plan, secrets, labels, stacks, compile_step=compile_step),
        )
        _write_arches(staging, plan, layers, pylocks)
        report = _report(plan, layers, compile_step, bytecode or {}, timeline)
        write_whole(staging / "report.json", mask(json.dumps(report, indent=2), urls=False) + "\n")
        # hadolint finds it when run in the context; it justifies each ignored rule.
        hadolint = shipped_text("hadolint.yaml")
        write_whole(staging / ".hadolint.yaml", hadolint)
        _write_marker(staging)
        staging.chmod(0o755)
        _swap(staging, output)
    except OSError as error:
        shutil.rmtree(staging, ignore_errors=True)
        culprit = f"{error.filename}: " if error.filename else ""
        raise UserError(
            f"{output}: cannot write the build context ({culprit}{error.strerror})"
        ) from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _staging(output: Path) -> Path:
    """A new directory beside `output` to assemble the context in (the swap is a rename)."""
    try:
        return Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    except OSError as error:
        raise UserError(f"{output}: cannot write the build context ({error.strerror})") from None


def _write_arches(
    staging: Path,
    plan: Plan,
    layers: Mapping[str, Sequence[ExtrasLayer]],
    pylocks: Mapping[str, str],
) -> None:
    """Each arch's locks and its extras layer files (copies of the cache's)."""
    for arch in plan.arches:
        lock = lock_text(plan, arch.arch)  # neither holds a secret the run read: masked if so
        write_whole(staging / f"requirements-{arch.arch}.lock", mask(lock, urls=False))
        write_whole(staging / f"pylock.{arch.arch}.toml", mask(pylocks[arch.arch], urls=False))
        for index, one in enumerate(layers.get(arch.arch, ()), 1):
            place(one.layer.path, staging / LAYER_FILE.format(arch=arch.arch, index=index))


def _report(
    plan: Plan,
    layers: Mapping[str, Sequence[ExtrasLayer]],
    compile_step: bool,
    bytecode: Mapping[str, Mapping[str, object]],
    timeline: Mapping[str, object] | None,
) -> dict:
    """report.json: the plan, each arch's extras layers and bytecode facts, the timeline."""
    report = plan.to_dict()
    if compile_step:
        report["bytecode_step"] = BYTECODE_BY_STEP
    for arch in plan.arches:
        if stack := layers.get(arch.arch, ()):
            report["architectures"][arch.arch]["extras_layers"] = [o.to_dict() for o in stack]
        if arch.arch in bytecode:
            report["architectures"][arch.arch]["bytecode"] = dict(bytecode[arch.arch])
    if timeline is not None:
        report["timeline"] = dict(timeline)
    return report


def _write_marker(staging: Path) -> None:
    """The marker: the tool and its version, then every path written (the marker's too)."""
    written = sorted(_entries(staging) | {MARKER})
    write_whole(
        staging / MARKER,
        f"{TOOL} {metadata.version(TOOL)}\n" + "".join(f"{path}\n" for path in written),
    )


def _entries(directory: Path) -> set[str]:
    """Every file and directory below `directory`, relative; symlinks are not followed."""
    found = set()
    for root, dirs, files in os.walk(directory):
        for name in (*dirs, *files):
            found.add(os.path.relpath(os.path.join(root, name), directory))
    return found


def _written_by_us(output: Path) -> set[str] | None:
    """The paths the marker says the tool wrote, or None if `output` has no valid marker."""
    marker = output / MARKER
    if marker.is_symlink() or not marker.is_file():
        return None
    first, *paths = marker.read_text(errors="replace").splitlines()
    return set(paths) if first.split(" ")[0] == TOOL else None


def check_output(output: Path) -> Path:
    """The directory to write the context to, or an error if writing it would lose user files.

    A new or empty directory, or a context this tool wrote (its marker lists every entry in
    it), may be replaced; anything else is refused, naming a few of its entries, and so is a
    symlink, wherever it points. Cheap enough to call before the slow steps, and called again
    right before the swap.
    """
    output = Path(os.path.abspath(output))
    refuse_link(output)  # the context goes where it is named, never where a link points
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        if not os.path.lexists(output):
            return output
        if not output.is_dir():
            raise UserError(f"{output}: exists and is not a directory; refusing to replace it")
        entries = _entries(output)
        ours = _written_by_us(output) if entries else set()
    except FileExistsError as error:  # a parent that is a file
        raise UserError(f"{error.filename}: exists and is not a directory") from None
    except OSError as error:
        culprit = error.filename or output
        raise UserError(f"{culprit}: cannot use it for --output ({error.strerror})") from None
    foreign = sorted(entries - ours) if ours is not None else sorted(entries)
    if foreign:
        top = sorted({path.split(os.sep)[0] for path in foreign})
        shown = ", ".join(top[:SHOWN_ENTRIES]) + (
            f" and {len(top) - SHOWN_ENTRIES} more" if len(top) > SHOWN_ENTRIES else ""
        )
        why = "files this tool did not write" if ours is not None else f"no {MARKER} marker"
        raise UserError(
            f"{output}: exists with {why} ({shown}); refusing to replace it: choose another"
            " --output, or move them away"
        )
    return output


def _swap(staging: Path, output: Path) -> None:
    check_output(output)
    if not os.path.lexists(output) or not any(output.iterdir()):
        staging.rename(output)  # rename(2) replaces an empty directory
        return
    # a fresh empty directory that rename(2) replaces: nothing planted at a fixed name is used
    retired = Path(tempfile.mkdtemp(prefix=f".{output.name}.old-", dir=output.parent))
    output.rename(retired)
    staging.rename(output)
    with suppress(OSError):
        shutil.rmtree(retired)


def add_to_output(output: Path, name: str, data: bytes) -> None:
    """Write a file the run made after rendering (an attached SBOM, say) beside report.json and
    list it in the marker, so that the next run may replace the directory as its own. No
    secret the run read is written (builder.reporter.mask)."""
    text = mask(data.decode("utf-8", "surrogateescape"), urls=False)
    write_whole(output / name, text.encode("utf-8", "surrogateescape"))
    listed = _written_by_us(output)
    if listed is not None and name not in listed:
        marker = output / MARKER
        write_whole(marker, marker.read_text(errors="replace") + f"{name}\n")


def update_report(
    output: Path,
    additions: dict,
    layers: Mapping[str, Sequence[Mapping[str, object]]] | None = None,
) -> None:
    """Merge what happened after rendering (image id, verification, push) into report.json.

    `layers` (arch -> each extras layer's fields, bottom to top) replace each arch's
    `extras_layers`: the tars' facts with the pushed blobs'.
    """
    path = output / "report.json"
    refuse_link(path)  # read, then replaced: never through a link planted meanwhile
    report = json.loads(path.read_text())
    report.update(additions)
    for arch, fields in (layers or {}).items():
        report["architectures"][arch]["extras_layers"] = [dict(one) for one in fields]
    write_whole(path, mask(json.dumps(report, indent=2), urls=False) + "\n")
