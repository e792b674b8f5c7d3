"""Issue 55's shapes, one step further than issue 47's (synthetic sources, each modelled on a real
wheel tests/integration/test_popular_needs.py plans): a literal command bound in the same
function and run by a runner imported by name (openai-whisper), a parameter's or an
attribute's default reaching the command (python-ffmpeg: a property returning
`[self._executable, ...]`, run through a helper that hands `*args` to Popen), a class
attribute used through `self`; and what must stay no need (a side feature's run)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.plans import plan_for
from support.wheelfactory import make_wheel

from builder.inspect.programs import scan_source, scan_sources

PURE = "py3-none-any"


def names(sources: dict[str, bytes]) -> list[tuple[str, tuple[str, ...], bool]]:
    return [(s.path, s.names, s.optional) for s in scan_sources(sources, sources.__getitem__)]


@pytest.mark.parametrize(
    ("imports", "call"),
    [
        ("from subprocess import CalledProcessError, run", "run(cmd, capture_output=True)"),
        ("import subprocess", "subprocess.run(cmd)"),
        ("from subprocess import Popen", "Popen(cmd)"),
        ("import subprocess as sp", "sp.check_output(cmd)"),
    ],
)
def test_a_literal_command_bound_in_the_function(imports: str, call: str) -> None:
    """openai-whisper's load_audio: `cmd = ["ffmpeg", "-nostdin", ...]`, then `run(cmd)`."""
    source = f"""\
{imports}
def load_audio(file, sr=16000):
    cmd = ["ffmpeg", "-nostdin", "-threads", "0", "-i", file, "-f", "s16le", "-"]
    return {call}
""".encode()
    assert [s.names for s in scan_source("whisper/audio.py", source)] == [("ffmpeg",)]


def test_a_parameters_default_at_the_commands_head() -> None:
    source = b"""\
import subprocess
def convert(path, executable: str = "ffmpeg"):
    subprocess.run([executable, "-i", path])
"""
    assert [s.names for s in scan_source("pkg/conv.py", source)] == [("ffmpeg",)]


PYTHON_FFMPEG = {
    "ffmpeg/utils.py": b"""\
import subprocess, sys
def create_subprocess(*args, **kwargs) -> subprocess.Popen:
    if sys.platform == "win32":
        kwargs["creationflags"] = subprocess.CREATE_NEW_PROCESS_GROUP
    return subprocess.Popen(*args, **kwargs)
""",
    "ffmpeg/asyncio/utils.py": b"""\
import asyncio
def create_subprocess(*args, **kwargs):
    return asyncio.create_subprocess_exec(*args, **kwargs)
""",
    "ffmpeg/ffmpeg.py": b"""\
import subprocess
from ffmpeg.utils import create_subprocess
class FFmpeg:
    def __init__(self, executable: str = "ffmpeg"):
        self._executable: str = executable
    @property
    def arguments(self) -> list[str]:
        return [self._executable, *self._options.build()]
    def execute(self):
        self._process = create_subprocess(self.arguments, bufsize=0, stdout=subprocess.PIPE)
""",
    "ffmpeg/asyncio/ffmpeg.py": b"""\
import subprocess
from ffmpeg.asyncio.utils import create_subprocess
class FFmpeg:
    def __init__(self, executable: str = "ffmpeg"):
        self._executable: str = executable
    @property
    def arguments(self) -> list[str]:
        return [self._executable, *self._options.build()]
    async def execute(self):
        self._process = await create_subprocess(*self.arguments, stdout=subprocess.PIPE)
""",
}


def test_a_property_returning_the_command_through_a_helper_of_varargs() -> None:
    """python-ffmpeg: `create_subprocess(self.arguments)` hands its `*args` to Popen (so its
    first argument is the command); the asyncio twin spreads the list, `*self.arguments`, into
    create_subprocess_exec (so the list's first element is the program)."""
    found = names(PYTHON_FFMPEG)
    assert ("ffmpeg/ffmpeg.py", ("ffmpeg",), False) in found
    assert ("ffmpeg/asyncio/ffmpeg.py", ("ffmpeg",), False) in found
    assert len(found) == 2


