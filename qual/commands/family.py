"""`qual <family>`: one subcommand per registered workload family, its flags generated from the
family's fields (or the family's own flags), run on --target with progress and an ETA on stderr,
printed as lines or as the outcome's --json document, and judged by qual.judge with --profile."""

from __future__ import annotations

import json
import sys
import time
import uuid

from qual import engine, store, watchdog
from qual.commands.target import (Reporter, add_target_flags, on_target, open_target,
                                  said_problems, watched)
from qual.family import Family
from qual.exits import Exit, ExitHelp, help_text, of_verdicts, usage_error
from qual.judge import judge
from qual.record import RunRecord, TestResult, rig_label, summarize
from qual.targets import Target
from qual.thresholds import ProfileError, family_table, load_profile
from qual.flags import add_field_flags, claimed, given
from qual.settings import described, duration


def add(sub, families: dict[str, Family], only: str | None = None) -> None:
    """A subcommand per family that runs from the command line; with `only` (the command a
    command line names), that family's alone: their generated flags are most of qual's
    parser's cost."""
    for family in families.values():
        if family.run is not None and only in (None, family.subcommand):
            add_parser(sub, family)


def handle(args, extra: list[str], families: dict[str, Family]) -> int:
    return run(args, families)


def add_parser(sub, family: Family) -> None:
    p = sub.add_parser(family.subcommand, help=family.description,
                       description=f"Run the {family.name} family ({family.description}) on a "
                                   "target and print what it measured; with --profile, judge it "
                                   "and store the run (docs/store.md).",
                       epilog=help_text(
                           (Exit.PASS, "done (with --profile: every criterion met)"),
                           (Exit.FAIL, "a criterion failed, or the drive failed an I/O"),
                           (Exit.USAGE, "a bad flag, before any I/O"),
                           (Exit.REFUSED, "refused, or not applicable to this target: said "
                                          "before any I/O"),
                           Exit.INCONCLUSIVE, (Exit.INCOMPLETE, "INCOMPLETE: a criterion not "
                                                                "judged"), Exit.INTERRUPTED),
                       formatter_class=ExitHelp)
    p.set_defaults(family=family, handler=handle)
    add_target_flags(p, "under .qual/")
    p.add_argument("--profile", default=None, metavar="NAME|FILE",
                   help=f"take the [{family.name}] table from this profile (flags override it) "
                        "and judge the measurements against its criteria: exit 1 on a failure")
    store.add_option(p, "with --profile: the results store the run's record goes to", off=True)
    if not _has_timeout_field(family):  # else the field's own flag sets it
        p.add_argument("--command-timeout", type=duration, default=None, metavar="DURATION",
                       help="end the command with a stall error when a call on the target has "
                            "not returned for this long (default: "
                            f"{watchdog.DEFAULT_COMMAND_TIMEOUT_S:g} s)")
    add_field_flags(p, family.fields)
    taken = claimed(family.fields)
    if "--seed" not in taken:
        p.add_argument("--seed", type=int, default=1,
                       help="seed of random offsets and write data (default 1)")
    if "--keep" not in taken and not (family.flags and family.flags.keeps):
        p.add_argument("--keep", action="store_true",
                       help="keep what the run made on the target (its scratch file, its data) "
                            "for the next run")
    if family.flags and family.flags.explain:
        p.add_argument("--plan", action="store_true",
                       help="print the arithmetic of what the run would do, and stop (nothing "
                            "is touched)")


def _settings(family: Family, args, profile):
    """The family's settings: the profile's table (if any) with the flags over it. Wrong
    flags are said per flag, before anything is touched."""
    flags = given(args, family.fields)
    base = profile.table(family.name) if profile else None
    if profile and base is None:
        raise ProfileError([(profile.path.name, family.name,
                             f"the profile has no [{family.name}] table")])
    if family.flags and not profile:
        flags = {**family.flags.defaults(flags), **flags}
    # the profile's table is parsed already: only the flags are parsed here
    return family_table(family, flags, base=base, label="flags")


def _has_timeout_field(family: Family) -> bool:
    return any(f.name == "command_timeout" for f in family.fields)


def _command_timeout(family: Family, args, settings) -> float:
    """The family's own command_timeout field where it has one, else --command-timeout."""
    if _has_timeout_field(family):
        return settings["command_timeout"]
    return args.command_timeout or watchdog.DEFAULT_COMMAND_TIMEOUT_S


def _run_on(family: Family, args, settings, say: Reporter, keep: bool):
    """The family's run on --target (locked unless torchrun's ranks share it), or on what its
    settings say it only reads (no lock, nothing removed)."""
    source = family.reads_from(settings)
    target = open_target(source or args.target, args)
    say.say(f"{family.name} on {source or target.spec} ({target.identity.label()})")
    # a family whose field takes --seed reads it from its table
    seeded = {"seed": args.seed} if "--seed" not in claimed(family.fields) else {}
    shared = family.flags.shared_target() if family.flags else False
    # torchrun ranks all open the target: rank 0 speaks for them

    def work(t: Target):
        try:
            return family.run(t, settings, progress=say, **seeded)
        finally:
            say.done()  # the last progress line before what the clean-up says
    return target, on_target(target, work, say=say.say, keep=keep or bool(source),
                             lock=not (source or shared),
                             remove=None if source else family.remove)


