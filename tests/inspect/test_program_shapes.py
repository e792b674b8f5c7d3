"""The shapes issue 47's review found wrappers name their programs in (synthetic sources, each
modelled on a real wheel that tests/integration/test_cli_plan_programs.py plans): a default
parameter value stored on an object, a runner under an alias, a method returning the command, a
helper whose parameter is the program passed by keyword, candidates a helper loops over,
programs only Debian's alternatives provide, and curated entries true of a range of releases.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from support.plans import plan_for
from support.wheelfactory import make_wheel

from builder.inspect.programs import scan_source, scan_sources
from builder.plan.debian import (
    ProgramEntry,
    _program_entry,
    package_for_program,
    program_table,
)
from builder.resolve.target import ARCHES

PURE = "py3-none-any"


def found(sources: dict[str, bytes]) -> set[tuple[str, tuple[str, ...], bool]]:
    return {(s.path, s.names, s.optional) for s in scan_sources(sources, sources.__getitem__)}


def test_a_default_stored_on_the_object_run_through_an_alias_of_popen() -> None:
    """ffmpy's shape: `popen` is subprocess.Popen (or psutil's) bound at module level, the
    command starts with `executable`, a constructor parameter defaulting to ffmpeg."""
    source = b"""\
import subprocess
try:
    from psutil import Popen
except ImportError:
    popen = subprocess.Popen
else:
    popen = Popen
class FFmpeg:
    def __init__(self, executable="ffmpeg", inputs=None):
        self.executable = executable
        self._cmd = [executable]
        self._cmd += list(inputs or ())
    def run(self):
        self.process = popen(self._cmd, stdout=subprocess.PIPE)
"""
    assert [s.names for s in scan_source("ff/ffmpy.py", source)] == [("ffmpeg",)]
    unrelated = source.replace(b"popen = subprocess.Popen", b"popen = print")
    unrelated = unrelated.replace(b"import subprocess", b"import subprocess as _")
    assert scan_source("ff/ffmpy.py", unrelated) == []  # an alias of no runner runs nothing


def test_a_method_returning_a_command_that_starts_with_an_attribute() -> None:
    """python-gnupg's shape: `cmd = self.make_args(args)`, whose list starts with
    `self.gpgbinary`, set from `gpgbinary='gpg'` in __init__."""
    source = b"""\
from subprocess import Popen
class GPG:
    def __init__(self, gpgbinary='gpg', options=None):
        self.gpgbinary = gpgbinary
        self.options = options
    def make_args(self, args, passphrase):
        cmd = [self.gpgbinary, '--status-fd', '2']
        if passphrase:
            cmd.extend(['--passphrase-fd', '0'])
        cmd.extend(args)
        return cmd
    def _open_subprocess(self, args, passphrase=False):
        cmd = self.make_args(args, passphrase)
        return Popen(cmd, shell=False)
"""
    assert [s.names for s in scan_source("gnupg.py", source)] == [("gpg",)]


def test_a_helper_whose_parameter_is_the_program_called_by_keyword() -> None:
    """`def call(program, args): cmd = [program, *args]; run(cmd)`, called from another
    module as `call(program="pandoc")` and positionally in its own."""
    sources = {
        "tool/util.py": b"""\
import subprocess
def call(program, args=(), check=True):
    cmd = [program, *args]
    return subprocess.run(cmd, check=check)
def version():
    return call("gs", ["--version"])
""",
        "tool/convert.py": b"""\
from .util import call
def to_html(path):
    return call(program="pandoc", args=["-t", "html", path])
def unrelated(path):
    return call(check=False)
""",
    }
    assert found(sources) == {
        ("tool/util.py", ("gs",), False),
        ("tool/convert.py", ("pandoc",), False),
    }


def test_candidates_a_helper_loops_over() -> None:
    """audioread's shape (`popen_multiple(COMMANDS, args)`, each tried in turn: one need with
    alternatives) and choreographer's (a `which` loop over names passed by keyword: a probe)."""
    source = b"""\
import shutil, subprocess
COMMANDS = ('ffmpeg', 'avconv')
def popen_multiple(commands, command_args, **kwargs):
    for i, command in enumerate(commands):
        cmd = [command] + command_args
        try:
            return subprocess.Popen(cmd, **kwargs)
        except OSError:
            if i == len(commands) - 1:
                raise
def browser_which(executable_names, *, ms_prog_id=None):
    for exe in executable_names:
        path = shutil.which(exe)
        if path:
            return path
def open_audio(path):
    return popen_multiple(COMMANDS, ['-i', path])
def find():
    return browser_which(executable_names=["chromium", "chromium-browser"])
"""
    assert {(s.names, s.optional) for s in scan_source("au/ffdec.py", source)} == {
        (("ffmpeg", "avconv"), False),
        (("chromium", "chromium-browser"), True),
    }


