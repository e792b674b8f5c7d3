"""Import time in the hardened sandbox: bytecode or not, one extras layer or many.

uid 65532 cannot write `__pycache__` in a read-only layer, so extras shipped without `.pyc`
are compiled from source in every sandbox command (issue 19). Splitting the extras into one
layer per distribution (issue 20) may make the import system's failed path lookups cross
more overlay lower layers. This benchmark builds the same requirement set six ways on the same
base and measures what a sandbox pays, so the layout is chosen on figures:

    a  hand-written: a builder stage `pip install --target --no-deps` (timestamp .pyc)
    b  one deps-extra layer, no bytecode (the tool today)
    c  one deps-extra layer + one bytecode layer (unchecked-hash .pyc, builder.layers.bytecode)
    d  one layer per distribution (largest lowest) + one bytecode layer
    e  one layer per distribution + one bytecode layer per distribution (2N layers)
    f  one layer per distribution, each holding its own bytecode (N layers)

Each image runs as the platform runs it (read-only root, uid 65532, no capabilities,
no-new-privileges, tmpfs /workspace and /tmp); inside, `python3 -c` times the imports with
perf_counter and a parent interpreter times the whole child. Runs are interleaved across
images after one discarded warm-up round; the report gives medians, minimums and the child's
CPU time (user+sys), which a busy machine disturbs far less than wall time. Container start is
`docker run` of the image's own entrypoint to the first `GET /` 200. The cold bytecode compile
(`Compiler`, a fresh cache) is timed against writing the deps layer, with COMPILERS 2 and 1.

    .venv/bin/python benchmarks/import_time.py [--base IMAGE] [--repeats 7] [--keep]

Needs the engine and the package index (wheels are downloaded once into --wheels; the image
builds themselves run without network: every wheel and layer is in the build context).
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import os
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import docker

from builder.cache import Cache
from builder.files import sha256_of
from builder.layers.bytecode import Compiled, CompileQueue, Compiler, Interpreter, bytecode_layer
from builder.layers.layer import (
    Layer,
    LayerWheels,
    keep,
    shadowed_files,
    source_date_epoch,
    wheels_layer,
    written,
)

T = TypeVar("T")
REPO = Path(__file__).resolve().parent.parent
DOCKER = "/usr/bin/docker"
ROOT = "/app/deps-extra"
PREFIX = "bsi-bench-import-"
DEFAULT_BASE = "bsi-bench-base:latest"
DEFAULT_SET = ("scikit-learn", "matplotlib", "sympy")
IMPORTS = "sklearn.ensemble, matplotlib.pyplot, sympy, scipy.stats"
# As the platform runs a sandbox (builder/verify/container.py): read-only, uid 65532, no
# capabilities, no-new-privileges, tmpfs /workspace and /tmp.
HARDENED = tuple(
    shlex.split(
        "--read-only --user 65532:65532 --cap-drop ALL --security-opt no-new-privileges"
        " --tmpfs /workspace:rw,nosuid,nodev,size=256m,uid=65532,gid=65532,mode=0755"
        " --tmpfs /tmp:rw,nosuid,nodev,size=256m,mode=1777"
    )
)
UV_COMPILE = (
    "pip compile requirements.in -c base.txt --python-platform x86_64-manylinux_2_40"
    " --python-version 3.13 --only-binary :all: --generate-hashes --no-header --no-annotate"
    " --quiet"
)
PIP_DOWNLOAD = (
    "download --no-deps --only-binary :all: --python-version 3.13 --implementation cp"
    " --abi cp313 --require-hashes -r extras.txt -d files -q"
)
PLATFORMS = (
    *(f"manylinux_2_{minor}_x86_64" for minor in range(40, 4, -1)),
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)  # pip download does not widen one manylinux tag to the older ones it implies
# Parent interpreter: times the child (the whole interpreter: wall, and CPU, which a busy
# machine disturbs less) and prints the figures.
TIMER = """
import json, resource, subprocess, sys, time
start = time.perf_counter()
child = subprocess.run([sys.executable, "-c", sys.argv[1]], capture_output=True, text=True)
wall = time.perf_counter() - start
if child.returncode:
    sys.exit(child.stderr[-2000:])
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"inside": float(child.stdout.split()[-1]), "interpreter": wall,
                  "cpu": usage.ru_utime + usage.ru_stime, "system": usage.ru_stime}))
