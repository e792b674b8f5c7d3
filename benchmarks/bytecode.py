"""What bytecode costs at build time (issue 19's build targets), in one run.

(i)   cold requirements -> image (`--no-verify`, no push) with bytecode against `--no-bytecode`:
      every run with its own empty tool and uv caches and on a base made for that run (so no
      BuildKit snapshot is reused), the two kinds interleaved, --repeat of each; medians and
      their ratio (target <= 1.15x). Beside it, the compile alone: the base's interpreter
      compiling the same wheels from an empty cache, its wall time and the CPU seconds its
      container used (what two cores have to find room for in a cold build).
(ii)  a no-change rerun of the bytecode build (target <= 1.0 s).
(iii) what bytecode adds to the image: the bytecode layers' bytes against the distribution
      layers' (report.json; the issue expects about +25 %).
(iv)  with --two-arch-base (a two-arch reference base in a registry): a two-arch build watched
      through the engine's events: how many compile containers ran, on which platform, and how
      many interpreters (execs) they started, against the distinct wheels of both arches.

    .venv/bin/python benchmarks/bytecode.py [--base-image bsi-reference:test] [-r FILE]
        [--repeat 2] [--two-arch-base 127.0.0.1:5000/team/runtime:1.0]

Needs the engine, the reference base and the index; (iv) also the test registry's login in
BSI_REGISTRY_USER / BSI_REGISTRY_PASSWORD (or .test-env.json).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
from upgrade import derived_base, timed  # noqa: E402

from builder.cache import Cache  # noqa: E402
from builder.contract import DEPS_EXTRA  # noqa: E402
from builder.layers.bytecode import COMPILERS, CompileQueue, Compiler  # noqa: E402

DEFAULT_SET = "scikit-learn\nmatplotlib\nsympy\n"
ROLE = "org.build-sandbox-image.role=bytecode"  # the compile container's label


CREATED: list[str] = []  # images this run made (bases, builds): removed at the end


def build_command(requirements: Path, base: str, work: Path, *extra: str) -> list[str]:
    """The tool as a user runs a build without verify or push, into `work`'s own caches."""
    tag = f"bsi-bench-bytecode-{uuid.uuid4().hex[:8]}"
    CREATED.append(tag)
    return [
        sys.executable, "-m", "builder", "-r", str(requirements), "--base-image", base,
        "--tag", tag, "--no-verify",
        "--output", str(work / "context"), "--cache-dir", str(work / "cache"), *extra,
    ]  # fmt: skip


@dataclass
class Runs:
    """One kind of build's figures, a value per cold build."""

    cold: list[float] = field(default_factory=list)  # wall seconds
    cpu: list[float] = field(default_factory=list)  # the tool's CPU seconds (its processes)
    rerun: list[float] = field(default_factory=list)  # the same build again, nothing changed


