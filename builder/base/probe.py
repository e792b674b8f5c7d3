"""The real base image's facts, read through the engine; the shipped profile is only a fallback.

One short-lived hardened container runs a stdlib-only script that reports the python patch
version, glibc, the distributions on PYTHONPATH, the sonames the loader can find and the dpkg
package list. Only the architecture the engine can run is observed directly; the other one's
sonames are derived from the same package list through the shipped soname index, plus the
libraries no package owns (e.g. /usr/local/lib), whose names do not depend on the arch.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import docker
import docker.errors
import requests

from builder.analysis.debian import packages_providing
from builder.analysis.target import ARCHES, GLIBC_MAJOR, GLIBC_MINOR, BaseProfile
from builder.cache import Cache
from builder.engine import failure_reason, local_image
from builder.errors import UserError

PROBE_TIMEOUT = 120
TARGET_PYTHON = "3.13"
TARGET_GLIBC = f"{GLIBC_MAJOR}.{GLIBC_MINOR}"
DEPS_DIR = "/app/deps"
EXAMPLES = 5
PROBE_LABEL = "org.build-sandbox-image.probe"  # on the probe container, to find strays

# Runs inside the base as `python3 -I -c SCRIPT '<json list of PYTHONPATH dirs>'`: stdlib only,
# no writes (read-only root), works as any user.
SCRIPT = r"""
import glob, json, os, platform, re, struct, subprocess, sys
from importlib import metadata

LIBRARY = re.compile(r"[^/]+\.so(\.[^/]*)?$")
SHT_DYNAMIC, DT_SONAME = 6, 14

def soname(path):
    # DT_SONAME of a 64-bit little-endian ELF (x86_64, aarch64): the name DT_NEEDED uses.
    # libfoo.so.1.2.3 files and libfoo.so dev links resolve to it; linker scripts give None.
    try:
        with open(path, "rb") as elf:
            head = elf.read(64)
            if head[:6] != b"\x7fELF\x02\x01":
                return None
            shoff, = struct.unpack_from("<Q", head, 0x28)
            shentsize, shnum = struct.unpack_from("<HH", head, 0x3A)
            elf.seek(shoff)
            table = elf.read(shentsize * shnum)
            sections = [struct.unpack_from("<IIQQQQII", table, i * shentsize)
                        for i in range(shnum)]
            for _, kind, _, _, offset, size, link, _ in sections:
                if kind != SHT_DYNAMIC:
                    continue
                elf.seek(offset)
                dynamic = elf.read(size)
                for i in range(0, len(dynamic) - 15, 16):
                    tag, value = struct.unpack_from("<qQ", dynamic, i)
                    if tag == DT_SONAME:
                        elf.seek(sections[link][4] + value)
                        return elf.read(256).split(b"\0", 1)[0].decode()
            return os.path.basename(path)
    except (OSError, struct.error, IndexError, UnicodeDecodeError):
        return None

def distributions(directory):
    found = {}
    for dist in metadata.distributions(path=[directory]):
        name = dist.metadata["Name"]
        if name:
            found.setdefault(re.sub(r"[-_.]+", "-", name).lower(), dist.version)
    return found

def loader_cache():
    for ldconfig in ("/sbin/ldconfig", "/usr/sbin/ldconfig"):
        if os.path.exists(ldconfig):
            try:
                out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True,
                                     timeout=60).stdout
            except (OSError, subprocess.SubprocessError):
                return []
            return [(line.split()[0], line.rpartition(" => ")[2].strip())
                    for line in out.splitlines() if " => " in line]
    return []

def packages():
    names = set()
    try:
        with open("/var/lib/dpkg/status", encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return names
    for stanza in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines()
                      if ": " in line and not line.startswith(" "))
        if fields.get("Status") == "install ok installed" and "Package" in fields:
            names.add(fields["Package"].split(":")[0])
    return names

def dpkg_files():
    owned = set()
    for listing in glob.glob("/var/lib/dpkg/info/*.list"):
        with open(listing, encoding="utf-8", errors="replace") as handle:
            for path in handle.read().splitlines():
                if LIBRARY.match(os.path.basename(path)):
                    owned.add(os.path.realpath(path))
    return owned

