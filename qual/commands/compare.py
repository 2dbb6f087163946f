"""`qual compare`: a run record gated against its baseline (firmware CI)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from qual import record, report, store, units
from qual.exits import Exit, ExitHelp, help_text, usage_error


def add(sub, families: dict) -> None:
    """The command's parser."""
    cmp = sub.add_parser("compare", help="gate a run record against a baseline (firmware CI)",
                         description="Compare every judged measurement of NEW with the same "
                                     "measurement of the BASELINE runs (their repetitions "
                                     "pooled), against the profile's tolerance: regressed only "
                                     "when the change's 95 % interval lies wholly beyond it. "
                                     "The same run on both sides (the same run id and the same "
                                     "measurements) is identical: exit 0.",
                         epilog=help_text(
                             (Exit.PASS, "all within tolerance, or identical"),
                             (Exit.FAIL, "a regression"), (Exit.USAGE, "refused or unreadable"),
                             (Exit.IMPROVED, "no regression, but a metric improved beyond its "
                                             "tolerance (refresh the baseline)"),
                             (Exit.INCONCLUSIVE, "no regression, but the noise is larger than "
                                                 "the question for a metric: repeat it")),
                         formatter_class=ExitHelp)
    cmp.add_argument("records", nargs="+", metavar="BASELINE... NEW",
                     help="the previous run records (qual-run.json files, or folders of "
                          "them: runs of the old firmware), then the run record to judge (or a "
                          "folder of runs of the new firmware, pooled); with --baseline, only "
                          "the record to judge")
    cmp.add_argument("--baseline", default=None, metavar="SELECTOR|PATH",
                     help="the baseline from the results store: every run of a model and "
                          "firmware ('model=X firmware=1.2'), of one drive ('serial=S'), or "
                          "the newest N ('model=X last=N'), of NEW's profile unless "
                          "'profile=P' (docs/store.md)")
    store.add_option(cmp, "the store --baseline reads")
    cmp.add_argument("--all", action="store_true", dest="gate_all",
                     help="gate informational metrics too (default: those the profile judges "
                          "or gives a tolerance; the rest are shown)")
    cmp.add_argument("--tolerance", default=None,
                     help="for criteria with no tolerance of their own (default: the profile's)")
    cmp.add_argument("--allow-other-drive", action="store_true",
                     help="compare records of different drive models")
    cmp.add_argument("--allow-other-profile", action="store_true",
                     help="compare records of different profiles")
    cmp.add_argument("--accept-improvements", action="store_true",
                     help="exit 0, not 3, when metrics only improved")
    cmp.add_argument("--chart", default=None, metavar="PNG", help="write a before/after chart")
    cmp.add_argument("--json", action="store_true", help="print a JSON document")
    cmp.set_defaults(handler=handle)


def handle(args, extra: list[str], families: dict) -> int:
    return cmd_compare(args)


