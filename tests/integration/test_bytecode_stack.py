"""The extras' bytecode layers (builder.layers.extras.with_bytecode) on the real engine: compiled
once by the native interpreter for every arch, byte for byte the same from two cold caches, and
an arm64 image built from the amd64 compile imports from its .pyc without writing anything."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from support.compilehelp import compile_all
from support.wheelfactory import make_wheel

from builder.assemble.assemble import Assembly, assemble
from builder.cache import Cache
from builder.contract import BYTECODE_LABEL
from builder.engines.connection import Engine
from builder.files import sha256_of
from builder.layers import bytecode
from builder.layers.bytecode import Compiler
from builder.layers.extras import LayerKind, distribution_layers, with_bytecode
from builder.verify.run import verify_image

pytestmark = pytest.mark.usefixtures("docker_client")

ROOT = "/app/deps-extra"
TAG = "cpython-313"


def _sets(tmp_path: Path) -> tuple[dict[str, list[tuple[str, str, str]]], dict[str, Path]]:
    """Per arch (name, version, sha256) pins sharing one pure wheel, and sha256 -> file."""
    shared = make_wheel(
        tmp_path / "w",
        "shared-pkg",
        "1.0",
        "py3-none-any",
        {
            "shared_pkg/__init__.py": b"from shared_pkg.sub import VALUE\n" * 20,
            "shared_pkg/sub.py": b'VALUE = {"foo", 2, 3}\n',
        },
    )
    own = {
        arch: make_wheel(
            tmp_path / "w", f"only-{arch}", "1.0", "py3-none-any", {f"only_{arch}.py": b"X = 1\n"}
        )
        for arch in ("amd64", "arm64")
    }
    wheels = {sha256_of(w): w for w in (shared, *own.values())}
    pins = {
        arch: [("shared-pkg", "1.0", sha256_of(shared)), (f"only-{arch}", "1.0", sha256_of(wheel))]
        for arch, wheel in own.items()
    }
    return pins, wheels


@pytest.fixture
def sets(tmp_path: Path) -> tuple[dict[str, list[tuple[str, str, str]]], dict[str, Path]]:
    """One set of wheels per test: two cold runs must see the very same files."""
    return _sets(tmp_path)


def _stacks(sets: Any, docker_client: Any, image: str, cache: Cache) -> Any:
    pins, wheels = sets
    stacks = {arch: distribution_layers(p, wheels, ROOT, cache, 24) for arch, p in pins.items()}
    distinct = {sha: wheels[sha] for stack in stacks.values() for o in stack for sha in o.wheels}
    with Compiler(docker_client, image, cache, ROOT) as compiler:
        parts = compile_all(compiler, list(distinct.items()))
        assert compiler.interpreter is not None
        by_sha = {part.wheel_sha256: part for part in parts}
        return with_bytecode(stacks, by_sha, compiler.interpreter, ROOT, cache)


def test_one_native_compile_serves_both_arches_and_two_cold_caches_agree(
    tmp_path: Path,
    sets: Any,
    docker_client: Any,
    test_env: dict,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    compiled: list[str] = []
    real = bytecode.Compiler.compile

    def counted(self: Compiler, sha: str, wheel: Path) -> Any:
        compiled.append(wheel.name)
        return real(self, sha, wheel)

    monkeypatch.setattr(bytecode.Compiler, "compile", counted)
    runs = [
        _stacks(sets, docker_client, test_env["base_image"], Cache(tmp_path / name))
        for name in ("one", "two")
    ]
    assert len(compiled) == 2 * 3, "each distinct wheel once per run, the shared one included"
    (first, facts), (second, _) = runs
    for arch in ("amd64", "arm64"):
        kinds = [one.kind for one in first[arch]]
        assert kinds == [
            LayerKind.DISTRIBUTION,
            LayerKind.DISTRIBUTION,
            LayerKind.BYTECODE,
            LayerKind.BYTECODE,
        ]
        dist, code = first[arch][:2], first[arch][2:]
        assert [one.names for one in code] == [one.names for one in dist]  # same group order
        assert [o.layer.diff_id for o in first[arch]] == [o.layer.diff_id for o in second[arch]]
        assert facts[arch].interpreter.cache_tag == TAG and facts[arch].compiled == 3
        assert facts[arch].size == sum(one.layer.size for one in code)
    shared = [
        next(o for o in first[arch] if o.kind == LayerKind.BYTECODE and o.names == ("shared-pkg",))
        for arch in ("amd64", "arm64")
    ]
    assert shared[0].layer.diff_id == shared[1].layer.diff_id  # amd64's compile, shipped for arm64


def test_an_arm64_image_imports_from_the_native_compile_without_writing(
    tmp_path: Path, sets: Any, docker_client: Any, test_env: dict, arm64_standin: str
) -> None:
    cache = Cache(tmp_path / "cache")
    stacks, _ = _stacks(sets, docker_client, test_env["base_image"], cache)
    system = docker_client.images.get(test_env["base_image_arm64"]).id
    tag = f"bsi-bytecode-{uuid.uuid4().hex[:8]}:arm64"
    labels = {"org.build-sandbox-image.test": "bytecode"}
    built = assemble(
        docker_client,
        system,
        stacks["arm64"],
        Assembly("arm64", ROOT, labels, "2026-01-01T00:00:00Z", tag),
        cache,
    )
    try:
        output = docker_client.containers.run(
            built.image_id,
            entrypoint=["python3", "-c", "import shared_pkg, only_arm64"],
            command=[],
            user="65532:65532",
            read_only=True,
            network_disabled=True,
            environment={"PYTHONPATH": ROOT, "PYTHONVERBOSE": "1"},
            platform="linux/arm64",
            remove=True,
            stderr=True,
        ).decode()
    finally:
        docker_client.images.remove(tag, force=True)
    for module in ("shared_pkg/__init__", "shared_pkg/sub", "only_arm64"):
        head, _, name = module.rpartition("/")
        cached = f"{ROOT}/{head + '/' if head else ''}__pycache__/{name}.{TAG}.pyc"
        assert f"code object from '{cached}'" in output, output[-2000:]
    assert "could not create" not in output and "wrote '" not in output


def test_verify_fails_an_image_whose_extras_lack_the_bytecode_its_label_promises(
    tmp_path: Path, sets: Any, docker_client: Any, reference_image: str
) -> None:
    """The label names an interpreter, so the `bytecode` line is required: without the bytecode
    layers the imports come from source and verify fails; with them it passes."""
    cache = Cache(tmp_path / "cache")
    stacks, facts = _stacks(sets, docker_client, reference_image, cache)
    system = docker_client.images.get(reference_image).id
    labels = {BYTECODE_LABEL: facts["amd64"].interpreter.build}
    lines = {}
    for name, stack in (("without", stacks["amd64"][:2]), ("with", stacks["amd64"])):
        tag = f"bsi-bytecode-{uuid.uuid4().hex[:8]}:{name}"
        assembly = Assembly("amd64", ROOT, labels, "2026-01-01T00:00:00Z", tag)
        assemble(docker_client, system, stack, assembly, cache)
        try:
            report = verify_image(
                tag, modules=["shared_pkg", "only_amd64"], engine=Engine.local(docker_client)
            )
        finally:
            docker_client.images.remove(tag, force=True)
        lines[name] = next(check for check in report.checks if check.name == "bytecode")
    assert not lines["without"].passed and "compiled from source" in lines["without"].detail
    assert lines["with"].passed, lines["with"].detail