machine = platform.machine()
found = loader_cache()
for directory in (f"/lib/{machine}-linux-gnu", f"/usr/lib/{machine}-linux-gnu", "/usr/local/lib"):
    for path in glob.glob(os.path.join(directory, "*.so*")):
        name = LIBRARY.match(os.path.basename(path)) and soname(path)
        if name:
            found.append((name, path))
owned = dpkg_files()
try:
    glibc = os.confstr("CS_GNU_LIBC_VERSION") or ""
except (ValueError, OSError):
    glibc = ""
print(json.dumps({
    "python": platform.python_version(),
    "glibc": glibc.replace("glibc ", ""),
    "machine": machine,
    "distributions": {d: distributions(d) for d in json.loads(sys.argv[1])},
    "sonames": sorted({name for name, _ in found}),
    "unpackaged": sorted({name for name, path in found if os.path.realpath(path) not in owned}),
    "packages": sorted(packages()),
}))
"""
SCRIPT_SHA256 = hashlib.sha256(SCRIPT.encode()).hexdigest()


def probe_base(image: str, client: docker.DockerClient, cache: Cache) -> BaseProfile:
    """The profile of the real base `image`; one container per image id, then cached."""
    found = local_image(image, client)
    image_id = found.id
    key = image_id.removeprefix("sha256:")
    record = cache.get_record("probe", key)
    if record is None or record.get("script_sha256") != SCRIPT_SHA256:
        record = {
            "image_id": image_id,
            "script_sha256": SCRIPT_SHA256,
            "facts": _run_probe(image, found, client),
        }
        cache.put_record("probe", key, record)
    config = found.attrs.get("Config") or {}
    return _profile(image, record["facts"], config, _repo_digest(image, found), image_id)


def _repository(image: str) -> str:
    """`host:5000/a/b:tag` and `a/b@sha256:...` -> their repository, in docker's short form."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name = name[: -len(last)] + last.split(":", 1)[0]
    return _familiar(name)


def _familiar(repository: str) -> str:
    for prefix in ("docker.io/library/", "docker.io/", "index.docker.io/library/"):
        if repository.startswith(prefix):
            return repository.removeprefix(prefix)
    return repository


def _repo_digest(image: str, found: Any) -> str | None:
    """The registry digest for `image`'s repository; a locally built image has none."""
    if "@" in image:
        return image.split("@", 1)[1]
    wanted = _repository(image)
    for entry in found.attrs.get("RepoDigests") or []:
        repository, _, digest = entry.partition("@")
        if _familiar(repository) == wanted and digest:
            return digest
    return None


def _env(config: Mapping[str, Any], name: str) -> str:
    for entry in config.get("Env") or []:
        key, _, value = entry.partition("=")
        if key == name:
            return value
    return ""


def _pythonpath_dirs(pythonpath: str) -> list[str]:
    return [d for d in pythonpath.split(":") if d]


def _run_probe(image: str, found: Any, client: docker.DockerClient) -> dict[str, Any]:
    """Run the probe script in one hardened, network-less container that is always removed."""
    config = found.attrs.get("Config") or {}
    dirs = _pythonpath_dirs(_env(config, "PYTHONPATH"))
    container = None
    try:
        container = client.containers.create(
            found.id,
            entrypoint=["python3", "-I", "-c", SCRIPT],
            command=[json.dumps(dirs)],
            user=config.get("User") or "",
            network_mode="none",
            read_only=True,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            labels={PROBE_LABEL: image},
        )
        container.start()
        status = container.wait(timeout=PROBE_TIMEOUT)["StatusCode"]
        stdout = container.logs(stdout=True, stderr=False).decode(errors="replace")
        stderr = container.logs(stdout=False, stderr=True).decode(errors="replace")
    except (docker.errors.DockerException, requests.RequestException) as exc:
        raise UserError(f"base image {image}: probing it failed: {failure_reason(exc)}") from None
    finally:
        if container is not None:
            container.remove(force=True)
    if status != 0:
        raise UserError(
            f"base image {image}: the probe exited {status} (python3 is required): "
            f"{stderr.strip()[-500:]}"
        )
    try:
        return json.loads(stdout)
    except json.JSONDecodeError:
        raise UserError(
            f"base image {image}: the probe printed no result: {stdout[:300]}"
        ) from None


