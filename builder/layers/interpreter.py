"""The engine image whose `python3` compiles the extras' bytecode: the base itself, natively.

The base's interpreter is the target's (the apt step adds libraries, never another CPython), so
the base serves every arch; it runs on the engine's own arch, since bytecode is the same for
every machine. The engine may not hold the base (BuildKit pulls into its own store), so it is
pulled for that one platform, with the credentials `docker pull` would use.
"""

from __future__ import annotations

import docker
import docker.errors

from builder.cache import Cache
from builder.credentials import engine_auth
from builder.engines.connection import native_arch
from builder.errors import UserError
from builder.layers.bytecode import Compiler
from builder.oci.name import ImageRef


def compile_arch(client: docker.DockerClient, arches: tuple[str, ...]) -> str:
    """The arch to compile on: the engine's own when it is built, else the first arch, under
    emulation (no image of the engine's own arch holds the target's interpreter then)."""
    native = native_arch(client)
    return native if native in arches else arches[0]


def interpreter_image(client: docker.DockerClient, base: ImageRef, arch: str) -> str:
    """The engine's id of `base` for `arch`, pulled for that platform unless present."""
    try:
        found = client.images.get(base.as_written)
        if found.attrs.get("Architecture") == arch:
            return str(found.id)
    except docker.errors.DockerException:
        pass  # not held, or a name@digest the engine cannot look up: pull it
    try:
        client.api.pull(
            base.name,
            tag=base.reference,
            platform=f"linux/{arch}",
            auth_config=engine_auth(base.registry),
        )
        pulled = f"{base.name}@{base.digest}" if base.digest else str(base)
        return str(client.images.get(pulled).id)
    except docker.errors.DockerException as error:
        raise UserError(
            f"bytecode: cannot pull {base.as_written} for linux/{arch}: {error}"
        ) from None


def base_compiler(
    client: docker.DockerClient, base: ImageRef, arches: tuple[str, ...], cache: Cache, root: str
) -> Compiler:
    """The (unstarted) Compiler of the base's interpreter on the arch `compile_arch` picks."""
    arch = compile_arch(client, arches)
    return Compiler(client, interpreter_image(client, base, arch), cache, root)
