"""qual's exit statuses: one table for every command (`qual run`, a family's own command,
`qual compare`, `qual clean`, …), the help's list made from it."""

from __future__ import annotations

import argparse
import enum
import sys


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


def of_verdicts(verdicts) -> Exit:
    """The exit status of one or more runs' verdicts (qual.record.summarize's), the worst
    first: FAIL or ERROR, then INCOMPLETE, then INCONCLUSIVE, else PASS. Every command that
    judges turns its verdicts into its status here."""
    said = set(verdicts)
    if said & {"FAIL", "ERROR"}:
        return Exit.FAIL
    if "INCOMPLETE" in said:
        return Exit.INCOMPLETE
    if "INCONCLUSIVE" in said:
        return Exit.INCONCLUSIVE
    return Exit.PASS


def help_text(*codes: Exit | tuple[Exit, str]) -> str:
    """`exit status:` and a line per code, for a command's --help: a code alone says its
    meaning from the table; (code, words) says what it means for that command."""
    lines = []
    for c in codes:
        code, said = c if isinstance(c, tuple) else (c, c.meaning)
        lines.append(f"  {int(code)}  {said}")
    return "exit status:\n" + "\n".join(lines)


class ExitHelp(argparse.HelpFormatter):
    """A command's help: its description wrapped as usual, its `exit status:` epilog (help_text)
    kept a line per code."""

    def _fill_text(self, text, width, indent):
        if text.startswith("exit status:"):
            return "\n".join(indent + line for line in text.splitlines())
        return super()._fill_text(text, width, indent)


def usage_error(command: str, message: str) -> Exit:
    """`qual COMMAND: error: MESSAGE` on stderr, and the usage status: what a command says of
    a bad argument, before anything is touched."""
    print(f"qual {command}: error: {message}", file=sys.stderr)
    return Exit.USAGE