def timed_cpu(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds of `command`, and the CPU seconds of it and the processes it waited for
    (not the engine's: BuildKit, `docker load` and the compile container run there)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = timed(command, env, cwd=REPO)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def cold_builds(
    requirements: Path, parent: str, temp: Path, repeat: int
) -> tuple[dict[bool, Runs], Path]:
    """Interleaved cold builds, with and without bytecode, each followed by a no-change rerun;
    the last bytecode build's directory."""
    runs = {True: Runs(), False: Runs()}
    last = temp
    for attempt in range(repeat):
        for with_bytecode in (True, False) if attempt % 2 == 0 else (False, True):
            work = temp / f"{'with' if with_bytecode else 'without'}-{attempt}"
            work.mkdir()
            base = f"bsi-bench-bytecode-{uuid.uuid4().hex[:8]}/base:1"
            derived_base(parent, base, base, work)
            CREATED.append(base)
            env = {**os.environ, "UV_CACHE_DIR": str(work / "uv"), "DOCKER_BUILDKIT": "1"}
            extra = () if with_bytecode else ("--no-bytecode",)
            command = build_command(requirements, base, work, *extra)
            wall, cpu = timed_cpu(command, env)
            runs[with_bytecode].cold.append(wall)
            runs[with_bytecode].cpu.append(cpu)
            runs[with_bytecode].rerun.append(timed(command, env, cwd=REPO))
            last = work if with_bytecode else last
    return runs, last


def sizes(report: dict[str, Any]) -> tuple[int, int]:
    """Bytes of the distribution layers and of the bytecode layers of the first arch."""
    arch = next(iter(report["architectures"].values()))
    layers = arch["extras_layers"]
    kinds = {
        kind: sum(o["tar_size"] for o in layers if o["kind"] == kind)
        for kind in ("distribution", "bytecode")
    }
    return kinds["distribution"], kinds["bytecode"]


def wheels_of(report: dict[str, Any], cache: Cache) -> list[tuple[str, Path]]:
    """(sha256, cached file) of every distinct wheel of every arch."""
    found: dict[str, Path] = {}
    for arch in report["architectures"].values():
        for wheel in arch["wheels"]:
            path = cache.find_blob(wheel["sha256"], wheel["filename"])
            if path is None:
                sys.exit(f"error: {wheel['filename']} is not in the build's cache")
            found[wheel["sha256"]] = path
    return list(found.items())


def compile_alone(
    client: docker.DockerClient,
    base: str,
    wheels: list[tuple[str, Path]],
    temp: Path,
    workers: int = COMPILERS,
) -> tuple[float, float]:
    """Wall seconds of compiling `wheels` from an empty cache, `workers` distributions at a time
    (a build's: one per core), and the container's CPU seconds."""
    with Compiler(client, base, Cache(temp / "compile-alone"), DEPS_EXTRA) as compiler:
        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=workers) as pool:
            queue = CompileQueue(lambda: compiler, pool)
            queue.add_as_ready((wheel, sha) for sha, wheel in wheels)
            queue.results()
        wall = time.perf_counter() - start
        stats = compiler.container.stats(stream=False)
    return wall, stats["cpu_stats"]["cpu_usage"]["total_usage"] / 1e9


def two_arch(requirements: Path, base: str, temp: Path) -> dict[str, Any]:
    """One two-arch build, and what the engine's events say the compile ran."""
    client = docker.from_env()
    work = temp / "two-arch"
    work.mkdir()
    env = {**os.environ, "UV_CACHE_DIR": str(work / "uv"), "DOCKER_BUILDKIT": "1"}
    since = int(time.time()) - 1
    seconds = timed(build_command(requirements, base, work), env, cwd=REPO)
    events = list(
        client.events(
            since=since,
            until=int(time.time()) + 1,
            decode=True,
            filters={"type": "container", "label": ROLE},
        )
    )
    # other builds on this engine compile too: only the containers of this base's images count
    repository = base.rsplit(":", 1)[0]
    ours = {
        str(image.id)
        for image in client.images.list()
        if any(n.startswith(repository) for n in image.tags + image.attrs.get("RepoDigests", []))
    }
    ids = {
        e["Actor"]["ID"]: e["Actor"]["Attributes"]["image"]
        for e in events
        if e.get("Action") == "create" and e["Actor"]["Attributes"]["image"] in ours
    }
    execs = [
        e
        for e in events
        if str(e.get("Action", "")).startswith("exec_start") and e["Actor"]["ID"] in ids
    ]
    native = str(client.info().get("Architecture"))
    platforms = [client.images.get(image).attrs.get("Architecture") for image in ids.values()]
    report = json.loads((work / "context" / "report.json").read_text())
    distinct = {w["sha256"] for a in report["architectures"].values() for w in a["wheels"]}
    return {
        "seconds": seconds,
        "arches": sorted(report["architectures"]),
        "containers": len(ids),
        "platforms": platforms,
        "engine": native,
        "interpreters": len(execs),
        "distinct_wheels": len(distinct),
    }


def remove_created(client: docker.DockerClient) -> None:
    """Every image this run tagged (each arch's, when the tool adds the arch to the tag)."""
    for image in client.images.list():
        for tag in image.tags:
            if any(tag.startswith(name) for name in CREATED):
                client.images.remove(tag, force=True)


