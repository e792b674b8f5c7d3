"""ELF reading, wheel inspection and native-need resolution on small wheels built with gcc."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import pytest
from support.wheelfactory import EXTENSION_SUFFIX, compile_so, make_wheel

from builder.cache import Cache
from builder.errors import UserError
from builder.files import sha256_of
from builder.inspect import wheels as inspection_module
from builder.inspect.elf import ElfFile, is_elf, read_elf
from builder.inspect.wheel_reader import inspect_as_ready, inspect_wheel
from builder.inspect.wheels import RECORD_KIND, WheelInspection, derive_top_level
from builder.plan.natives import (
    By,
    NativeNeed,
    SymbolProblem,
    external_needs,
    resolve_needs,
    symbol_problems,
)
from builder.resolve.target import ARCHES

LOADER = ARCHES["amd64"].loader
BASE = frozenset({"libc.so.6", "libm.so.6", "libgcc_s.so.1"})
MAXIMA = {"GLIBC": (2, 41), "GLIBCXX": (3, 4, 33), "CXXABI": (1, 3, 15), "GCC": (14, 0, 0)}
TAG = "cp313-cp313-manylinux_2_17_x86_64.manylinux2014_x86_64"
CALLS_PUTS = '#include <stdio.h>\nvoid hello(void) { puts("hi"); }\n'


def lib_source(function: str, calls: str = "") -> str:
    declaration = f"extern int {calls}(void);\n" if calls else ""
    body = f"return {calls}();" if calls else "return 1;"
    return f"{declaration}int {function}(void) {{ {body} }}\n"


def inspect(tmp_path: Path, wheel: Path) -> WheelInspection:
    return inspect_wheel(wheel, sha256_of(wheel), Cache(tmp_path / "cache"))


def needs(*wheels: WheelInspection, base: frozenset[str] = BASE) -> dict[str, tuple[str, ...]]:
    return {need.soname: need.needed_by for need in external_needs(wheels, base, LOADER)}


def test_is_elf_and_elf_facts(tmp_path: Path) -> None:
    so = compile_so(tmp_path, CALLS_PUTS, "libhello.so.1", soname="libhello.so.1", libs=["gomp"])
    with so.open("rb") as stream:
        assert is_elf(stream.read(4))
        elf = read_elf(stream, "pkg/libhello.so.1")
    assert not is_elf(b"PK\x03\x04") and not is_elf(b"")
    assert elf.path == "pkg/libhello.so.1"
    assert elf.machine == "x86_64"
    assert elf.soname == "libhello.so.1"
    assert "libgomp.so.1" in elf.needed and "libc.so.6" in elf.needed
    assert elf.rpaths == ()
    assert ("libc.so.6", "GLIBC_2.2.5") in elf.version_needs
    assert list(elf.version_needs) == sorted(set(elf.version_needs))
    assert ElfFile.from_dict(elf.to_dict()) == elf


def test_libgomp_is_an_external_need_naming_the_file(tmp_path: Path) -> None:
    ext = compile_so(tmp_path, lib_source("train"), "core.so", libs=["gomp"])
    path = f"gompy/_core{EXTENSION_SUFFIX}"
    wheel = inspect(tmp_path, make_wheel(tmp_path, "GomPy", "1.0", TAG, {path: ext.read_bytes()}))
    assert wheel.name == "gompy" and not wheel.is_pure
    assert [elf.path for elf in wheel.elf_files] == [path]
    assert external_needs([wheel], BASE, LOADER) == (
        NativeNeed("libgomp.so.1", (f"gompy==1.0: {path}",)),
    )


def test_vendored_library_found_through_origin_runpath(tmp_path: Path) -> None:
    vendored = "libvend-1a2b3c4d.so.1"
    lib = compile_so(tmp_path, lib_source("vend"), vendored, soname=vendored)
    ext = compile_so(
        tmp_path,
        lib_source("use", calls="vend"),
        "ext.so",
        libs=[f":{vendored}"],
        libdirs=[lib.parent],
        rpath="$ORIGIN/../vend.libs",
    )
    files = {"vend/_ext.abi3.so": ext.read_bytes(), f"vend.libs/{vendored}": lib.read_bytes()}
    wheel = inspect(tmp_path, make_wheel(tmp_path, "vend", "2.0", TAG, files))
    by_path = {elf.path: elf for elf in wheel.elf_files}
    assert by_path["vend/_ext.abi3.so"].rpaths == ("$ORIGIN/../vend.libs",)
    assert needs(wheel) == {}
    resolved = [r for r in resolve_needs([wheel], BASE, LOADER) if r.soname == vendored]
    assert [(r.by, r.provider) for r in resolved] == [(By.RPATH, f"vend.libs/{vendored}")]


def test_origin_rpath_to_a_sibling_directory(tmp_path: Path) -> None:
    lib = compile_so(tmp_path, lib_source("sib"), "libsib.so.1", soname="libsib.so.1")
    kwargs = {"libs": [":libsib.so.1"], "libdirs": [lib.parent], "runpath": False}
    ext_a = compile_so(tmp_path, lib_source("a", "sib"), "a.so", rpath="$ORIGIN/../lib", **kwargs)
    ext_b = compile_so(tmp_path, lib_source("b", "sib"), "b.so", rpath="${ORIGIN}/../lib", **kwargs)
    files = {
        "pkg/lib/libsib.so.1": lib.read_bytes(),
        "pkg/ext/a.so": ext_a.read_bytes(),
        "pkg/ext/deeper/b.so": ext_b.read_bytes(),  # ../lib from here is pkg/ext/lib: not there
    }
    wheel = inspect(tmp_path, make_wheel(tmp_path, "pkg", "1.0", TAG, files))
    by_path = {elf.path: elf for elf in wheel.elf_files}
    assert by_path["pkg/ext/a.so"].rpaths == ("$ORIGIN/../lib",)  # DT_RPATH, raw
    resolved = {
        r.path: r for r in resolve_needs([wheel], BASE, LOADER) if r.soname == "libsib.so.1"
    }
    assert resolved["pkg==1.0: pkg/ext/a.so"].by == By.RPATH
    # Not in b.so's search path, but the set has it: satisfied once a sibling loaded it.
    assert resolved["pkg==1.0: pkg/ext/deeper/b.so"].by == By.WHEEL_SET
    assert needs(wheel) == {}


def test_library_from_another_wheel_of_the_set(tmp_path: Path) -> None:
    lib = compile_so(tmp_path, lib_source("shared"), "libshared.so.3", soname="libshared.so.3")
    ext = compile_so(
        tmp_path,
        lib_source("use", "shared"),
        "use.so",
        libs=[":libshared.so.3"],
        libdirs=[lib.parent],
    )
    provider = make_wheel(
        tmp_path, "provider", "1.0", TAG, {"provider/libshared.so.3": lib.read_bytes()}
    )
    user = make_wheel(tmp_path, "user", "1.0", TAG, {"user/use.so": ext.read_bytes()})
    user_only = inspect(tmp_path, user)
    assert needs(user_only) == {"libshared.so.3": ("user==1.0: user/use.so",)}
    assert needs(user_only, inspect(tmp_path, provider)) == {}


def test_base_provided_soname_is_no_need(tmp_path: Path) -> None:
    ext = compile_so(tmp_path, lib_source("cxx"), "cxx.so", libs=["stdc++"])
    wheel = inspect(
        tmp_path, make_wheel(tmp_path, "cxx", "1.0", TAG, {"cxx/_cxx.so": ext.read_bytes()})
    )
    assert "libstdc++.so.6" in wheel.elf_files[0].needed
    assert needs(wheel) == {"libstdc++.so.6": ("cxx==1.0: cxx/_cxx.so",)}
    assert needs(wheel, base=BASE | {"libstdc++.so.6"}) == {}


def test_unknown_soname_names_library_and_file(tmp_path: Path) -> None:
    unknown = compile_so(
        tmp_path, lib_source("zzq"), "libzzqunknown.so.1", soname="libzzqunknown.so.1"
    )
    ext = compile_so(
        tmp_path,
        lib_source("use", "zzq"),
        "zzq.so",
        libs=[":libzzqunknown.so.1"],
        libdirs=[unknown.parent],
        rpath="$ORIGIN",
    )
    path = f"zzq/_zzq{EXTENSION_SUFFIX}"
    wheel = inspect(tmp_path, make_wheel(tmp_path, "zzq", "0.1", TAG, {path: ext.read_bytes()}))
    assert needs(wheel) == {"libzzqunknown.so.1": (f"zzq==0.1: {path}",)}


def test_loader_and_vdso_are_never_needs() -> None:
    elf = ElfFile("m/x.so", "x86_64", None, ("ld-linux-x86-64.so.2", "linux-vdso.so.1"), (), ())
    wheel = WheelInspection("m-1-py3-none-any.whl", "0" * 64, "m", "1", (), ("m",), (elf,))
    assert external_needs([wheel], frozenset(), LOADER) == ()


def test_files_of_another_machine_are_ignored() -> None:
    elf = ElfFile("m/arm.so", "aarch64", None, ("libarm-only.so.1",), (), ())
    wheel = WheelInspection("m-1-py3-none-any.whl", "0" * 64, "m", "1", (), ("m",), (elf,))
    assert external_needs([wheel], frozenset(), LOADER) == ()
    assert (
        external_needs([wheel], frozenset(), ARCHES["arm64"].loader)[0].soname == "libarm-only.so.1"
    )


def test_too_new_glibc_symbol_version(tmp_path: Path) -> None:
    fake_libc = compile_so(
        tmp_path,
        lib_source("fake_fn"),
        "libfakec.so",
        soname="libc.so.6",
        version_script="GLIBC_2.99 { global: fake_fn; local: *; };\n",
    )
    ext = compile_so(
        tmp_path, lib_source("use", "fake_fn"), "new.so", libs=["fakec"], libdirs=[fake_libc.parent]
    )
    old = compile_so(tmp_path, CALLS_PUTS, "old.so")
    files = {"glibcy/_new.so": ext.read_bytes(), "glibcy/_old.so": old.read_bytes()}
    wheel = inspect(tmp_path, make_wheel(tmp_path, "glibcy", "1.0", TAG, files))
    by_path = {elf.path: elf for elf in wheel.elf_files}
    assert ("libc.so.6", "GLIBC_2.99") in by_path["glibcy/_new.so"].version_needs
    assert ("libc.so.6", "GLIBC_2.2.5") in by_path["glibcy/_old.so"].version_needs
    assert symbol_problems([wheel], MAXIMA) == (
        SymbolProblem("glibcy==1.0: glibcy/_new.so", "libc.so.6", "GLIBC_2.99", "2.41"),
    )


def test_symbol_versions_at_or_below_maxima_pass() -> None:
    version_needs = (
        ("libc.so.6", "GLIBC_2.41"),
        ("libc.so.6", "GLIBC_PRIVATE"),
        ("libgcc_s.so.1", "GCC_14.0"),
        ("libstdc++.so.6", "CXXABI_TM_1"),
        ("libstdc++.so.6", "GLIBCXX_3.4.33"),
        ("libvendored-abc.so.6", "GLIBCXX_3.4.40"),  # shipped by the set itself
    )
    ext = ElfFile("x/a.so", "x86_64", None, (), (), version_needs)
    vendored = ElfFile("x.libs/libvendored-abc.so.6", "x86_64", "libvendored-abc.so.6", (), (), ())
    wheel = WheelInspection("x-1-py3-none-any.whl", "0" * 64, "x", "1", (), ("x",), (ext, vendored))
    assert symbol_problems([wheel], MAXIMA) == ()
    newer = ElfFile("x/b.so", "x86_64", None, (), (), (("libstdc++.so.6", "GLIBCXX_3.4.34"),))
    wheel = WheelInspection("x-1-py3-none-any.whl", "0" * 64, "x", "1", (), ("x",), (newer,))
    assert symbol_problems([wheel], MAXIMA) == (
        SymbolProblem("x==1: x/b.so", "libstdc++.so.6", "GLIBCXX_3.4.34", "3.4.33"),
    )


def test_data_platlib_maps_to_tree_root_and_scripts_are_ignored(tmp_path: Path) -> None:
    ext = compile_so(tmp_path, lib_source("plat"), "plat.so", libs=["gomp"])
    tool = compile_so(tmp_path, lib_source("tool"), "tool", libs=["gomp"])
    files = {
        "plat-1.0.data/platlib/plat/__init__.py": b"",
        "plat-1.0.data/platlib/plat/_plat.so": ext.read_bytes(),
        "plat-1.0.data/purelib/platpure.py": b"",
        "plat-1.0.data/scripts/tool": tool.read_bytes(),
        "plat-1.0.data/data/share/lib/libtool.so": tool.read_bytes(),
    }
    wheel = inspect(tmp_path, make_wheel(tmp_path, "plat", "1.0", TAG, files))
    assert [elf.path for elf in wheel.elf_files] == ["plat/_plat.so"]
    assert wheel.top_level == ("plat", "platpure")
    assert wheel.tags == ("cp313-cp313-manylinux2014_x86_64", "cp313-cp313-manylinux_2_17_x86_64")


def test_top_level_derived_from_the_tree(tmp_path: Path) -> None:
    files = {
        "alpha/__init__.py": b"",
        "_beta.py": b"",
        f"gamma{EXTENSION_SUFFIX}": b"not really elf",
        "delta.abi3.so": b"",
        "ns/sub/mod.py": b"",
        "docs/readme.txt": b"",
        "x.libs/libfoo.so": b"",
        "__pycache__/zeta.cpython-313.pyc": b"",
        "setup.cfg": b"",
        "odd.pth": b"",
    }
    wheel = inspect(tmp_path, make_wheel(tmp_path, "mixed", "1.0", "py3-none-any", files))
    assert wheel.is_pure
    assert wheel.top_level == ("alpha", "delta", "gamma", "ns", "_beta")
    assert derive_top_level(["_a/x.py", "b.py", "a-b/c.py"]) == ("b", "_a")


def test_top_level_txt_used_when_sane(tmp_path: Path) -> None:
    files = {"alpha/__init__.py": b"", "tests/test_x.py": b"", "_speed.abi3.so": b""}
    sane = make_wheel(
        tmp_path / "a", "a", "1.0", "py3-none-any", files, top_level=["alpha", "_speed", "missing"]
    )
    assert inspect(tmp_path, sane).top_level == ("alpha", "_speed")
    insane = make_wheel(
        tmp_path / "b", "b", "1.0", "py3-none-any", files, top_level=["", "not-a-name"]
    )
    assert inspect(tmp_path, insane).top_level == ("alpha", "tests", "_speed")


def test_second_inspection_comes_from_cache_without_opening_the_zip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ext = compile_so(tmp_path, lib_source("c"), "c.so", libs=["gomp"])
    wheel_path = make_wheel(
        tmp_path / "wheels", "cached", "1.0", TAG, {"cached/c.so": ext.read_bytes()}
    )
    sha256 = sha256_of(wheel_path)
    cache = Cache(tmp_path / "cache")
    first = inspect_wheel(wheel_path, sha256, cache)
    assert cache.get_record(RECORD_KIND, sha256)["schema"] == inspection_module.SCHEMA
    wheel_path.write_bytes(b"corrupted after the first inspection")

    def no_zip(*args: object, **kwargs: object) -> None:
        raise AssertionError("the zip was opened")

    monkeypatch.setattr(zipfile, "ZipFile", no_zip)
    assert inspect_wheel(wheel_path, sha256, cache) == first
    wheel_path.unlink()
    assert inspect_as_ready([(wheel_path, sha256)], cache) == {sha256: first}


def test_cache_record_of_another_schema_is_ignored(tmp_path: Path) -> None:
    wheel_path = make_wheel(tmp_path, "old", "1.0", "py3-none-any", {"old.py": b""})
    sha256 = sha256_of(wheel_path)
    cache = Cache(tmp_path / "cache")
    stale = {**inspect_wheel(wheel_path, sha256, cache).to_dict(), "schema": 0, "top_level": ["x"]}
    cache.put_record(RECORD_KIND, sha256, stale)
    assert inspect_wheel(wheel_path, sha256, cache).top_level == ("old",)
    assert cache.get_record(RECORD_KIND, sha256)["schema"] == inspection_module.SCHEMA


def test_inspect_in_parallel_keys_each_wheel_by_its_sha256(tmp_path: Path) -> None:
    ext = compile_so(tmp_path, lib_source("p"), "p.so", libs=["gomp"])
    paths = [
        make_wheel(
            tmp_path / "w", f"par{index}", "1.0", TAG, {f"par{index}/p.so": ext.read_bytes()}
        )
        for index in range(3)
    ]
    cache = Cache(tmp_path / "cache")
    items = [(path, sha256_of(path)) for path in reversed(paths)]
    results = inspect_as_ready(items, cache, workers=2)
    named = {sha256: r.name for sha256, r in results.items()}
    assert named == {sha256_of(path): f"par{index}" for index, path in enumerate(paths)}
    assert all(cache.get_record(RECORD_KIND, sha256) for _, sha256 in items)
    assert inspect_as_ready(items, cache, workers=2) == results


@pytest.mark.parametrize("damage", ["garbage", "truncated", "bad member"])
def test_corrupt_wheel_is_a_user_error_naming_it(tmp_path: Path, damage: str) -> None:
    ext = compile_so(tmp_path, lib_source("c"), "c.so")
    wheel_path = make_wheel(tmp_path, "broken", "1.0", TAG, {"broken/c.so": ext.read_bytes()})
    data = bytearray(wheel_path.read_bytes())
    if damage == "garbage":
        data = bytearray(b"this is not a zip file at all")
    elif damage == "truncated":
        data = data[: len(data) // 2]
    else:
        with zipfile.ZipFile(wheel_path) as zf:
            info = zf.getinfo("broken/c.so")
        start = info.header_offset + 30 + len(info.filename) + len(info.extra)
        data[start + 40 : start + 80] = bytes(40)
    wheel_path.write_bytes(bytes(data))
    with pytest.raises(UserError, match=re.escape(wheel_path.name)):
        inspect(tmp_path, wheel_path)


def test_invalid_wheel_filename_is_a_user_error(tmp_path: Path) -> None:
    path = tmp_path / "not-a-wheel.zip"
    path.write_bytes(b"")
    with pytest.raises(UserError, match=re.escape(path.name)):
        inspect(tmp_path, path)


def test_malformed_elf_member_is_a_user_error_naming_wheel_and_member(tmp_path: Path) -> None:
    files = {"bad/_x.so": b"\x7fELF" + b"\xff" * 60}
    wheel_path = make_wheel(tmp_path, "bad", "1.0", TAG, files)
    with pytest.raises(UserError, match=re.escape(f"{wheel_path.name}: bad/_x.so")):
        inspect(tmp_path, wheel_path)
