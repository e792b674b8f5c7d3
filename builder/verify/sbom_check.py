"""The `sbom` check: what the running image holds against what its SBOM says it holds.

Read inside the sandbox, as the platform's commands see it: every `*.dist-info` in the
PYTHONPATH entries (the base's /app/deps and the extras) by the Name and Version of its
METADATA, and every package dpkg's status database marks "install ok installed". Both ways
must agree: an installed distribution or package the SBOM omits fails the check, and so does
one it lists that the image does not have.
"""

from __future__ import annotations

from builder.attest.sbom import Listed, listed
from builder.errors import UserError
from builder.verify.client import Sandbox, python_json
from builder.verify.report import Check, CheckFailed, expect, short

SHOWN = 3  # differences named in the detail

INVENTORY_SCRIPT = """
import email.parser, json, os, re
found = []
for entry in filter(None, os.environ.get("PYTHONPATH", "").split(":")):
    if not os.path.isdir(entry):
        continue
    for name in sorted(os.listdir(entry)):
        path = os.path.join(entry, name, "METADATA")
        if name.endswith(".dist-info") and os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                head = email.parser.Parser().parse(f, headersonly=True)
            project = re.sub(r"[-_.]+", "-", head.get("Name", "")).lower()
            found.append(["pypi", project, head.get("Version", "")])
with open("/var/lib/dpkg/status", encoding="utf-8", errors="replace") as f:
    for paragraph in f.read().split("\\n\\n"):
        fields = dict(re.findall(r"^([A-Za-z-]+): *(.*)$", paragraph, re.M))
        if fields.get("Status") == "install ok installed" and "Package" in fields:
            found.append(["deb", fields["Package"], fields.get("Version", "")])
print(json.dumps(found))
"""


def installed(sandbox: Sandbox) -> frozenset[Listed]:
    """Every distribution and Debian package the running image holds."""
    rows = python_json(sandbox, INVENTORY_SCRIPT)
    expect(isinstance(rows, list), f"unexpected inventory: {short(rows)}")
    return frozenset(Listed(str(kind), str(name), str(version)) for kind, name, version in rows)


def check_sbom(sandbox: Sandbox, document: bytes) -> str:
    """Raise CheckFailed naming what the SBOM omits or invents; else say what agreed."""
    try:
        _, claimed = listed(document)
    except UserError as error:
        raise CheckFailed(str(error)) from None
    held = installed(sandbox)
    omitted, absent = sorted(held - claimed, key=_key), sorted(claimed - held, key=_key)
    problems = []
    if omitted:
        problems.append(f"{len(omitted)} installed but not in the SBOM ({_named(omitted)})")
    if absent:
        problems.append(f"{len(absent)} in the SBOM but not installed ({_named(absent)})")
    expect(not problems, "; ".join(problems))
    counts = {kind: sum(1 for item in held if item.kind == kind) for kind in ("pypi", "deb")}
    return (
        f"the SBOM lists exactly the {counts['pypi']} Python distributions and"
        f" {counts['deb']} Debian packages installed"
    )


def sbom_check(sandbox: Sandbox, document: bytes | None) -> Check:
    """The table line; an image verified without an SBOM says so and passes."""
    if document is None:
        return Check("sbom", True, "no SBOM given: not compared")
    try:
        return Check("sbom", True, check_sbom(sandbox, document))
    except CheckFailed as failure:
        return Check("sbom", False, str(failure))


def _key(item: Listed) -> tuple[str, str, str]:
    return item.kind, item.name, item.version


def _named(items: list[Listed]) -> str:
    names = [f"{i.kind}:{i.name}=={i.version}" for i in items[:SHOWN]]
    return ", ".join(names) + (", ..." if len(items) > SHOWN else "")
