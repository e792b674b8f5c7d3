"""The layering the package promises, and the house rules that keep it readable.

- the pipeline's stages (resolve -> inspect -> plan -> layers -> context -> assemble -> verify ->
  publish) each import only earlier stages, never a later one nor the orchestration; the
  stages inspect and plan reach no process, engine or network module, transitively; verify
  knows no stage before it (the CLI hands it names); the OCI core imports nothing of the
  project but the errors, the retry policy and the digest of a stream;
- the pure core, declared per module (PURE_MODULES): the decisions import only each other and
  no process, thread, socket, engine, registry or temporary-file module, call no file API, and
  are at least a fifth of builder/ by lines (the runtime server excluded);
- one home per publishing step: blobs, manifests and tags are written by oci/remote.py only,
  media types and a document's digest live in oci/v1.py, platform variants in the core;
- one home per shared concept: one retry loop (builder/retry.py), one sha256-with-size of a
  stream and one `Readable` (builder/digest.py; a file's sha256 is builder/files.py's, counted
  with the digest's `Sha256`);
- the orchestration alone sequences producers, verification and writes, and the publisher
  (builder/publish/publisher.py) alone writes what was verified: a producer's images, the
  index, the signatures, the tag and the state. publish/ is the last stage, so it may import
  every package beside the stages (the signer in sign/, the attestations, the SOCI indexes of
  layers/, the OCI core) without widening any rule; it never imports the orchestration;
- no package holds more than 12 modules directly, no `# fmt` escapes, no function outside the
  CLI with more than 8 parameters, module-level constants immutable; a function's length only
  as a backstop (ruff's complexity rules hold the rest);
- the documents agree with the tree: every path pyproject.toml names exists, and
  docs/design.md names every package, subpackage and module.

Imports are read with `ast` (module level and inside functions alike), so a lazy import does
not slip past the rule, and followed transitively: a layer must not reach what it may not
import through another module, and no module of builder/ imports itself through others.
"""

from __future__ import annotations

import ast
import re
import tomllib
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "builder"
MAX_MODULES_PER_PACKAGE = 12
# The pipeline's stages in the order the data flows through them.
STAGES = ("resolve", "inspect", "plan", "layers", "context", "assemble", "verify", "publish")
# The orchestration (the only code that sequences producers, verification and writes) and the
# command line above it.
ORCHESTRATION = ("builder.orchestration", "builder.cli")
# What inspect and plan may not reach: the modules that talk to a process, an engine or a
# network (the stricter rule of the pure core, per module, is PURE_MODULES's, below).
IO_MODULES = ("subprocess", "docker", "socket", "http", "urllib.request", "requests")
PURE = ("inspect", "plan")


def _later(stage: str) -> tuple[str, ...]:
    return tuple(f"builder.{s}" for s in STAGES[STAGES.index(stage) + 1 :])


# layer -> the builder packages/modules (and third-party names) it must never import
FORBIDDEN = {
    **{stage: (*_later(stage), *ORCHESTRATION) for stage in STAGES},
    **{stage: (*_later(stage), *ORCHESTRATION, *IO_MODULES) for stage in PURE},
    "verify": (
        *(f"builder.{s}" for s in STAGES if s != "verify"),
        "builder.base",
        *ORCHESTRATION,
    ),
    "base": (*(f"builder.{s}" for s in STAGES[3:]), *ORCHESTRATION),
    "attest": (
        *(f"builder.{s}" for s in STAGES),
        "builder.base",
        "builder.engines",
        "builder.oci",
        "docker",
        *ORCHESTRATION,
    ),
    "engines": (*(f"builder.{s}" for s in STAGES[1:]), "builder.base", *ORCHESTRATION),
    "oci": (
        *(f"builder.{s}" for s in STAGES),
        "builder.base",
        "builder.engines",
        "builder.attest",
        "docker",
        *ORCHESTRATION,
    ),
    "cache": (*(f"builder.{s}" for s in STAGES), "builder.oci", "docker", *ORCHESTRATION),
}


def package_of(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])


def imported_names(source: str, package: str) -> set[str]:
    """Every module `source` imports, absolute names (relative imports resolved)."""
    tree = ast.parse(source)
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}".rstrip(".")
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def modules(layer: str) -> list[Path]:
    return sorted((PACKAGE / layer).rglob("*.py"))


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_only_what_it_may(layer: str) -> None:
    assert modules(layer), f"builder/{layer} has no modules"
    offences = [
        f"{path.relative_to(PACKAGE.parent)} imports {name}"
        for path in modules(layer)
        for name in sorted(imported_names(path.read_text(), package_of(path)))
        if any(name == f or name.startswith(f + ".") for f in FORBIDDEN[layer])
    ]
    assert not offences, "\n".join(offences)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# The runtime server runs inside the image as its own top-level package (sandbox_server).
SERVER = PACKAGE / "runtime" / "server"


@cache
def import_graph() -> dict[str, frozenset[str]]:
    """builder module -> every name it imports (modules of builder/ as modules, with the
    packages Python runs on the way, and third-party names as written)."""
    paths = {
        module_name(path): path for path in PACKAGE.rglob("*.py") if SERVER not in path.parents
    }

    def module_of(name: str) -> str:
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else package_of(path)
        edges = set()
        for imported in imported_names(path.read_text(), package):
            target = module_of(imported) if imported.startswith("builder") else imported
            parts = target.split(".")
            edges.update(".".join(parts[:n]) for n in range(1, len(parts) + 1))
        edges.discard(name)
        graph[name] = frozenset(edges)
    return graph


