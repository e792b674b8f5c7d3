"""Distributions from no index on record (issue 45): the SBOM's purl qualifiers and external
references, the provenance's materials, the lock's comment, each from a planned wheel's
`Source`, without credentials."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime

from packageurl import PackageURL
from support.plans import reference_profile

from builder.attest.contents import PythonDistribution
from builder.attest.provenance import BuildParameters, BuildRun, provenance_document
from builder.attest.sbom import ImageContents, timestamp
from builder.attest.sbom_render import sbom_document
from builder.context.render import lock_text
from builder.plan.plan import ArchPlan, Plan, PlannedWheel
from builder.publish.attachments import wheel_origin
from builder.resolve.resolution import Source, SourceKind

COMMIT = "0123456789abcdef0123456789abcdef01234567"
SHA = {name: char * 64 for name, char in (("git", "a"), ("url", "b"), ("house", "c"))}


def _wheel(name: str, source: Source | None, url: str = "") -> PlannedWheel:
    module = name.replace("-", "_")
    return PlannedWheel(
        name, "1.0", f"{module}-1.0-py3-none-any.whl", SHA.get(name.split("-")[-1], "d" * 64),
        "py3-none-any", url or (source.url() if source else ""), (module,), source=source,
    )  # fmt: skip


VCS = Source(SourceKind.VCS, "git+https://git.example/acme/tools", "", COMMIT, "v1.4.0", "lib")
URL = Source(SourceKind.URL, "https://artifacts.example/acme_url-1.0-py3-none-any.whl", SHA["url"])
WHEELS = (
    _wheel("acme-git", VCS),
    _wheel("acme-url", URL),
    _wheel(
        "acme-house",
        Source(SourceKind.FIND_LINKS, "/srv/wheelhouse"),
        "file:///srv/wheelhouse/acme_house-1.0-py3-none-any.whl",
    ),
    _wheel("acme-index", None, "https://files.example/acme_index-1.0-py3-none-any.whl"),
)


def _contents() -> ImageContents:
    python = tuple(
        PythonDistribution(w.name, w.version, "/app/deps-extra", wheel=wheel_origin(w))
        for w in WHEELS
    )
    return ImageContents(
        "127.0.0.1:5000/acme/sandbox", "sha256:" + "1" * 64, "amd64", "runtime:1",
        "sha256:" + "2" * 64, (), (), python, timestamp(1_700_000_000), "0.1.0",
    )  # fmt: skip


def test_the_sbom_names_a_repository_at_its_commit_and_a_file_by_its_url() -> None:
    data = json.loads(sbom_document(_contents()))  # schema-checked inside
    by_name = {c["name"]: c for c in data["components"] if c.get("purl", "").startswith("pkg:py")}
    git = by_name["acme-git"]
    vcs_url = f"git+https://git.example/acme/tools@{COMMIT}#subdirectory=lib"
    assert PackageURL.from_string(git["purl"]).qualifiers == {"vcs_url": vcs_url}
    assert git["externalReferences"][0]["type"] == "vcs"
    assert git["externalReferences"][0]["url"] == vcs_url
    url = by_name["acme-url"]
    assert PackageURL.from_string(url["purl"]).qualifiers == {"download_url": URL.location}
    assert url["externalReferences"][0] == {
        "type": "distribution",
        "url": URL.location,
        "hashes": [{"alg": "SHA-256", "content": SHA["url"]}],
    }
    house = by_name["acme-house"]
    assert PackageURL.from_string(house["purl"]).qualifiers == {
        "download_url": "file:///srv/wheelhouse/acme_house-1.0-py3-none-any.whl"
    }
    assert by_name["acme-index"]["purl"] == "pkg:pypi/acme-index@1.0"  # PyPI: no qualifier


def test_the_provenance_names_each_origin_and_the_commit() -> None:
    run = BuildRun(
        "127.0.0.1:5000/acme/sandbox", "sha256:" + "1" * 64, "amd64", "runtime:1",
        "sha256:" + "2" * 64, tuple(wheel_origin(w) for w in WHEELS), (), 1_700_000_000, "0.1.0",
        datetime(2026, 12, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC),
    )  # fmt: skip
    parameters = BuildParameters((), arches=("amd64",), platform_version="1", base_image="b")
    statement = json.loads(provenance_document(parameters, run))
    materials = {
        d["name"]: d for d in statement["predicate"]["buildDefinition"]["resolvedDependencies"]
    }
    git = materials["acme_git-1.0-py3-none-any.whl"]
    assert git["digest"] == {"sha256": SHA["git"], "gitCommit": COMMIT}
    assert git["uri"].endswith(f"@{COMMIT}#subdirectory=lib")
    assert git["annotations"] == {"origin": "vcs"}
    assert materials["acme_url-1.0-py3-none-any.whl"]["annotations"] == {"origin": "url"}
    assert materials["acme_house-1.0-py3-none-any.whl"]["annotations"] == {"origin": "find-links"}
    assert "annotations" not in materials["acme_index-1.0-py3-none-any.whl"]


def test_the_lock_says_where_a_direct_pin_came_from_and_a_moved_branch_changes_it() -> None:
    arch = ArchPlan("amd64", WHEELS, (), (), (), ())
    plan = Plan(reference_profile(), "base:1", (arch,), (), ())
    lock = lock_text(plan, "amd64")
    assert f"acme-git==1.0 --hash=sha256:{SHA['git']}  # from {VCS.url()}\n" in lock
    assert (
        f"acme-url==1.0 --hash=sha256:{SHA['url']}  # from {URL.location} (sha256:{SHA['url']})\n"
        in lock
    )
    assert f"acme-house==1.0 --hash=sha256:{SHA['house']}\n" in lock  # a wheelhouse: an index
    local = Source(SourceKind.PATH, "/home/ci/build-7/vendor/acme_path-1.0.whl", "e" * 64)
    elsewhere = replace(local, location="/home/ci/build-9/vendor/acme_path-1.0.whl")
    locks = {
        lock_text(Plan(reference_profile(), "b:1", (replace(arch, wheels=(w,)),), (), ()), "amd64")
        for w in (_wheel("acme-path", local), _wheel("acme-path", elsewhere))
    }
    assert locks == {
        f"acme-path==1.0 --hash=sha256:{'d' * 64}  # from a local file (sha256:{'e' * 64})\n"
    }
    moved = replace(WHEELS[0], source=replace(VCS, commit="f" * 40))
    other = Plan(reference_profile(), "base:1", (replace(arch, wheels=(moved,)),), (), ())
    assert lock_text(other, "amd64") != lock_text(
        Plan(reference_profile(), "base:1", (replace(arch, wheels=WHEELS[:1]),), (), ()), "amd64"
    )
