"""What a wheel may hold, checked before anything unpacks it: the one home of these checks.

A wheel is hostile input (a team's requirements name it; CI runners hold registry logins). Its
members' paths, and the paths its metadata makes (console and gui scripts from
entry_points.txt, `<name>.data/<scheme>/…`), become paths in a layer: a member `../etc/x`, a
script named `../../../etc/x`, or a `.data` path leaving its scheme would write outside the
install root, and `docker load` then fails on the duplicate directories naming nothing. Each
such name is refused in one line naming the wheel and the name.

A wheel's unpacked size is bounded too: a few megabytes can inflate to gigabytes (a zip bomb)
and fill a runner's disk. The sum of the sizes its members declare is checked once, as its
download ends, before the inspection, the layer writer or the compiler reads a byte; none of
them reads a member past its declared size (zipfile stops there, and a member that inflates
to more fails its CRC), so the declared sum bounds the bytes written. Only stored and deflated
members are read: zipfile inflates bzip2 and lzma without a bound on one call's output.

Pure: the checks take an archive already open or its member list; inspect.wheel_reader opens
the wheel (`check_wheel`, `check_housed`).
"""

from __future__ import annotations

import configparser
import zipfile
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path

from builder.errors import UserError, human, shown

UNPACKED_MAX = 8 << 30  # bytes a wheel may unpack to by default; torch's CUDA wheel is ~2 GB
RATIO_FLOOR = 1 << 30  # above this many unpacked bytes, the ratio below applies too
RATIO_MAX = 100  # unpacked bytes per wheel byte; real wheels are below 10, a zip bomb ~1000
METADATA_MAX = 64 << 20  # a .dist-info file read whole (RECORD, entry_points.txt)
COMPRESSIONS = frozenset({zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED})
SCRIPT_SECTIONS = ("console_scripts", "gui_scripts")
DATA_SCHEMES = frozenset({"purelib", "platlib", "scripts", "headers", "data"})
NAME_MAX = 255  # bytes of one file name on Linux's file systems
# what zipfile raises for a member that does not inflate as its entry says: a bad CRC (one that
# inflates past its declared size is cut there, and fails its CRC), a damaged stream
UNREADABLE = (zipfile.BadZipFile, zlib.error, EOFError)


def unreadable(wheel: str, member: str, error: BaseException) -> UserError:
    """The one line for a member that does not unpack (an UNREADABLE error)."""
    return UserError(f"{wheel}: {shown(member)} does not unpack ({error})")


def path_fault(path: str) -> str | None:
    """Why `path` (a member's, or under a `.data` scheme) is not a plain relative path that
    stays under its root, or None."""
    if "\0" in path:
        return "holds a NUL"
    if path.startswith("/") or "\\" in path:
        return "is absolute" if path.startswith("/") else "holds a backslash"
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "leaves its root" if ".." in parts else "has an empty or '.' part"
    if any(len(part.encode(errors="surrogateescape")) > NAME_MAX for part in parts):
        return f"has a name longer than {NAME_MAX} bytes"
    return None


def script_fault(name: str) -> str | None:
    """Why `name` (a script's, written into bin/) is not a plain file name, or None."""
    if not name or any(c in name for c in "/\\\0") or name.startswith(("-", ".")):
        return "is not a plain file name"
    if not name.isprintable():
        return "holds a control character"
    return path_fault(name)


def checked_members(archive: zipfile.ZipFile, wheel: str) -> list[zipfile.ZipInfo]:
    """The wheel's members, once every path is plain and relative, every `.data` path is
    under a scheme, and every member is stored or deflated; refused in one line otherwise."""
    infos = archive.infolist()
    for info in infos:
        name = info.filename.removesuffix("/") if info.is_dir() else info.filename
        if why := path_fault(name):
            raise UserError(f"{wheel}: member {shown(info.filename)} {why}")
        if info.compress_type not in COMPRESSIONS:
            raise UserError(
                f"{wheel}: member {shown(info.filename)} is compressed with method"
                f" {info.compress_type}: a wheel's members are stored or deflated"
            )
        first, _, rest = name.partition("/")
        if first.endswith(".data") and rest and not info.is_dir():
            scheme, _, inner = rest.partition("/")
            if scheme not in DATA_SCHEMES or not inner:
                raise UserError(
                    f"{wheel}: member {shown(info.filename)} is under no install scheme"
                    f" ({', '.join(sorted(DATA_SCHEMES))})"
                )
    return infos


def scripts(archive: zipfile.ZipFile, dist_info: str, wheel: str) -> list[tuple[str, str]]:
    """(name, `module:attribute`) of each console script entry_points.txt declares, sorted;
    every script name (console and gui) checked as a file name in bin/."""
    try:
        info = archive.getinfo(f"{dist_info}/entry_points.txt")
    except KeyError:
        return []
    if info.file_size > METADATA_MAX:  # check_unpacked_size refuses it first in a run
        raise UserError(
            f"{wheel}: entry_points.txt declares {human(info.file_size)}, more than a .dist-info"
            f" file's {human(METADATA_MAX)}"
        )
    parser = configparser.ConfigParser(delimiters=("=",), interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    try:
        parser.read_string(archive.read(info).decode())
    except UNREADABLE as error:
        raise unreadable(wheel, info.filename, error) from None
    except (configparser.Error, UnicodeDecodeError) as error:
        said = str(error).splitlines()[0]
        raise UserError(f"{wheel}: entry_points.txt does not parse ({said[:200]})") from None
    for section in SCRIPT_SECTIONS:
        for name, _ in parser.items(section) if parser.has_section(section) else ():
            if why := script_fault(name):
                raise UserError(f"{wheel}: {section[:-1].replace('_', ' ')} {shown(name)} {why}")
    if not parser.has_section("console_scripts"):
        return []
    return sorted(parser.items("console_scripts"))


def check_unpacked_size(infos: Sequence[zipfile.ZipInfo], wheel: Path, limit: int) -> None:
    """Refuse a wheel whose members declare more than `limit` bytes in all (0: no bound), or,
    past RATIO_FLOOR, more than RATIO_MAX times the wheel's own size (a zip bomb); and one
    whose .dist-info file (read whole into memory) declares more than METADATA_MAX."""
    metadata = (i for i in infos if i.filename.count("/") == 1 and ".dist-info/" in i.filename)
    if big := next((i for i in metadata if i.file_size > METADATA_MAX), None):
        raise UserError(
            f"{wheel.name}: {shown(big.filename)} declares {human(big.file_size)}, more than"
            f" a .dist-info file's {human(METADATA_MAX)}"
        )
    unpacked = sum(info.file_size for info in infos)
    packed = wheel.stat().st_size
    if limit == 0 or (unpacked <= limit and unpacked <= max(RATIO_FLOOR, RATIO_MAX * packed)):
        return
    bound = f"the bound of {human(limit)}" if unpacked > limit else f"{RATIO_MAX} times its size"
    raise UserError(
        f"{wheel.name}: unpacks to {human(unpacked)} from {human(packed)}, more than {bound}"
        " (a zip bomb?); --wheel-max raises the bound, 0 lifts it"
    )


def dist_infos(names: Iterable[str]) -> set[str]:
    return {
        name.split("/")[0] for name in names if name.count("/") == 1 and name.endswith("/WHEEL")
    }
