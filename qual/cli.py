"""The `qual` command: one I/O job, the workload families, the suites, reports and gating.

Each command is a module of qual.commands that owns its parser, its handler and its exit
statuses' help: `io` (one fio-like job), `run` (the suites, a thin wrapper over pytest),
`report` (the HTML report), `compare` (firmware gating), `accept`, `history` and `store` (the
results store), `profiles` and `clean`, and one subcommand per workload family (`family`).
This module only builds the parser from them and dispatches."""

from __future__ import annotations

import argparse
import os
import sys

from qual import engine, flags, watchdog
from qual.commands import compare, family, io, population, profiles, report, run
from qual.errors import InvalidJob, NotApplicable, QualError, Refused
from qual.exits import Exit, usage_error
from qual.workloads import registry


def version() -> str:
    """qual's version, and the I/O backends this machine has."""
    from importlib import metadata

    try:
        mine = metadata.version("qual")
    except metadata.PackageNotFoundError:  # a source tree on the path, not installed
        mine = "unknown (not installed)"
    uring = engine.io_uring_status() or "available"
    return f"qual {mine} (io_uring: {uring}; psync: available)"


def _parser(families: dict, only: str | None = None) -> argparse.ArgumentParser:
    """qual's parser; with `only` (the command a command line names), a family's subcommand
    only if it is that one: the families' generated flags are most of the parser's cost."""
    p = argparse.ArgumentParser(prog="qual", description=__doc__.split("\n")[0])
    p.add_argument("--version", action="version", version=version())
    sub = p.add_subparsers(dest="command", required=True)
    io.add(sub, families)
    run.add(sub, families)
    family.add(sub, families, only)
    for each in (report, compare, population, profiles):
        each.add(sub, families)
    return p


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def main(argv: list[str] | None = None) -> int:
    try:
        families = registry()
    except QualError as e:
        print(f"qual: error: {e}", file=sys.stderr)
        return Exit.USAGE
    argv = sys.argv[1:] if argv is None else list(argv)
    word = argv[0] if argv and not argv[0].startswith("-") else None
    parser = _parser(families, only=word)
    said = _subcommands(parser)
    if word is not None and word not in said.choices:  # its error lists every command
        parser = _parser(families)
        said = _subcommands(parser)
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "run":  # said with the command's own usage
        was = flags.renamed(args.family.fields) if hasattr(args, "family") else {}
        for word in extra:
            if word.split("=")[0] in was:
                said.choices[args.command].error(
                    f"{word.split('=')[0]} was renamed: use {was[word.split('=')[0]]}")
        said.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.handler(args, extra, families)
    except NotApplicable as e:  # nothing of the run applies here: refused before any I/O
        print(f"qual {args.command}: not applicable: {e}", file=sys.stderr)
        return Exit.REFUSED
    except Refused as e:  # the run as asked would measure nothing worth having
        print(f"qual {args.command}: refused: {e}", file=sys.stderr)
        return Exit.REFUSED
    except InvalidJob as e:  # the job's own parameters: a bad flag, refused before any I/O
        return usage_error(args.command, str(e))
    except QualError as e:
        print(f"qual {args.command}: error: {e}", file=sys.stderr)
        return Exit.FAIL
    except KeyboardInterrupt:
        print(f"qual {args.command}: interrupted", file=sys.stderr)
        return Exit.INTERRUPTED
    except BrokenPipeError:  # the reader went away (`qual ... | head`): nothing left to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return Exit.BROKEN_PIPE


def entry() -> int:
    """The `qual` command: main() in a supervised child (qual.watchdog.supervised), so that a
    command on storage that stopped answering still ends with its status."""
    return watchdog.supervised(main)


if __name__ == "__main__":
    sys.exit(entry())
