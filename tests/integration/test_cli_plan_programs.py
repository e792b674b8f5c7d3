"""Plan-only (--no-build) against the real package index: wrappers of one program get its
Debian package on amd64 and arm64, whatever shape their code names it in; nothing else gains
one (tabulate, the popular data set).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("package_index")

ARCHES = ("amd64", "arm64")
WRAPPERS = {  # distribution -> (a program it runs, the package installed for it)
    "pdf2image": ("pdftoppm", "poppler-utils"),
    "pytesseract": ("tesseract", "tesseract-ocr"),
    "pydub": ("ffmpeg", "ffmpeg"),
    "graphviz": ("dot", "graphviz"),
    "ffmpeg-python": ("ffprobe", "ffmpeg"),  # picked here: one-program wrappers
    "pypandoc": ("pandoc", "pandoc"),
}
POPULAR = (
    "matplotlib", "sympy", "pandas", "scikit-learn", "lightgbm", "requests", "beautifulsoup4",
    "openpyxl", "imageio", "networkx", "plotly", "seaborn", "statsmodels", "nltk", "pillow",
    # issue 47's: what a data-science sandbox is asked for beside them (helpers run through
    # parameters and candidates are read now, so more of their code is followed)
    "scipy", "pyarrow", "opencv-python-headless", "tqdm", "jinja2", "sqlalchemy", "lxml",
    "pyyaml", "xlsxwriter", "reportlab", "python-docx", "pypdf", "scikit-image", "ipython",
    "jupyter-core", "nbconvert", "librosa", "click", "bokeh", "altair", "numba", "tldextract",
)  # fmt: skip
# The native libraries the popular set loads (numba's OpenMP and TBB layers): no program's.
POPULAR_LIBRARIES = {"libgomp1", "libtbb12"}
# issue 47's shapes, one real wheel each: the program as a default stored on the object
# (ffmpy's FFmpeg(executable="ffmpeg"), python-gnupg's GPG(gpgbinary="gpg") through a method
# returning the command), a helper's parameter passed by keyword (pydot's
# call_graphviz(program=prog)), a program only Debian's alternatives provide (tabula-py's
# java), a browser a dependency locates by candidate names (kaleido 1.x through choreographer).
SHAPES = {  # distribution -> (the program, its package, where it is read or "curated")
    "ffmpy": ("ffmpeg", "ffmpeg", "ffmpy/ffmpy.py:"),
    "python-gnupg": ("gpg", "gpg", "gnupg.py:"),
    "pydot": ("dot", "graphviz", "pydot/core.py:"),
    "tabula-py": ("java", "default-jre-headless", "tabula/backend.py:"),
    "kaleido": ("chromium", "chromium", "curated"),
    "choreographer": ("chromium", "chromium", "curated"),
}


def plan(tmp: Path, cache: Path, requirements: list[str], *args: str) -> tuple[str, dict]:
    req = tmp / "requirements.txt"
    req.write_text("".join(f"{name}\n" for name in requirements))
    out = tmp / "context"
    result = subprocess.run(
        [sys.executable, "-m", "builder", "-r", str(req), "--output", str(out),
         "--cache-dir", str(cache), "--no-build", *(a for arch in ARCHES for a in ("--arch", arch)),
         *args],
        capture_output=True,
        text=True,
        cwd=tmp,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout + result.stderr, json.loads((out / "report.json").read_text())


@pytest.fixture(scope="module")
def wrappers(shared_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    """One plan of every wrapper and tabulate, on both arches."""
    return plan(tmp_path_factory.mktemp("wrappers"), shared_cache, [*WRAPPERS, "tabulate"])


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("distribution", sorted(WRAPPERS))
def test_a_wrapper_gets_its_programs_package(
    wrappers: tuple[str, dict], distribution: str, arch: str
) -> None:
    stdout, report = wrappers
    program, package = WRAPPERS[distribution]
    record = report["architectures"][arch]
    assert package in record["apt_packages"]
    runs = [
        need
        for need in record["programs"]
        if need["program"] == program
        and any(d.startswith(f"{distribution}==") for d in need["distributions"])
    ]
    assert runs and runs[0]["package"] == package and not runs[0]["optional"], record["programs"]
    assert f"runs {program} -> {package}" in stdout


def test_tabulate_gains_nothing(wrappers: tuple[str, dict]) -> None:
    stdout, report = wrappers
    for arch in ARCHES:
        record = report["architectures"][arch]
        assert not [
            n
            for n in record["programs"]
            if any(d.startswith("tabulate==") for d in n["distributions"])
        ]
        assert record["apt_installed_size"] > 500_000_000  # ffmpeg's libraries, mostly
        assert set(record["apt_packages"]) == {
            "ffmpeg",
            "graphviz",
            "pandoc",
            "poppler-utils",
            "tesseract-ocr",
        }
    assert "ffmpeg graphviz pandoc poppler-utils tesseract-ocr (with their dependencies: " in stdout
    tabulate = next(line for line in stdout.splitlines() if line.strip().startswith("tabulate "))
    assert tabulate.rstrip().endswith(" -")


def test_a_program_left_out_is_not_installed_and_warned(shared_cache: Path, tmp_path: Path) -> None:
    stdout, report = plan(tmp_path, shared_cache, ["pydub"], "--without-program", "ffmpeg")
    for arch in ARCHES:
        record = report["architectures"][arch]
        assert record["apt_packages"] == []
        ffmpeg = next(n for n in record["programs"] if n["program"] == "ffmpeg")
        assert ffmpeg["left_out"] is True and ffmpeg["optional"] is False
    assert "runs ffmpeg -> ffmpeg (left out)" in stdout
    assert "warning: ffmpeg (ffmpeg) left out by without-programs: pydub==" in stdout


def test_the_popular_set_gains_no_program(shared_cache: Path, tmp_path: Path) -> None:
    """The no-false-needs guard: every program the popular set runs is a side feature."""
    stdout, report = plan(tmp_path, shared_cache, POPULAR)
    for arch in ARCHES:
        record = report["architectures"][arch]
        assert set(record["apt_packages"]) <= POPULAR_LIBRARIES, record["programs"]
        assert "libgomp1" in record["apt_packages"]
        assert [n for n in record["programs"] if not n["optional"]] == []
        readers = {d.partition("==")[0] for n in record["programs"] for d in n["distributions"]}
        assert {"matplotlib", "ipython", "nbconvert", "sympy"} <= readers  # read, and optional
        assert {"texlive-latex-base", "dvipng", "pandoc"} <= set(record["optional_apt_packages"])
    assert "runs " not in stdout


def test_the_shapes_wrappers_name_their_programs_in(shared_cache: Path, tmp_path: Path) -> None:
    stdout, report = plan(tmp_path, shared_cache, ["ffmpy", "python-gnupg", "pydot", "tabula-py",
                                                   "kaleido>=1"])  # fmt: skip
    for arch in ARCHES:
        record = report["architectures"][arch]
        assert set(record["apt_packages"]) == {p for _, p, _ in SHAPES.values()}, record["programs"]
        needs = {n["program"]: n for n in record["programs"]}
        for distribution, (program, package, where) in SHAPES.items():
            need = needs[program]
            assert need["package"] == package and not need["optional"], need
            sites = [
                x.partition(": ")[2] for x in need["needed_by"] if x.startswith(f"{distribution}==")
            ]
            assert any(site.startswith(where) for site in sites), need["needed_by"]
    assert "runs java -> default-jre-headless" in stdout and "runs gpg -> gpg" in stdout


def test_a_need_is_decided_for_the_release_resolved(shared_cache: Path, tmp_path: Path) -> None:
    """kaleido 0.2.1 runs the Chromium its wheel ships (1.x needs one: the test above);
    audioread tries ffmpeg then avconv, read as one need, optional by its curated entry."""
    stdout, report = plan(tmp_path, shared_cache, ["kaleido==0.2.1", "audioread"])
    for arch in ARCHES:
        record = report["architectures"][arch]
        assert record["apt_packages"] == [], record["programs"]
        assert "chromium" not in {n["program"] for n in record["programs"]}
        (ffmpeg,) = [n for n in record["programs"] if n["program"] == "ffmpeg"]
        assert ffmpeg["optional"] and ffmpeg["why"].startswith("curated: it decodes")
        assert all(x.startswith("audioread==") for x in ffmpeg["needed_by"])
        assert any("audioread/ffdec.py:" in x for x in ffmpeg["needed_by"])
        assert "ffmpeg" in record["optional_apt_packages"]
    assert "runs " not in stdout


def test_a_reviewers_picks(shared_cache: Path, tmp_path: Path) -> None:
    """gitpython and ocrmypdf get git and tesseract-ocr by their curated entries; psutil's AIX
    lsdev and pycparser's (cffi's) cpp stay optional though each is its package's only run;
    statsmodels' flag passed to a helper is no program."""
    picks = ["gitpython", "ocrmypdf", "psutil", "cffi", "statsmodels"]
    stdout, report = plan(tmp_path, shared_cache, picks)
    for arch in ARCHES:
        record = report["architectures"][arch]
        assert set(record["apt_packages"]) >= {"git", "tesseract-ocr"}, record["programs"]
        assert not {"procinfo", "cpp", "ghostscript"} & set(record["apt_packages"])
        assert {"procinfo", "cpp"} <= set(record["optional_apt_packages"])
        assert not [n for n in record["programs"] if not n["program"][0].isalpha()]
        assert "False" not in {n["program"] for n in record["programs"]}
    assert "runs git -> git" in stdout and "runs tesseract -> tesseract-ocr" in stdout


