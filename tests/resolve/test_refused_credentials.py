"""A wrong index password is an authentication failure naming the host, never "no such
distribution" (uv's own conclusion, having read nothing) and never the password."""

from __future__ import annotations

import pytest

from builder.cli.errors import error_line
from builder.reporter import remember
from builder.resolve.requirements import RequirementSet
from builder.resolve.resolution import authentication_failed
from builder.resolve.target import ARCHES, Target, shipped_facts
from builder.resolve.unresolvable import unresolvable

AMD64 = ARCHES["amd64"]
# uv 0.x's words, as captured from `uv pip compile` against a loopback index refusing Basic auth
INDEX_REFUSED = (
    "error: No solution found when resolving dependencies\n"
    "  cause: Because bsi-private was not found in the package registry and you require"
    " bsi-private==1.0, we can conclude that your requirements are unsatisfiable.\n\n"
    "hint: An index URL (http://127.0.0.1:42109/simple) could not be queried due to a lack of"
    " valid authentication credentials ({status})\n"
)
LINKS_REFUSED = (
    "error: Failed to read `--find-links` URL: http://127.0.0.1:42109/simple/bsi-private/\n"
    "  cause: HTTP status client error ({status}) for url"
    " (http://127.0.0.1:42109/simple/bsi-private/)\n"
)


# as uv says it when its lines are wrapped at the terminal's width
LINKS_REFUSED_WRAPPED = (
    "error: Failed to read `--find-links` URL:\n"
    "       http://ci:****@127.0.0.1:42109/simple/bsi-private/\n"
    "  cause: Failed to fetch: http://127.0.0.1:42109/simple/bsi-private/\n"
    "  cause: HTTP status client error ({status}) for url\n"
    "       (http://127.0.0.1:42109/simple/bsi-private/)\n"
)


@pytest.mark.parametrize("said", [INDEX_REFUSED, LINKS_REFUSED, LINKS_REFUSED_WRAPPED])
@pytest.mark.parametrize("status", ["401 Unauthorized", "403 Forbidden"])
def test_an_index_or_a_page_of_links_refusing_the_credentials_is_said_so(
    said: str, status: str
) -> None:
    error = unresolvable(
        said.format(status=status), RequirementSet((), ()), Target(shipped_facts(), (AMD64,)), AMD64
    )
    assert str(error) == (
        f"cannot resolve for amd64: authentication failed at 127.0.0.1:42109 ({status}): the"
        " user:password@ of its URL is wrong, or missing"
    )


def test_the_failure_names_the_host_and_not_the_credentials() -> None:
    said = authentication_failed("https://ci:hunter2-pass@pypi.corp.example/simple", "401")
    assert said.startswith("authentication failed at pypi.corp.example (401)")
    assert "hunter2" not in said and "ci:" not in said


def test_uvs_own_words_quoted_in_the_error_line_are_masked() -> None:
    """uv's cause is quoted as it said it; the CLI's one line masks what the run read."""
    remember("value-of-CI_TOKEN-81f2")
    stderr = "error: Failed to parse entry\n  cause: unexpected `value-of-CI_TOKEN-81f2` at 3\n"
    error = unresolvable(stderr, RequirementSet((), ()), Target(shipped_facts(), (AMD64,)), AMD64)
    assert "value-of-CI_TOKEN-81f2" in str(error)  # it does quote uv
    assert error_line(str(error)) == ("error: cannot resolve for amd64: unexpected `***` at 3")
