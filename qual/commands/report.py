"""`qual report`: a run's HTML report (qual's first page and Allure's), or a drive model's
population page."""

from __future__ import annotations

import functools
import argparse
import json
import os
import shutil
from pathlib import Path

from qual import first_page, report, shipped, store, thresholds
from qual.exits import Exit, ExitHelp, help_text, usage_error
from qual.thresholds import DEFAULT_GATE, SEVERITIES
from qual.workloads import registry


REPORT_MARK = ".qual-report"  # in a report folder qual made: the only kind it overwrites


ALLURE_FOLDER = "allure"  # in a report folder: Allure's report of the tests


REPORT_TIMEOUT_S = 600  # building a report of thousands of results takes seconds, not minutes


def add(sub, families: dict) -> None:
    """The command's parser."""
    rp = sub.add_parser("report", help="the HTML qualification report (Allure 3)",
                        description="Build the report of one or more runs: DIR/index.html, "
                                    "qual's first page (the verdict, the drive, the profile, "
                                    "each criterion that needs a decision, the caveats), and "
                                    "DIR/allure/index.html, the Allure 3 report of the tests; "
                                    "both single files that open from disk. Then apply "
                                    "allurerc.mjs's quality gate.",
                        epilog=help_text((Exit.PASS, "built, and the gate holds"),
                                         (Exit.FAIL, "the gate failed"),
                                         (Exit.USAGE, "nothing to report, or no Allure 3 CLI")),
                        formatter_class=ExitHelp)
    rp.add_argument("results", nargs="*", help="qual results folders (qual-results/) or "
                                               "allure-results folders")
    rp.add_argument("--population", action="store_true",
                    help="instead: the acceptance report of a drive model's drives from the "
                         "store (--model, --firmware; --profile: default the newest run's), "
                         "one self-contained page (docs/store.md)")
    rp.add_argument("--model", default=None, help="with --population: the drive model")
    rp.add_argument("--firmware", default=None, help="with --population: the firmware")
    rp.add_argument("--profile", default=None,
                    help="with --population: the profile (default: the newest run's)")
    store.add_option(rp, "with --population: the store to read")
    rp.add_argument("--out", required=True,
                    help="the report folder (made by qual): index.html, qual's first page, "
                         "and allure/index.html, the tests; both single files that open from "
                         "disk")
    rp.add_argument("--single-file", action="store_true",
                    help=argparse.SUPPRESS)  # the default since every report opens from disk
    rp.add_argument("--history", default=None, metavar="JSONL",
                    help="trend history across runs (default: qual-history.jsonl beside --out)")
    rp.add_argument("--gate", choices=SEVERITIES, default=None,
                    help="least severity whose failed test fails the gate (default: the "
                         "profile's `gate`)")
    rp.set_defaults(handler=handle)


def handle(args, extra: list[str], families: dict) -> int:
    return cmd_report(args)


