"""The shipped Debian data and its loaders, and the soname index generator's parsing."""

from __future__ import annotations

import gzip
import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from builder.plan.debian import (
    DynamicLoad,
    dynamic_loads,
    package_for,
    packages_providing,
    soname_index,
    sonames_for_load,
    split_symbol_version,
    symbol_maxima,
    version_tuple,
)
from builder.resolve.target import ARCHES, Arch

REPO = Path(__file__).resolve().parents[2]
ALL_ARCHES = pytest.mark.parametrize("arch", list(ARCHES.values()), ids=list(ARCHES))


def _generator() -> ModuleType:
    path = REPO / "scripts" / "gen_soname_index.py"
    spec = importlib.util.spec_from_file_location("gen_soname_index", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@ALL_ARCHES
@pytest.mark.parametrize(
    ("soname", "package"),
    [
        ("libgomp.so.1", "libgomp1"),
        ("libGL.so.1", "libgl1"),
        ("libglib-2.0.so.0", "libglib2.0-0t64"),
        ("libmagic.so.1", "libmagic1t64"),
        ("libzbar.so.0", "libzbar0t64"),
        ("libcairo.so.2", "libcairo2"),
        ("libstdc++.so.6", "libstdc++6"),
    ],
)
def test_package_for_known_sonames(arch: Arch, soname: str, package: str) -> None:
    assert package_for(soname, arch) == package


@ALL_ARCHES
def test_index_covers_the_archive_and_the_loader(arch: Arch) -> None:
    index = soname_index(arch)
    assert 14_000 < len(index) < 20_000
    assert index[arch.loader] == "libc6"
    assert package_for("libdoes-not-exist.so.9", arch) is None


@ALL_ARCHES
def test_packages_providing_is_the_reverse_lookup(arch: Arch) -> None:
    provided = packages_providing(["libc6", "libgomp1", "no-such-package"], arch)
    assert {"libc.so.6", "libm.so.6", arch.loader, "libgomp.so.1"} <= provided
    assert "libGL.so.1" not in provided
    assert packages_providing([], arch) == frozenset()


@ALL_ARCHES
def test_every_dynamic_load_resolves_to_packages(arch: Arch) -> None:
    for load in dynamic_loads().values():
        for soname in load.sonames:
            assert package_for(soname, arch), f"{load.distribution}: {soname} on {arch.name}"


def test_dynamic_loads_table() -> None:
    loads = dynamic_loads()
    assert loads["python-magic"] == DynamicLoad(
        distribution="python-magic",
        sonames=(),
        packages=(),
        reason="",
        check="import magic; assert 'text' in magic.from_buffer(b'hello world')",
    )
    assert {"pyzbar", "cairocffi", "cairosvg", "weasyprint", "pyvips", "psycopg"} <= set(loads)
    assert loads["wand"].sonames == ("libMagickWand-7.Q16.so.10",) and loads["wand"].reason
    for name, load in loads.items():
        assert name == load.distribution
        assert load.reason or not (load.sonames or load.packages), name
        if load.check is not None:
            compile(load.check, name, "exec")


@ALL_ARCHES
@pytest.mark.parametrize(
    ("name", "expected"),
    [("pq", "libpq.so.5"), ("libpq.so.5", "libpq.so.5"), ("libmagic", "libmagic.so.1"),
     ("magic", "libmagic.so.1"), ("libcairo.so", "libcairo.so.2"),
     ("gobject-2.0", "libgobject-2.0.so.0"),
     ("/usr/lib/x86_64-linux-gnu/libzbar.so.0", "libzbar.so.0")],
)  # fmt: skip
def test_run_time_names_map_like_find_library(arch: Arch, name: str, expected: str) -> None:
    assert sonames_for_load(name, arch)[0] == expected


@ALL_ARCHES
def test_foreign_and_unknown_run_time_names(arch: Arch) -> None:
    assert sonames_for_load("libpq.dll", arch) is None
    assert sonames_for_load("libvips.42.dylib", arch) is None
    assert sonames_for_load("msvcrt", arch) is None
    assert sonames_for_load("zzqnosuchlib", arch) == ()
    for name in ("ucrtbase", "msvcr110", "/System/Library/Frameworks/IOKit.framework/IOKit"):
        assert sonames_for_load(name, arch) is None  # another OS's names
    for name in ("codegen/aoti_runtime/interface.cpp", "script.ld"):
        assert sonames_for_load(name, arch) is None  # no library at all
    # a dot in a real library's name: Debian's own names win over the suffix rule
    assert sonames_for_load("MagickWand-7.Q16", arch)[0] == "libMagickWand-7.Q16.so.10"
    assert sonames_for_load("libpython3.13", arch)[0] == "libpython3.13.so.1"


def test_symbol_maxima() -> None:
    assert symbol_maxima() == {
        "GLIBC": (2, 41),
        "GLIBCXX": (3, 4, 33),
        "CXXABI": (1, 3, 15),
        "CXXABI_TM": (1,),
        "GCC": (14, 0, 0),
    }


def test_versions_compare_numerically() -> None:
    assert version_tuple("2.41") > version_tuple("2.5")
    assert split_symbol_version("GLIBCXX_3.4.33") == ("GLIBCXX", (3, 4, 33))
    assert split_symbol_version("CXXABI_TM_1") == ("CXXABI_TM", (1,))
    assert split_symbol_version("GLIBC_PRIVATE") is None
    assert split_symbol_version("GLIBC_ABI_DT_RELR") is None


CONTENTS = """\
usr/bin/file                                            utils/file
usr/lib/x86_64-linux-gnu/libmagic.so.1                  libs/libmagic1t64
usr/lib/x86_64-linux-gnu/libmagic.so                    libdevel/libmagic-dev
usr/lib/x86_64-linux-gnu/libGL.so.1                     libs/libgl1,x11/libgl1-dbg
usr/lib/x86_64-linux-gnu/gl4es/libGL.so.1               libs/libgl4es0
usr/lib/x86_64-linux-gnu/primus/libGL.so.1              utils/primus-libs
usr/lib/aarch64-linux-gnu/libGL.so.1                    libs/libgl1
usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2           libs/libc6
usr/lib64/ld-linux-x86-64.so.2                          libs/libc6
lib/x86_64-linux-gnu/libold.so.3                        libs/libold3
usr/lib/x86_64-linux-gnu/libACE-8.0.2.so                libs/libace-8.0.2,libdevel/libace-dev
usr/lib/x86_64-linux-gnu/libfoo.so.1 libdevel/libfoo-dev,libs/zfoo,libs/libfoo1-extra,libs/libfoo1
usr/lib/x86_64-linux-gnu/libbar.so.2                    devel/libbar2-amd64-cross,libs/bar2
usr/lib/x86_64-linux-gnu/libsoname.sol                  libs/notalib
usr/lib/x86_64-linux-gnu/my lib.so.2                    contrib/libs/spaced
usr/share/doc/libfoo1/libfoo.so.1                       doc/libfoo-doc
"""


def test_parse_contents_keeps_loader_path_libraries_with_preferred_packages_first() -> None:
    parsed = _generator().parse_contents(CONTENTS.splitlines(keepends=True), "x86_64-linux-gnu")
    assert parsed == {
        "libmagic.so.1": ["libmagic1t64"],
        "libGL.so.1": ["libgl1", "libgl1-dbg"],
        "ld-linux-x86-64.so.2": ["libc6"],
        "libold.so.3": ["libold3"],
        "libACE-8.0.2.so": ["libace-8.0.2", "libace-dev"],
        "libfoo.so.1": ["libfoo1", "libfoo1-extra", "zfoo", "libfoo-dev"],
        "libbar.so.2": ["bar2", "libbar2-amd64-cross"],
        "my lib.so.2": ["spaced"],
    }


def test_write_index_is_sorted_and_reproducible(tmp_path: Path) -> None:
    generator = _generator()
    index = {"libz.so.1": ["zlib1g"], "liba.so.1": ["liba1", "liba-dev"]}
    first, second = tmp_path / "first.tsv.gz", tmp_path / "second.tsv.gz"
    generator.write_index(index, first)
    generator.write_index(dict(reversed(index.items())), second)
    assert first.read_bytes() == second.read_bytes()
    assert gzip.decompress(first.read_bytes()) == b"liba.so.1\tliba1,liba-dev\nlibz.so.1\tzlib1g\n"


@ALL_ARCHES
def test_a_load_finds_every_version_of_its_library_newest_first(arch: Arch) -> None:
    # The lookup bisects the sorted index for one library; a pass over the whole index, ranking
    # every library, must agree with it for each one.
    versions: dict[str, list[str]] = {}
    for soname in soname_index(arch):
        if match := re.fullmatch(r"(lib.+\.so)((?:\.\d+)+)", soname):
            versions.setdefault(match[1], []).append(soname)
    assert len(versions) > 5_000
    for stem, names in versions.items():
        newest = sorted(names, key=lambda n: (-int(n[len(stem) + 1 :].split(".")[0]), n.count(".")))
        assert sonames_for_load(stem, arch) == tuple(newest), stem
