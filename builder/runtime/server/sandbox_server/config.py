"""Limits and defaults fixed at start-up, and the sizes every module shares."""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1024 * 1024
CHUNK = 256 * 1024


@dataclass(frozen=True)
class Config:
    """Limits and defaults, fixed at start-up."""

    workspace: str
    max_upload: int
    max_output: int
    default_timeout: float
    max_timeout: float
    file_mode: int
    max_reply: int = 32 * MIB
    max_executes: int = 32
    max_queued: int = 64
    max_connections: int = 256
    max_connections_per_source: int = 64
    max_executes_per_source: int = 16
    header_timeout: float = 30.0
    body_timeout: float = 600.0
    spool_dir: str | None = None
