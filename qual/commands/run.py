"""`qual run`: the suites, a thin wrapper over pytest (its plan, its resume, the plugin's
options in its help)."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from qual import shipped, store
from qual.exits import Exit, help_text, usage_error
from qual.plugin.journal import JOURNAL_NAME, Journal
from qual.record import LAST_RECORD, RECORD_NAME


RUN_EXIT_CODES = help_text(Exit.PASS, Exit.FAIL, Exit.USAGE, Exit.REFUSED, Exit.INCONCLUSIVE,
                           Exit.INCOMPLETE, Exit.INTERRUPTED)


def _plugin_options() -> str:
    """The plugin's --qual-* options as help text: `qual run` passes them on to pytest untouched
    (its own parser must not take them), and its --help lists them."""
    from qual.plugin import hooks

    shown = argparse.ArgumentParser(prog="qual run", add_help=False, usage=argparse.SUPPRESS)
    hooks.pytest_addoption(_PytestOptions(shown.add_argument_group(
        "passed on to pytest (qual's plugin)")))
    return shown.format_help().strip() + "\n"


def _with_plugin_options(parser: argparse.ArgumentParser):
    """`qual run`'s help, ending with the plugin's options and the exit codes: read only when
    shown, since the plugin imports pytest, which no other command needs."""
    shown = parser.format_help

    def format_help() -> str:
        parser.epilog = f"{_plugin_options()}\n{RUN_EXIT_CODES}"
        return shown()
    return format_help


class _PytestOptions:
    """Stands in for pytest's option parser: collects the plugin's --qual-* options into an
    argparse group, only to show them."""

    def __init__(self, group):
        self.group = group

    def getgroup(self, *_args, **_kw):
        return self

    def addoption(self, *names, **kw):
        kw = {k: v for k, v in kw.items() if k in ("action", "default", "metavar", "help",
                                                    "choices", "type", "nargs", "const")}
        self.group.add_argument(*names, **kw)

    def addini(self, *_args, **_kw):
        pass


def add(sub, families: dict) -> None:
    """The command's parser."""
    run = sub.add_parser("run", help="run the qualification suites (a wrapper over pytest)",
                         description="Run the suites; unknown arguments go to pytest (-k, -n, "
                                     "-x, and the plugin's --qual-* options below).",
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    run.format_help = _with_plugin_options(run)
    run.add_argument("--target", action="append", default=None,
                     help="file, directory or block device; several for a rig's drives")
    run.add_argument("--profile", default=None, help="profile name or .toml path (default ci)")
    run.add_argument("--results", default=None,
                     help="folder for qual-run.json and allure-results/ (default qual-results)")
    run.add_argument("--resume", default=None, metavar="RESULTS",
                     help="continue the run whose results folder this is (killed, stopped, "
                          "the host rebooted): the tests it finished are kept, the rest of its "
                          "plan runs; its profile and drives unless given (refused for another "
                          "profile, drive serial or firmware, or qual version)")
    run.add_argument("--plan", action="store_true",
                     help="print what the run would do (tests, bytes, estimated seconds) and "
                          "every reason it cannot go ahead; run nothing (exit 4 if refused)")
    run.add_argument("--json", action="store_true", help="with --plan: the plan as JSON")
    store.add_option(run, "the results store each drive's record also goes to", off=True)
    run.set_defaults(handler=handle)


def handle(args, extra: list[str], families: dict) -> int:
    return cmd_run(args, extra, families)


def taken_option(extra: list[str], name: str) -> tuple[str | None, list[str]]:
    """The value of a pytest option among `qual run`'s extra arguments (`--name=V` or
    `--name V`; the last one given), and the arguments without it."""
    value, rest, i = None, [], 0
    while i < len(extra):
        if extra[i].startswith(f"{name}="):
            value = extra[i].split("=", 1)[1]
        elif extra[i] == name and i + 1 < len(extra):
            value = extra[i + 1]
            i += 1
        else:
            rest.append(extra[i])
        i += 1
    return value, rest


def cmd_run(args, extra: list[str], families: dict) -> int:
    import pytest

    # one results folder: the plugin's spelling of it is --results too (record and Allure
    # results always land together)
    given, extra = taken_option(extra, "--qual-results")
    if given is not None:
        if args.results is not None and Path(args.results) != Path(given):
            return usage_error("run", f"--results {args.results} and --qual-results {given} "
                                      "name two folders: give one")
        args.results = given
    if args.resume and args.results and Path(args.results) != Path(args.resume):
        print("qual run: error: --resume RESULTS is the results folder; --results names "
              "another", file=sys.stderr)
        return Exit.REFUSED
    results = Path(args.resume or args.results or "qual-results")
    alluredir = results / "allure-results"
    profile, targets = args.profile or "ci", args.target or ()
    if args.resume:
        try:
            run = resumed_run(results)
        except ValueError as e:
            print(f"qual run: error: --resume: {e}", file=sys.stderr)
            return Exit.REFUSED
        profile, targets = args.profile or run["profile"], args.target or run["targets"]
        extra = [*extra, "--qual-resume"]
    suites = [str(shipped("suites"))] + [str(f.suite) for f in families.values() if f.suite]
    # qual's own pytest settings, whatever folder it runs from (suites/pytest.ini); plugins a
    # qualification never uses are not loaded (hypothesis's alone took 0.7-1.1 s of CPU a run)
    argv = [*suites, "-c", str(shipped("suites") / "pytest.ini"), f"--qual-profile={profile}",
            f"--qual-results={results}", "-p", "no:cacheprovider", "-p", "no:benchmark",
            "-p", "no:hypothesispytest"]
    argv += [f"--qual-target={t}" for t in targets]
    if args.store:
        try:  # a store named wrongly: refused before any I/O, like any bad flag
            store.check_url(args.store)
        except store.StoreError as e:
            return usage_error("run", f"--store: {e}")
        argv.append(f"--qual-store={args.store}")
    if args.plan:
        return _plan(argv + extra, args.json)
    if args.json:
        print(f"qual run: error: --json goes with --plan (the run's record is "
              f"{results / RECORD_NAME})", file=sys.stderr)
        return Exit.REFUSED  # bad options, before any I/O (pytest's usage error)
    if _distributed(extra):  # the plan, and its refusals, before any worker starts
        code, doc, said = _collect_plan(argv + extra)
        if code != 0:
            sys.stderr.write(said if doc is None else "qual: refused before any I/O, nothing "
                             "was written:\n" + "".join(f"  - {r}\n" for p in doc.get(
                                 "drives", [doc]) for r in p["refusals"]))
            return code
    if not args.resume:
        # Allure results accumulate across runs: start clean, here and not under xdist
        # workers. The last record stays beside the new one's place: the plan's estimates
        # learn from it. A journal left by a killed run is no longer this folder's to resume.
        shutil.rmtree(alluredir, ignore_errors=True)
        for old in [results / RECORD_NAME, *results.glob(f"*/{RECORD_NAME}")]:
            if old.exists():
                old.replace(old.with_name(LAST_RECORD))
        for old in [results / JOURNAL_NAME, *results.glob(f"*/{JOURNAL_NAME}")]:
            old.unlink(missing_ok=True)
    code = int(pytest.main(argv + [f"--alluredir={alluredir}"] + extra))
    # pytest says 2 for Ctrl-C, which is qual's usage error: qual says 130, as its help does
    return Exit.INTERRUPTED if code == pytest.ExitCode.INTERRUPTED else code


def resumed_run(results: Path) -> dict:
    """The profile and drives of the run whose journal(s) a results folder holds (ValueError
    when it holds none: nothing to resume)."""
    found = [results / JOURNAL_NAME, *sorted(results.glob(f"*/{JOURNAL_NAME}"))]
    journals = [Journal.load(p) for p in found if p.exists()]
    if not journals:
        raise ValueError(f"{results} holds no journal ({JOURNAL_NAME}): nothing to resume (a "
                         "finished run leaves its record, not a journal)")
    return journals[0].header["run"]


def _collect_plan(argv: list[str]) -> tuple[int, dict | None, str]:
    """The suites collected in this process (nothing run) and their plan: pytest's exit status,
    the plan document (None when pytest refused before one: a bad profile or option) and what
    pytest said."""
    import contextlib
    import io

    import pytest

    with tempfile.TemporaryDirectory(prefix="qual-plan-") as scratch:
        out = Path(scratch) / "plan.json"
        said = io.StringIO()
        with contextlib.redirect_stdout(said):
            code = int(pytest.main([*argv, f"--qual-plan={out}", "-q", "-n", "0"]))
        doc = json.loads(out.read_text()) if out.exists() else None
    return code, doc, said.getvalue()


def _plan(argv: list[str], as_json: bool) -> int:
    """`qual run --plan`: the plan printed, as a table or as JSON."""
    from qual.plan import plan_lines

    code, doc, said = _collect_plan(argv)
    if doc is None:
        sys.stderr.write(said)
        return code
    if as_json:
        print(json.dumps(doc, indent=2))
    else:
        for plan in doc.get("drives", [doc]):
            for line in plan_lines(plan):
                print(line)
    return code


def _distributed(extra: list[str]) -> bool:
    """pytest-xdist's workers collect the tests, not the process that starts them."""
    return any(a in ("-n", "--numprocesses") or a.startswith(("-n", "--numprocesses="))
               for a in extra)
