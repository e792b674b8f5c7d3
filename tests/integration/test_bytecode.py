"""Bytecode compiled by the base's own interpreter (builder.layers.bytecode), on the real engine.

The reproducibility traps the module guards against are shown to be real here first (a shared
interpreter and a random hash seed each change the bytes), so the tests that the compiler's
output is stable could fail if it stopped guarding against them.
"""

from __future__ import annotations

import tarfile
import threading
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from support.compilehelp import compile_all
from support.unpack import unpack
from support.wheelfactory import make_wheel

from builder.cache import Cache
from builder.errors import UserError
from builder.files import sha256_of
from builder.layers import bytecode, first_reads
from builder.layers.bytecode import CompileQueue, Compiler, bytecode_layer

pytestmark = pytest.mark.usefixtures("docker_client")

ROOT = "/app/deps-extra"
# CPython gh-129724: SEEDED's bytecode differs when an interpreter compiled IMPORTER before it.
IMPORTER = b"import foo\n"
SEEDED = b'a = {"foo", 2, 3}\n\n\ndef f():\n    b = {"foo", 2, 3}\n'
SHARED_NAMES = b"def f(alpha, beta):\n    return alpha.beta_gamma + beta.delta_epsilon\n"
BROKEN = b"print 'python 2'\n"


@pytest.fixture(scope="module")
def standin(test_env: dict) -> str:
    """An image with the target's CPython: the stand-in base the reference base is built on."""
    return str(test_env["base_image"])


def _wheels(tmp_path: Path) -> list[tuple[str, Path]]:
    one = make_wheel(
        tmp_path / "w",
        "alpha-pkg",
        "1.0",
        "py3-none-any",
        {
            "alpha_pkg/__init__.py": IMPORTER,
            "alpha_pkg/names.py": SHARED_NAMES,
            "alpha_pkg/tests/fixture_py2.py": BROKEN,
            "alpha_pkg/data.txt": b"not python\n",
        },
    )
    two = make_wheel(
        tmp_path / "w",
        "beta-pkg",
        "2.0",
        "py3-none-any",
        {"beta_pkg/__init__.py": SHARED_NAMES, "beta_pkg/sub/mod.py": SEEDED},
    )
    return [(sha256_of(wheel), wheel) for wheel in (one, two)]


def _members(tar: Path) -> dict[str, bytes]:
    with tarfile.open(tar) as archive:
        return {
            m.name: archive.extractfile(m).read()  # type: ignore[union-attr]
            for m in archive
            if m.isfile()
        }


def test_two_cold_compiles_give_the_same_layer(tmp_path: Path, docker_client, standin):
    wheels = _wheels(tmp_path)
    layers = []
    for run in ("a", "b"):
        cache = Cache(tmp_path / f"cache-{run}")
        with Compiler(docker_client, standin, cache, ROOT) as compiler:
            parts = compile_all(compiler, wheels)
            assert compiler.interpreter is not None
            layers.append(bytecode_layer(parts, compiler.interpreter, ROOT, 1_700_000_000, cache))
    assert layers[0].layer.diff_id == layers[1].layer.diff_id
    assert layers[0].compiled == 4
    assert layers[0].skipped == ("alpha_pkg/tests/fixture_py2.py",)
    members = _members(layers[0].layer.path)
    tag = layers[0].interpreter.cache_tag
    assert tag == "cpython-313"
    assert sorted(members) == sorted(
        f"app/deps-extra/{p}"
        for p in (
            f"alpha_pkg/__pycache__/__init__.{tag}.pyc",
            f"alpha_pkg/__pycache__/names.{tag}.pyc",
            f"beta_pkg/__pycache__/__init__.{tag}.pyc",
            f"beta_pkg/sub/__pycache__/mod.{tag}.pyc",
        )
    )
    with tarfile.open(layers[0].layer.path) as archive:
        for member in archive:
            assert (member.uid, member.gid, member.mtime) == (0, 0, 1_700_000_000)
            assert member.mode == (0o755 if member.isdir() else 0o644)
    pyc = members[f"app/deps-extra/alpha_pkg/__pycache__/names.{tag}.pyc"]
    flags = int.from_bytes(pyc[4:8], "little")
    assert flags == 0b01, "hash-based and unchecked (PEP 552), so it never goes stale"
    same_source = members[f"app/deps-extra/beta_pkg/__pycache__/__init__.{tag}.pyc"]
    assert pyc[8:16] == same_source[8:16], "the header holds the source's hash, not a time"


