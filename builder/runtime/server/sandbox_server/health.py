"""Whether a new command could run now: the ``status`` that ``GET /`` answers.

Both the handlers and the gate (for connections over a bound) answer ``GET /``, so both build
the body here: ``{"status": "ok"}``, or ``{"status": "unavailable", "reason": ...}`` with a 503.
"""

from __future__ import annotations

from enum import StrEnum


class Health(StrEnum):
    """The server's readiness; its values are the contract's ``status`` strings."""

    OK = "ok"
    UNAVAILABLE = "unavailable"


def health_payload(reason: str | None) -> dict[str, str]:
    """``GET /``'s JSON body: ok when nothing stands in the way (``reason`` None), else
    unavailable and why."""
    if reason is None:
        return {"status": Health.OK}
    return {"status": Health.UNAVAILABLE, "reason": reason}
