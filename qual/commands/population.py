"""The results store's commands: `qual accept` (a drive model over its drives), `qual
history` (its figures over firmware versions) and `qual store` (import, info)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from qual import store, thresholds
from qual.exits import Exit, ExitHelp, help_text, usage_error


def _add_model(parser) -> None:
    parser.add_argument("--model", required=True, help="the drive model, as the drives report it")


def add(sub, families: dict) -> None:
    """The three commands' parsers."""
    acc = sub.add_parser("accept", help="accept or reject a drive model over its drives (the "
                                        "store's latest run of each)",
                         description="Acceptance on a population (docs/store.md): each drive's "
                                     "latest run of the profile, of the model at the firmware, "
                                     "from the store. Per judged figure: the drives' median, MAD "
                                     "and spread (coefficient of variation), and each drive's "
                                     "robust z-score, judged by the profile's [population] "
                                     "table.",
                         epilog=help_text(
                             (Exit.PASS, "ACCEPT"),
                             (Exit.FAIL, "REJECT: a drive failed, an outlier, a spread too wide"),
                             (Exit.USAGE, "bad options, or no store"),
                             (Exit.INCOMPLETE, "INCOMPLETE: too few drives, or a run that "
                                               "decided nothing")),
                         formatter_class=ExitHelp)
    _add_model(acc)
    acc.add_argument("--firmware", required=True, help="the firmware revision")
    acc.add_argument("--profile", required=True, help="profile name or .toml path: its "
                                                      "criteria and [population] rules")
    store.add_option(acc, "the store to read")
    acc.add_argument("--json", action="store_true", help="print a JSON document")

    hist = sub.add_parser("history", help="how a drive model's figures moved over firmware "
                                          "versions and time (from the store)",
                          description="Per figure and firmware: runs, drives, the median, the "
                                      "first and last run; and a PNG chart per figure (a point "
                                      "per drive and run, each firmware's median line).",
                          epilog=help_text((Exit.PASS, "shown"), (Exit.USAGE, "bad options, "
                                           "no store, or no run of the model")),
                          formatter_class=ExitHelp)
    _add_model(hist)
    hist.add_argument("--metric", default=None, help="one metric (e.g. seq_read_bw; default all)")
    hist.add_argument("--profile", default=None, help="only runs of this profile name")
    hist.add_argument("--charts", default="qual-history", metavar="DIR",
                      help="where the charts go, one PNG per figure (default qual-history)")
    store.add_option(hist, "the store to read")
    hist.add_argument("--json", action="store_true", help="print a JSON document")

    st = sub.add_parser("store", help="the results store: import run records, say where it is",
                        description="Every qual run stores each drive's record in the results "
                                    "store as it ends (docs/store.md).",
                        epilog=help_text((Exit.PASS, "done"), (Exit.FAIL, "the store cannot "
                                         "be opened"), (Exit.USAGE, "a record was refused (the "
                                         "rest were stored)")),
                        formatter_class=ExitHelp)
    st_sub = st.add_subparsers(dest="store_command", metavar="{import,info}", required=True)
    imp = st_sub.add_parser("import", help="store run records (files, or folders searched for "
                                           "qual-run.json); one stored before is not stored again")
    imp.add_argument("paths", nargs="+", metavar="PATH",
                     help="qual-run.json files, or folders searched for them")
    info = st_sub.add_parser("info", help="the store's URL, schema version and what it holds")
    for each in (imp, info):
        store.add_option(each, "the store")
    acc.set_defaults(handler=handle_accept)
    hist.set_defaults(handler=handle_history)
    st.set_defaults(handler=handle_store)


def handle_accept(args, extra: list[str], families: dict) -> int:
    return cmd_accept(args, families)


def handle_history(args, extra: list[str], families: dict) -> int:
    return cmd_history(args)


def handle_store(args, extra: list[str], families: dict) -> int:
    return cmd_store(args)


def cmd_accept(args, families: dict) -> int:
    from qual import accept

    try:
        profile = thresholds.load_profile(args.profile, families)
        with store.open_store(args.store) as db:
            answer = accept.accept(db, args.model, args.firmware, profile)
    except thresholds.ProfileError as e:
        return usage_error("accept", f"--profile {args.profile}:\n{e}")
    except store.StoreError as e:
        return usage_error("accept", str(e))
    if not answer.drives:
        return usage_error("accept", f"no run of profile {profile.name} in the store is of "
                                     f"model {args.model!r} at firmware {args.firmware!r}")
    if args.json:
        print(json.dumps(answer.as_dict(), indent=2))
    else:
        print("\n".join(accept.lines(answer)))
    return answer.exit_status()


def cmd_history(args) -> int:
    import re

    from qual import history

    try:
        with store.open_store(args.store) as db:
            points = db.history(args.model, metric=args.metric, profile=args.profile)
    except store.StoreError as e:
        return usage_error("history", str(e))
    if not points:
        return usage_error("history", f"no stored run of model {args.model!r}" +
                           (f" measured {args.metric}" if args.metric else "") +
                           (f" with profile {args.profile}" if args.profile else ""))
    out = Path(args.charts)
    out.mkdir(parents=True, exist_ok=True)
    charts = []
    for figure, firmwares in history.by_figure(points).items():
        path = out / (re.sub(r"[^\w.=,-]+", "_", figure).strip("_") + ".png")
        path.write_bytes(history.chart(args.model, figure, firmwares))
        charts.append(str(path))
    if args.json:
        print(json.dumps({"model": args.model, "figures": history.rows(points),
                          "charts": charts}, indent=2))
    else:
        print("\n".join(history.lines(args.model, points)))
        print(f"{len(charts)} chart(s) in {out}/")
    return Exit.PASS


def cmd_store(args) -> int:
    try:
        if store.check_url(args.store) is None:
            raise store.StoreError("the store is off (QUAL_STORE=off): name one with --store")
    except store.StoreError as e:
        return usage_error("store", f"--store: {e}")
    try:
        with store.open_store(args.store) as db:
            if args.store_command == "info":
                print(f"store: {store.shown(db.url)}\nschema version: {db.version()}")
                for name, n in db.counts().items():
                    print(f"{name}: {n}")
                return Exit.PASS
            stored, refused = db.import_paths(args.paths)
    except store.StoreError as e:
        print(f"qual store: error: {e}", file=sys.stderr)
        return Exit.FAIL
    for path, run_id, new in stored:
        print(f"{'stored' if new else 'stored before'}: {path} (run {run_id})")
    for path, why in refused:
        print(f"refused: {path}: {why}", file=sys.stderr)
    print(f"{sum(new for *_, new in stored)} stored, {sum(not new for *_, new in stored)} "
          f"stored before, {len(refused)} refused, in {store.shown(db.url)}")
    return Exit.USAGE if refused else Exit.PASS
