"""plan_arch on synthetic wheels: Debian packages for real sonames, one-line errors otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging import _manylinux
from support.plans import SOURCE, TAG, plan_for
from support.wheelfactory import compile_so, make_wheel

from builder.errors import UserError
from builder.plan.plan import requested_distributions
from builder.resolve.target import ARCHES, Arch


@pytest.mark.parametrize("arch", ARCHES.values(), ids=ARCHES.keys())
def test_manylinux_tags_are_the_ones_pip_accepts_on_glibc_2_41(
    arch: Arch, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The target's platform tags are what packaging (pip's tag rule) yields for a machine of
    this arch whose glibc is trixie's: down to 2_5 on x86_64, 2_17 on aarch64, aliases too."""
    monkeypatch.setattr(_manylinux, "_get_glibc_version", lambda: (2, 41))
    monkeypatch.setattr(_manylinux, "_get_manylinux_module", lambda: None)
    assert arch.platforms() == list(_manylinux.platform_tags([arch.machine]))
    oldest = {"x86_64": "manylinux1", "aarch64": "manylinux2014"}[arch.machine]
    assert arch.platforms()[-1] == f"{oldest}_{arch.machine}"


def test_linked_library_becomes_its_debian_package(tmp_path: Path) -> None:
    so = compile_so(tmp_path, SOURCE, "ext.so", libs=["gomp"])
    wheel = make_wheel(tmp_path, "gompy", "1.0", TAG, {"gompy/_ext.so": so.read_bytes()})
    plan = plan_for(tmp_path, [wheel])
    assert plan.apt_packages == ("libgomp1",)
    (library,) = plan.libraries
    assert (library.soname, library.package) == ("libgomp.so.1", "libgomp1")
    assert library.needed_by == ("gompy==1.0: gompy/_ext.so",)
    assert plan.wheels[0].tag == "cp313-cp313-manylinux_2_17_x86_64"


def test_base_provided_libraries_need_no_package(tmp_path: Path) -> None:
    so = compile_so(tmp_path, SOURCE, "ext.so", libs=["stdc++", "m"])
    wheel = make_wheel(tmp_path, "cxx", "1.0", TAG, {"cxx/_ext.so": so.read_bytes()})
    assert plan_for(tmp_path, [wheel]).apt_packages == ()


def test_unknown_soname_names_the_library_and_the_file(tmp_path: Path) -> None:
    private = compile_so(tmp_path, SOURCE, "libzzqprivate.so", soname="libzzqprivate.so.3")
    so = compile_so(tmp_path, SOURCE, "ext.so", libs=["zzqprivate"], libdirs=[private.parent])
    wheel = make_wheel(tmp_path, "odd", "2.0", TAG, {"odd/_ext.so": so.read_bytes()})
    with pytest.raises(UserError) as caught:
        plan_for(tmp_path, [wheel])
    message = str(caught.value)
    assert message.startswith("libzzqprivate.so.3: no Debian 13 package provides")
    assert "odd==2.0: odd/_ext.so" in message


def test_too_new_glibc_symbol_is_refused(tmp_path: Path) -> None:
    libc = compile_so(
        tmp_path, "int fake_fn(void) { return 0; }\n", "libfakec.so", soname="libc.so.6",
        version_script="GLIBC_2.99 { global: fake_fn; local: *; };\n",
    )  # fmt: skip
    so = compile_so(
        tmp_path, "int fake_fn(void);\nint g(void) { return fake_fn(); }\n", "new.so",
        libs=["fakec"], libdirs=[libc.parent],
    )  # fmt: skip
    wheel = make_wheel(tmp_path, "futuristic", "1.0", TAG, {"futuristic/_new.so": so.read_bytes()})
    with pytest.raises(UserError, match=r"futuristic==1.0: futuristic/_new.so needs GLIBC_2.99"):
        plan_for(tmp_path, [wheel])


@pytest.mark.parametrize(
    "tag",
    ["cp313-cp313-musllinux_1_2_x86_64", "cp313-cp313t-manylinux_2_17_x86_64",
     "cp312-cp312-manylinux_2_17_x86_64", "cp313-cp313-linux_x86_64",
     "cp313-cp313-manylinux_2_42_x86_64", "cp313-cp313-manylinux_2_17_aarch64",
     "cp313-cp313-manylinux_2_4_x86_64"],
)  # fmt: skip
def test_wheels_the_target_cannot_use_are_refused(tmp_path: Path, tag: str) -> None:
    wheel = make_wheel(tmp_path, "picky", "1.0", tag, {"picky/__init__.py": b""})
    with pytest.raises(UserError, match=r"picky==1.0: no wheel for CPython 3.13"):
        plan_for(tmp_path, [wheel])


@pytest.mark.parametrize(
    "tag",
    ["cp313-abi3-manylinux_2_28_x86_64", "cp39-abi3-manylinux2014_x86_64",
     "py3-none-any", "py2.py3-none-any", "cp313-cp313-manylinux_2_41_x86_64",
     # legacy tags pip installs on x86_64 (libclang's, nvidia-cuda-nvrtc's, playwright's)
     "py2.py3-none-manylinux2010_x86_64", "py3-none-manylinux_2_12_x86_64",
     "py3-none-manylinux1_x86_64", "cp313-cp313-manylinux_2_5_x86_64.manylinux1_x86_64"],
)  # fmt: skip
def test_wheels_the_target_accepts(tmp_path: Path, tag: str) -> None:
    wheel = make_wheel(tmp_path, "fine", "1.0", tag, {"fine/__init__.py": b""})
    assert plan_for(tmp_path, [wheel]).wheels[0].top_level == ("fine",)


def test_deep_imports_follow_the_direct_requirements_the_extras_install(tmp_path: Path) -> None:
    """numpy is asked for but not installed here (the base's, the platform's to prove); dep is
    installed but not asked for; pkg-a is asked for twice."""
    wheels = [
        make_wheel(
            tmp_path / "w", name, "1.0", "py3-none-any", {f"{name.replace('-', '_')}/x.py": b""}
        )
        for name in ("pkg-a", "dep")
    ]
    arch_plan = plan_for(tmp_path, wheels)
    found = requested_distributions(["pkg-a", "numpy", "pkg-a"], [arch_plan])
    assert found == ("pkg-a",)
