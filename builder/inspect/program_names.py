"""What a program's name may be, which word of a command line names it, and whether a file
names a runner at all (the cheap test before its syntax is read).

A wheel's strings reach the program index, the plan, report.json and verification's program
runs only through `program_name`: a plain file name, never shell syntax.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence

# What a program name may be before it is looked up, listed or run by verification: a file
# name of letters, digits and `._+-`, with a letter, not a word of shell syntax (`;`, `$(`),
# a number (`123`) or a path's directory part. A wheel's strings go no further otherwise.
PROGRAM_NAME = re.compile(r"(?=[^A-Za-z]*[A-Za-z])[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")
# `env [-i] [VAR=value] program`: the program is the first word after these.
ENV = frozenset({"env", "/usr/bin/env", "/bin/env"})

# Only files that name subprocess or call a runner are parsed (most of a wheel set runs
# nothing; "which" and "exec" alone are English and Python words in too many files).
# A call is found where a word is (bytes.find), then matched there: one regex tried at every
# position of 69 MB of sources took 4.7 s of a cold inspection, the finds 0.3 s.
RUNNER_WORDS = (
    b"system",
    b"popen",
    b"exec",
    b"spawn",
    b"posix_spawn",
    b"which",
    b"find_executable",
)
CALL = re.compile(
    rb"(?:system|popen|exec[lv]p?e?|spawn[lv]p?e?|posix_spawnp?|which|find_executable)\s*\("
)
WORD_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


def program_name(text: str) -> str | None:
    """`/usr/bin/pdftoppm` -> `pdftoppm`, `gs.exe` -> `gs`; None for what no program is named
    (an option, a placeholder, an empty string)."""
    name = posixpath.basename(text.strip().strip("\"'"))
    name = name.removesuffix(".exe")
    return name if PROGRAM_NAME.fullmatch(name) else None


def first_word(text: str) -> str:
    """The program a shell command line starts with (`pdftoppm -v` -> `pdftoppm`, `env
    LANG=C dot -V` -> `dot`)."""
    words = text.split()
    start = launched(words)
    return words[start] if start < len(words) else ""


def launched(words: Sequence[str | None]) -> int:
    """The index of the program in a command's words (None: a word not known), past `env`,
    its options and `VAR=value` assignments."""
    if not words or words[0] not in ENV:
        return 0
    index = 1
    while index < len(words) and (word := words[index]) is not None:
        if not (word.startswith("-") or "=" in word):
            break
        index += 1
    return index


def mentions_runner(source: bytes) -> bool:
    """Whether `source` names subprocess or calls a runner by name (a word: `os.system(`,
    not `filesystem(`)."""
    if b"subprocess" in source:
        return True
    for word in RUNNER_WORDS:
        at = source.find(word)
        while at >= 0:
            if (at == 0 or source[at - 1] not in WORD_BYTES) and CALL.match(source, at):
                return True
            at = source.find(word, at + 1)
    return False