def test_a_distribution_compiles_the_same_alone_or_beside_others(
    tmp_path: Path, docker_client, standin
):
    """Each distribution gets a fresh interpreter: what else is compiled cannot change it."""
    wheels = _wheels(tmp_path)
    with Compiler(docker_client, standin, Cache(tmp_path / "both"), ROOT) as compiler:
        together = compile_all(compiler, wheels)
    with Compiler(docker_client, standin, Cache(tmp_path / "alone"), ROOT) as compiler:
        alone = compile_all(compiler, wheels[1:])
    assert _members(together[1].tar) == _members(alone[0].tar)


def test_one_worker_or_one_per_wheel_compile_the_same_bytes(tmp_path: Path, docker_client, standin):
    """The queue's width (bytecode.COMPILERS, one per core) changes when each distribution is
    compiled, never its bytes: the same tars with one worker and with a worker per wheel."""
    wheels = _wheels(tmp_path)
    tars = []
    for workers in (1, len(wheels)):
        cache = Cache(tmp_path / f"cache-{workers}")
        with (
            Compiler(docker_client, standin, cache, ROOT) as compiler,
            ThreadPoolExecutor(max_workers=workers) as pool,
        ):
            queue = CompileQueue(lambda compiler=compiler: compiler, pool)
            for sha, wheel in wheels:
                queue.add(sha, wheel)
            done = queue.results()
        tars.append({sha: _members(part.tar) for sha, part in done.items()})
    assert tars[0] == tars[1]
    assert all(tars[0].values())


def test_the_trap_is_real(tmp_path: Path, docker_client, standin):
    """In one shared interpreter a file's bytes depend on what it compiled before."""
    script = """
import marshal, sys
first = compile(sys.argv[1], "a.py", "exec")
print(marshal.dumps(compile(sys.argv[2], "b.py", "exec")).hex())
"""
    container = docker_client.containers.run(
        standin, entrypoint=["sleep", "infinity"], command=[], detach=True
    )
    try:

        def run(*argv: str) -> str:
            result = container.exec_run(
                ["python3", "-s", "-P", "-c", script, *argv],
                environment={"PYTHONHASHSEED": "0", "PYTHONPATH": ""},
            )
            assert result.exit_code == 0, result.output
            return result.output.decode().strip()

        assert run("x = 1\n", SEEDED.decode()) != run(IMPORTER.decode(), SEEDED.decode())
    finally:
        container.remove(force=True)


def test_the_cache_answers_for_the_same_interpreter(
    tmp_path: Path, docker_client, standin, monkeypatch: pytest.MonkeyPatch
):
    wheels = _wheels(tmp_path)
    cache = Cache(tmp_path / "cache")
    with Compiler(docker_client, standin, cache, ROOT) as compiler:
        first = compile_all(compiler, wheels)

    def never(_: Path) -> tuple[str, ...]:
        raise AssertionError("a cache hit parsed the sources again for the first reads")

    monkeypatch.setattr(first_reads, "wheel_first_reads", never)
    with Compiler(docker_client, standin, cache, ROOT) as compiler:
        compiler.container.remove(force=True)  # a second compile would now fail
        again = compile_all(compiler, wheels)
    assert [c.tar for c in again] == [c.tar for c in first]
    assert [c.first for c in again] == [c.first for c in first] and any(c.first for c in first)


