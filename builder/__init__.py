"""build-sandbox-image: requirements.txt in, verified sandbox runtime image out.

One process-wide setting lives here, because it must be in place before any module imports
docker: paramiko loads lazily. docker-py imports paramiko whenever it is installed (for its
ssh:// transport), and paramiko imports invoke, cryptography and unittest.mock: about 0.3 s on
every command. The tool's ssh:// engines run the ssh binary (`use_ssh_client`), so paramiko's
code runs only for a DOCKER_HOST=ssh:// local engine; it is then loaded on first use.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec
    from types import ModuleType

DEFERRED = "paramiko"


class _DeferredFinder:
    """A meta path finder that finds `DEFERRED` as the other finders do, and wraps its loader in
    a LazyLoader: the module is created on `import` and runs on its first attribute access.

    importlib is imported only then, and the class does not derive importlib.abc's finder:
    importing that costs every command more than it saves.
    """

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != DEFERRED:
            return None
        import importlib.util

        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = importlib.util.LazyLoader(spec.loader)
                return spec
        return None  # not installed: the import fails as it would have


if not any(isinstance(finder, _DeferredFinder) for finder in sys.meta_path):
    sys.meta_path.insert(0, _DeferredFinder())