def reachable(module: str) -> set[str]:
    """Every name `module` imports, directly or through the builder modules it imports."""
    graph = import_graph()
    seen: set[str] = set()
    todo = [module]
    while todo:
        for name in graph.get(todo.pop(), ()):
            if name not in seen:
                seen.add(name)
                todo.append(name)
    return seen


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_no_layer_reaches_what_it_may_not_through_another_module(layer: str) -> None:
    """A lower layer must not reach the orchestration (or any layer it may not import) by way
    of a module it may import: that is the same dependency, only hidden."""
    offences = [
        f"{module_name(path)} reaches {name}"
        for path in modules(layer)
        for name in sorted(reachable(module_name(path)))
        if any(name == f or name.startswith(f + ".") for f in FORBIDDEN[layer])
    ]
    assert not offences, "\n".join(offences)


def test_no_import_cycle() -> None:
    """Every module of builder/ can be understood before the modules that import it."""
    cycles = sorted(module for module in import_graph() if module in reachable(module))
    assert not cycles, f"modules that import themselves through others: {cycles}"


def test_every_layer_says_its_job_and_its_imports() -> None:
    for layer in FORBIDDEN:
        doc = ast.get_docstring(ast.parse((PACKAGE / layer / "__init__.py").read_text()))
        assert doc and "import" in doc, f"builder/{layer}/__init__.py must say what it may import"


def test_no_package_holds_more_than_twelve_modules() -> None:
    """A package is one concept a newcomer can hold in mind; past twelve modules it is two.
    The runtime server's packages included."""
    crowded = {
        str(package.relative_to(PACKAGE.parent)): n
        for package in {path.parent for path in PACKAGE.rglob("__init__.py")}
        if (n := len(list(package.glob("*.py")))) > MAX_MODULES_PER_PACKAGE
    }
    assert not crowded, f"packages over {MAX_MODULES_PER_PACKAGE} modules: {crowded}"


def test_no_formatter_escapes() -> None:
    """`# fmt: skip` was used to squeeze modules under the line limit; none may come back."""
    marker = "fmt: " + "skip"
    found = [
        str(path.relative_to(PACKAGE.parent))
        for path in PACKAGE.rglob("*.py")
        if marker in path.read_text()
    ]
    assert not found, f"{marker} in {found}"


MAX_PARAMETERS = 8


