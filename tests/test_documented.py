"""Every `qual` command line the README and docs/ show works as written: each parses with
qual's own parser (every flag, every value as shown), and each that needs no device (the
profiles, a plan, the help, the store's info) runs as a user types it and exits 0."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from qual import cli
from qual.workloads import registry

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def documented_lines() -> list[tuple[str, str]]:
    """(page:line, the command line) of every `qual ...` line in a fenced block; a line
    continued with a backslash is joined; `$ ` prompts are dropped."""
    found = []
    for page in PAGES:
        in_block, line, start = False, "", 0
        for number, text in enumerate(page.read_text().splitlines(), 1):
            if text.strip().startswith("```"):
                in_block = not in_block
                continue
            said = text.strip().removeprefix("$ ")
            if not in_block or not (line or said.startswith("qual ")):
                continue
            line, start = (line + " " + said, start) if line else (said, number)
            if line.endswith("\\"):
                line = line[:-1]
                continue
            found.append((f"{page.relative_to(ROOT)}:{start}", line))
            line = ""
    return found


def as_written(line: str) -> list[str]:
    """The line's words after `qual`: its comment gone, its optional `[...]` parts and a
    trailing `...` left out (the line without them is the one a user can type)."""
    line = re.sub(r"\s\[[^\]]*\]", "", line)
    words = shlex.split(line, comments=True)
    assert words[0] == "qual"
    return [w for w in words[1:] if w != "..."]


# the documented lines that touch no device and no record: run whole, as written
NEEDS_NOTHING = {"profiles", "run --help", "store info"}


def needs_nothing(words: list[str]) -> bool:
    return " ".join(words) in NEEDS_NOTHING or ("--plan" in words and "--target" not in words)


LINES = documented_lines()


def test_the_docs_show_command_lines_of_every_kind():
    """The collector finds the lines (a change of the docs' fences would leave nothing to
    test): at least one of each command the pages document."""
    commands = {as_written(line)[0] for _, line in LINES}
    assert {"run", "io", "profiles", "report", "compare", "store", "accept", "history",
            "bandwidth", "checkpoint", "gnn", "train", "kvcache", "vectordb",
            "powercut"} <= commands
    assert sum(needs_nothing(as_written(line)) for _, line in LINES) >= 6


@pytest.mark.parametrize("where,line", LINES, ids=[w for w, _ in LINES])
def test_every_documented_line_parses(where, line):
    """Each line's flags and values are the parser's own: argparse would exit 2 on a flag
    that was renamed or a value it refuses."""
    words = as_written(line)
    families = registry()
    parser = cli._parser(families)
    if words[-1] == "--help":
        return  # help exits; it runs below
    args, extra = parser.parse_known_args(words)
    if args.command == "run":  # the rest goes to pytest: the plugin's options, and -n
        import argparse

        from qual.commands.run import _PytestOptions
        from qual.plugin import hooks

        pytest_side = argparse.ArgumentParser()
        pytest_side.add_argument("-n")  # pytest-xdist's
        hooks.pytest_addoption(_PytestOptions(pytest_side))
        _, left = pytest_side.parse_known_args(extra)
        assert not left, f"{where}: {line}: neither qual's nor the plugin's: {left}"
    else:
        assert not extra, f"{where}: {line}: not qual's flags: {extra}"


@pytest.mark.parametrize("where,line", [(w, l) for w, l in LINES
                                        if needs_nothing(as_written(l))],
                         ids=[w for w, l in LINES if needs_nothing(as_written(l))])
def test_every_documented_line_that_needs_no_device_runs(where, line, tmp_path):
    env = dict(os.environ, QUAL_STORE=f"sqlite:///{tmp_path / 'store.sqlite'}")
    proc = subprocess.run([sys.executable, "-m", "qual.cli", *as_written(line)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{where}: {line}\n{proc.stdout}\n{proc.stderr}"
    assert proc.stdout.strip()
    assert list(tmp_path.iterdir()) in ([], [tmp_path / "store.sqlite"])  # nothing else made