def _profile(
    image: str,
    facts: Mapping[str, Any],
    config: Mapping[str, Any],
    digest: str | None,
    image_id: str,
) -> BaseProfile:
    """Turn the container's facts into a profile; the arch not observed is derived."""
    observed = next((a for a in ARCHES.values() if a.machine == facts["machine"]), None)
    if observed is None:
        supported = ", ".join(a.machine for a in ARCHES.values())
        raise UserError(f"base image {image} is {facts['machine']}; supported: {supported}")
    pythonpath = _env(config, "PYTHONPATH")
    distributions: dict[str, str] = {}
    for directory in _pythonpath_dirs(pythonpath):  # first on the path wins, as at import time
        for name, version in facts["distributions"].get(directory, {}).items():
            distributions.setdefault(name, version)
    packages = frozenset(facts["packages"])
    unpackaged = frozenset(facts["unpackaged"])
    sonames = {
        arch.name: frozenset(facts["sonames"])
        if arch == observed
        else packages_providing(packages, arch) | unpackaged
        for arch in ARCHES.values()
    }
    return BaseProfile(
        image=image,
        python_version=facts["python"],
        glibc=facts["glibc"],
        user=config.get("User") or "",
        pythonpath=pythonpath,
        distributions=distributions,
        sonames=sonames,
        packages={arch: packages for arch in ARCHES},
        digest=digest,
        source=f"probed {image_id.removeprefix('sha256:')[:12]}",
    )


def profile_differences(shipped: BaseProfile, probed: BaseProfile) -> list[str]:
    """What the real base has that the shipped profile does not say: shown, never hidden."""
    lines = []
    for label, old, new in (
        ("python", shipped.python_version, probed.python_version),
        ("glibc", shipped.glibc, probed.glibc),
        ("user", shipped.user or "root", probed.user or "root"),
        ("PYTHONPATH", shipped.pythonpath or "unset", probed.pythonpath or "unset"),
    ):
        if old != new:
            lines.append(f"{label}: {new} (shipped profile says {old})")
    old_dists, new_dists = shipped.distributions, probed.distributions
    added = sorted(set(new_dists) - set(old_dists))
    removed = sorted(set(old_dists) - set(new_dists))
    changed = sorted(n for n in set(old_dists) & set(new_dists) if old_dists[n] != new_dists[n])
    if added:
        lines.append("distributions only in the base: " + _pins(added, new_dists))
    if removed:
        lines.append("distributions missing from the base: " + _pins(removed, old_dists))
    if changed:
        lines.append(
            "distributions at other versions: "
            + ", ".join(f"{n} {new_dists[n]} (shipped {old_dists[n]})" for n in changed)
        )
    for arch in sorted(set(shipped.sonames) | set(probed.sonames)):
        old_sonames = shipped.sonames.get(arch, frozenset())
        new_sonames = probed.sonames.get(arch, frozenset())
        if missing := old_sonames - new_sonames:
            lines.append(f"{arch}: {_count(missing)} of the shipped profile missing")
        if extra := new_sonames - old_sonames:
            lines.append(f"{arch}: {_count(extra)} not in the shipped profile")
    return lines


def _pins(names: list[str], versions: Mapping[str, str]) -> str:
    return ", ".join(f"{name}=={versions[name]}" for name in names)


def _count(sonames: frozenset[str]) -> str:
    examples = sorted(sonames)[:EXAMPLES]
    more = ", …" if len(sonames) > EXAMPLES else ""
    noun = "soname" if len(sonames) == 1 else "sonames"
    return f"{len(sonames)} {noun} ({', '.join(examples)}{more})"


def base_problems(profile: BaseProfile) -> list[str]:
    """Ways the base breaks the runtime contract the extension recipe relies on."""
    problems = []
    if profile.user.split(":", 1)[0] in {"", "0", "root"}:
        problems.append(f"{profile.image} runs as root (the runtime must run as uid 65532)")
    if DEPS_DIR not in _pythonpath_dirs(profile.pythonpath):
        problems.append(
            f"{profile.image}: {DEPS_DIR} is not on PYTHONPATH ({profile.pythonpath or 'unset'})"
        )
    if ".".join(profile.python_version.split(".")[:2]) != TARGET_PYTHON:
        problems.append(f"{profile.image}: python is {profile.python_version}, not {TARGET_PYTHON}")
    if profile.glibc != TARGET_GLIBC:
        problems.append(
            f"{profile.image}: glibc is {profile.glibc or 'absent'}, not {TARGET_GLIBC}"
        )
    return problems