def parameter_count(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    arguments = function.args
    names = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
    names += [a for a in (arguments.vararg, arguments.kwarg) if a is not None]
    return len([a for a in names if a.arg not in ("self", "cls")])


def test_no_function_outside_the_cli_takes_more_than_eight_parameters() -> None:
    """Records, not long parameter lists (click hands the CLI's options over one by one)."""
    long = [
        f"{path.relative_to(PACKAGE.parent)}: {node.name} ({parameter_count(node)})"
        for path in builder_modules()
        if PACKAGE / "cli" not in path.parents
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and parameter_count(node) > MAX_PARAMETERS
    ]
    assert not long, f"functions with more than {MAX_PARAMETERS} parameters: {long}"


MUTABLE_CALLS = frozenset({"dict", "list", "set", "defaultdict", "OrderedDict", "bytearray"})


def test_module_level_constants_are_immutable() -> None:
    """An UPPER_CASE module constant is a tuple, frozenset, MappingProxyType, str, number..."""
    offences = []
    for path in builder_modules():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            else:
                continue
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            mutable = isinstance(
                value, ast.Dict | ast.List | ast.Set | ast.DictComp | ast.ListComp | ast.SetComp
            ) or (
                isinstance(value, ast.Call)
                and isinstance(value.func, ast.Name)
                and value.func.id in MUTABLE_CALLS
            )
            offences += [
                f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {name}"
                for name in names
                if mutable and name.lstrip("_").isupper()
            ]
    assert not offences, f"mutable module constants: {offences}"


def test_only_the_orchestration_sequences_producers_verification_and_writes() -> None:
    """`deliver` is called by builder.orchestration.commands alone; images are verified only in
    the delivery (and by the `verify` command); only the publisher writes a producer's images,
    signs them and records the state (a rebase that must pull its image writes it by digest
    first, and `base --tag` writes engine images that no producer made)."""
    allowed = {
        "builder.orchestration.delivery.deliver": {"builder/orchestration/commands.py"},
        "builder.verify.run.verify_image": {
            "builder/orchestration/delivery.py",
            "builder/cli/verify.py",
        },
        "builder.oci.remote.write": {
            "builder/publish/publisher.py",
            "builder/orchestration/produce_rebase.py",
            "builder/assemble/from_engine.py",
        },
        "builder.oci.remote.sign_and_tag": {"builder/publish/publisher.py"},
        "builder.sign.cosign.signed_push": {"builder/publish/publisher.py"},
        "builder.publish.state.save_state": {"builder/publish/publisher.py"},
    }
    offences = [
        f"{path.relative_to(PACKAGE.parent)} imports {name}"
        for path in builder_modules()
        for name in sorted(imported_names(path.read_text(), package_of(path)) & set(allowed))
        if str(path.relative_to(PACKAGE.parent)) not in allowed[name]
    ]
    assert not offences, "\n".join(offences)


def test_the_index_is_built_in_one_place() -> None:
    """A tag names one index, built by the publisher's `index_of` for a one-job run and for a
    runners' merge alike (builder.publish.publisher); `base --tag` indexes engine images no
    producer made (builder.assemble.from_engine)."""
    homes = {"builder/publish/publisher.py", "builder/assemble/from_engine.py"}
    builders = [
        str(path.relative_to(PACKAGE.parent))
        for path in builder_modules()
        if str(path.relative_to(PACKAGE.parent)) not in homes
        and path != CORE / "v1.py"
        and "Index.build(" in path.read_text()
    ]
    assert not builders, f"an index built outside {sorted(homes)}: {builders}"


def test_import_rule_reader_sees_lazy_and_relative_imports() -> None:
    """The checker itself must catch what it exists to catch."""
    source = "def f():\n    from ..context import render\n    import docker\n"
    names = imported_names(source, "builder.plan")
    assert "builder.context.render" in names and "docker" in names


# -- the pure core: the decisions, readable without an engine ----------------------------------
# Purity is declared per module. A pure module decides and does no I/O of its own: it imports
# no process, thread, socket, engine, registry or temporary-file API and calls no file API; it
# is handed what it decides on (a wheel's member list, a run's JSON lines, a file's bytes) by
# an I/O edge beside it (inspect.wheel_reader, verify.client, verify.deep.imports, the
# orchestration...). It imports only other pure modules of builder/ and, of what is outside,
# none of PURE_FORBIDDEN_IMPORTS. Package __init__ modules are listed when a pure module's
# import runs them.
PURE_MODULES = frozenset(
    {
        "builder",
        "builder.contract",
        "builder.data",
        "builder.digest",
        "builder.errors",
        "builder.attest",
        "builder.attest.contents",
        "builder.attest.provenance",
        "builder.attest.sbom",
        "builder.attest.sbom_render",
        "builder.base",
        "builder.base.profile",
        "builder.context",
        "builder.context.labels",
        "builder.inspect",
        "builder.inspect.elf",
        "builder.inspect.literals",
        "builder.inspect.loads",
        "builder.inspect.members",
        "builder.inspect.program_names",
        "builder.inspect.program_reader",
        "builder.inspect.programs",
        "builder.inspect.wheels",
        "builder.layers",
        "builder.layers.install_layout",
        "builder.oci",
        "builder.oci.mutate",
        "builder.oci.name",
        "builder.oci.v1",
        "builder.plan",
        "builder.plan.browsers",
        "builder.plan.debian",
        "builder.plan.gpu",
        "builder.plan.layering",
        "builder.plan.natives",
        "builder.plan.plan",
        "builder.plan.program_needs",
        "builder.plan.sizes",
        "builder.publish",
        "builder.publish.build_facts",
        "builder.publish.tags",
        "builder.resolve",
        "builder.resolve.index_options",
        "builder.resolve.resolution",
        "builder.resolve.target",
        "builder.verify",
        "builder.verify.deep",
        "builder.verify.deep.causes",
        "builder.verify.deep.script",
        "builder.verify.report",
    }
)
# The tool's own shipped tables (builder/data: Debian's sonames and packages, the GPU table, the
# base profile) are part of the installed tool, fixed as its code is: builder.data is their
# one reader, and the one module of the pure set allowed importlib.resources and a file read.
SHIPPED_DATA = "builder.data"
# What a pure module may not reach (stdlib and third-party; a deny-list, with its prefixes).
PURE_FORBIDDEN_IMPORTS = (
    *IO_MODULES,
    "ssl",
    "multiprocessing",
    "concurrent",
    "threading",
    "asyncio",
    "selectors",
    "signal",
    "tempfile",
    "shutil",
    "fcntl",
    "mmap",
    "sqlite3",
    "glob",
    "importlib.resources",
)
# Calls that open, read, write or lay out files: `open(...)`, `path.open(...)`, `x.read_text()`,
# `zipfile.ZipFile(path)`... by the called name (what `ast` can see without types; `stat`,
# `exists` and `is_dir` are left out: a ZipInfo has `is_dir` too). Any `os.<f>(...)` but
# `os.path.*` and `os.fspath` is I/O as well.
PURE_FORBIDDEN_CALLS = frozenset(
    {
        "open",
        "read_bytes",
        "read_text",
        "write_bytes",
        "write_text",
        "mkdir",
        "makedirs",
        "unlink",
        "rmdir",
        "rmtree",
        "iterdir",
        "rglob",
        "listdir",
        "scandir",
        "touch",
        "symlink_to",
        "chmod",
        "ZipFile",
        "TarFile",
    }
)
# The pure core's share of the tool's lines. The runtime server (builder/runtime/) is not
# counted: it runs inside the image as its own program and imports nothing of the tool.
MIN_PURE_SHARE = 0.20
RUNTIME = PACKAGE / "runtime"


def module_paths() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py") if SERVER not in p.parents}


def file_calls(path: Path) -> list[str]:
    """`line name` of each call in `path` that opens, reads or writes a file (above)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        function = node.func
        name = function.attr if isinstance(function, ast.Attribute) else None
        name = function.id if isinstance(function, ast.Name) else name
        dotted = ast.unparse(function)
        if name in PURE_FORBIDDEN_CALLS or (
            dotted.startswith("os.") and not dotted.startswith(("os.path.", "os.fspath"))
        ):
            found.append(f"{node.lineno} {dotted}")
    return found


def test_every_pure_module_exists() -> None:
    missing = sorted(PURE_MODULES - set(module_paths()))
    assert not missing, f"PURE_MODULES names modules that are not there: {missing}"


@pytest.mark.parametrize("module", sorted(PURE_MODULES))
def test_a_pure_module_imports_only_pure_modules_and_no_io(module: str) -> None:
    """Directly: its builder imports are pure modules; transitively: no module it reaches
    imports an I/O, process, thread or temporary-file module (builder.data alone reads its
    tables, with importlib.resources)."""
    paths = module_paths()
    impure = sorted(
        name for name in import_graph()[module] if name in paths and name not in PURE_MODULES
    )
    assert not impure, f"{module} imports modules outside the pure core: {impure}"
    through = {module} | {name for name in reachable(module) if name in paths}
    reached = sorted(
        f"{name} (by {importer})"
        for importer in through
        for name in import_graph()[importer]
        if any(name == f or name.startswith(f + ".") for f in PURE_FORBIDDEN_IMPORTS)
        and not (importer == SHIPPED_DATA and name == "importlib.resources")
    )
    assert not reached, f"{module} reaches {reached}"


@pytest.mark.parametrize("module", sorted(PURE_MODULES - {SHIPPED_DATA}))
def test_a_pure_module_calls_no_file_api(module: str) -> None:
    path = module_paths()[module]
    found = file_calls(path)
    assert not found, f"{path.relative_to(PACKAGE.parent)} does I/O: {found}"


def test_the_pure_core_is_at_least_a_fifth_of_the_tool() -> None:
    """The decisions a reviewer needs to read without an engine (which wheel, which Debian
    package, which need is optional, how a failure is classified, what a layer holds) are not a
    corner of the tool: at least MIN_PURE_SHARE of builder/ by lines, the runtime excluded."""
    paths = {n: p for n, p in module_paths().items() if RUNTIME not in p.parents}
    lines = {name: len(path.read_text().splitlines()) for name, path in paths.items()}
    pure = sum(lines[name] for name in PURE_MODULES)
    total = sum(lines.values())
    share = pure / total
    assert share >= MIN_PURE_SHARE, (
        f"the pure core is {pure} of {total} lines of builder/ (runtime excluded):"
        f" {share:.1%}, under {MIN_PURE_SHARE:.0%}"
    )


def test_the_purity_checks_see_what_they_exist_to_see(tmp_path: Path) -> None:
    """The call reader catches a file read, an open, a zip opened and an os call; not a path's
    arithmetic."""
    path = tmp_path / "m.py"
    path.write_bytes(
        b"import os\n"
        b"def f(p, z):\n"
        b"    p.read_text(); open(p); z.ZipFile(p); os.replace(p, p)\n"
        b"    return os.path.join(p, 'x'), os.fspath(p)\n"
    )
    found = sorted(call.split(" ", 1)[1] for call in file_calls(path))
    assert found == ["open", "os.replace", "p.read_text", "z.ZipFile"]


# -- the OCI core: one home for each image-publishing concept ---------------------------------
CORE = PACKAGE / "oci"


def builder_modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def calls(path: Path, attribute: str) -> list[int]:
    """Lines of `path` that call `<anything>.attribute(...)` or `attribute(...)`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            function = node.func
            name = function.attr if isinstance(function, ast.Attribute) else None
            name = function.id if isinstance(function, ast.Name) else name
            if name == attribute:
                found.append(node.lineno)
    return found


def test_the_core_imports_nothing_of_the_project_but_errors_the_retry_policy_and_digests() -> None:
    """The retry policy is shared with the package index's downloads (builder.resolve), and
    the digest of a stream with the cache and the layers, so they live beside the errors, and
    themselves import nothing of the project."""
    offences = [
        f"{path.relative_to(PACKAGE.parent)} imports {name}"
        for path in sorted(CORE.rglob("*.py"))
        for name in sorted(imported_names(path.read_text(), package_of(path)))
        if (name.startswith("builder.") or name == "builder" or name == "docker")
        and not name.startswith(
            ("builder.oci", "builder.errors", "builder.retry", "builder.digest")
        )
    ]
    offences += [
        f"builder/{shared.name} imports {name}"
        for shared in (PACKAGE / "retry.py", PACKAGE / "digest.py")
        for name in sorted(imported_names(shared.read_text(), "builder"))
        if name.startswith("builder")
    ]
    assert not offences, "\n".join(offences)


@pytest.mark.parametrize(
    ("primitive", "home"),
    [
        ("put_manifest", "builder/oci/remote.py"),  # manifests by digest, tags last: `write`
        ("upload_blob", "builder/oci/remote.py"),  # the one blob uploader: `upload_blobs`
        ("mount", "builder/oci/remote.py"),
    ],
)
def test_one_function_does_each_publishing_step(primitive: str, home: str) -> None:
    """Registry writes and the platform choice happen in the core's one place only."""
    elsewhere = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in builder_modules()
        if not str(path.relative_to(PACKAGE.parent)).startswith(home)
        for line in calls(path, primitive)
    ]
    assert not elsewhere, f"{primitive} called outside {home}: {elsewhere}"


