"""Small real wheels and shared objects for tests, built with the host's gcc.

Real ELF files exercise pyelftools the way real wheels do; synthetic wheels keep the tests fast
and offline.
"""

from __future__ import annotations

import base64
import hashlib
import re
import struct
import subprocess
import zipfile
from collections.abc import Mapping, Sequence
from itertools import product
from pathlib import Path

GCC = "/usr/bin/gcc"
EXTENSION_SUFFIX = ".cpython-313-x86_64-linux-gnu.so"


def compile_so(
    tmp_path: Path,
    source: str,
    name: str,
    *,
    soname: str | None = None,
    libs: Sequence[str] = (),
    rpath: str | None = None,
    runpath: bool = True,
    libdirs: Sequence[Path] = (),
    version_script: str | None = None,
) -> Path:
    """Compile C `source` into `tmp_path/build/<name>` as a shared object.

    `libs` are `-l` names, always kept as DT_NEEDED (--no-as-needed); `rpath` is stored as
    DT_RUNPATH, or as DT_RPATH when `runpath` is False; `version_script` is its text.
    """
    build = tmp_path / "build"
    build.mkdir(parents=True, exist_ok=True)
    stem = name.replace("/", "_")
    c_file = build / f"{stem}.c"
    c_file.write_text(source)
    output = build / name
    command = [GCC, "-shared", "-fPIC", "-o", str(output), str(c_file)]
    if soname:
        command.append(f"-Wl,-soname,{soname}")
    if rpath is not None:
        command.append(f"-Wl,-rpath,{rpath}")
        command.append("-Wl,--enable-new-dtags" if runpath else "-Wl,--disable-new-dtags")
    if version_script is not None:
        script = build / f"{stem}.map"
        script.write_text(version_script)
        command.append(f"-Wl,--version-script={script}")
    command += [f"-L{directory}" for directory in libdirs]
    command += ["-Wl,--no-as-needed", *(f"-l{lib}" for lib in libs)]
    subprocess.run(command, check=True, capture_output=True, text=True)
    return output


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def wheel_filename(name: str, version: str, tag: str) -> str:
    return f"{re.sub(r'[-_.]+', '_', name)}-{version}-{tag}.whl"


def make_wheel(
    tmp_path: Path,
    name: str,
    version: str,
    tag: str,
    files: Mapping[str, bytes],
    *,
    top_level: Sequence[str] | None = None,
    requires: Sequence[str] = (),
) -> Path:
    """Write a valid wheel with `files` (archive path → content) plus a dist-info directory.

    `tag` may be compressed (`cp313-cp313-manylinux_2_17_x86_64.manylinux2014_x86_64`); the
    WHEEL file lists every expanded tag. `top_level` adds a top_level.txt, `requires` its
    dependencies (Requires-Dist).
    """
    filename = wheel_filename(name, version, tag)
    dist_info = f"{filename.split('-')[0]}-{version}.dist-info"
    interpreters, abis, platforms = (part.split(".") for part in tag.split("-"))
    tag_lines = "".join(f"Tag: {'-'.join(t)}\n" for t in product(interpreters, abis, platforms))
    pure = platforms == ["any"]
    metadata = {
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        + "".join(f"Requires-Dist: {requirement}\n" for requirement in requires),
        f"{dist_info}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: wheelfactory\n"
            f"Root-Is-Purelib: {'true' if pure else 'false'}\n{tag_lines}"
        ),
    }
    if top_level is not None:
        metadata[f"{dist_info}/top_level.txt"] = "".join(f"{line}\n" for line in top_level)
    contents = {**files, **{path: text.encode() for path, text in metadata.items()}}
    record = "".join(
        f"{path},{_record_hash(data)},{len(data)}\n" for path, data in contents.items()
    )
    record += f"{dist_info}/RECORD,,\n"
    tmp_path.mkdir(parents=True, exist_ok=True)
    wheel = tmp_path / filename
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data in contents.items():
            zf.writestr(path, data)
        zf.writestr(f"{dist_info}/RECORD", record)
    return wheel


def zip_bomb(
    tmp_path: Path, name: str, unpacked: int, *, declared: int | None = None, member: str = ""
) -> Path:
    """A valid wheel of `name` 1.0 plus one member of `unpacked` zero bytes, deflated (about
    1000:1: a GiB makes a wheel of a MiB). `declared`: the size its zip entries say instead
    (a lie: the member inflates past it), patched into both of its headers."""
    wheel = make_wheel(tmp_path, name, "1.0", "py3-none-any", {})
    member = member or f"{wheel.name.split('-')[0]}/zeros.bin"
    chunk = bytes(1 << 20)
    with zipfile.ZipFile(wheel, "a", zipfile.ZIP_DEFLATED) as zf:
        with zf.open(member, "w", force_zip64=unpacked >= 1 << 32) as out:
            for _ in range(unpacked // len(chunk)):
                out.write(chunk)
            out.write(bytes(unpacked % len(chunk)))
        info = zf.getinfo(member)
    if declared is not None:
        _declare(wheel, info, declared)
    return wheel


def _declare(wheel: Path, info: zipfile.ZipInfo, size: int) -> None:
    """Patch `info`'s uncompressed size in its local header and its central directory entry."""
    with zipfile.ZipFile(wheel) as zf:
        position = zf.start_dir  # the central directory's first entry
    data = bytearray(wheel.read_bytes())
    local = info.header_offset
    data[local + 22 : local + 26] = struct.pack("<I", size)
    while data[position + 46 : position + 46 + len(info.orig_filename)].decode() != info.filename:
        lengths = struct.unpack("<HHH", data[position + 28 : position + 34])
        position += 46 + sum(lengths)
    data[position + 24 : position + 28] = struct.pack("<I", size)
    wheel.write_bytes(bytes(data))
