"""Run-time library loads read from Python sources: each idiom with file:line, mapped to Debian."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from support.plans import AMD64, plan_for
from support.wheelfactory import make_wheel

from builder.cache import Cache
from builder.files import sha256_of
from builder.inspect.loads import LoadSite, scan_source, worth_reading
from builder.inspect.wheel_reader import inspect_wheel

PURE = "py3-none-any"


def sites(source: str, path: str = "pkg/mod.py") -> list[LoadSite]:
    return scan_source(path, textwrap.dedent(source).encode())


@pytest.mark.parametrize(
    ("source", "line", "names"),
    [
        ('import ctypes\nlib = ctypes.CDLL("libzbar.so.0")\n', 2, ("libzbar.so.0",)),
        ('from ctypes import cdll\n\nlib = cdll.LoadLibrary("libmagic.so.1")\n', 3,
         ("libmagic.so.1",)),
        ('import ctypes\nlib = ctypes.PyDLL("libpq.so.5")\n', 2, ("libpq.so.5",)),
        ('import ctypes.util\nname = ctypes.util.find_library("pq")\n', 2, ("pq",)),
        ('from ctypes.util import find_library\nx = 1\nfind_library("archive")\n', 3,
         ("archive",)),
        ('import cffi\nffi = cffi.FFI()\nlib = ffi.dlopen("libcairo.so.2")\n', 3,
         ("libcairo.so.2",)),
    ],
)  # fmt: skip
def test_each_loading_call_is_found_with_its_line(source: str, line: int, names: tuple) -> None:
    assert sites(source) == [LoadSite("pkg/mod.py", line, names)]


def test_module_constant() -> None:
    found = sites("""
        import ctypes
        LIBNAME = "libdmtx.so.0"

        def load():
            return ctypes.CDLL(LIBNAME)
    """)
    assert found == [LoadSite("pkg/mod.py", 6, ("libdmtx.so.0",))]


def test_helper_function_returning_the_name() -> None:
    found = sites("""
        import sys
        from cffi import FFI

        def library_name(name, abi, prefix="lib"):
            if sys.platform == "win32":
                return f"{prefix}{name}-{abi}.dll"
            return f"{prefix}{name}.so.{abi}"

        ffi = FFI()
        vips = ffi.dlopen(library_name("vips", 42))
    """)
    assert found == [LoadSite("pkg/mod.py", 11, ("libvips-42.dll", "libvips.so.42"))]


def test_candidates_tried_in_a_loop() -> None:
    found = sites("""
        import ctypes
        CANDIDATES = ("libfoo.so.2", "libfoo.so.1")
        for candidate in CANDIDATES:
            try:
                lib = ctypes.cdll.LoadLibrary(candidate)
                break
            except OSError:
                pass
    """)
    assert found == [LoadSite("pkg/mod.py", 6, ("libfoo.so.2", "libfoo.so.1"))]


def test_helper_taking_candidate_names_reports_its_callers() -> None:
    found = sites("""
        def _dlopen(ffi, *names):
            for name in names:
                try:
                    return ffi.dlopen(name)
                except OSError:
                    pass

        gobject = _dlopen(ffi, "gobject-2.0", "libgobject-2.0.so.0")
        pango = _dlopen(ffi, "pango-1.0")
    """)
    assert found == [
        LoadSite("pkg/mod.py", 9, ("gobject-2.0", "libgobject-2.0.so.0")),
        LoadSite("pkg/mod.py", 10, ("pango-1.0",)),
    ]


def test_computed_paths_and_windows_loaders_are_not_needs() -> None:
    assert not sites("""
        import ctypes, os
        here = os.path.dirname(__file__)
        lib = ctypes.CDLL(os.path.join(here, "lib_lightgbm.so"))
        kernel = ctypes.windll.kernel32
        other = ctypes.WinDLL("user32.dll")
        self_ = ctypes.CDLL(None)
    """)


def test_only_candidate_files_are_read() -> None:
    assert worth_reading("pkg/loader.py")
    assert not worth_reading("pkg/tests/test_loader.py")
    assert not worth_reading("pkg/data.json")
    # sources shipped as data: no import reaches them
    assert not worth_reading("pkg/third-party/template.py")
    assert not worth_reading("pkg/examples-1.0/run.py")
    assert not worth_reading("pkg/1.0.py")
    assert worth_reading("pkg/_vendor/six.py")
    assert scan_source("pkg/x.py", b"import os\nprint(1)\n") == []
    assert scan_source("pkg/x.py", b"ctypes = (\n") == []  # unparsable: nothing, no crash


def test_wheel_inspection_records_load_sites(tmp_path: Path) -> None:
    source = b'import ctypes.util\nLIB = ctypes.util.find_library("pq")\n'
    wheel = make_wheel(tmp_path, "pqclient", "1.0", PURE, {"pqclient/__init__.py": source})
    inspection = inspect_wheel(wheel, sha256_of(wheel), Cache(tmp_path / "cache"))
    assert inspection.loads == (LoadSite("pqclient/__init__.py", 2, ("pq",)),)


def test_find_library_maps_to_the_debian_package_with_file_and_line(tmp_path: Path) -> None:
    source = (
        b"import ctypes.util, sys\n"
        b"if sys.platform == 'win32':\n"
        b"    name = ctypes.util.find_library('libpq.dll')\n"
        b"else:\n"
        b"    name = ctypes.util.find_library('pq')\n"
        b"libc = ctypes.util.find_library('c')\n"
    )
    wheel = make_wheel(tmp_path, "pqclient", "1.0", PURE, {"pqclient/pq.py": source})
    plan = plan_for(tmp_path, [wheel])
    assert plan.apt_packages == ("libpq5",)  # libc comes with the base; the .dll is Windows'
    (library,) = plan.libraries
    assert (library.soname, library.how) == ("libpq.so.5", "loaded at run time")
    assert library.needed_by == ("pqclient==1.0: pqclient/pq.py:5",)
    assert plan.warnings == ()


def test_first_candidate_debian_ships_is_the_need(tmp_path: Path) -> None:
    source = b"import cffi\nffi = cffi.FFI()\nlib = ffi.dlopen('cairo-2') or ffi.dlopen('cairo')\n"
    source += b"for n in ('libzzq-1', 'gobject-2.0'):\n    ffi.dlopen(n)\n"
    wheel = make_wheel(tmp_path, "drawer", "1.0", PURE, {"drawer/ffi.py": source})
    plan = plan_for(tmp_path, [wheel])
    assert plan.apt_packages == ("libcairo2", "libglib2.0-0t64")
    assert plan.warnings == ("warning: drawer==1.0: drawer/ffi.py:3 loads cairo-2 at run time;"
                             " no Debian 13 package provides it for amd64",)  # fmt: skip


def test_unmapped_name_is_a_warning_naming_file_and_line(tmp_path: Path) -> None:
    source = b"import ctypes\n\n\nlib = ctypes.CDLL('libzzqnothing.so.7')\n"
    wheel = make_wheel(tmp_path, "odd", "2.0", PURE, {"odd/native.py": source})
    plan = plan_for(tmp_path, [wheel])
    assert plan.apt_packages == ()
    assert plan.warnings == (
        "warning: odd==2.0: odd/native.py:4 loads libzzqnothing.so.7 at run time;"
        " no Debian 13 package provides it for amd64",
    )
    assert AMD64.name == "amd64"