def test_media_types_and_manifest_serialization_have_one_home() -> None:
    """Only oci/v1.py spells an OCI/Docker media type or defines a document's digest or its
    serializer (the digest of a stream or a file is builder/digest.py's)."""
    spelled = [
        str(path.relative_to(PACKAGE.parent))
        for path in builder_modules()
        if path != CORE / "v1.py"
        and (
            "application/vnd.oci." in path.read_text()
            or "application/vnd.docker." in path.read_text()
        )
    ]
    assert not spelled, f"media types spelled outside builder/oci/v1.py: {spelled}"
    defined = [
        f"{path.relative_to(PACKAGE.parent)}: {node.name}"
        for path in builder_modules()
        if path != CORE / "v1.py"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef) and node.name in {"canonical", "digest_of", "_digest"}
    ]
    assert not defined, f"digest or serialization helpers outside builder/oci/v1.py: {defined}"


def test_the_platform_rule_has_one_home() -> None:
    """Only the core speaks of platform variants: every index entry is chosen by Index.pick."""
    offences = [
        str(path.relative_to(PACKAGE.parent))
        for path in builder_modules()
        if CORE not in path.parents and '"variant"' in path.read_text()
    ]
    assert not offences, f"platform variants handled outside builder/oci: {offences}"


def test_the_arch_names_map_in_one_place() -> None:
    """`{"x86_64": "amd64"}`-style tables and arm64's v8 live in oci/v1.py (the target's
    Arch table, which names triplets and loaders too, is its own data)."""
    offences = []
    for path in builder_modules():
        if path == CORE / "v1.py" or path == PACKAGE / "resolve" / "target.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict):
                keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
                values = {v.value for v in node.values if isinstance(v, ast.Constant)}
                if {"x86_64", "aarch64"} & keys or "v8" in values:
                    offences.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert not offences, f"arch tables outside builder/oci/v1.py: {offences}"


