"""A home for the sandbox user, and the caches built into the image for it.

Libraries keep config and caches under `$HOME`, `$XDG_CACHE_HOME` and `$XDG_CONFIG_HOME`. With
none set the home is `/` on a read-only root: matplotlib warns at every start that it made a
temporary cache directory, builds its font list again in every process, and falls back to the
current directory (the user's /workspace) when no temp dir is writable. So every image names a
home on the writable /tmp the platform mounts (builder.contract.HOME; docs/contract.md says why
there), and matplotlib's own config dir inside it.

A writable home alone still leaves the first process of every sandbox to build the font list,
and matplotlib ignores a config dir it cannot write even when it holds a valid cache (its issue
32246), so the cache cannot simply be shipped in place. It is built at image-build time, as
Jupyter's docker-stacks do: the assembled image runs once (no network, uid 65532, read-only root,
a tmpfs /tmp, the runtime's own environment), and what that wrote under the home becomes a layer
at builder.contract.HOME_SEED, which the server copies into the home at start.

The layer is reproducible: the run has `PYTHONHASHSEED=0` (matplotlib lists the fonts it finds
from a set), and the tar is normalized (root-owned, fixed modes, the extras' date).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Iterable, Mapping
from types import MappingProxyType

import docker
import docker.errors
from packaging.utils import canonicalize_name

from builder.cache import Cache
from builder.contract import HOME, HOME_SEED, SANDBOX_USER
from builder.errors import UserError
from builder.layers.bytecode import normalized_tar
from builder.layers.install_layout import LAYER_TAR
from builder.layers.layer import Layer, keep, written
from builder.plan.plan import ArchPlan, Plan

SEED_FORMAT = "home-seed/1"  # bump when the script, the environment or the tar layout changes
# What builds a distribution's caches in its home, run once at image-build time (as docker-stacks
# build matplotlib's font list: import its font manager with the Agg backend).
SEEDS: Mapping[str, str] = MappingProxyType({"matplotlib": "import matplotlib.font_manager"})
MPLCONFIGDIR = f"{HOME}/.config/matplotlib"  # matplotlib's config and cache dir, in the home

# Runs in the assembled image: each seed's code, then every regular file under $HOME (relative
# path -> base64) as one JSON object on stdout.
SEED_SCRIPT = """
import base64, json, os, sys
for code in json.loads(sys.argv[1]):
    exec(code, {})
home, files = os.environ["HOME"], {}
for root, dirs, names in os.walk(home):
    for name in names:
        path = os.path.join(root, name)
        if os.path.isfile(path) and not os.path.islink(path):
            with open(path, "rb") as handle:
                files[os.path.relpath(path, home)] = base64.b64encode(handle.read()).decode()
print(json.dumps(files, sort_keys=True))
"""


def distribution_names(arch: ArchPlan) -> frozenset[str]:
    """The normalized names of the distributions an arch's image installs."""
    return frozenset(canonicalize_name(wheel.name) for wheel in arch.wheels)


def plan_names(plan: Plan) -> frozenset[str]:
    """The distributions any arch of `plan` installs: what the home's environment follows, the
    same for every arch as the Dockerfile's final stage is."""
    return frozenset().union(*(distribution_names(arch) for arch in plan.arches))


def home_env(names: Iterable[str]) -> dict[str, str]:
    """The environment an image of the distributions `names` (normalized) sets for its home."""
    env = {"HOME": HOME, "XDG_CACHE_HOME": f"{HOME}/.cache", "XDG_CONFIG_HOME": f"{HOME}/.config"}
    if "matplotlib" in names:  # config and cache in one dir, as docker-stacks set it
        env["MPLCONFIGDIR"] = MPLCONFIGDIR
    return env


def image_env(plan: Plan) -> dict[str, str]:
    """The environment `plan`'s image sets: its home's, and what points Playwright and Selenium
    at Debian's Chromium (builder.plan.browsers)."""
    return {**home_env(plan_names(plan)), **plan.browser_env}


def seeds_of(names: Iterable[str]) -> tuple[str, ...]:
    """The distributions among `names` whose caches are built at image-build time, sorted."""
    return tuple(sorted(set(names) & set(SEEDS)))


def seed_layer(
    client: docker.DockerClient, image_id: str, seeds: tuple[str, ...], epoch: int, cache: Cache
) -> Layer:
    """The layer of the caches `seeds` build in the home of `image_id`, under HOME_SEED.

    Cached by the image (its id is its config's digest: its layers and environment) and the
    seeds: a rerun of the same image starts no container.
    """
    key_text = "\n".join([SEED_FORMAT, image_id, str(epoch), *seeds])
    key = hashlib.sha256(key_text.encode()).hexdigest()
    record = cache.get_record("home-seed", key)
    if record and (path := cache.checked_blob(record["diff_id"].split(":", 1)[1], LAYER_TAR)):
        return Layer(path, record["diff_id"], record["size"], epoch)
    files = _seeded_files(client, image_id, seeds)
    root = HOME_SEED.strip("/")
    temp, digest = written(cache, lambda out: normalized_tar(out, files.items(), root, epoch))
    layer = keep(temp, digest, cache, epoch)
    cache.put_record("home-seed", key, {"diff_id": layer.diff_id, "size": layer.size})
    return layer


def _seeded_files(
    client: docker.DockerClient, image_id: str, seeds: tuple[str, ...]
) -> dict[str, bytes]:
    """Run the seeds in the image as the platform runs it; the files they left in the home."""
    code = json.dumps([SEEDS[name] for name in seeds])
    environment = {
        **home_env(seeds),
        "MPLBACKEND": "Agg",  # no display: what docker-stacks build the cache with
        "PYTHONHASHSEED": "0",  # the font list's order follows a set of paths
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    try:
        output = client.containers.run(
            image_id,
            entrypoint=["python3", "-c", SEED_SCRIPT, code],
            command=[],
            user=SANDBOX_USER,
            environment=environment,
            network_disabled=True,
            read_only=True,
            tmpfs={"/tmp": "rw,mode=1777"},
            working_dir="/tmp",
            labels={"org.build-sandbox-image.role": "home-seed"},
            remove=True,
            stderr=False,
        )
    except docker.errors.ContainerError as error:
        stderr = error.stderr or b""
        text = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr
        last = text.strip().splitlines()[-1:]
        raise UserError(
            f"home seed: building the caches of {', '.join(seeds)} in {image_id} failed:"
            f" {' '.join(last)[:200]}"
        ) from None
    except docker.errors.DockerException as error:
        raise UserError(f"home seed: cannot run {image_id}: {error}") from None
    try:
        found = json.loads(output)
        return {str(path): base64.b64decode(data) for path, data in found.items()}
    except (ValueError, AttributeError, binascii.Error):
        raise UserError(f"home seed: {image_id} gave no list of files") from None
