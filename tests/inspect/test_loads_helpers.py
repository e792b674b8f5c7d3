"""Loader helpers called from another module of the same wheel, and loads the code can do without.

Modelled on cairocffi: `__init__.py` defines `dlopen(ffi, library_names, filenames)`, and
`pixbuf.py` (which mentions no loader word but the helper's name) calls it after
`from . import dlopen`; an optional library is loaded in `try: … except OSError: x = None`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from support.plans import plan_for
from support.wheelfactory import make_wheel

from builder.cache import Cache
from builder.files import sha256_of
from builder.inspect.loads import LoadSite, scan_sources
from builder.inspect.wheel_reader import inspect_wheel

PURE = "py3-none-any"
INIT = b"""\
from ctypes.util import find_library


def dlopen(ffi, library_names, filenames):
    for library_name in library_names:
        found = find_library(library_name)
        if found:
            filenames = (found, *filenames)
    for filename in filenames:
        try:
            return ffi.dlopen(filename)
        except OSError:
            pass
    raise OSError("not found")
"""
PIXBUF = b"""\
from . import dlopen as load
from .ffi import ffi_pixbuf as ffi

pixbuf = load(ffi, ("gdk_pixbuf-2.0",), ("libgdk_pixbuf-2.0.so.0", "libgdk_pixbuf-2.0.dylib"))
try:
    gdk = load(ffi, ("gdk-3",), ("libgdk-3.so.0",))
except OSError:
    gdk = None
"""
ATTRIBUTE = b"""\
import drawlib
from drawlib import _native as native

cairo = drawlib.dlopen(None, ("cairo",), ())
other = native.open_library("libzbar.so.0")
"""
NATIVE = b"""\
import ctypes


def open_library(name):
    return ctypes.CDLL(name)
"""


def read_from(files: dict[str, bytes]) -> Callable[[str], bytes]:
    return lambda path: files[path]


def test_helper_imported_from_the_package_is_followed_to_its_callers() -> None:
    files = {"drawlib/__init__.py": INIT, "drawlib/pixbuf.py": PIXBUF}
    found = scan_sources(list(files), read_from(files))
    pixbuf = [site for site in found if site.path == "drawlib/pixbuf.py"]
    assert pixbuf == [
        LoadSite("drawlib/pixbuf.py", 4, ("gdk_pixbuf-2.0",)),
        LoadSite("drawlib/pixbuf.py", 4, ("libgdk_pixbuf-2.0.so.0", "libgdk_pixbuf-2.0.dylib")),
        LoadSite("drawlib/pixbuf.py", 6, ("gdk-3",), optional=True),
        LoadSite("drawlib/pixbuf.py", 6, ("libgdk-3.so.0",), optional=True),
    ]


def test_module_attribute_calls_and_files_without_loader_words() -> None:
    files = {
        "drawlib/__init__.py": INIT,
        "drawlib/_native.py": NATIVE,
        "drawlib/use.py": ATTRIBUTE,  # no "ctypes"/"dlopen": parsed because it names a helper
        "drawlib/unrelated.py": b"import os\n",
    }
    found = {(s.path, s.line, s.names) for s in scan_sources(list(files), read_from(files))}
    assert ("drawlib/use.py", 4, ("cairo",)) in found
    assert ("drawlib/use.py", 5, ("libzbar.so.0",)) in found
    assert all(path != "drawlib/unrelated.py" for path, _, _ in found)


def test_helpers_in_another_wheel_or_a_local_namesake_are_not_followed() -> None:
    caller = b"from otherdist import dlopen\nlib = dlopen(None, ('cairo',), ('libcairo.so.2',))\n"
    files = {"mine/__init__.py": INIT, "mine/use.py": caller}
    assert [s.path for s in scan_sources(list(files), read_from(files))] == []


def test_candidate_loop_is_required_and_guarded_load_optional() -> None:
    source = b"""\
import ctypes
for name in ("libfoo.so.2", "libfoo.so.1"):
    try:
        foo = ctypes.CDLL(name)
        break
    except OSError:
        pass
try:
    bar = ctypes.CDLL("libbar.so.1")
except (ImportError, OSError):
    bar = None
try:
    baz = ctypes.CDLL("libbaz.so.1")
except OSError as exc:
    raise ImportError("baz is required") from exc
"""
    files = {"pkg/native.py": source}
    found = {site.names: site.optional for site in scan_sources(list(files), read_from(files))}
    assert found == {
        ("libfoo.so.2", "libfoo.so.1"): False,
        ("libbar.so.1",): True,
        ("libbaz.so.1",): False,
    }


def test_wheel_plan_marks_guarded_loads_optional(tmp_path: Path) -> None:
    files = {"drawlib/__init__.py": INIT, "drawlib/pixbuf.py": PIXBUF}
    wheel = make_wheel(tmp_path, "drawlib", "1.0", PURE, files)
    inspection = inspect_wheel(wheel, sha256_of(wheel), Cache(tmp_path / "cache"))
    assert {site.line for site in inspection.loads if site.path == "drawlib/pixbuf.py"} == {4, 6}
    plan = plan_for(tmp_path, [wheel])
    assert "libgdk-pixbuf-2.0-0" in plan.apt_packages
    assert "libgtk-3-0t64" in plan.optional_packages
    assert "libgtk-3-0t64" not in plan.apt_packages
    (gdk,) = [lib for lib in plan.libraries if lib.package == "libgtk-3-0t64"]
    assert gdk.optional and gdk.needed_by == ("drawlib==1.0: drawlib/pixbuf.py:6",)
