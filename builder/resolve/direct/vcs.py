"""Git repositories as requirement sources: a ref resolved to its commit, the commit exported.

A tag, branch or commit is resolved to the 40-hex commit at plan time (`git ls-remote`, or a
fetch for an abbreviated commit), so the lock pins the commit: a rebuild of the same commit is
the same wheel, a branch that moved is a change. The project is then exported from a fresh,
shallow fetch of exactly that commit (`git archive`: no `.git`, no untracked file), which is what
gets built.

Credentials in an https URL (from `${VAR}`) never go on git's command line, where other users
of the machine could read them: they go as an `Authorization` header scoped to that URL, in
git's environment (GIT_CONFIG_*), so git sends them to that host only. ssh uses the caller's
agent or key, as git would. Every line git prints is redacted before it is shown.
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
import tempfile
import urllib.parse
from collections.abc import Mapping
from pathlib import Path

from builder.errors import UserError
from builder.reporter import mask
from builder.resolve.direct.lines import DirectSource
from builder.resolve.direct.trees import refuse_links_out
from builder.resolve.resolution import redact

COMMIT = re.compile(r"[0-9a-f]{40}")
SHORT_COMMIT = re.compile(r"[0-9a-f]{7,39}")
GIT_TIMEOUT = 300  # seconds for one git command: a clone of a big repository, not a hang


def _git_environment(url: str) -> tuple[str, Mapping[str, str]]:
    """The URL git is given (no credentials) and git's environment carrying them, scoped."""
    parts = urllib.parse.urlsplit(url)
    environment = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}  # fail, never wait for a prompt
    if parts.username is None or parts.scheme not in ("http", "https"):
        return url, environment  # ssh: the user is no secret, the agent or key authenticates
    plain = redact(url)
    user = urllib.parse.unquote(parts.username)
    password = urllib.parse.unquote(parts.password or "")
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    given = int(os.environ.get("GIT_CONFIG_COUNT", "0") or "0")  # the operator's own, kept
    environment |= {
        "GIT_CONFIG_COUNT": str(given + 1),
        f"GIT_CONFIG_KEY_{given}": f"http.{plain}.extraHeader",
        f"GIT_CONFIG_VALUE_{given}": f"Authorization: Basic {token}",
    }
    return plain, environment


def _git(arguments: list[str], source: DirectSource, cwd: Path | None = None) -> str:
    """Run git for `source`, its output; one redacted line naming the source when it fails."""
    _, environment = _git_environment(source.target)
    try:
        result = subprocess.run(
            ["git", *arguments],
            capture_output=True,
            text=True,
            env=environment,
            cwd=cwd,
            timeout=GIT_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        raise UserError(f"{source.origin}: {source.shown}: git did not answer in time") from None
    except FileNotFoundError:
        raise UserError(f"{source.origin}: a git requirement needs git on this machine") from None
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["failed"])[-1]
        raise UserError(f"{source.origin}: {source.shown}: {mask(last)[:200]}")
    return result.stdout


def resolve_commit(source: DirectSource) -> str:
    """The 40-hex commit `source`'s ref names now (the default branch when it names none)."""
    if COMMIT.fullmatch(source.ref):
        return source.ref  # exporting it fetches it: a commit that does not exist fails there
    url, _ = _git_environment(source.target)
    if SHORT_COMMIT.fullmatch(source.ref):
        return _expand_short(source, url)
    listing = _git(["ls-remote", "--", url], source)
    refs: dict[str, str] = {}
    for line in listing.splitlines():
        commit, _, name = line.partition("\t")
        refs[name] = commit
    ref = source.ref or "HEAD"
    for name in (f"refs/tags/{ref}^{{}}", f"refs/tags/{ref}", f"refs/heads/{ref}", ref):
        if name in refs and COMMIT.fullmatch(refs[name]):
            return refs[name]
    raise UserError(
        f"{source.origin}: {source.shown}: no tag, branch or commit {ref!r} in the repository"
    )


def _expand_short(source: DirectSource, url: str) -> str:
    """An abbreviated commit, looked up in a full fetch of the repository."""
    with tempfile.TemporaryDirectory(prefix="bsi-git-") as temp:
        _git(["init", "--quiet", "--bare", temp], source)
        _git(["fetch", "--quiet", "--", url, "+refs/heads/*:refs/heads/*"], source, Path(temp))
        try:
            found = _git(["rev-parse", "--verify", f"{source.ref}^{{commit}}"], source, Path(temp))
        except UserError:
            raise UserError(
                f"{source.origin}: {source.shown}: no commit {source.ref!r} in the repository"
            ) from None
    return found.strip()


def export(source: DirectSource, commit: str, destination: Path) -> Path:
    """The tree of `commit` written into `destination` (no `.git`); the project's directory."""
    url, _ = _git_environment(source.target)
    with tempfile.TemporaryDirectory(prefix="bsi-git-") as temp:
        repository = Path(temp)
        _git(["init", "--quiet", "--bare", str(repository)], source)
        try:
            _git(["fetch", "--quiet", "--depth", "1", "--", url, commit], source, repository)
        except UserError:
            raise UserError(
                f"{source.origin}: {source.shown}: commit {commit} cannot be fetched"
            ) from None
        # The commit's tree checked out into `destination` from the temporary repository: no
        # `.git` there, and no tar to extract (3.11.2, the floor, has no extraction filters).
        worktree = f"--work-tree={destination}"
        _git([worktree, "read-tree", commit], source, repository)
        _git([worktree, "checkout-index", "--all"], source, repository)
    refuse_links_out(destination, f"{source.origin}: {source.shown}@{commit[:12]}")
    project = destination / source.subdirectory if source.subdirectory else destination
    if not (project / "pyproject.toml").is_file() and not (project / "setup.py").is_file():
        where = f" in {source.subdirectory!r}" if source.subdirectory else ""
        raise UserError(
            f"{source.origin}: {source.shown}@{commit[:12]}: no pyproject.toml or setup.py{where}"
        )
    return project