def cmd_compare(args) -> int:
    fail = functools.partial(usage_error, "compare")

    if args.baseline is not None and len(args.records) != 1:
        return fail("with --baseline, give only the run record to judge")
    if args.baseline is None and len(args.records) < 2:
        return fail("give the baseline run record(s), then the new one (or --baseline)")
    args.new = args.records[-1]
    try:  # NEW may be a folder of runs, pooled as the baseline's are
        news = [record.read_record(p) for p in record.record_paths([args.new])]
        new = news[0]
        if args.baseline is not None:
            base = store.baseline(args.baseline, args.store, profile=new["profile"].get("name"),
                                  exclude=record.run_id_of(new))
            olds, label, sources = base.records, base.label, [base.path]
            # the store's baseline grows with every stored run; a file baseline is replaced
            refresh = f"qual store import {args.new}" if store.is_selector(args.baseline) \
                else f"cp {args.new} {args.baseline}"
            args.baseline = base.path
        else:
            args.baseline = args.records[0]
            sources = [str(p) for p in record.record_paths(args.records[:-1])]
            olds = [record.read_record(p) for p in sources]
            label = Path(args.baseline).name + (f" and {len(olds) - 1} more run(s)"
                                                if len(olds) > 1 else "")
            refresh = f"cp {args.new} {args.baseline}"
        tolerance = units.parse_quantity(args.tolerance, "ratio") if args.tolerance else None
    except (ValueError, units.UnitError, store.StoreError) as e:
        return fail(str(e))
    # a run is never its own baseline: the same run on both sides is identical, not a
    # question. The same run id with other measurements (a copy someone changed, a stopped
    # run against its resumed one) is compared like any other run.
    judged = {record.run_id_of(n): record.comparable_measurements(n) for n in news}
    olds = [o for o in olds
            if judged.get(record.run_id_of(o)) != record.comparable_measurements(o)]
    if not olds:
        said = f"identical: {args.new} is the baseline run itself; there is nothing to compare"
        print(json.dumps({"baseline": args.baseline, "new": args.new, "identical": True,
                          "metrics": []}, indent=2) if args.json else said)
        return Exit.PASS
    old = olds[0]
    refused = sorted({r for o in olds for r in record.mismatches(
        o, model=record.drive_model(new), profile=new.get("profile", {}).get("name"))})
    refused = [r for r in refused if not (
        (r.startswith("drive model") and args.allow_other_drive) or
        (r.startswith("profile") and args.allow_other_profile))]
    if refused:
        return fail("; ".join(refused) + " (--allow-other-drive / --allow-other-profile to "
                    "compare them anyway)")
    rows, gone, added = record.compare_records(olds, news, old_label=label,
                                               default_tolerance=tolerance,
                                               gate_all=args.gate_all)
    if not rows:
        return fail(f"{args.new} and {args.baseline} share no comparable measurement")
    regressed = [r for r in rows if not r.passed]
    improved = [r for r in rows if r.improved]
    unsure = [r for r in rows if r.inconclusive]
    shown = [r for r in rows if not r.gated]
    if args.chart:
        Path(args.chart).write_bytes(report.baseline_chart(rows, f"{args.baseline} -> {args.new}"))
    if args.json:
        print(json.dumps({"baseline": args.baseline, "new": args.new,
                          "baselines": sources,
                          "metrics": [r.as_dict() for r in rows], "regressed": len(regressed),
                          "improved": len(improved), "inconclusive": len(unsure),
                          "not_gated": len(shown), "only_in_baseline": gone,
                          "only_in_new": added, "refresh_baseline": refresh}, indent=2))
    else:
        def pooled(runs: list) -> str:
            return f" (and {len(runs) - 1} more run(s), pooled)" if len(runs) > 1 else ""
        for label, path, doc, more in (("baseline", args.baseline, old, pooled(olds)),
                                       ("new", args.new, new, pooled(news))):
            print(f"{label:8}  {path}: {report.run_label(doc)}{more}")
        for line in report.table_lines(report.comparison_rows(rows),
                                       header=report.COMPARISON_HEADER):
            print(line)
        print(report.COMPARISON_KEY)
        within = len(rows) - len(regressed) - len(improved) - len(unsure) - len(shown)
        print(f"{len(rows)} compared: {len(regressed)} regressed, {len(improved)} improved "
              f"beyond tolerance, {len(unsure)} inconclusive, {within} within tolerance, "
              f"{len(shown)} informational (shown, not gated; --all gates them)")
        for mid in gone:
            print(f"not measured in the new run: {mid}")
        for r in regressed:
            print(f"REGRESSED: {r.line()}")
        for r in improved:
            print(f"IMPROVED: {r.line()}")
        for r in unsure:
            print(f"INCONCLUSIVE: {r.line()}")
        print(f"to make the new run the baseline: {refresh}")
    if regressed:
        return Exit.FAIL
    if unsure:
        return Exit.INCONCLUSIVE
    return Exit.IMPROVED if improved and not args.accept_improvements else Exit.PASS