def test_pyc_files_import_in_a_read_only_sandbox(tmp_path: Path, docker_client, standin):
    """The layer's .pyc are what the interpreter loads as uid 65532, writing nothing."""
    wheels = _wheels(tmp_path)
    cache = Cache(tmp_path / "cache")
    with Compiler(docker_client, standin, cache, ROOT) as compiler:
        assert compiler.interpreter is not None
        layer = bytecode_layer(
            compile_all(compiler, wheels), compiler.interpreter, ROOT, 1_700_000_000, cache
        )
    sources = tmp_path / "src"
    for _, wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            for name in archive.namelist():
                if name.endswith(".py"):
                    (sources / name).parent.mkdir(parents=True, exist_ok=True)
                    (sources / name).write_bytes(archive.read(name))
    unpack(layer.layer.path, tmp_path / "pyc")
    for pyc in (tmp_path / "pyc" / "app" / "deps-extra").rglob("*.pyc"):
        target = sources / pyc.relative_to(tmp_path / "pyc" / "app" / "deps-extra")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(pyc.read_bytes())
    check = "import beta_pkg.sub.mod"
    output = docker_client.containers.run(
        standin,
        entrypoint=["python3", "-c", check],
        command=[],
        user="65532:65532",
        read_only=True,
        environment={"PYTHONPATH": ROOT, "PYTHONVERBOSE": "1"},
        volumes={str(sources): {"bind": ROOT, "mode": "ro"}},
        remove=True,
        stderr=True,
    ).decode()
    # verbose mode names each module's origin: "code object from '<pyc>'" (quoted) when it
    # was loaded from bytecode, the bare source path when it was compiled
    for module in ("beta_pkg/__init__", "beta_pkg/sub/mod"):
        head, name = module.rsplit("/", 1)
        cached = f"{ROOT}/{head}/__pycache__/{name}.cpython-313.pyc"
        assert f"code object from '{cached}'" in output, output[-2000:]
    assert "could not create" not in output and "wrote '" not in output


def _sized(tmp_path: Path) -> list[tuple[str, Path]]:
    """Three wheels holding 1, 30 and 10 lines of Python: their compile order is known."""
    wheels = [
        make_wheel(tmp_path / "q", name, "1.0", "py3-none-any", {f"{name}.py": b"x = 1\n" * lines})
        for name, lines in (("small", 1), ("large", 30), ("middle", 10))
    ]
    return [(sha256_of(wheel), wheel) for wheel in wheels]


def _recording(
    monkeypatch: pytest.MonkeyPatch, compiled: threading.Event | None = None
) -> list[str]:
    """The distributions compiled, in order; `compiled` is set after the first one ends."""
    order: list[str] = []
    real = bytecode.Compiler.compile

    def recorded(self: Compiler, sha: str, wheel: Path) -> Any:
        order.append(wheel.name.split("-")[0])
        part = real(self, sha, wheel)
        if compiled is not None:
            compiled.set()
        return part

    monkeypatch.setattr(bytecode.Compiler, "compile", recorded)
    return order


def test_the_queue_compiles_the_largest_waiting_wheel_first(
    tmp_path: Path, docker_client, standin, monkeypatch: pytest.MonkeyPatch
):
    """The biggest distributions decide when the last compile ends: they go first."""
    order = _recording(monkeypatch)
    wheels = _sized(tmp_path)
    queued = threading.Event()
    with (
        Compiler(docker_client, standin, Cache(tmp_path / "cache"), ROOT) as compiler,
        ThreadPoolExecutor(max_workers=1) as pool,
    ):
        queue = CompileQueue(lambda: (queued.wait(), compiler)[1], pool)
        for sha, wheel in wheels + wheels[:1]:  # the same wheel twice: compiled once
            queue.add(sha, wheel)
        queued.set()
        done = queue.results()
    assert order == ["large", "middle", "small"]
    assert sorted(done) == sorted(sha for sha, _ in wheels)
    assert all(done[sha].compiled == 1 for sha, _ in wheels)