# -- a top level that shows the architecture --------------------------------------------------
MAX_TOP_LEVEL_MODULES = 10


def test_the_top_level_holds_only_shared_concepts() -> None:
    """Layers are packages; what stays directly in builder/ is what every layer shares."""
    top = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, f"{len(top)} modules directly in builder/: {top}"


def test_every_package_says_its_job() -> None:
    packages = [path.parent for path in PACKAGE.rglob("__init__.py")]
    silent = [
        str(package.relative_to(PACKAGE.parent))
        for package in packages
        if not ast.get_docstring(ast.parse((package / "__init__.py").read_text()))
    ]
    assert not silent, f"packages without a docstring saying their job: {silent}"


def test_no_developer_tool_ships_in_the_package() -> None:
    """A module run as a script (`if __name__ == "__main__":`) is a developer tool: scripts/.
    `python -m builder` and the runtime server's entry point are the exceptions."""
    entry_points = {PACKAGE / "__main__.py"}
    scripts = [
        str(path.relative_to(PACKAGE.parent))
        for path in builder_modules()
        if path not in entry_points and PACKAGE / "runtime" not in path.parents
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)
    ]
    assert not scripts, f"scripts inside the package: {scripts}"


def test_output_goes_through_the_cli_or_the_reporter() -> None:
    """No `print(...)` and no `sys.stdout`/`sys.stderr` outside the CLI, the reporter and the
    runtime server: a layer says things through the reporter or the log it was given, so a
    library caller decides where lines go. (Scripts run inside containers are strings, not
    calls, and are not counted.)"""
    speakers = {PACKAGE / "reporter.py"}
    offences = [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
        for path in builder_modules()
        if path not in speakers and not {PACKAGE / "cli", SERVER} & set(path.parents)
        for node in ast.walk(ast.parse(path.read_text()))
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "print"
        )
        or (
            isinstance(node, ast.Attribute)
            and node.attr in ("stdout", "stderr")
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
        )
    ]
    assert not offences, f"output outside the CLI and the reporter: {offences}"


# -- typed values from the edge inward: counts that may only go down --------------------------
# Issue 28's targets are 5 parse sites and 20 untyped mappings. The ceilings are the measured
# counts, so a new string or dict boundary fails here. The parse sites: the CLI's click type
# (a reference, a repository), the config, the state, the shipped profile's file, an engine's
# RepoDigests. The mappings: JSON documents read or written whole (OCI configs kept with the
# fields the tool does not know, the sandbox server's bodies, a verified statement) and the
# engine's and docker config's answers.
MAX_REFERENCE_PARSES = 5
MAX_UNTYPED_MAPPINGS = 19
UNTYPED_MAPPING = re.compile(r"\b(?:dict|Mapping|MutableMapping)\[str, Any\]")


def test_image_references_are_parsed_at_few_places() -> None:
    """`ImageRef.parse`/`parse_repository` belong where text enters (the CLI, the config, an
    engine's or a registry's answer); inside, a reference travels as an `ImageRef`."""
    sites = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in builder_modules()
        for attribute in ("parse", "parse_repository")
        for line in attribute_calls(path, "ImageRef", attribute)
    ]
    assert len(sites) <= MAX_REFERENCE_PARSES, f"{len(sites)} parse sites: {sites}"


def test_untyped_mappings_are_few() -> None:
    """`dict[str, Any]` and its kin belong at an edge (the engine API, JSON in or out)."""
    found = {
        str(path.relative_to(PACKAGE.parent)): n
        for path in builder_modules()
        if (n := len(UNTYPED_MAPPING.findall(path.read_text())))
    }
    assert sum(found.values()) <= MAX_UNTYPED_MAPPINGS, f"{sum(found.values())}: {found}"


