"""qual's exit statuses: one table for every command (`qual run`, a family's own command,
`qual compare`, `qual clean`, …), the help's list made from it."""

from __future__ import annotations

import enum


class Exit(enum.IntEnum):
    PASS = 0          # every criterion judged and met (or a command did what it was asked)
    FAIL = 1          # a criterion failed, a drive returned an error, a test could not measure
    USAGE = 2         # an argument qual cannot parse
    IMPROVED = 3      # `qual compare`: a figure improved past its tolerance, not accepted
    REFUSED = 4       # refused before any I/O (the plan, a bad profile or option): nothing written
    INCONCLUSIVE = 5  # nothing failed, but the noise is larger than the question
    INCOMPLETE = 6    # nothing failed, but a criterion was not judged
    INTERRUPTED = 130  # Ctrl-C
    BROKEN_PIPE = 141  # the reader went away (`qual … | head`), as a shell's 128 + SIGPIPE

    @property
    def meaning(self) -> str:
        return MEANINGS[self]


MEANINGS = {
    Exit.PASS: "PASS: every criterion judged and met",
    Exit.FAIL: "FAIL: a criterion failed, a drive returned an error, or a test could not "
               "measure (ERROR)",
    Exit.USAGE: "usage: an argument of qual's own it cannot parse",
    Exit.IMPROVED: "qual compare: a figure improved past its tolerance (--accept-improvements "
                   "takes it)",
    Exit.REFUSED: "refused before any I/O (the plan, a bad profile, a pytest usage error): "
                  "nothing written",
    Exit.INCONCLUSIVE: "INCONCLUSIVE: nothing failed, but the noise is larger than the question",
    Exit.INCOMPLETE: "INCOMPLETE: nothing failed, but a criterion was not judged",
    Exit.INTERRUPTED: "interrupted (Ctrl-C)",
    Exit.BROKEN_PIPE: "the reader of its output went away",
}


def help_text(*codes: Exit) -> str:
    """`exit status:` and a line per code, for a command's --help."""
    return "exit status:\n" + "\n".join(f"  {int(c)}  {c.meaning}" for c in codes)