def run_record(family: Family, target: Target, profile, measured: list, verdict, started: str,
               seed: int | None) -> dict:
    """A family command's run as a run record (one test: the command), for the store: the
    profile's other families' criteria are not selected, so it is judged on its family's."""
    test = TestResult(f"qual {family.subcommand}", target.spec,
                      "failed" if verdict.failing else "passed")
    test.judged({"measurements": [m.as_dict() for m in measured], **verdict.as_dict()})
    others = sorted({c.family for c in profile.criteria} - {family.name})
    return RunRecord(
        target={"spec": target.spec, "kind": target.kind, "path": str(target.path),
                "identity": target.identity.as_dict()},
        profile=profile.as_dict(),
        engine={"io_uring": engine.io_uring_status() or "available",
                "backends_used": sorted({m.backend for m in measured if m.backend})},
        tests=[test], summary=summarize([test], profile, {"left_out": others, "tests": []}),
        started=started, finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"), seed=seed,
        run_id=uuid.uuid4().hex, rig=rig_label()).as_dict()


def verdict_line(record: dict | None, outcome, family: Family, profile) -> str:
    """`verdict: …`: the run record's own verdict (qual.record.summarize: FAIL, INCOMPLETE,
    INCONCLUSIVE, PASS) against the profile's criteria; "measured" where nothing was judged
    (FAIL where the run itself found a fault)."""
    s = record["summary"] if record else {}
    checks = s.get("checks_passed", 0) + s.get("checks_failed", 0)
    if not (checks or s.get("not_judged")):
        if outcome.exit_status() != Exit.PASS:
            return "verdict: FAIL (the run found a fault; see above)"
        why = f"profile {profile.name} has no {family.name} criteria" if profile else \
            "no --profile"
        return f"verdict: measured ({why}: nothing judged)"
    missing = len(s["not_judged"])
    return (f"verdict: {s['verdict']} against profile {profile.name}: {s['checks_passed']} of "
            f"{checks} checks passed" + (f", {missing} not judged" if missing else ""))


def run(args, families: dict[str, Family]) -> int:
    family: Family = args.family
    name = family.subcommand
    try:
        profile = load_profile(args.profile, families) if args.profile else None
        settings = _settings(family, args, profile)
        if profile:
            store.check_url(args.store)
    except store.StoreError as e:
        return usage_error(name, f"--store: {e}")
    except ProfileError as e:
        return said_problems(name, family.fields, e.problems)
    if getattr(args, "plan", False):
        doc, lines = family.flags.explain(settings)
        print(json.dumps(doc, indent=2) if args.json else "\n".join(lines))
        return Exit.PASS
    keep = (family.flags and family.flags.keeps) or getattr(args, "keep", False)
    say = Reporter(name, args.quiet)
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    with watched(name, family.reads_from(settings) or args.target,
                 _command_timeout(family, args, settings)):
        target, outcome = _run_on(family, args, settings, say, keep)
    if outcome is None:
        return Exit.PASS  # a rank other than 0 under torchrun
    measured = outcome.measurements()  # the honesty checks run here, with or without a profile
    verdict = judge(measured, profile) if profile else None
    record = run_record(family, target, profile, measured, verdict, started,
                        getattr(args, "seed", None)) if verdict else None
    if args.json:
        doc = outcome.document()
        if verdict:
            doc = {**doc, **verdict.as_dict(), "profile": profile.name}
        print(json.dumps(doc, indent=2, default=str))
    else:
        print(f"ran: {family.name} on {target.spec}: "
              + " ".join(described(family.fields, settings)))
        print("\n".join(outcome.lines()))
        if verdict and verdict.lines():
            print("\n".join(verdict.lines()))
        print(verdict_line(record, outcome, family, profile))
    if verdict:
        print(f"qual {name}: " + store.store_record(record, args.store), file=sys.stderr)
        verdict.raise_unresolved(target.spec)
        code = of_verdicts({record["summary"]["verdict"]})
        if code == Exit.FAIL:
            print(f"qual {name}: {len(verdict.failing)} of {verdict.checks} checks failed "
                  f"against profile {profile.name}", file=sys.stderr)
        elif code == Exit.INCOMPLETE:
            why = verdict.unverified[0] if verdict.unverified else \
                ", ".join(record["summary"].get("not_judged", ())) + " not measured"
            print(f"qual {name}: INCOMPLETE: {len(verdict.unverified)} criteria of profile "
                  f"{profile.name} not judged without proof: {why}", file=sys.stderr)
        elif code == Exit.INCONCLUSIVE:
            unsure = [v.line() for v in verdict.verdicts if v.inconclusive]
            print(f"qual {name}: INCONCLUSIVE: {unsure[0] if unsure else ''}", file=sys.stderr)
        if code != Exit.PASS:
            return code
    return outcome.exit_status()