def test_a_wheel_compiles_while_later_ones_are_still_coming(
    tmp_path: Path, docker_client, standin, monkeypatch: pytest.MonkeyPatch
):
    """add_as_ready compiles each wheel as it arrives: the second is only handed over once the
    first was compiled, which a queue waiting for the last download would never do."""
    compiled_first = threading.Event()
    order = _recording(monkeypatch, compiled_first)
    (first_sha, first), (second_sha, second) = _sized(tmp_path)[:2]

    def arriving() -> Iterator[tuple[Path, str]]:
        yield first, first_sha
        assert compiled_first.wait(timeout=120), "nothing compiled before the last arrival"
        yield second, second_sha

    with (
        Compiler(docker_client, standin, Cache(tmp_path / "cache"), ROOT) as compiler,
        ThreadPoolExecutor(max_workers=bytecode.COMPILERS) as pool,
    ):
        queue = CompileQueue(lambda: compiler, pool)
        queue.add_as_ready(arriving())
        done = queue.results()
    assert order == ["small", "large"]
    assert sorted(done) == sorted([first_sha, second_sha])


def test_an_image_by_id_starts_no_container_until_a_wheel_is_new(
    tmp_path: Path, docker_client, standin
):
    """An engine image id cannot change its python3: a rerun takes the interpreter identified
    before from the cache and starts a container only for a wheel not compiled yet."""
    image = docker_client.images.get(standin).id
    wheels = _wheels(tmp_path)
    cache = Cache(tmp_path / "cache")
    with Compiler(docker_client, image, cache, ROOT) as compiler:
        first = compile_all(compiler, wheels[:1])
        assert compiler.container is not None
        identified = compiler.interpreter
    with Compiler(docker_client, image, cache, ROOT) as compiler:
        assert compiler.container is None and compiler.interpreter == identified
        assert [c.tar for c in compile_all(compiler, wheels[:1])] == [c.tar for c in first]
        assert compiler.container is None, "everything was in the cache"
        compile_all(compiler, wheels[1:])
        assert compiler.container is not None and compiler.interpreter == identified
    with Compiler(docker_client, standin, cache, ROOT) as compiler:  # a tag may move: identify
        assert compiler.container is not None


def test_a_failure_after_compiles_were_queued_drops_those_not_started(tmp_path: Path):
    """prepare's compile pool (bytecode.cancelled_on_error): a step failing while wheels wait
    for a compile raises once the running compile ends, not after compiling every queued one.
    The stand-in compiler holds its first compile until the pool is shut down."""
    shut_down, ran = threading.Event(), list[str]()

    class Pool(ThreadPoolExecutor):
        def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
            if cancel_futures:
                super().shutdown(wait=False, cancel_futures=True)
            shut_down.set()  # lets the running compile end
            super().shutdown(wait, cancel_futures=cancel_futures)

    class Holding:
        def compile(self, wheel_sha256: str, wheel: Path) -> Any:
            ran.append(wheel_sha256)
            shut_down.wait()
            return None

    wheels = _wheels(tmp_path) * 3  # the same two, queued once each
    more = [(f"{n}{sha[1:]}", wheel) for n, (sha, wheel) in enumerate(wheels)]
    with (
        pytest.raises(UserError, match="the step after"),
        Pool(max_workers=1) as pool,
        bytecode.cancelled_on_error(pool),
    ):
        queue = CompileQueue(lambda: Holding(), pool)  # type: ignore[arg-type, return-value]
        queue.add_as_ready((wheel, sha) for sha, wheel in more)
        assert len(queue.jobs) == len(more) > 1
        raise UserError("the step after the compiles were queued failed")
    assert len(ran) == 1  # the one running; none of the queued ones started