def test_a_command_spread_where_the_program_is_expected() -> None:
    """`create_subprocess_exec(*cmd)`: the list's first element is the program; a spread where
    the whole command is expected (`Popen(*cmd)`) says nothing known."""
    source = b"""\
import asyncio, subprocess
async def transcode(path):
    cmd = ["ffmpeg", "-i", path]
    return await asyncio.create_subprocess_exec(*cmd)
def odd(cmd):
    return subprocess.Popen(*cmd)
"""
    assert [s.names for s in scan_source("pkg/aio.py", source)] == [("ffmpeg",)]


def test_a_method_that_is_no_property_is_not_read_as_a_value() -> None:
    """`self.arguments` without @property is a bound method: no command."""
    sources = dict(PYTHON_FFMPEG)
    sources["ffmpeg/ffmpeg.py"] = sources["ffmpeg/ffmpeg.py"].replace(b"    @property\n", b"")
    assert [path for path, _, _ in names(sources)] == ["ffmpeg/asyncio/ffmpeg.py"]


def test_a_class_attribute_used_through_self() -> None:
    source = b"""\
import subprocess
class Converter:
    binary = "ffmpeg"
    def convert(self, path):
        return subprocess.check_output([self.binary, "-i", path])
"""
    assert [s.names for s in scan_source("pkg/conv.py", source)] == [("ffmpeg",)]


def test_an_attribute_set_from_a_constructors_default() -> None:
    source = b"""\
import subprocess
class Transcoder:
    def __init__(self, executable="ffmpeg"):
        self.executable = executable
    def run(self, path):
        cmd = [self.executable, "-i", path]
        return subprocess.run(cmd, check=True)
"""
    assert [s.names for s in scan_source("pkg/tc.py", source)] == [("ffmpeg",)]


def test_varargs_handed_on_whole_are_not_read_past_the_helper() -> None:
    """A helper handing `*args` to Popen, called with nothing literal: no program, no error."""
    source = b"""\
import subprocess
def spawn(*args, **kwargs):
    return subprocess.Popen(*args, **kwargs)
def go(command):
    return spawn(command)
"""
    assert scan_source("pkg/spawn.py", source) == []


OCRMYPDF = {
    "ocrmypdf/_exec/ghostscript.py": b"import subprocess\n"
    b"def rasterize(args):\n    return subprocess.run(['gs', *args])\n",
    "ocrmypdf/_exec/tesseract.py": b"import subprocess\n"
    b"def ocr(args):\n    return subprocess.run(['tesseract', *args])\n",
    "ocrmypdf/_exec/pngquant.py": b"import subprocess\n"
    b"def quantize(args):\n    return subprocess.run(['pngquant', *args])\n",
}


@pytest.mark.parametrize(
    ("version", "apt", "optional"),
    [
        ("16.13.0", ("ghostscript", "tesseract-ocr"), ("pngquant",)),
        ("17.0.0", ("tesseract-ocr",), ("ghostscript", "pngquant")),
    ],
)
def test_a_plugin_the_default_configuration_runs_is_required(
    tmp_path: Path, version: str, apt: tuple[str, ...], optional: tuple[str, ...]
) -> None:
    """ocrmypdf 16.x makes PDF/A, its default output, with Ghostscript (its curated entry);
    17.x writes PDF/A itself and uses Ghostscript only when it is there."""
    plan = plan_for(tmp_path, [make_wheel(tmp_path, "ocrmypdf", version, PURE, OCRMYPDF)])
    assert (plan.apt_packages, plan.optional_packages) == (apt, optional)


def test_whispers_one_module_running_ffmpeg_is_its_job(tmp_path: Path) -> None:
    """openai-whisper runs ffmpeg from one module of fourteen, under the share that makes a
    wrapper: its curated entry says transcribing a file needs it."""
    files = {f"whisper/m{i}.py": b"x = 1\n" for i in range(13)}
    files["whisper/audio.py"] = (
        b"from subprocess import run\n"
        b"def load_audio(file):\n    cmd = ['ffmpeg', '-nostdin', '-i', file]\n"
        b"    return run(cmd)\n"
    )
    plan = plan_for(tmp_path, [make_wheel(tmp_path, "openai-whisper", "20250625", PURE, files)])
    assert plan.apt_packages == ("ffmpeg",)
    (need,) = plan.programs
    assert not need.optional and need.why.startswith("curated: transcribe()")
    files["whisper/audio.py"] = files["whisper/audio.py"].replace(b"ffmpeg", b"sox")
    other = plan_for(tmp_path / "other", [make_wheel(tmp_path, "whisperish", "1", PURE, files)])
    assert other.apt_packages == () and other.optional_packages == ("sox",)  # the share alone