@dataclass(frozen=True)
class Figures:
    names: str
    runs: dict[bool, Runs]  # with bytecode (True) and without
    distributions: int  # bytes of the distribution layers
    bytecode: int  # bytes of the bytecode layers
    wheels: int
    compile_wall: float
    compile_cpu: float
    multi: dict[str, Any] | None


def measure(args: argparse.Namespace, temp: Path, client: docker.DockerClient) -> Figures:
    """Every figure: the cold builds first, then the compile alone, then the two-arch build."""
    requirements = temp / "requirements.txt"
    requirements.write_text(args.r.read_text() if args.r else DEFAULT_SET)
    runs, last = cold_builds(requirements, args.base_image, temp, args.repeat)
    report = json.loads((last / "context" / "report.json").read_text())
    wheels = wheels_of(report, Cache(last / "cache"))
    compile_wall, compile_cpu = compile_alone(client, args.base_image, wheels, temp)
    multi = two_arch(requirements, args.two_arch_base, temp) if args.two_arch_base else None
    names = " ".join(requirements.read_text().split())
    return Figures(names, runs, *sizes(report), len(wheels), compile_wall, compile_cpu, multi)


def show(f: Figures, args: argparse.Namespace) -> None:
    def med(values: list[float]) -> float:
        return statistics.median(values)

    def each(values: list[float]) -> str:
        return " ".join(f"{value:.1f}" for value in values)

    yes, no = f.runs[True], f.runs[False]
    lines = [
        f"set: {f.names}  base: {args.base_image}  (medians of {args.repeat}, interleaved)",
        f"(i)   cold build: bytecode {med(yes.cold):6.1f} s   --no-bytecode {med(no.cold):6.1f} s"
        f"   ratio {med(yes.cold) / med(no.cold):5.2f}x (target <= 1.15x)",
        f"      each run: bytecode {each(yes.cold)} s; --no-bytecode {each(no.cold)} s",
        f"      the tool's own CPU: bytecode {med(yes.cpu):.1f} s; --no-bytecode"
        f" {med(no.cpu):.1f} s (the engine's work not counted)",
        f"      the compile alone ({f.wheels} wheels, empty cache): {f.compile_wall:.1f} s wall,"
        f" {f.compile_cpu:.1f} CPU s in its container",
        f"(ii)  no-change rerun: bytecode {med(yes.rerun):5.2f} s; --no-bytecode"
        f" {med(no.rerun):5.2f} s (target <= 1.0 s; each: {each(yes.rerun)}; {each(no.rerun)})",
        f"(iii) extras: distribution layers {f.distributions / 1e6:6.1f} MB, bytecode layers"
        f" {f.bytecode / 1e6:6.1f} MB: +{f.bytecode / f.distributions:.0%} (issue: ~+25 %)",
    ]
    if f.multi:
        m = f.multi
        lines.append(
            f"(iv)  two-arch build ({' + '.join(m['arches'])}, {m['seconds']:.1f} s):"
            f" {m['containers']} compile container(s) on {', '.join(m['platforms'])}"
            f" (engine: {m['engine']}), {m['interpreters']} interpreters started for"
            f" {m['distinct_wheels']} distinct wheels (one each, plus one identity)"
        )
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-image", default="bsi-reference:test")
    parser.add_argument(
        "-r", type=Path, help="requirements (default: scikit-learn, matplotlib, sympy)"
    )
    parser.add_argument("--repeat", type=int, default=2, help="cold builds of each kind")
    parser.add_argument("--two-arch-base", help="a two-arch reference base in a registry")
    args = parser.parse_args()
    if args.two_arch_base and "BSI_REGISTRY_USER" not in os.environ:
        test_env = json.loads((REPO / ".test-env.json").read_text())
        os.environ["BSI_REGISTRY_USER"] = test_env["registry_user"]
        os.environ["BSI_REGISTRY_PASSWORD"] = test_env["registry_password"]
    client = docker.from_env()
    with tempfile.TemporaryDirectory(prefix="bsi-bench-bytecode-") as name:
        try:
            figures = measure(args, Path(name), client)
        finally:
            remove_created(client)
    show(figures, args)


if __name__ == "__main__":
    main()