def test_textract_s_parsers_run_their_programs_through_a_shared_method(
    shared_cache: Path, tmp_path: Path
) -> None:
    """Each textract parser runs its program through `self.run` (ShellParser.run): reading
    follows the method, and the curated entry installs the PDF and .doc programs."""
    stdout, report = plan(tmp_path, shared_cache, ["textract"])
    for arch in ARCHES:
        record = report["architectures"][arch]
        assert set(record["apt_packages"]) == {"antiword", "poppler-utils"}, record["programs"]
        assert {"sox", "tesseract-ocr", "unrtf"} <= set(record["optional_apt_packages"])
        sites = {n["program"]: n for n in record["programs"]}
        assert any("textract/parsers/doc_parser.py:" in w for w in sites["antiword"]["needed_by"])
    assert "runs antiword -> antiword, runs pdftotext -> poppler-utils" in stdout


def refused(tmp: Path, cache: Path, requirement: str, *args: str) -> str:
    """The one `error:` line of a plan that must fail (exit 1, no context written)."""
    req = tmp / "requirements.txt"
    req.write_text(f"{requirement}\n")
    out = tmp / "refused"
    result = subprocess.run(
        [sys.executable, "-m", "builder", "-r", str(req), "--output", str(out),
         "--cache-dir", str(cache), "--no-build", "--arch", "amd64", *args],
        capture_output=True,
        text=True,
        cwd=tmp,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout[-2000:]
    assert not out.exists()
    (line,) = [one for one in result.stderr.splitlines() if one.startswith("error:")]
    return line


def test_an_unknown_program_left_out_is_an_error(shared_cache: Path, tmp_path: Path) -> None:
    line = refused(tmp_path, shared_cache, "pydub", "--without-program", "ffmepg")
    assert line == (
        "error: without-programs: 'ffmepg' is neither a program nor a package Debian 13 ships"
        " for amd64"
    )


def test_a_wrapper_of_a_program_debian_does_not_ship_is_refused(
    shared_cache: Path, tmp_path: Path
) -> None:
    """pdfkit finds wkhtmltopdf with `which` and runs the path printed; trixie has no
    wkhtmltopdf. Importing pdfkit succeeds, so an image built anyway would pass its import
    checks and fail at the first page: refused, unless the operator leaves it out by name."""
    line = refused(tmp_path, shared_cache, "pdfkit")
    assert line.startswith("error: pdfkit==") and line.endswith(
        " runs wkhtmltopdf, which no Debian 13 package ships for amd64: what runs it would fail"
        " in the image (to build without it: --without-program wkhtmltopdf)"
    )
    stdout, report = plan(tmp_path, shared_cache, ["pdfkit"], "--without-program", "wkhtmltopdf")
    assert "warning: wkhtmltopdf (no Debian 13 package ships it for amd64) left out" in stdout
    assert "runs wkhtmltopdf -> no Debian 13 package (left out)" in stdout
    for arch in ARCHES:
        record = report["architectures"][arch]
        assert record["apt_packages"] == []
        (need,) = [n for n in record["programs"] if n["program"] == "wkhtmltopdf"]
        assert need["package"] is None and need["left_out"] is True
