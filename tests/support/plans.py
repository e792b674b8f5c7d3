"""Plans of synthetic wheels for amd64 against the shipped base facts, without the network;
the reference base's profile, for a test that plans or resolves against it; a run's settings
and a producer of one stand-in image for a test that delivers by hand."""

from __future__ import annotations

from pathlib import Path

from builder.cache import Cache
from builder.config import RunSettings, Settings
from builder.files import sha256_of
from builder.inspect.wheel_reader import inspect_wheel, member_bytes
from builder.oci.name import ImageRef
from builder.orchestration.delivery import Produced
from builder.plan.browsers import BROWSERS_JSON
from builder.plan.plan import ArchPlan, choose_wheel, plan_arch
from builder.resolve.resolution import LockedPackage, RemoteFile, Resolution
from builder.resolve.target import (
    ARCHES,
    REFERENCE_BASE,
    BaseProfile,
    Target,
    shipped_facts,
    shipped_profile,
)

AMD64 = ARCHES["amd64"]
TAG = "cp313-cp313-manylinux_2_17_x86_64.manylinux2014_x86_64"
SOURCE = "int f(void) { return 1; }\n"


def run_settings(**given: object) -> Settings:
    """A run's settings on the reference base, resolved against a plan on it: `given` over
    the defaults (verify, template, ...)."""
    base = ImageRef.parse(REFERENCE_BASE)
    asked = RunSettings((), base, **given)  # type: ignore[arg-type]
    return Settings(asked, base, "0" * 12)


def reference_profile() -> BaseProfile:
    """The shipped facts as the reference base's own, as a run with the default base without a
    probe plans against them."""
    return shipped_profile(ImageRef.parse(REFERENCE_BASE))


def plan_for(
    tmp_path: Path,
    wheels: list[Path],
    with_optional: bool = False,
    without: frozenset[str] = frozenset(),
) -> ArchPlan:
    target = Target(shipped_facts(), (AMD64,))
    cache = Cache(tmp_path / "cache")
    packages, chosen, inspections = [], {}, {}
    for wheel in wheels:
        sha = sha256_of(wheel)
        file = RemoteFile(wheel.name, wheel.as_uri(), sha)
        inspection = inspect_wheel(wheel, sha, cache)
        package = LockedPackage(inspection.name, inspection.version, (file,))
        packages.append(package)
        chosen[package.name] = choose_wheel(package, target, AMD64)
        inspections[sha] = inspection
    resolution = Resolution(AMD64, tuple(packages), (), (), "")
    listings = {  # Playwright's browsers.json, read as the orchestration reads it
        sha256_of(wheel): listing
        for wheel in wheels
        if (listing := member_bytes(wheel, BROWSERS_JSON)) is not None
    }
    return plan_arch(resolution, chosen, inspections, target, with_optional, without, listings)


class StandInProducer:
    """A delivery's producer that makes no image: each arch's `Produced` names one stand-in
    (what a test of the delivery's own steps gives it)."""

    path, label = "build", "local:tag"

    def announce(self, arch: str, emulated: bool) -> str:
        return f"making {arch}"

    def produce(self, arch: str) -> Produced:
        return Produced(arch, "sha256:" + "e" * 64, b"{}", lambda *_: None, {"id": "x"})  # type: ignore[arg-type,return-value]