def attribute_calls(path: Path, owner: str, attribute: str) -> list[int]:
    """Lines of `path` that call `owner.attribute(...)`."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == attribute
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == owner
    ]


# -- one home for each concept ----------------------------------------------------------------
def defined_functions(path: Path) -> set[str]:
    return {
        node.name
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }


def code_constants(path: Path) -> list[tuple[int, object]]:
    """Every constant of `path` but docstrings: what the code spells, not what it explains."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and id(node) not in docstrings
    ]


def test_the_tool_version_has_one_home() -> None:
    homes = [
        str(path.relative_to(PACKAGE.parent))
        for path in builder_modules()
        if "tool_version" in defined_functions(path)
    ]
    assert homes == ["builder/context/labels.py"], homes


def test_a_json_object_is_read_in_one_place() -> None:
    """`oci.v1.json_object` reads every document that must be a JSON object; a caller turns its
    ValueError into its own error (assemble.saved: the engine's save)."""
    homes = [
        str(path.relative_to(PACKAGE.parent))
        for path in builder_modules()
        if defined_functions(path) & {"json_object", "_json_object"}
    ]
    assert homes == ["builder/oci/v1.py"], homes


def test_the_contract_constants_are_spelled_only_in_the_contract() -> None:
    """The sandbox uid and the library directories are builder.contract's; the in-image server
    keeps its own copies (it imports nothing of the tool)."""
    spelled = {65532, "65532", "65532:65532", "/app/deps", "/app/deps-extra"}
    offences = [
        f"{path.relative_to(PACKAGE.parent)}:{line} {value!r}"
        for path in builder_modules()
        if path != PACKAGE / "contract.py" and SERVER not in path.parents
        for line, value in code_constants(path)
        if isinstance(value, int | str) and not isinstance(value, bool) and value in spelled
    ]
    assert not offences, f"contract constants spelled outside builder/contract.py: {offences}"


def test_an_index_is_narrowed_to_a_platform_in_the_core() -> None:
    """`Index.pick` is the one platform rule and `remote.platform_image` the one way to read a
    platform's image out of an index; outside the core an index is only asked which entry it
    has (the registry probe: which arches to probe; the attachments: which entry's referrers)."""
    allowed = {"builder/base/from_registry.py", "builder/publish/attachments.py"}
    offences = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in builder_modules()
        if CORE not in path.parents and str(path.relative_to(PACKAGE.parent)) not in allowed
        for line in calls(path, "pick")
    ]
    assert not offences, f"index entries picked outside builder/oci: {offences}"


def test_one_stream_over_chunks() -> None:
    """A raw stream over an iterator of byte chunks is layers.layer.ChunkStream; the only other
    raw stream of the tool caps what a layer may inflate to (base.layers)."""
    streams = sorted(
        f"{path.relative_to(PACKAGE.parent)}:{node.name}"
        for path in builder_modules()
        if SERVER not in path.parents
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
        and any("RawIOBase" in ast.unparse(base) for base in node.bases)
    )
    assert streams == ["builder/base/layers.py:_Capped", "builder/layers/layer.py:ChunkStream"]


def test_a_docker_save_is_read_in_one_place() -> None:
    """The engine's `docker save` (`get_image`) is read by builder/assemble/saved.py alone: as a
    stream for the config and one layer, or on disk by its manifest for every layer."""
    offences = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in builder_modules()
        if path != PACKAGE / "assemble" / "saved.py"
        for line in calls(path, "get_image")
    ]
    assert not offences, f"docker save read outside builder/assemble/saved.py: {offences}"


# Modules that write with write_text/write_bytes only into a temporary directory of their own.
OWN_TEMPORARY_DIRECTORIES = frozenset(
    {
        "builder/resolve/uv.py",
        "builder/orchestration/produce_build.py",
        "builder/orchestration/reference_base.py",
        "builder/assemble/apt.py",
        "builder/assemble/build.py",
    }
)


def test_a_file_a_user_sees_is_written_in_one_place() -> None:
    """Every file the tool writes outside its cache and its own temporary directories goes
    through builder/files.py (a fresh temporary file renamed over the target, never through a
    symlink), and nothing is hard-linked out of the cache (an edit of the link would be one of
    the cache). The runtime server, which runs inside the image, is not the tool."""
    offences = [
        f"{path.relative_to(PACKAGE.parent)}:{line} {writer}"
        for path in builder_modules()
        if SERVER not in path.parents
        and str(path.relative_to(PACKAGE.parent)) not in OWN_TEMPORARY_DIRECTORIES
        for writer in ("write_text", "write_bytes")
        for line in calls(path, writer)
    ]
    offences += [
        f"{path.relative_to(PACKAGE.parent)}:{line} {linker}"
        for path in builder_modules()
        for linker in ("link", "hardlink_to", "link_to")
        for line in calls(path, linker)
    ]
    assert not offences, f"writes outside builder/files.py: {offences}"


def test_a_layer_is_gzipped_in_one_place() -> None:
    """Every blob a push uploads is compressed by builder/layers/gzipped.py (one format, one
    cache, each tar checked against its diff ID): nothing else deflates."""
    writers = ("compressobj", "compress", "GzipFile")
    offences = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in builder_modules()
        if path != PACKAGE / "layers" / "gzipped.py"
        for writer in writers
        for line in calls(path, writer)
        if writer != "GzipFile" or '"rb"' not in path.read_text().splitlines()[line - 1]
    ]
    assert not offences, f"compression outside builder/layers/gzipped.py: {offences}"


