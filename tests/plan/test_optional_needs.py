"""Needs of plugins loaded on demand are optional: listed with the file, installed on request."""

from __future__ import annotations

from pathlib import Path

from support.plans import SOURCE, TAG, plan_for
from support.wheelfactory import EXTENSION_SUFFIX, compile_so, make_wheel


def plugin_wheel(tmp_path: Path, extension_libs: list[str]) -> Path:
    """qtlike: an extension module, and a platform plugin that links a vendored helper
    which links libgomp (the way Qt's xcb plugin pulls X libraries through libQt5XcbQpa)."""
    helper = compile_so(tmp_path, SOURCE, "libhelper.so.1", soname="libhelper.so.1", libs=["gomp"])
    plugin = compile_so(
        tmp_path, SOURCE, "libqxcb.so", libs=[":libhelper.so.1"], libdirs=[helper.parent],
        rpath="$ORIGIN/../../../qtlike.libs",
    )  # fmt: skip
    extension = compile_so(tmp_path, SOURCE, "core.so", libs=extension_libs)
    return make_wheel(tmp_path, "qtlike", "1.0", TAG, {
        f"qtlike/_core{EXTENSION_SUFFIX}": extension.read_bytes(),
        "qtlike/qt/plugins/platforms/libqxcb.so": plugin.read_bytes(),
        "qtlike.libs/libhelper.so.1": helper.read_bytes(),
    })  # fmt: skip


def test_plugin_only_need_is_optional_and_names_the_file(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, [plugin_wheel(tmp_path, [])])
    assert plan.apt_packages == ()
    assert plan.optional_packages == ("libgomp1",)
    (library,) = plan.libraries
    assert library.optional and library.soname == "libgomp.so.1"
    assert library.needed_by == ("qtlike==1.0: qtlike.libs/libhelper.so.1",)


def test_with_optional_installs_plugin_needs(tmp_path: Path) -> None:
    installed = plan_for(tmp_path, [plugin_wheel(tmp_path, [])], with_optional=True)
    assert installed.apt_packages == ("libgomp1",) == installed.optional_packages


def test_need_shared_with_an_extension_module_is_not_optional(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, [plugin_wheel(tmp_path, ["gomp"])])
    assert plan.apt_packages == ("libgomp1",)
    assert plan.optional_packages == ()


def test_library_loaded_directly_is_not_a_plugin(tmp_path: Path) -> None:
    lib = compile_so(tmp_path, SOURCE, "lib_model.so", libs=["gomp"])  # lightgbm's shape
    wheel = make_wheel(
        tmp_path, "modelish", "1.0", TAG, {"modelish/lib/lib_model.so": lib.read_bytes()}
    )
    plan = plan_for(tmp_path, [wheel])
    assert plan.apt_packages == ("libgomp1",)
    assert not plan.libraries[0].optional


def transport_wheel(tmp_path: Path, directory: str) -> Path:
    """An extension module linking its host library, and beside that library a transport the
    host library opens by name (it links libgomp; NVSHMEM's UCX transport links libucx the same
    way), which no file links."""
    host = compile_so(tmp_path, SOURCE, "libhost.so.3", soname="libhost.so.3")
    transport = compile_so(tmp_path, SOURCE, "nvshmem_transport_ucx.so.6", libs=["gomp"])
    extension = compile_so(
        tmp_path, SOURCE, "core.so", libs=[":libhost.so.3"], libdirs=[host.parent],
        rpath=f"$ORIGIN/../{directory.split('/', 1)[1]}",
    )  # fmt: skip
    return make_wheel(tmp_path, "nvidia-nvshmem-cu13", "3.0", TAG, {
        f"nvidia/nvshmem/_core{EXTENSION_SUFFIX}": extension.read_bytes(),
        f"{directory}/libhost.so.3": host.read_bytes(),
        f"{directory}/nvshmem_transport_ucx.so.6": transport.read_bytes(),
    })  # fmt: skip


def test_a_plugin_its_library_opens_on_demand_is_optional(tmp_path: Path) -> None:
    """NVSHMEM's transports (builder/data/gpu.toml's plugins): what they link is optional."""
    plan = plan_for(tmp_path, [transport_wheel(tmp_path, "nvidia/nvshmem/lib")])
    assert (plan.apt_packages, plan.optional_packages) == ((), ("libgomp1",))
    (library,) = plan.libraries
    assert library.needed_by == (
        "nvidia-nvshmem-cu13==3.0: nvidia/nvshmem/lib/nvshmem_transport_ucx.so.6",
    )


def test_a_library_no_table_names_is_loaded_for_sure(tmp_path: Path) -> None:
    """The same shape elsewhere may be a library Python opens through a computed path
    (torch's libtorch_global_deps.so): its needs stay required."""
    plan = plan_for(tmp_path, [transport_wheel(tmp_path, "nvidia/other/lib")])
    assert (plan.apt_packages, plan.optional_packages) == (("libgomp1",), ())


def test_an_extension_named_like_a_library_is_an_extension(tmp_path: Path) -> None:
    """pyarrow's core module is `pyarrow/lib.cpython-313-….so`: what it links is required even
    beside a plugin directory's files."""
    extension = compile_so(tmp_path, SOURCE, "lib.so", libs=["gomp"])
    wheel = make_wheel(tmp_path, "arrowish", "1.0", TAG, {
        f"arrowish/plugins/lib{EXTENSION_SUFFIX}": extension.read_bytes(),
    })  # fmt: skip
    assert plan_for(tmp_path, [wheel]).apt_packages == ("libgomp1",)