def cmd_report(args) -> int:
    import subprocess

    fail = functools.partial(usage_error, "report")

    if args.population:
        return population_report(args)
    if not args.results:
        return fail("give the results folder(s) to report (or --population)")
    allure_dirs, records = [], []
    for folder in map(Path, args.results):
        if not folder.is_dir():
            return fail(f"{folder} is not a folder")
        dirs, recs = report.find_results(folder)
        if not dirs:
            return fail(f"{folder} holds no Allure results (qual run writes them to "
                        "qual-results/allure-results)")
        allure_dirs += dirs
        records += recs
    out = Path(args.out)
    if out.exists() and any(out.iterdir()) and not (out / REPORT_MARK).exists():
        return fail(f"{out} is not empty and qual did not make it: give a new folder")
    package = report.allure_package()
    if package is None:
        return fail(report.ALLURE_MISSING)
    gate = args.gate or next((r["profile"].get("gate") for r in records
                              if r["profile"].get("gate")), DEFAULT_GATE)
    history = Path(args.history) if args.history else out.resolve().parent / "qual-history.jsonl"
    detail = out / ALLURE_FOLDER  # Allure's report, one file, beside qual's first page
    env = {**os.environ, "QUAL_REPORT_NAME": report.report_name(records) if records else
           "qual qualification", "QUAL_OUTPUT": str(detail.resolve()),
           "QUAL_HISTORY": str(history), "QUAL_SINGLE_FILE": "1",
           "QUAL_GATE_SEVERITIES": ",".join(SEVERITIES[:SEVERITIES.index(gate) + 1]),
           "QUAL_VARIABLES": json.dumps(report.front_page(records)),
           "NO_COLOR": "1", "FORCE_COLOR": "0"}
    out.mkdir(parents=True, exist_ok=True)
    (out / REPORT_MARK).write_text("made by qual report\n")
    if detail.exists():  # a previous report's (the folder is qual's: REPORT_MARK)
        shutil.rmtree(detail)
    report.forget_run(history, allure_dirs)  # reported again, a run is still one run in trends
    try:  # the report and the gate in one pass (allure/build.mjs): its tab shows this gate
        built = subprocess.run(["node", str(shipped("allure") / "build.mjs"), str(package),
                                str(shipped("allure") / "allurerc.mjs"),
                                *(str(d.resolve()) for d in allure_dirs)],
                               env=env, capture_output=True, text=True, timeout=REPORT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return fail(f"the Allure report did not finish within {REPORT_TIMEOUT_S} s")
    # the Awesome plugin writes to its output itself or, in some layouts, to its own subfolder
    nested = detail / "awesome"
    if not (detail / "index.html").exists() and (nested / "index.html").exists():
        for part in nested.iterdir():
            part.rename(detail / part.name)
        nested.rmdir()
    said = built.stdout.strip().splitlines()
    if built.returncode not in (0, 1) or not (detail / "index.html").exists() or not said:
        return fail(f"the Allure CLI could not build the report:\n{built.stdout}"
                    f"{built.stderr[-3000:]}\n{report.ALLURE_MISSING}")
    report.without_analytics(detail / "index.html")
    index = out / "index.html"
    index.write_text(first_page.page(records, f"{ALLURE_FOLDER}/index.html"))
    broken = json.loads(said[-1])["gate"]
    print(f"report: {index}")
    print(f"open it in a browser, from disk as it is: {index.resolve().as_uri()} (the Allure "
          f"report of the tests: {ALLURE_FOLDER}/index.html beside it)")
    print(f"history: {history}")
    print(f"quality gate (no failed test of severity {gate} or above): "
          + ("FAILED" if broken else "passed"))
    for rule in broken:
        print(f"  {rule['rule']}: {rule['message']}")
    return Exit.FAIL if broken else Exit.PASS


def population_report(args) -> int:
    """`qual report --population`: qual accept's answer as one self-contained page."""
    from qual import accept, population_page

    fail = functools.partial(usage_error, "report --population")

    if args.results or not args.model or not args.firmware:
        return fail("give --model and --firmware (and no results folder)")
    out = Path(args.out)
    if out.exists() and any(out.iterdir()) and not (out / REPORT_MARK).exists():
        return fail(f"{out} is not empty and qual did not make it: give a new folder")
    try:
        with store.open_store(args.store) as db:
            given = args.profile or db.newest_profile(args.model, args.firmware)
            if given is None:
                return fail(f"no stored run of model {args.model!r} at firmware "
                            f"{args.firmware!r}")
            profile = thresholds.load_profile(given, registry())
            answer = accept.accept(db, args.model, args.firmware, profile)
    except store.StoreError as e:
        return fail(str(e))
    except thresholds.ProfileError as e:
        return fail(f"profile {given}:\n{e}")
    if not answer.drives:
        return fail(f"no run of profile {profile.name} in the store is of model "
                    f"{args.model!r} at firmware {args.firmware!r}")
    out.mkdir(parents=True, exist_ok=True)
    (out / REPORT_MARK).write_text("made by qual report\n")
    index = out / "index.html"
    index.write_text(population_page.page(answer))
    print(f"report: {index} (one self-contained page: open it from disk)")
    print(f"verdict: {answer.answer}")
    return answer.exit_status()