def test_values_a_helper_answers_itself_are_no_programs() -> None:
    """sympy's shape: preview(viewer=...) writes a buffer for "BytesIO" and runs any other
    viewer; pydot's: call_graphviz(program=prog) runs what it is given, "dot" by default."""
    source = b"""\
import shutil, subprocess
def preview(expr, viewer=None):
    if viewer == "file":
        pass
    elif viewer == "BytesIO":
        pass
    elif not shutil.which(viewer):
        raise OSError(viewer)
    if viewer == "file":
        return expr
    elif viewer == "BytesIO":
        return expr
    else:
        subprocess.run([viewer, expr])
def show(expr):
    preview(expr, viewer="BytesIO")
    preview(expr, viewer="evince")
def call_graphviz(program, arguments):
    if program == "dot":
        arguments = ["-q", *arguments]
    program_with_args = [program] + arguments
    return subprocess.Popen(program_with_args)
def create(prog="dot"):
    return call_graphviz(program=prog, arguments=["-Tpng"])
"""
    assert {(s.names, s.optional) for s in scan_source("sym/preview.py", source)} == {
        (("evince",), True),
        (("evince",), False),
        (("dot",), False),
    }


@pytest.mark.parametrize("arch", sorted(ARCHES))
def test_programs_only_alternatives_provide(arch: str) -> None:
    """Debian links /usr/bin/java (nc, cc, magick...) through update-alternatives: no package
    has a file by that name, so the Contents-made index alone cannot map it."""
    table = program_table()
    assert {"java", "javac", "nc", "cc"} <= set(table.alternatives)
    for name, alternative in table.alternatives.items():
        assert alternative.reason and package_for_program(name, ARCHES[arch]) == alternative.package
    assert package_for_program("java", ARCHES[arch]) == "default-jre-headless"
    assert package_for_program("gcc", ARCHES[arch]) == "gcc"  # the index first


def test_a_java_wrapper_gets_the_default_jre(tmp_path: Path) -> None:
    """tabula-py's shape: `["java", *options, "-jar", jar]` from one module of a few."""
    files = {
        "tab/backend.py": b"import subprocess\ndef run(options, jar):\n"
        b"    args = ['java'] + options + ['-jar', jar]\n    return subprocess.run(args)\n",
        "tab/io.py": b"x = 1\n",
        "tab/util.py": b"y = 2\n",
    }
    plan = plan_for(tmp_path, [make_wheel(tmp_path, "tab", "1.0", PURE, files)])
    assert plan.apt_packages == ("default-jre-headless",)
    (need,) = plan.programs
    assert (need.program, need.optional) == ("java", False)


@pytest.mark.parametrize(
    ("version", "apt", "why"),
    [("0.2.1", (), "curated: kaleido 0.x"), ("1.0.0", ("chromium",), "curated: kaleido 1.x")],
)
def test_a_curated_entry_holds_for_its_releases_only(
    tmp_path: Path, version: str, apt: tuple[str, ...], why: str
) -> None:
    """kaleido 0.x ships its own Chromium; 1.x drives the system's: each release gets the
    entry whose `versions` cover it."""
    files = {"kaleido/__init__.py": b"import subprocess\nsubprocess.run(['unzip', 'x.zip'])\n"}
    plan = plan_for(tmp_path, [make_wheel(tmp_path, "kaleido", version, PURE, files)])
    assert plan.apt_packages == apt
    assert all(need.why.startswith(why) for need in plan.programs), plan.programs


def test_a_release_no_entry_covers_is_decided_by_its_code() -> None:
    entry = ProgramEntry("x", ("dot",), False, "since 2", None, SpecifierSet(">=2"))
    assert entry.covers("2.1") and entry.covers("3.0rc1")
    assert not entry.covers("1.9") and not entry.covers("not-a-version")
    assert ProgramEntry("x", None, True, "always", None).covers("not-a-version")
    assert program_table().entry("kaleido", "1.5.1") is not None
    assert program_table().entry("pdfkit", "0.6.1") is not None  # no range: every release
    assert program_table().entry("no-such-distribution", "1.0") is None


def test_a_curated_range_that_is_no_specifier_is_refused() -> None:
    with pytest.raises(ValueError, match=r"programs.toml \[kaleido\]: bad versions 'one'"):
        _program_entry("kaleido", {"versions": "one", "optional": True, "reason": "x"})
    with pytest.raises(ValueError, match="decides without a reason"):
        _program_entry("kaleido", {"versions": ">=1", "required": ["chromium"]})
