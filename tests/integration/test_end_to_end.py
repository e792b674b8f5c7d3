"""Requirements to a built, verified image on the real engine, on the reference base.

Each build runs the whole command (probe, resolve, fetch, inspect, plan, render, BuildKit
build, hardened verify); the assertions then look at the image itself.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
import uuid
from pathlib import Path
from typing import Any

import pytest
from support.images import Built, build, docker, inspect, provisional_holding, run_hardened
from support.wheelfactory import make_wheel
from support.wheelindex import serve_wheel

pytestmark = pytest.mark.usefixtures("docker_client", "package_index")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


def test_the_union_build_verified_every_library_hardened(union_image: Built) -> None:
    """One CLI run planned, built and verified the image the tests below look at."""
    assert "FAIL" not in union_image.result.stdout
    image = union_image.report["image"]
    assert image["tag"] == union_image.tag
    assert image["verification"]["passed"] is True
    names = {c["name"] for c in image["verification"]["checks"]}
    assert {"import bs4", "import lightgbm", "import magic", "import psycopg"} <= names
    assert {"timeout", "traversal", "import wand"} <= names
    for name in ("bs4", "lightgbm", "magic", "psycopg", "wand"):
        assert f"PASS  import {name}" in union_image.result.stdout
    # where the run's time went, for an operator reading a CI minute (issue 38)
    assert set(image["seconds"]) == {"build", "preload", "load", "facts", "verify"}
    assert all(spent >= 0 for spent in image["seconds"].values())
    assert image["seconds"]["verify"] > 1  # a hardened container started, the set imported
    assert "push_seconds" not in image  # nothing was pushed
    # ... and when: each wheel inspected, laid out and compiled after it arrived (a pipeline)
    timeline = union_image.report["timeline"]
    assert list(timeline["steps"])[:2] == ["base", "resolve"]
    assert {"downloads", "inspections", "plan", "layers", "bytecode"} <= set(timeline["steps"])
    assert all(began <= ended for began, ended in timeline["steps"].values())
    wheels = {w["filename"] for w in union_image.report["architectures"]["amd64"]["wheels"]}
    assert set(timeline["wheels"]) == wheels
    for stages in timeline["wheels"].values():
        assert set(stages) == {"arrived", "inspected", "laid_out", "compiled"}
        assert all(stages["arrived"] <= stages[later] for later in stages)


def test_the_early_load_left_no_provisional_image(
    union_image: Built, test_env: dict, docker_client: Any
) -> None:
    """The distribution layers were loaded under a provisional image while the bytecode
    compiled (report.json's `preload`); the image holds them now and the provisional is gone."""
    layers = inspect(test_env, union_image.tag)["RootFS"]["Layers"]
    assert provisional_holding(docker_client, layers) == []
    assert union_image.report["image"]["seconds"]["preload"] > 0


def test_beautifulsoup4_imports_hardened(union_image: Built, test_env: dict) -> None:
    result = run_hardened(
        test_env, union_image.tag, "import bs4, os; print(bs4.__file__, os.getuid())"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["/app/deps-extra/bs4/__init__.py", "65532"]


def test_image_config_and_layers(union_image: Built, reference_image: str, test_env: dict) -> None:
    config = inspect(test_env, union_image.tag)
    assert config["Config"]["User"] == "65532:65532"
    env = dict(item.split("=", 1) for item in config["Config"]["Env"])
    assert env["PYTHONPATH"] == "/app/deps:/app/deps-extra"
    base_layers = inspect(test_env, reference_image)["RootFS"]["Layers"]
    assert config["RootFS"]["Layers"][: len(base_layers)] == base_layers
    assert len(config["RootFS"]["Layers"]) > len(base_layers)
    probe = (
        "import os, stat\n"
        "bad = []\n"
        "for root, dirs, files in os.walk('/app/deps-extra'):\n"
        "    for name in [root, *(os.path.join(root, f) for f in files)]:\n"
        "        st = os.lstat(name)\n"
        "        if st.st_uid != 0 or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):\n"
        "            bad.append(name)\n"
        "print(len(bad), os.stat('/app/deps-extra').st_uid)\n"
    )
    result = run_hardened(test_env, union_image.tag, probe)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0", "0"]


def runtime_check(built: Built, module: str) -> dict:
    """The verification's run-time load check (builder/data/ctypes.toml) that imports `module`."""
    checks = built.report["image"]["verification"]["checks"]
    imports = (f"import {module}", f"from {module}.")
    found = [
        c
        for c in checks
        if c["name"].startswith("check ") and any(one in c["detail"] for one in imports)
    ]
    assert len(found) == 1, checks
    return found[0]


def test_lightgbm_gets_libgomp1_and_trains_hardened(union_image: Built, test_env: dict) -> None:
    assert "libgomp.so.1 -> libgomp1" in union_image.result.stdout
    lightgbm_image = union_image.tag
    dpkg = docker(test_env, "run", "--rm", "--entrypoint", "dpkg-query", lightgbm_image,
                  "-W", "-f", "${Status}", "libgomp1")  # fmt: skip
    assert dpkg.stdout == "install ok installed"
    train = (
        "import numpy as np, lightgbm as lgb\n"
        "X = np.random.default_rng(0).random((200, 3)); y = (X[:, 0] > 0.5).astype(int)\n"
        "model = lgb.train({'objective': 'binary', 'verbose': -1, 'num_threads': 2},\n"
        "                  lgb.Dataset(X, y), num_boost_round=5)\n"
        "print(lgb.__file__, model.num_trees())\n"
    )
    result = run_hardened(test_env, lightgbm_image, train)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["/app/deps-extra/lightgbm/__init__.py", "5"]


def test_without_libgomp1_the_same_extras_fail(
    union_image: Built, reference_image: str, test_env: dict, tmp_path: Path
) -> None:
    """The control: copy the very same /app/deps-extra onto the base without the apt step."""
    lightgbm_image = union_image.tag
    (tmp_path / "Dockerfile").write_text(
        "ARG BASE\nARG EXTRAS\nFROM ${EXTRAS} AS extras\nFROM ${BASE}\n"
        "COPY --from=extras /app/deps-extra /app/deps-extra\n"
        "ENV PYTHONPATH=/app/deps:/app/deps-extra\n"
    )
    docker(
        test_env, "build", "-q", "-t", "bsi-e2e/no-gomp:test",
        "--build-arg", f"BASE={reference_image}",
        "--build-arg", f"EXTRAS={lightgbm_image}", str(tmp_path),
    )  # fmt: skip
    result = run_hardened(test_env, "bsi-e2e/no-gomp:test", "import lightgbm")
    assert result.returncode != 0
    assert "libgomp.so.1" in result.stderr


def test_python_magic_identifies_a_file(union_image: Built, test_env: dict) -> None:
    assert "libmagic.so.1 -> libmagic1t64" in union_image.result.stdout
    assert runtime_check(union_image, "magic")["passed"] is True
    code = (
        "import gzip, magic\n"
        "print(magic.from_buffer(b'%PDF-1.4\\n%\\xe2\\xe3\\xcf\\xd3\\n1 0 obj\\n'))\n"
        "print(magic.from_buffer(gzip.compress(b'sandbox'), mime=True))\n"
    )
    run = run_hardened(test_env, union_image.tag, code)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[0].startswith("PDF document")
    assert run.stdout.splitlines()[1] == "application/gzip"


def test_psycopg_image_loads_libpq(union_image: Built, test_env: dict) -> None:
    """psycopg, pure Python, gets libpq5 from its find_library call, and the image passes verify
    with a check that really loads libpq."""
    assert "libpq.so.5 -> libpq5" in union_image.result.stdout
    assert runtime_check(union_image, "psycopg")["passed"] is True
    run = run_hardened(test_env, union_image.tag, "import psycopg; print(psycopg.pq.version())")
    assert run.returncode == 0, run.stderr
    assert int(run.stdout.strip()) >= 170000  # trixie's libpq 17


def test_wand_gets_the_library_its_computed_name_finds_and_draws(
    union_image: Built, test_env: dict
) -> None:
    """Importing wand loads nothing: without the curated soname, the image passed the import
    check and failed at the first Image. With it, MagickWand is installed and a check draws."""
    assert "libMagickWand-7.Q16.so.10 -> libmagickwand-7.q16-10" in union_image.result.stdout
    assert runtime_check(union_image, "wand")["passed"] is True
    code = (
        "from wand.image import Image\n"
        "with Image(width=3, height=2, background='blue') as image:\n"
        "    image.format = 'png'\n"
        "    blob = image.make_blob()\n"
        "with Image(blob=blob) as back:\n"
        "    print(back.size, back.format)\n"
    )
    run = run_hardened(test_env, union_image.tag, code)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "(3, 2) PNG"


def test_secrets_never_land_in_the_image_or_context(
    tmp_path: Path, cache_dir: Path, reference_image: str, test_env: dict
) -> None:
    token = f"idx-{uuid.uuid4().hex}"
    ca_marker = f"BSI-CA-{uuid.uuid4().hex}"
    wheel = make_wheel(
        tmp_path / "wheels", "bsi-private-tool", "1.0", "py3-none-any",
        {"bsi_private_tool/__init__.py": b"VALUE = 42\n"},
    )  # fmt: skip
    with serve_wheel(wheel, "bsi-private-tool", credentials=f"ci:{token}") as port:
        ca_bundle = tmp_path / "apt-ca.pem"
        ca_bundle.write_text(
            f"-----BEGIN CERTIFICATE-----\n{ca_marker}\n-----END CERTIFICATE-----\n"
        )
        index = f"http://ci:{token}@127.0.0.1:{port}/simple"
        tag = "bsi-e2e/secrets:test"
        try:
            result = build(
                tmp_path, cache_dir, reference_image,
                f"--extra-index-url {index}\nbsi-private-tool\npython-magic\n", tag,
                "--apt-ca-bundle", str(ca_bundle),
            )  # fmt: skip
            assert result.returncode == 0, result.stdout[-3000:] + result.stderr
            assert "PASS  import bsi_private_tool" in result.stdout
            assert token not in result.stdout + result.stderr
            context = tmp_path / "context"
            assert "--mount=type=secret,id=apt-ca" in (context / "Dockerfile").read_text()
            for path in context.rglob("*"):
                if path.is_file():
                    data = path.read_bytes()
                    assert token.encode() not in data, path
                    assert ca_marker.encode() not in data, path
            history = docker(test_env, "history", "--no-trunc", tag).stdout
            assert token not in history and ca_marker not in history
            saved = subprocess.run(
                [test_env["docker"], "save", tag], capture_output=True, check=True, timeout=600
            ).stdout
            with tarfile.open(fileobj=io.BytesIO(saved)) as outer:
                for member in outer.getmembers():
                    if not member.isfile():
                        continue
                    blob = outer.extractfile(member).read()  # type: ignore[union-attr]
                    assert token.encode() not in blob, member.name
                    assert ca_marker.encode() not in blob, member.name
        finally:
            docker(test_env, "rmi", "-f", tag, check=False)
