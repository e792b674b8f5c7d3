"""What tests share about the machine they run on: the registry's record, the session's name,
and how a missing part of the machine ends a test (fail in CI, skip elsewhere).

tests/conftest.py makes the fixtures from these; a test module imports them from here.
"""

from __future__ import annotations

import base64
import os
import uuid
from typing import NamedTuple

import pytest

SETUP_HINT = "run scripts/setup-env.sh (or make test)"
SESSION = uuid.uuid4().hex[:8]  # names this session's repositories in the shared registry


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def unavailable(reason: str) -> None:
    """Fail in CI, skip elsewhere: CI must never pass by skipping the real tests."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: failing instead of skipping)", pytrace=False)
    pytest.skip(f"{reason}; {SETUP_HINT}")


class Registry(NamedTuple):
    host: str  # "127.0.0.1:5000", plain http (docker trusts loopback registries without TLS)
    user: str
    password: str

    def auth_header(self) -> str:
        token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        return f"Basic {token}"
