"""Nothing imported that a command does not use (issue 30): `--help` and a run that pushes,
signs and renders nothing must not start by importing the whole stack.

Each check runs a fresh interpreter and reads its `sys.modules`, so a top-level import added
back anywhere on the path (the CLI, the orchestration, a layer below) fails here. No timings:
the figures are in docs/performance.md.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# Third-party packages `--help` must not import (nor anything of builder's beyond the CLI's).
HEAVY = (
    "docker",
    "paramiko",
    "invoke",
    "requests",
    "urllib3",
    "cyclonedx",
    "jsonschema",
    "packageurl",
    "elftools",
    "ruamel",
    "debian",
    "cryptography",
    "nacl",
    "uv",
    "flatbuffers",
)
# What a build or rebuild imports at start is docker (its client) and requests; not these,
# which only signing, an SBOM, a template, an image's packages, an uncached wheel or a push's
# SOCI index need.
NOT_ON_A_RERUN = (
    "cyclonedx",
    "jsonschema",
    "elftools",
    "pdb",
    "ruamel",
    "debian",
    "nacl",
    "flatbuffers",
)


def loaded_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running `code`."""
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    return set(json.loads(done.stdout.splitlines()[-1]))


def tops(modules: set[str]) -> set[str]:
    return {name.split(".")[0] for name in modules}


@pytest.mark.parametrize("command", ["", "rebuild", "verify", "sbom", "base"])
def test_help_imports_nothing_heavy(command: str) -> None:
    words = [*command.split(), "--help"]
    code = (
        "from builder.cli.app import main\n"
        "try:\n"
        f"    main({words!r})\n"
        "except SystemExit as done:\n"
        "    assert done.code == 0, done.code\n"
    )
    loaded = loaded_after(code)
    assert not tops(loaded) & set(HEAVY), sorted(tops(loaded) & set(HEAVY))
    assert "builder.orchestration.commands" not in loaded


def test_a_build_starts_without_sbom_signing_template_or_elf_libraries() -> None:
    loaded = loaded_after("import builder.orchestration.commands, builder.orchestration.fleet")
    assert "docker" in loaded  # the client: what the check below is about is still reached
    assert not tops(loaded) & set(NOT_ON_A_RERUN), sorted(tops(loaded) & set(NOT_ON_A_RERUN))
    assert "cryptography.hazmat.primitives.serialization" not in loaded  # builder.sign.keys
    # the verifier and the SBOM reading: only a run that verifies or pushes imports them
    assert "builder.verify.run" not in loaded and "builder.publish.attachments" not in loaded
    # docker-py imports paramiko for ssh://; its body (0.3 s) runs only when first used
    assert "paramiko.transport" not in loaded


def test_deferred_paramiko_loads_when_used() -> None:
    loaded = loaded_after("import builder, docker, paramiko\nparamiko.SSHClient")
    assert "paramiko.transport" in loaded