"""
CHILD = "import time; t = time.perf_counter(); {body}; print(time.perf_counter() - t)"
FINAL = f"ENV PYTHONPATH=/app/deps:{ROOT}\nUSER 65532:65532\n"
HANDWRITTEN = f"""\
FROM {{base}} AS builder
USER 0:0
COPY wheels/ /tmp/wheels/
RUN env -u PYTHONPATH PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-index \\
    --no-deps --no-cache-dir --disable-pip-version-check --target {ROOT} /tmp/wheels/*.whl

FROM {{base}}
USER 0:0
COPY --from=builder {ROOT} {ROOT}
{FINAL}"""


@dataclass(frozen=True)
class Variant:
    """One image of the comparison: its letter, what it is, the layer tars it ADDs, its figures."""

    key: str
    title: str
    tars: tuple[Path, ...] = ()
    bytecode_bytes: int = 0
    image: str = ""
    layers: int = 0
    added: int = 0  # image size minus the base's
    # seconds by measure: inside, interpreter, cpu, system, docker_run (from Run), start
    samples: dict[str, list[float]] = field(default_factory=dict)

    def median(self, measure: str) -> float:
        return statistics.median(self.samples[measure])

    def least(self, measure: str) -> float:
        return min(self.samples[measure])


@dataclass(frozen=True)
class Timings:
    """Cold writes of the set's layers and its bytecode, seconds."""

    deps_layer: float
    per_distribution_layers: float
    compile_by_workers: dict[int, float]


def docker_cli(*args: str, quiet: bool = True) -> str:
    output = subprocess.run(
        [DOCKER, *args],
        check=True,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL if quiet else None,
        env={**os.environ, "DOCKER_BUILDKIT": "1"},
    )
    return output.stdout


def resolve_wheels(packages: Sequence[str], wheels_dir: Path) -> list[Path]:
    """The extras of `packages` over the reference base, as the tool would install them.

    Resolved for CPython 3.13 manylinux x86_64 with the base's /app/deps pins as constraints
    (builder/runtime/pylock.amd64.toml), then the base's own distributions dropped; the wheels
    are downloaded hash-checked into `wheels_dir` (kept between runs).
    """
    lock = tomllib.loads((REPO / "builder/runtime/pylock.amd64.toml").read_text())
    pins = {p["name"]: p["version"] for p in lock["packages"]}
    wheels_dir.mkdir(parents=True, exist_ok=True)
    (wheels_dir / "requirements.in").write_text("\n".join(packages) + "\n")
    (wheels_dir / "base.txt").write_text("".join(f"{n}=={v}\n" for n, v in pins.items()))
    uv = [str(REPO / ".venv/bin/uv"), *shlex.split(UV_COMPILE)]
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    text = subprocess.run(uv, cwd=wheels_dir, env=env, check=True, capture_output=True, text=True)
    blocks = [b for b in text.stdout.replace("\\\n", " ").splitlines() if b.strip()]
    extras = [b for b in blocks if b.split("==")[0].strip().lower() not in pins]
    (wheels_dir / "extras.txt").write_text("\n".join(extras) + "\n")
    platforms = [f"--platform={p}" for p in PLATFORMS]
    pip = [str(REPO / ".venv/bin/pip"), *shlex.split(PIP_DOWNLOAD), *platforms]
    subprocess.run(pip, cwd=wheels_dir, check=True, stderr=subprocess.DEVNULL)
    names = {b.split("==")[0].strip().lower().replace("-", "_") for b in extras}
    found = [w for w in (wheels_dir / "files").glob("*.whl") if _dist(w) in names]
    if len(found) != len(names):
        sys.exit(f"wanted {sorted(names)}, found {sorted(w.name for w in found)}")
    return sorted(found, key=_dist)  # lock order, as the tool writes the single layer


def _dist(wheel: Path) -> str:
    return wheel.name.split("-")[0].lower().replace("-", "_")


def ensure_base(base: str | None) -> tuple[str, bool]:
    """The base image, and whether this run built it (the reference base, BuildKit-cached)."""
    if base:
        present = subprocess.run([DOCKER, "image", "inspect", base], capture_output=True)
        if present.returncode:
            sys.exit(f"{base}: no such image on this engine (nothing is pulled)")
        return base, False
    command = [str(REPO / ".venv/bin/build-sandbox-image"), "base", "--tag", DEFAULT_BASE]
    command += ["--from", "python:3.13-slim-trixie"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode:
        sys.exit(f"building the base failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    return DEFAULT_BASE, True


def timed(action: Callable[[], T]) -> tuple[T, float]:
    start = time.perf_counter()
    result = action()
    return result, time.perf_counter() - start


@dataclass(frozen=True)
class Layers:
    """The tars the variants are made of, per distribution ordered largest (lowest) first."""

    single: Layer
    per_distribution: tuple[Layer, ...]
    bytecode: Layer
    bytecode_per_distribution: tuple[Layer, ...]
    merged_per_distribution: tuple[Layer, ...]
    timings: Timings


def write_layers(
    client: docker.DockerClient, base: str, wheels: Sequence[Path], work: Path
) -> Layers:
    """Every layer of the comparison, into a fresh cache, the cold writes and compiles timed."""
    cache = Cache(work / "cache")
    shas = {wheel: sha256_of(wheel) for wheel in wheels}
    every = LayerWheels(tuple((shas[w], w) for w in wheels))
    single, single_seconds = timed(lambda: wheels_layer(every, ROOT, cache))
    order = sorted(wheels, key=lambda w: (-w.stat().st_size, w.name))  # largest lowest
    per, per_seconds = timed(lambda: per_distribution(order, wheels, shas, cache))
    seconds: dict[int, float] = {}
    (parts, interpreter), seconds[2] = timed(lambda: compile_all(client, base, shas, cache, 2))
    once = Cache(work / "cache-serial")
    _, seconds[1] = timed(lambda: compile_all(client, base, shas, once, 1))
    shutil.rmtree(once.root)
    epoch = source_date_epoch(wheels)
    everything = bytecode_layer(parts, interpreter, ROOT, epoch, cache).layer
    part_of = dict(zip(wheels, parts, strict=True))
    own = tuple(bytecode_layer([part_of[w]], interpreter, ROOT, epoch, cache).layer for w in order)
    merged = tuple(merged_layer(d, b, cache) for d, b in zip(per, own, strict=True))
    timings = Timings(single_seconds, per_seconds, seconds)
    return Layers(single, per, everything, own, merged, timings)


def per_distribution(
    order: Sequence[Path], wheels: Sequence[Path], shas: dict[Path, str], cache: Cache
) -> tuple[Layer, ...]:
    """One layer per wheel in `order`, each leaving out what a later wheel (lock order) installs,
    as builder.layers.extras writes them."""
    shadowed = shadowed_files(wheels)
    return tuple(
        wheels_layer(LayerWheels(((shas[w], w),), shadowed[w]), ROOT, cache) for w in order
    )


def compile_all(
    client: docker.DockerClient, base: str, shas: dict[Path, str], cache: Cache, workers: int
) -> tuple[list[Compiled], Interpreter]:
    """The set's bytecode with `workers` distributions at once, in the order of `shas`."""
    with Compiler(client, base, cache, ROOT) as compiler, ThreadPoolExecutor(workers) as pool:
        assert compiler.interpreter is not None
        queue = CompileQueue(lambda: compiler, pool)  # as a build compiles
        queue.add_as_ready(shas.items())
        done = queue.results()
        return [done[sha] for sha in shas.values()], compiler.interpreter


def merged_layer(distribution: Layer, its_bytecode: Layer, cache: Cache) -> Layer:
    """One sorted tar of a distribution's files and its bytecode (variant f)."""
    members: dict[str, tuple[tarfile.TarInfo, bytes | None]] = {}
    for layer in (its_bytecode, distribution):  # the distribution's directory entries win
        with tarfile.open(layer.path) as archive:
            for member in archive:
                extracted = archive.extractfile(member) if member.isfile() else None
                members[member.name] = (member, extracted.read() if extracted else None)

    def write(out: Any) -> None:
        with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for name in sorted(members):
                info, data = members[name]
                tar.addfile(info, io.BytesIO(data) if data is not None else None)

    temp, digest = written(cache, write)
    return keep(temp, digest, cache, distribution.source_date_epoch)


def variants(layers: Layers) -> list[Variant]:
    def tars(*parts: Layer | Sequence[Layer]) -> tuple[Path, ...]:
        flat = [p for part in parts for p in ([part] if isinstance(part, Layer) else part)]
        return tuple(layer.path for layer in flat)

    own_bytes = sum(layer.size for layer in layers.bytecode_per_distribution)
    per, own = layers.per_distribution, layers.bytecode_per_distribution
    return [
        Variant("a", "hand-written pip --target"),
        Variant("b", "one layer, no bytecode", tars(layers.single)),
        Variant(
            "c",
            "one layer + bytecode layer",
            tars(layers.single, layers.bytecode),
            layers.bytecode.size,
        ),
        Variant("d", "N layers + bytecode layer", tars(per, layers.bytecode), layers.bytecode.size),
        Variant("e", "N layers + N bytecode layers", tars(per, own), own_bytes),
        Variant(
            "f", "N layers, bytecode inside each", tars(layers.merged_per_distribution), own_bytes
        ),
    ]


def build_images(
    base: str, wheels: Sequence[Path], chosen: list[Variant], work: Path
) -> list[Variant]:
    """`docker build` each variant from one context of hard-linked tars and wheels (no network)."""
    context = work / "context"
    (context / "wheels").mkdir(parents=True)
    (context / "layers").mkdir()
    for wheel in wheels:
        os.link(wheel, context / "wheels" / wheel.name)
    built = []
    for variant in chosen:
        if variant.key == "a":
            dockerfile = HANDWRITTEN.format(base=base)
        else:
            adds = []
            for tar in variant.tars:
                name = f"layers/{tar.parent.name}.tar"
                if not (context / name).exists():
                    os.link(tar, context / name)
                adds.append(f"ADD {name} /\n")
            dockerfile = f"FROM {base}\n{''.join(adds)}{FINAL}"
        (work / f"Dockerfile.{variant.key}").write_text(dockerfile)
        image = f"{PREFIX}{variant.key}:latest"
        docker_cli(
            "build", "-q", "-f", str(work / f"Dockerfile.{variant.key}"), "-t", image, str(context)
        )
        facts = json.loads(docker_cli("image", "inspect", image, base))
        layers, added = len(facts[0]["RootFS"]["Layers"]), facts[0]["Size"] - facts[1]["Size"]
        code = variant.bytecode_bytes or (census(image)["pyc_bytes"] if variant.key == "a" else 0)
        built.append(Variant(variant.key, variant.title, variant.tars, code, image, layers, added))
    return built


CENSUS = f"""
import json, os
py = pyc = size = hashed = 0
for directory, _, names in os.walk({ROOT!r}):
    for name in names:
        path = os.path.join(directory, name)
        if name.endswith(".py"):
            py += 1
        elif name.endswith(".pyc"):
            pyc, size = pyc + 1, size + os.path.getsize(path)
            with open(path, "rb") as f:
                hashed += int.from_bytes(f.read(8)[4:], "little") & 1
print(json.dumps({{"py": py, "pyc": pyc, "pyc_bytes": size, "hash_based": hashed}}))
"""


def census(image: str) -> dict[str, int]:
    """Sources and bytecode files in the image's extras (and how many .pyc are hash-based)."""
    out = docker_cli("run", "--rm", *HARDENED, "--entrypoint", "python3", image, "-c", CENSUS)
    figures: dict[str, int] = json.loads(out)
    return figures


@dataclass(frozen=True)
class Run:
    """One `python3 -c` in a hardened container, seconds."""

    inside: float  # perf_counter around the body, in the child
    interpreter: float  # the child's wall, from its parent in the container
    cpu: float  # the child's user + system
    system: float  # the child's system time: where the kernel's path lookups show
    docker_run: float  # the whole `docker run`, from the host


def run_python(image: str, body: str) -> Run:
    """Time `body` in a child interpreter of a hardened container of `image`."""
    command = ["run", "--rm", *HARDENED, "--entrypoint", "python3", image]
    command += ["-c", TIMER, CHILD.format(body=body)]
    out, wall = timed(lambda: docker_cli(*command, quiet=False))
    figures = json.loads(out.strip().splitlines()[-1])
    return Run(figures["inside"], figures["interpreter"], figures["cpu"], figures["system"], wall)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def start_seconds(image: str) -> float:
    """`docker run` of the image's own entrypoint to the first `GET /` 200 on loopback."""
    port = free_port()
    name = f"{PREFIX}start-{port}"
    start = time.perf_counter()
    docker_cli("run", "-d", "--name", name, *HARDENED, "-p", f"127.0.0.1:{port}:8888", image)
    try:
        while time.perf_counter() - start < 60:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            try:
                connection.request("GET", "/")
                if connection.getresponse().status == 200:
                    return time.perf_counter() - start
            except (OSError, http.client.HTTPException):
                time.sleep(0.01)
            finally:
                connection.close()
        raise SystemExit(f"{image}: no GET / 200 within 60 s")
    finally:
        subprocess.run([DOCKER, "rm", "-f", name], check=False, capture_output=True)


def interleaved(
    images: Sequence[Variant], repeats: int, measure: Callable[[Variant], None]
) -> None:
    """`measure` each image once per round, rotating the order; round 0 only warms up."""
    for round_ in range(repeats + 1):
        shift = round_ % len(images)
        for variant in [*images[shift:], *images[:shift]]:
            measure(variant if round_ else Variant(variant.key, variant.title, image=variant.image))


def measure_imports(variant: Variant, imports: str) -> None:
    for measure, seconds in asdict(run_python(variant.image, f"import {imports}")).items():
        variant.samples.setdefault(measure, []).append(seconds)


def size_lines(images: Sequence[Variant], facts: dict[str, Any]) -> list[str]:
    """The run's heading, then each image's layers, sizes and bytecode census."""
    mib = 1 << 20
    lines = [
        f"commit {facts['commit']}  base {facts['base']} ({facts['base_layers']} layers)"
        f"  repeats {facts['repeats']} (interleaved, after a warm-up round)",
        f"extras: {len(facts['wheels'])} distributions ({', '.join(facts['wheels'])})",
        f"imports: {facts['imports']}",
        "",
        f"{'':3}{'image':32}{'layers':>7}{'added MiB':>10}{'pyc MiB':>9}{'+%':>6}"
        f"{'.py':>7}{'.pyc':>7}{'hash-based':>11}",
    ]
    for v in images:
        counts = facts["census"][v.key]
        lines.append(
            f"{v.key:3}{v.title:32}{v.layers:>7}{v.added / mib:>10.1f}"
            f"{v.bytecode_bytes / mib:>9.1f}"
            f"{100 * v.bytecode_bytes / (v.added - v.bytecode_bytes):>5.0f}%"
            f"{counts['py']:>7}{counts['pyc']:>7}{counts['hash_based']:>11}"
        )
    return lines


def time_lines(images: Sequence[Variant], facts: dict[str, Any]) -> list[str]:
    """Each image's median times (and against the hand-written `a`), then the startup floor."""
    lines = [
        "",
        "seconds, medians (import: perf_counter in the child; cpu: the child's user+sys, sys;"
        " interp: the child's wall; run: docker run; start: docker run -> GET / 200)",
        f"{'':3}{'image':32}{'import':>8}{'min':>7}{'cpu':>7}{'sys':>7}{'interp':>8}{'run':>7}"
        f"{'start':>7}{'import/a':>10}{'cpu/a':>7}",
    ]
    hand = {v.key: v for v in images}["a"]
    for v in images:
        lines.append(
            f"{v.key:3}{v.title:32}{v.median('inside'):>8.3f}{v.least('inside'):>7.3f}"
            f"{v.median('cpu'):>7.3f}{v.median('system'):>7.3f}{v.median('interpreter'):>8.3f}"
            f"{v.median('docker_run'):>7.2f}{v.median('start'):>7.3f}"
            f"{v.median('inside') / hand.median('inside'):>9.3f}x"
            f"{v.median('cpu') / hand.median('cpu'):>6.3f}x"
        )
    floor = facts["floor"]
    lines.append(
        f"startup floor (c, python3 -c pass): interp {floor['interpreter']:.3f} s,"
        f" docker run {floor['docker_run']:.2f} s"
    )
    return lines


def ratio_lines(images: Sequence[Variant]) -> list[str]:
    """The ratios the targets name: imports between pairs of images, container start against b."""
    by = {v.key: v for v in images}
    lines = ["", "ratios: import median / min / cpu median / sys median"]
    pairs = [("c", "b", "the bytecode win"), ("c", "a", "ours vs hand-written")]
    pairs += [(k, "c", "many layers vs one") for k in "def"] + [("d", "a", ""), ("f", "a", "")]
    for top, bottom, what in pairs:
        high, low = by[top], by[bottom]
        lines.append(
            f"  {top}/{bottom}: {high.median('inside') / low.median('inside'):.3f}x"
            f" / {high.least('inside') / low.least('inside'):.3f}x"
            f" / {high.median('cpu') / low.median('cpu'):.3f}x"
            f" / {high.median('system') / low.median('system'):.3f}x  {what}"
        )
    lines.append("container start vs b (one layer, no bytecode), median / min:")
    lines += [
        f"  {k}/b: {by[k].median('start') / by['b'].median('start'):.3f}x"
        f" / {by[k].least('start') / by['b'].least('start'):.3f}x"
        for k in "acdef"
    ]
    return lines


def report(images: Sequence[Variant], timings: Timings, facts: dict[str, Any]) -> list[str]:
    """The figures as printed: sizes, then times per image, then the ratios the targets name."""
    compile2, compile1 = timings.compile_by_workers[2], timings.compile_by_workers[1]
    deps = timings.deps_layer
    return [
        *size_lines(images, facts),
        *time_lines(images, facts),
        *ratio_lines(images),
        f"cold writes (fresh cache): deps layer {deps:.1f} s, per-distribution layers"
        f" {timings.per_distribution_layers:.1f} s, bytecode compile {compile2:.1f} s"
        f" (COMPILERS=2) / {compile1:.1f} s (COMPILERS=1);"
        f" (deps layer + compile) / deps layer = {(deps + compile2) / deps:.2f}x",
        f"time taken {facts['seconds']:.0f} s",
    ]


def measured(base: str, images: Sequence[Variant], args: argparse.Namespace) -> dict[str, Any]:
    """Imports, the startup floor and container start, interleaved; the facts the report names."""
    inspect = json.loads(docker_cli("image", "inspect", base))
    facts: dict[str, Any] = {
        "base": base,
        "base_layers": len(inspect[0]["RootFS"]["Layers"]),
        "repeats": args.repeats,
        "imports": args.imports,
        "census": {v.key: census(v.image) for v in images},
    }
    interleaved(images, args.repeats, lambda v: measure_imports(v, args.imports))
    c = next(v for v in images if v.key == "c")
    floor = [run_python(c.image, "pass") for _ in range(args.repeats)]
    facts["floor"] = {
        "interpreter": statistics.median(run.interpreter for run in floor),
        "docker_run": statistics.median(run.docker_run for run in floor),
    }
    interleaved(
        images,
        args.repeats,
        lambda v: v.samples.setdefault("start", []).append(start_seconds(v.image)),
    )
    return facts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packages", nargs="+", default=list(DEFAULT_SET))
    parser.add_argument("--imports", default=IMPORTS, help="the modules timed, comma-separated")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--base", help=f"base image (default: build {DEFAULT_BASE})")
    parser.add_argument("--wheels", type=Path, default=Path.home() / ".cache/bsi-bench-import")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--keep", action="store_true", help="keep the bsi-bench-* images")
    args = parser.parse_args()
    began = time.perf_counter()
    git = ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"]
    commit = subprocess.run(git, check=True, capture_output=True, text=True).stdout.strip()
    base, built_base = ensure_base(args.base)
    wheels = resolve_wheels(args.packages, args.wheels)
    try:
        with tempfile.TemporaryDirectory(prefix="bsi-bench-import-") as temp:
            layers = write_layers(docker.from_env(), base, wheels, Path(temp))
            images = build_images(base, wheels, variants(layers), Path(temp))
        facts = measured(base, images, args)
        facts |= {"commit": commit, "wheels": [_dist(w) for w in wheels]}
        facts["seconds"] = time.perf_counter() - began
        print("\n".join(report(images, layers.timings, facts)))
        if args.json:
            facts["images"] = [asdict(v) for v in images]
            facts["timings"] = asdict(layers.timings)
            args.json.write_text(json.dumps(facts, indent=1, default=str))
    finally:
        if not args.keep:
            doomed = [f"{PREFIX}{key}:latest" for key in "abcdef"]
            doomed += [DEFAULT_BASE] if built_base else []
            subprocess.run([DOCKER, "rmi", *doomed], check=False, capture_output=True)


if __name__ == "__main__":
    main()