def test_an_image_config_is_read_and_written_in_the_core() -> None:
    """Its fields are `ConfigFile`'s to read and `mutate`'s to write; outside builder/oci no
    code spells them."""
    fields = {"rootfs", "diff_ids", "history"}
    offences = [
        f"{path.relative_to(PACKAGE.parent)}:{line} {value!r}"
        for path in builder_modules()
        if CORE not in path.parents and SERVER not in path.parents
        for line, value in code_constants(path)
        if isinstance(value, str) and value in fields
    ]
    assert not offences, f"image config fields spelled outside builder/oci: {offences}"


def constructions(path: Path, name: str) -> list[int]:
    """Lines of `path` that call `name(...)` by its bare name: a record being made."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name
    ]


@pytest.mark.parametrize("record", ["Grounds", "Delivery"])
def test_a_run_is_asked_for_in_one_place(record: str) -> None:
    """`build` and `rebuild` make their Grounds and Delivery through grounds_for and
    delivery_for, so the two commands cannot drift apart."""
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in builder_modules()
        for line in constructions(path, record)
    ]
    assert len(found) == 1 and found[0].startswith("builder/orchestration/commands.py"), found


@pytest.mark.parametrize(
    ("name", "home"),
    [
        ("Settings", "builder/orchestration/prepare.py"),
        ("image_tag", "builder/publish/publisher.py"),
    ],
)
def test_a_run_s_settings_are_resolved_in_one_place(name: str, home: str) -> None:
    """The settings are resolved against the plan by `prepare.settle` alone, and the tag a
    push moves is named by `publisher.target_of` alone; the values derived from the record
    (the platform version, the local tag) are its own properties (builder.config.Settings)."""
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in builder_modules()
        for line in constructions(path, name)
    ]
    assert len(found) == 1 and found[0].startswith(home), found
    spelled = [
        str(path.relative_to(PACKAGE.parent))
        for path in builder_modules()
        if "sandbox-extension:x" in path.read_text()
    ]
    assert spelled == ["builder/config.py"], spelled


def test_native_or_emulated_is_decided_in_one_place() -> None:
    """`engines.connection.runs_emulated` is the one rule (the delivery orders and announces
    the arches by it, verify picks a sandbox's bounds by it), over the engine's own arch that
    `native_arch` reads from `docker info`; no module asks `docker version` for an `Arch`."""
    deciders = sorted(
        str(path.relative_to(PACKAGE.parent))
        for path in builder_modules()
        if "builder.engines.connection.runs_emulated"
        in imported_names(path.read_text(), package_of(path))
    )
    assert deciders == ["builder/orchestration/delivery.py", "builder/verify/container.py"]
    asked = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in builder_modules()
        if path != PACKAGE / "engines" / "connection.py"
        for line, value in code_constants(path)
        if value == "Arch"
    ]
    assert not asked, f"an engine's arch read outside builder/engines/connection.py: {asked}"


# -- tests a newcomer can find ----------------------------------------------------------------
TESTS = PACKAGE.parent / "tests"
MAX_TOP_LEVEL_TEST_FILES = 10


def test_every_package_has_its_test_folder() -> None:
    """ "Where is this tested" is a folder name: tests/<package>/ for each package of builder/
    (data/ holds tables, tested where they are read)."""
    packages = sorted(
        path.parent.name for path in PACKAGE.glob("*/__init__.py") if path.parent.name != "data"
    )
    missing = [name for name in packages if not list((TESTS / name).glob("test_*.py"))]
    assert not missing, f"packages without tests/<package>/test_*.py: {missing}"


def test_few_test_files_sit_directly_under_tests() -> None:
    """The top of tests/ holds the house's own rules; every other test lives in a folder."""
    top = sorted(path.name for path in TESTS.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_TEST_FILES, f"{len(top)} files directly in tests/: {top}"


def test_one_retry_loop() -> None:
    """`Retries.attempt` in builder/retry.py is the one loop of every remote call (the registry
    client's and the package index's): no other module asks the policy for another try
    (`again`), computes a wait (`backoff`, `retry_after`) or sleeps the run's sleep between
    tries (a `Retries`' `sleep`; `time.sleep` in a poll for a state is another matter)."""
    retry = PACKAGE / "retry.py"
    offences = [
        f"{path.relative_to(PACKAGE.parent)}:{line} {decision}"
        for path in builder_modules()
        if path != retry
        for decision in ("again", "backoff", "retry_after")
        for line in calls(path, decision)
    ]
    offences += [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno} sleep"
        for path in builder_modules()
        if path != retry
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "sleep"
        and not (isinstance(node.func.value, ast.Name) and node.func.value.id == "time")
    ]
    assert not offences, f"retry decisions or waits outside builder/retry.py: {offences}"
    assert {"again", "attempt"} <= defined_functions(retry)
    users = sorted(
        str(path.relative_to(PACKAGE.parent))
        for path in builder_modules()
        if calls(path, "attempt")
    )
    assert users == ["builder/oci/transport.py", "builder/resolve/index.py"], users


DIGEST = PACKAGE / "digest.py"


def test_one_sha256_with_size() -> None:
    """builder/digest.py alone hashes bytes given in pieces (`hashlib.sha256()` made empty and
    fed: a download, a layer tar written or read, a gzip, a registry blob, an upload, a ztoc's
    spans) and defines a stream's digest; a file's is builder/files.py's (it reads the file),
    counted with the digest's `Sha256`. What stays elsewhere hashes bytes whole
    in memory: cache keys, a script's fingerprint, the ztoc check's raw span digests (compared
    as bytes, never named)."""
    fed = [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
        for path in builder_modules()
        if path != DIGEST and SERVER not in path.parents
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and ast.unparse(node.func) in ("hashlib.sha256", "sha256")
        and not node.args
    ]
    assert not fed, f"sha256 fed in pieces outside builder/digest.py: {fed}"
    helpers = {"sha256_of", "file_sha256", "file_digest", "sha256_digest", "_sha256"}
    # a file's digest reads the file: builder/files.py's, counted with digest's Sha256, so that
    # the digest stays pure (PURE_MODULES)
    of_a_file = {"sha256_of", "file_sha256"}
    defined = [
        f"{path.relative_to(PACKAGE.parent)}: {name}"
        for path in builder_modules()
        if path != DIGEST
        for name in sorted(defined_functions(path) & helpers)
        if not (path == PACKAGE / "files.py" and name in of_a_file)
    ]
    assert not defined, f"file or stream digest helpers outside builder/digest.py: {defined}"
    hashing = sorted(
        f"{path.relative_to(PACKAGE.parent)}:{node.name}"
        for path in builder_modules()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and "Hashing" in node.name
    )
    # a ztoc hashes each span apart (a Sha256 per span): a soci format's field, not a stream's
    assert hashing == [
        "builder/digest.py:HashingReader",
        "builder/digest.py:HashingWriter",
        "builder/oci/ztoc.py:_SpanHashing",
    ]


def test_one_readable() -> None:
    """The stream of a blob's bytes that the OCI core, the layers and the base's layer reader
    take is one protocol, builder.digest.Readable (the lowest place all of them may import)."""
    homes = sorted(
        f"{path.relative_to(PACKAGE.parent)}:{node.name}"
        for path in builder_modules()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
        and (node.name == "Readable" or any("Protocol" in ast.unparse(b) for b in node.bases))
        and any(isinstance(item, ast.FunctionDef) and item.name == "read" for item in node.body)
    )
    assert homes == ["builder/digest.py:Readable"], homes


# -- functions a reader can hold in mind ------------------------------------------------------
# A backstop, not a target: what keeps a function readable is ruff's complexity rules (C901 at
# most 12, PLR0912's branches, PLR0915's statements, in `make lint`). A function that sequences
# many steps says so in its name and reads as a list of calls, however long that list; one past
# this many lines is steps that want names.
MAX_FUNCTION_LINES = 100
REPO = PACKAGE.parent


def long_functions(paths: list[Path]) -> list[str]:
    """Functions of `paths` longer than MAX_FUNCTION_LINES, from the `def` line to the end
    (decorators excluded: click's options are declarations, not logic)."""
    return [
        f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({lines})"
        for path in paths
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (lines := (node.end_lineno or node.lineno) - node.lineno + 1) > MAX_FUNCTION_LINES
    ]


def test_no_function_is_past_the_length_backstop() -> None:
    """Complexity is held by ruff in `make lint`; length here only as a backstop. The runtime
    server, the scripts, the benchmarks and the tests themselves included."""
    paths = sorted(
        path
        for folder in ("builder", "scripts", "benchmarks", "tests")
        for path in (REPO / folder).rglob("*.py")
    )
    long = long_functions(paths)
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_lint_holds_the_complexity_of_every_function() -> None:
    """The limits that replace a line cap are on in ruff's configuration."""
    lint = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    assert {"C901", "PLR0912", "PLR0915"} <= set(lint["select"])
    assert lint["mccabe"]["max-complexity"] <= 12


# -- the documents a newcomer reads agree with the tree ---------------------------------------
# A path pyproject.toml names: a folder of the repository, then a file, a folder or a glob.
NAMED_PATH = re.compile(r"\b(?:builder|tests|docs|scripts|benchmarks)/[\w./*-]*[\w*]")


def test_every_path_pyproject_names_exists() -> None:
    """A comment or a setting that points at a test file or a module that moved misleads."""
    named = sorted(set(NAMED_PATH.findall((REPO / "pyproject.toml").read_text())))
    assert named, "pyproject.toml names no path: the pattern is wrong"
    missing = [path for path in named if not list(REPO.glob(path))]
    assert not missing, f"pyproject.toml names paths that do not exist: {missing}"


DESIGN = REPO / "docs" / "design.md"


def test_the_design_names_every_package_and_module() -> None:
    """docs/design.md is where a newcomer learns the layout: every package and subpackage of
    builder/ is named by its path (`resolve/direct/`), and every module outside the runtime
    server by its name (`shard`, `literals`)."""
    design = DESIGN.read_text()
    packages = sorted(
        str(path.parent.relative_to(PACKAGE)) for path in PACKAGE.rglob("__init__.py")
    )
    unnamed = [f"{name}/" for name in packages if name != "." and f"{name}/" not in design]
    unnamed += [
        str(path.relative_to(PACKAGE))
        for path in builder_modules()
        if SERVER not in path.parents
        and path.stem not in ("__init__", "__main__")
        and f"`{path.stem}`" not in design
        and f"{path.stem}.py" not in design
    ]
    assert not unnamed, f"docs/design.md does not name: {unnamed}"
