"""`qual profiles` (the shipped profiles: list, show, check) and `qual clean` (what qual
made on a target, removed)."""

from __future__ import annotations

import json
import sys

from qual import report, thresholds, units
from qual.exits import Exit, ExitHelp, help_text
from qual.targets import Target
from qual.targets.filesystem import erase_leftover


def add(sub, families: dict) -> None:
    """The two commands' parsers."""
    prof = sub.add_parser("profiles", help="list the shipped profiles, show one, or check them",
                          description="Without NAME: the shipped profiles, a line each. With "
                                      "NAME (a shipped name or a .toml path): its settings, its "
                                      "families and every criterion (bound, unit, severity, "
                                      "tolerance, source, where it is written).",
                          epilog=help_text((Exit.PASS, "shown, or every bound can be met"),
                                           (Exit.FAIL, "--check found a bound no drive of the "
                                                       "class can meet"),
                                           (Exit.REFUSED, "the profile is invalid")),
                          formatter_class=ExitHelp)
    prof.add_argument("name", nargs="?", default=None, metavar="NAME",
                      help="the profile to show (default: list them all)")
    prof.add_argument("--json", action="store_true",
                      help="as JSON: the list (name, description, file, families, criteria), "
                           "or NAME's settings and criteria")
    prof.add_argument("--check", nargs="?", const="", default=None, metavar="PROFILE",
                      help="check that a drive of the class can meet every bound (link, "
                      "published peaks, dataset size): the shipped profiles, or this one; "
                      "exit 1 when one cannot")

    clean = sub.add_parser("clean", help="remove the scratch file qual created on a target, or "
                                         "the filesystem a killed run left on a block device",
                           description="Remove what qual provably made and a killed run left: "
                                       "its scratch file and lock in a folder, its own "
                                       "filesystem on a block device (by its label); never "
                                       "anything else.",
                           epilog=help_text((Exit.PASS, "removed, or nothing of qual's "
                                            "there"), (Exit.FAIL, "the target cannot be read"),
                                            (Exit.USAGE, "a bad argument")),
                           formatter_class=ExitHelp)
    clean.add_argument("target", nargs="?", default=None, metavar="TARGET",
                       help="the file, folder or block device a run was given (default: the "
                            "default target, .qual/target.dat)")
    prof.set_defaults(handler=handle_profiles)
    clean.set_defaults(handler=handle_clean)


def handle_profiles(args, extra: list[str], families: dict) -> int:
    if args.name is not None and args.check is None:
        return cmd_profile(families, args.name, as_json=args.json)
    return cmd_profiles(families, args.check if args.name is None else args.name,
                        as_json=args.json)


def handle_clean(args, extra: list[str], families: dict) -> int:
    return cmd_clean(args, families)


