"""The real base image's facts, read through the engine; the shipped profile is only a fallback.

One short-lived hardened container runs a stdlib-only script that reports the python patch
version, glibc, the distributions on PYTHONPATH, the sonames the loader can find and the dpkg
status file. Only the architecture the engine can run is observed directly;
`profile.profile_from_facts` derives the other one, as it does for the registry reader.
The script stays self-contained (it runs in the base's python with `-I`); what can be parsed
on the host (the dpkg status) is.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import docker
import docker.errors
import requests

from builder.base.profile import (
    ArchFacts,
    installed_packages,
    profile_from_facts,
    pythonpath_dirs,
)
from builder.cache import Cache
from builder.engines.connection import failure_reason, held_digests, local_image
from builder.errors import UserError
from builder.oci.name import ImageRef
from builder.reporter import QUIET, Reporter
from builder.resolve.target import ARCHES, BaseProfile
from builder.retry import Retries

PROBE_TIMEOUT = 120
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

def dpkg_status():
    # Parsed on the host (builder.base.profile.installed_packages), as the registry reader does.
    try:
        with open("/var/lib/dpkg/status", encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""

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
    "dpkg_status": dpkg_status(),
}))
"""
SCRIPT_SHA256 = hashlib.sha256(SCRIPT.encode()).hexdigest()


def probe_base(
    base: ImageRef,
    client: docker.DockerClient,
    cache: Cache,
    reporter: Reporter = QUIET,
    retries: Retries | None = None,
) -> BaseProfile:
    """The profile of the real base `base`; one container per image id, then cached. Its
    registry is asked through the run's `retries` whether the engine's copy is current."""
    image = base.as_written
    found = local_image(base, client, reporter, retries)
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
    facts = record["facts"]
    observed = next((a for a in ARCHES.values() if a.machine == facts["machine"]), None)
    if observed is None:
        supported = ", ".join(a.machine for a in ARCHES.values())
        raise UserError(f"base image {image} is {facts['machine']}; supported: {supported}")
    config = found.attrs.get("Config") or {}
    return profile_from_facts(
        base,
        {observed.name: facts},
        pythonpath=_env(config, "PYTHONPATH"),
        user=config.get("User") or "",
        digest=_repo_digest(base, found),
        source=f"probed {image_id.removeprefix('sha256:')[:12]}",
    )


def _repo_digest(ref: ImageRef, found: Any) -> str | None:
    """The registry digest for `ref`'s repository; a locally built image has none."""
    return ref.digest or next(iter(held_digests(ref, found)), None)


def _env(config: Mapping[str, Any], name: str) -> str:
    for entry in config.get("Env") or []:
        key, _, value = entry.partition("=")
        if key == name:
            return value
    return ""


def _run_probe(image: str, found: Any, client: docker.DockerClient) -> ArchFacts:
    """Run the probe script in one hardened, network-less container that is always removed."""
    config = found.attrs.get("Config") or {}
    dirs = pythonpath_dirs(_env(config, "PYTHONPATH"))
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
        facts = json.loads(stdout)
    except json.JSONDecodeError:
        raise UserError(
            f"base image {image}: the probe printed no result: {stdout[:300]}"
        ) from None
    facts["packages"] = sorted(installed_packages(facts.pop("dpkg_status")))
    return facts