def cmd_profile(families: dict, name: str, as_json: bool = False) -> int:
    """`qual profiles NAME`: one profile's settings and criteria."""
    try:
        profile = thresholds.load_profile(name, families)
    except thresholds.ProfileError as e:
        print(f"qual profiles: error: {name}: invalid profile:\n{e}", file=sys.stderr)
        return Exit.REFUSED
    settings = {k: v for k, v in profile.as_dict().items()
                if k not in ("name", "description", "path", "files", "tolerances", "digest")}
    settings["population"] = dict(vars(profile.population))
    criteria = [{"id": c.id, "family": c.family, "metric": c.metric, "params": c.param_dict,
                 "min": c.min, "max": c.max, "unit": c.unit, "severity": c.severity,
                 "tolerance": c.tolerance, "source": c.source, "origin": c.origin}
                for c in profile.criteria]
    if as_json:
        print(json.dumps({"name": profile.name, "description": profile.description,
                          "files": [str(f) for f in profile.files], "digest": profile.digest,
                          "families": sorted(profile.tables), "settings": settings,
                          "criteria": criteria}, indent=2, default=str))
        return Exit.PASS
    print(f"{profile.name}: {profile.description}")
    print("files: " + " <- ".join(str(f) for f in profile.files))
    print("families: " + ", ".join(sorted(profile.tables)))
    rules = settings.pop("population")
    for key, value in settings.items():
        print(f"{key}: " + (f"{value * 100:g} %" if key == "tolerance" else str(value)))
    print(f"population (qual accept): at least {rules['min_drives']} drives, max_spread "
          f"{rules['max_spread'] * 100:g} %, outlier_z {rules['outlier_z']:g}, min_deviation "
          f"{rules['min_deviation'] * 100:g} %" + "".join(
              f", {mid} max_spread {r * 100:g} %" for mid, r in rules["spreads"].items()))
    rows = []
    for c in profile.criteria:
        bounds = [f">= {units.format_quantity(c.min, c.unit)}" if c.min is not None else "",
                  f"<= {units.format_quantity(c.max, c.unit)}" if c.max is not None else ""]
        tol = f"{c.tolerance * 100:g} %" if c.tolerance is not None else "-"
        rows.append((c.id, " and ".join(b for b in bounds if b), c.severity, tol, c.source,
                     c.origin))
    print(f"{len(rows)} criteria:")
    for line in report.table_lines(rows, header=("criterion", "bound", "severity", "tolerance",
                                                 "source", "written at")):
        print(line)
    return Exit.PASS


def cmd_profiles(families: dict, check: str | None = None, as_json: bool = False) -> int:
    from qual import feasibility, thresholds

    rows = thresholds.list_profiles(families)
    if as_json and check is None:
        docs = []
        for name, description, path in rows:
            doc = {"name": name, "description": description, "file": str(path)}
            try:
                profile = thresholds.load_profile(path, families)
                doc.update(families=sorted(profile.tables),
                           criteria=[c.id for c in profile.criteria])
            except thresholds.ProfileError as e:
                doc["problems"] = [f"{k}: {why}" for _, k, why in e.problems]
            docs.append(doc)
        print(json.dumps(docs, indent=2))
        return Exit.PASS
    if check is None:
        width = max(len(name) for name, _, _ in rows)
        for name, description, _ in rows:
            print(f"{name:<{width}}  {description}")
        return Exit.PASS
    failed = 0
    for spec in [check] if check else [name for name, _, _ in rows]:
        try:
            profile = thresholds.load_profile(spec, families)
        except thresholds.ProfileError as e:  # as `qual run` says it: exit 4, a line each
            print(f"qual profiles: error: {spec}: invalid profile:\n{e}", file=sys.stderr)
            return Exit.REFUSED
        problems = feasibility.problems(profile, families)
        print(f"{profile.name}: " + ("feasible" if not problems else
                                     f"{len(problems)} bound(s) no drive of the class can meet"))
        for p in problems:
            print(f"  {p}")
        failed += bool(problems)
    return Exit.FAIL if failed else Exit.PASS


def cmd_clean(args, families: dict) -> int:
    """`qual clean TARGET`: qual's leftover filesystem on a block device (only where its label
    proves it qual's), or every file and folder qual made in a file target's folder."""
    target = Target(args.target)
    if target.kind == "block":
        erased = erase_leftover(str(target.path))
        print(f"qual clean: {target.spec}: " + ("erased qual's filesystem" if erased
                                                else "no filesystem of qual's on it"))
        return Exit.PASS
    folder = target.directory
    before = set(folder.iterdir()) if folder is not None and folder.is_dir() else set()
    removed = target.cleanup()
    for family in families.values():
        if family.remove:
            family.remove(target)
    after = set(folder.iterdir()) if folder is not None and folder.is_dir() else set()
    removed += sorted(str(p) for p in before - after if str(p) not in removed)
    for path in removed:
        print(f"qual clean: removed {path}")
    if not removed:
        print(f"qual clean: nothing of qual's on {target.spec}")
    return Exit.PASS
