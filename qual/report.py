"""What people read: Allure metadata files, the terminal verdict table, and charts."""

from __future__ import annotations

import contextlib
import html
import json
import os
import math
import re
import time
import types
import uuid
from pathlib import Path

from qual import units
from qual.charts import png, subplots
from qual.targets.identity import drive_label

# Allure categories, matched in order (allurereport.org: categories file). A threshold or
# baseline violation is an AssertionError (status failed); an engine or target error is any
# other exception (status broken).
CATEGORIES = [
    {"name": "Threshold violations", "matchedStatuses": ["failed"],
     "messageRegex": r"(?s).*\] = .* (<|>) (min|max) .*"},
    {"name": "Baseline regressions", "matchedStatuses": ["failed"],
     "messageRegex": r"(?s).*worse than baseline.*"},
    {"name": "Unsafe target refused", "matchedStatuses": ["broken"],
     "traceRegex": r"(?s).*UnsafeTarget.*"},
    {"name": "Implausible measurements", "matchedStatuses": ["broken"],
     "traceRegex": r"(?s).*ImplausibleMeasurement.*"},
    {"name": "Engine errors", "matchedStatuses": ["broken"],
     "traceRegex": r"(?s).*(QualError|DeviceIoError|DataMismatch|NoSpace|TargetUnavailable|"
                   r"InvalidJob|BackendUnavailable|Cancelled).*"},
    {"name": "Infrastructure errors", "matchedStatuses": ["broken"]},
    {"name": "Not applicable", "matchedStatuses": ["skipped"]},
]


def environment(record: dict) -> dict[str, str]:
    """The drive, host, kernel, engine and profile, for Allure's environment widget."""
    ident = record["target"].get("identity") or {}
    host = record["host"]
    env = {
        "drive.model": ident.get("model"),
        "drive.serial": ident.get("serial"),
        "drive.firmware": ident.get("firmware"),
        "drive.device": ident.get("device"),
        "drive.link": " x".join(filter(None, [ident.get("link_speed"), ident.get("link_width")])),
        "target": record["target"].get("spec"),
        "target.kind": record["target"].get("kind"),
        "host": host.get("hostname"),
        "host.cpu": host.get("cpu"),
        "host.os": host.get("os"),
        "kernel": host.get("kernel"),
        "engine.backend": ", ".join(record["engine"].get("backends_used", [])) or "none",
        "engine.io_uring": record["engine"].get("io_uring"),
        "profile": f"{record['profile']['name']} ({record['profile']['digest']})",
        "qual": record.get("qual_version"),
    }
    return {k: str(v) for k, v in env.items() if v not in (None, "")}


def drive_name(record: dict) -> str:
    """The drive of a record, as every title names it."""
    return drive_label(record["target"].get("identity"), record["target"]["spec"])


# the worst of several runs leads
VERDICT_ORDER = ("FAIL", "ERROR", "INCOMPLETE", "INCONCLUSIVE", "PASS")


def report_name(records: list[dict]) -> str:
    """The report's title, on its first screen: the verdict (the worst of the runs'), the
    drive and the profile."""
    drives = sorted({drive_name(r) for r in records})
    profiles = sorted({r["profile"]["name"] for r in records})
    shown = drives[0] if len(drives) == 1 else f"{len(drives)} drives ({', '.join(drives)})"
    verdicts = [r.get("summary", {}).get("verdict") for r in records]
    worst = min((v for v in verdicts if v in VERDICT_ORDER), key=VERDICT_ORDER.index,
                default=None)
    return f"{worst + ': ' if worst else ''}Qualification: {shown} / {', '.join(profiles)}"


def write_allure_metadata(alluredir: Path, records: list[dict]) -> None:
    """environment.properties, executor.json and categories.json (written once, by the
    controller: the files are per run, not per worker). With several drives each drive's
    entries carry its number (drive1.model, ...)."""
    alluredir.mkdir(parents=True, exist_ok=True)
    env: dict[str, str] = {}
    for i, record in enumerate(records, 1):
        for k, v in environment(record).items():
            key = f"drive{i}.{k}" if len(records) > 1 and (k.startswith(("drive", "target"))) else k
            env[key] = v
    lines = [f"{k}={_escape(v)}" for k, v in env.items()]
    (alluredir / "environment.properties").write_text("\n".join(lines) + "\n")
    record = records[0]
    executor = {
        "name": "qual",
        "type": "qual",
        "buildName": f"qual {record.get('qual_version')} on {record['host'].get('hostname')}",
        "reportName": report_name(records),
    }
    (alluredir / "executor.json").write_text(json.dumps(executor, indent=2))
    (alluredir / "categories.json").write_text(json.dumps(CATEGORIES, indent=2))


def _escape(value: str) -> str:
    """A value for a Java .properties file."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace("=", "\\=").replace(":", "\\:")


# ------------------------------------------------------------------ terminal summary


VERDICT_HEADER = ("metric", "parameters", "measured", "bound", "margin", "verdict")
COMPARISON_HEADER = ("metric", "parameters", "baseline median", "new median",
                     "change [95 % interval]", "tolerance", "verdict")
COMPARISON_KEY = ("change: the gate's estimate of new against baseline, + better; with several "
                  "repetitions a side the Hodges-Lehmann estimate over every pair of repetitions, "
                  "not the ratio of the two medians")


def comparison_rows(regressions) -> list[tuple[str, ...]]:
    """(metric, parameters, baseline, new, change, tolerance, verdict) per compared metric,
    regressions first, then improvements beyond tolerance, then the rest."""
    order = sorted(regressions, key=lambda r: (r.passed, not r.inconclusive, not r.improved,
                                               not r.gated, r.id))
    rows = []
    for r in order:
        metric, _, params = r.id.partition("[")
        rows.append((metric, params.rstrip("]"),
                     units.format_quantity(r.baseline, dimension=r.dimension),
                     units.format_quantity(r.value, dimension=r.dimension),
                     f"{r.change * 100:+.1f} %" + (f" [{r.low * 100:+.1f}, {r.high * 100:+.1f}]"
                                                   if r.low != r.high else ""),
                     f"{r.tolerance * 100:g} %",
                     "REGRESSED" if not r.passed else "INCONCLUSIVE" if r.inconclusive else
                     "IMPROVED" if r.improved else "same" if r.gated else "(not gated)"))
    return rows


def run_label(record: dict) -> str:
    """drive model, serial, firmware, profile and start time of a run record."""
    ident = record.get("target", {}).get("identity") or {}
    drive = ", ".join(f"{k} {ident[k]}" for k in ("model", "serial", "firmware") if ident.get(k))
    return (f"{drive or record.get('target', {}).get('spec', 'unknown drive')}; profile "
            f"{record.get('profile', {}).get('name')}; {record.get('started')}")


def table_lines(rows: list[tuple[str, ...]], header: tuple[str, ...] = VERDICT_HEADER) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*header), fmt.format(*("-" * w for w in widths))] + \
           [fmt.format(*r) for r in rows]


# ------------------------------------------------------------------ the HTML report (Allure 3)

# Allure 3's Awesome page loads Google's analytics tag from the internet whenever it is opened
# (plugin-awesome sets analyticsEnable with no option to unset it): a qualification report
# opened on an air-gapped rig, or sent to a customer, must not call out, so qual takes it out
ANALYTICS = re.compile(r'<script async src="https://www\.googletagmanager\.com/[^"]*"></script>'
                       r'\s*<script>[^<]*gtag\([^<]*</script>\s*')


def without_analytics(page: Path) -> None:
    """Take Allure's analytics tag out of a report page it built (ANALYTICS)."""
    text = page.read_text()
    page.write_text(ANALYTICS.sub("", text, count=1))


ALLURE_MISSING = ("the HTML report needs the Allure 3 command line, the npm package `allure`: "
                  "install Node.js (Debian: apt-get install nodejs npm), then "
                  "`npm install -g allure@3.14` (later versions' quality gate needs Node.js 22)")


def allure_package() -> Path | None:
    """The folder of the Allure 3 npm package that `qual report` builds with (through Node.js
    and allure/build.mjs): the one behind `allure` on PATH, else one npm installed where qual
    runs (what `npx allure` would use); None without Node.js or Allure 3."""
    import shutil
    import subprocess

    if shutil.which("node") is None:
        return None
    candidates = []
    if shutil.which("allure"):
        candidates.append(Path(shutil.which("allure")).resolve().parent)
    try:
        local = subprocess.run(["node", "-p", "require.resolve('allure/package.json')"],
                               capture_output=True, text=True, timeout=60)
        if local.returncode == 0:
            candidates.append(Path(local.stdout.strip()).parent)
    except (OSError, subprocess.TimeoutExpired):
        pass
    for folder in candidates:
        try:
            meta = json.loads((folder / "package.json").read_text())
        except (OSError, ValueError):
            continue
        if meta.get("name") == "allure" and str(meta.get("version", "")).startswith("3."):
            return folder
    return None


def find_results(folder: Path) -> tuple[list[Path], list[dict]]:
    """Allure results folders and run records under a qual results folder (a single run, a
    multi-drive run with one folder per drive, or an allure-results folder itself)."""
    from qual.record import RECORD_NAME, read_record

    folder = Path(folder)
    if any(folder.glob("*-result.json")):  # an allure-results folder: its record is beside it
        allure_dirs, places = [folder], [folder.parent]
    else:
        allure_dirs = sorted({p.parent for p in folder.glob("**/*-result.json")})
        places = [folder, *folder.iterdir()] if folder.is_dir() else []
    records = []
    for path in sorted({p / RECORD_NAME for p in places if (p / RECORD_NAME).is_file()}):
        try:
            records.append(read_record(path))
        except ValueError:
            continue
    return allure_dirs, records


# ------------------------------------------------------------------ the qualification summary

SUMMARY_HEADER = ("criterion", "measured", "bound", "margin", "verdict", "source")


def summary_rows(record: dict) -> dict[str, list[tuple[str, ...]]]:
    """Per workload family, (criterion, measured, bound, margin, verdict, source) for every
    verdict and baseline comparison of the run, then every criterion nobody judged."""
    tables: dict[str, list[tuple[str, ...]]] = {}
    for t in record["tests"]:
        family = {m["id"]: m["family"] for m in t.get("measurements", [])}
        for v in t.get("verdicts", []):
            margin = f"{v['margin'] * 100:+.1f} %" if math.isfinite(v["margin"]) else "n/a"
            tables.setdefault(family.get(v["id"], "other"), []).append((
                v["id"], units.format_quantity(v["value"], v["unit"]),
                f"{v['bound']} {units.format_quantity(v['limit'], v['unit'])}", margin,
                "PASS" if v["passed"] else
                "INCONCLUSIVE" if v.get("inconclusive") else "FAIL",
                f"{Path(str(v.get('origin', ''))).name.split(':')[0]}: {v['source']}"))
        for r in t.get("regressions", []):
            tables.setdefault(family.get(r["id"], "other"), []).append((
                r["id"], units.format_quantity(r["value"], dimension=_dimension(t, r["id"])),
                "baseline " + units.format_quantity(r["baseline"], dimension=_dimension(t, r["id"])),
                f"{r['change'] * 100:+.1f} %",
                "REGRESSED" if not r["passed"] else "IMPROVED" if r["improved"] else
                "INCONCLUSIVE" if r.get("inconclusive") else "PASS",
                f"tolerance {r['tolerance'] * 100:g} %"))
    for found in record["summary"].get("device_errors", []):  # the drive's own answer
        where = f"{found['op']} at offset {found['offset']}" if found["op"] else ""
        tables.setdefault("device errors", []).append(
            (found["test"].split("::")[-1], where, "", "", f"DEVICE ERROR {found['errno']}",
             str(found["target"] or "")))
    unverified = {u.split(":", 1)[0]: u.split(":", 1)[1].strip()
                  for u in record["summary"].get("unverified", [])}
    for missing in record["summary"].get("not_judged", []):
        if missing in unverified:
            tables.setdefault("not judged", []).append(
                (missing, "", "", "", "UNVERIFIED", unverified[missing]))
        else:
            tables.setdefault("not judged", []).append((missing, "", "", "", "NOT JUDGED", ""))
    for left_out in record["summary"].get("not_selected", []):  # a subset's: decides nothing
        tables.setdefault("not selected", []).append(
            (left_out, "", "", "", "NOT SELECTED", "its tests were not selected (-k, -m)"))
    return tables


def _dimension(test: dict, mid: str) -> str | None:
    return next((m["dimension"] for m in test["measurements"] if m["id"] == mid), None)


def summary_lines(record: dict, source_width: int = 70) -> list[str]:
    """The summary for the terminal: one table per workload family, and how a drive that
    stopped the run (stalled, or gone) did."""
    lines = [f"{how}: {record[key]['what'].removeprefix('Stalled: ')}"
             + (f" (in {record[key]['test']})" if record[key].get("test") else "")
             for key, how in (("stalled", "stalled"), ("device_gone", "device gone"))
             if record.get(key)]
    tables = summary_rows(record)
    if not tables:
        return [*lines, "(no criterion was judged)"]
    left_out = tables.pop("not selected", [])
    for family, rows in tables.items():
        clipped = [(*r[:5], r[5] if len(r[5]) <= source_width else r[5][:source_width - 1] + "…")
                   for r in rows]
        lines += [f"[{family}]", *table_lines(clipped, header=SUMMARY_HEADER)]
    if left_out:  # a subset's: one line, each criterion once
        lines.append(f"not selected (-k, -m; decides nothing): {len(left_out)} criteria: "
                     + ", ".join(row[0] for row in left_out))
    return lines


def _starts(results: list[dict]) -> frozenset:
    """What identifies one run in Allure's history: its tests' start times."""
    return frozenset(r.get("start") for r in results)


def forget_run(history: Path, allure_dirs: list[Path]) -> int:
    """Drop from Allure's history file the entries of the run these results hold, before a
    report of it is built again: the build appends the run once more, so rebuilding a report
    never counts a run twice in the trends. Returns the entries dropped."""
    if not history.exists():
        return 0
    run = _starts([json.loads(f.read_text()) for d in allure_dirs
                   for f in d.glob("*-result.json")])
    lines = [line for line in history.read_text().splitlines() if line.strip()]
    kept = [line for line in lines
            if _starts(list((json.loads(line).get("testResults") or {}).values())) != run]
    if len(kept) < len(lines):
        tmp = history.with_name(f".{history.name}.tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, history)
    return len(lines) - len(kept)


def placement(record: dict) -> str | None:
    """Where the run's families ran on a raw namespace: on the device, and on the filesystem
    qual made there (its type and mkfs options); None for a file target."""
    where: dict[str, set[str]] = {}
    for t in record.get("tests", ()):
        if t.get("where") in ("raw", "filesystem"):
            where.setdefault(t["where"], set()).add(t["nodeid"].split("::")[0]
                                                    .rsplit("/", 1)[-1].removesuffix(".py"))
    if not where:
        return None
    fs = (record.get("plan") or {}).get("filesystem") or {}
    parts = []
    if where.get("raw"):
        parts.append(f"raw on the device: {', '.join(sorted(where['raw']))}")
    if where.get("filesystem"):
        parts.append(f"on qual's {fs.get('type', '')} filesystem (mkfs.{fs.get('type', '')} "
                     f"{' '.join(fs.get('options', ()))}, erased after): "
                     f"{', '.join(sorted(where['filesystem']))}")
    return "; ".join(parts)


def summary_body(record: dict) -> str:
    """The qualification summary: the drive's identity, the run's verdict, and one table
    per workload family with every criterion, measured value, bound, margin, verdict, source."""
    esc = html.escape
    ident = record["target"].get("identity") or {}
    facts = [("drive", drive_name(record)), ("serial", ident.get("serial")),
             ("firmware", ident.get("firmware")),
             ("link", " x".join(filter(None, [ident.get("link_speed"), ident.get("link_width")]))),
             ("target", record["target"].get("spec")), ("profile", record["profile"]["name"]),
             ("host", record["host"].get("hostname")), ("started", record.get("started")),
             ("baseline", record.get("baseline")), ("ran", placement(record))]
    s = record["summary"]
    parts = [
        f"<h1 id='qual-summary'>Qualification summary: {esc(drive_name(record))} "
        f"<span class='v v{esc(s['verdict'])}'>{esc(s['verdict'])}</span></h1>",
        "<table class='identity'>",
        *(f"<tr><th>{esc(k)}</th><td>{esc(str(v))}</td></tr>" for k, v in facts if v),
        "</table>",
        f"<p>{s['checks_passed']} checks passed, {s['checks_failed']} failed, "
        f"{s['tests_broken']} tests broken, {s['measurements']} measurements "
        f"({s['informational']} informational).</p>",
    ]
    parts += [f"<p class='caveat'>CAVEAT: {esc(c)}</p>" for c in s.get("caveats", ())]
    return "\n".join(parts) + "\n" + summary_tables(record)


def summary_tables(record: dict) -> str:
    """Per workload family, a table of every criterion: measured, bound, margin, verdict,
    source (HTML)."""
    esc = html.escape
    parts = []
    for family, rows in summary_rows(record).items():
        parts.append(f"<h2>{esc(family)}</h2><table class='summary'><tr>"
                     + "".join(f"<th>{esc(h)}</th>" for h in SUMMARY_HEADER) + "</tr>")
        for r in rows:
            cls = r[4].split()[0]
            parts.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r[:4])
                         + f"<td class='{esc(cls)}'>{esc(r[4])}</td><td>{esc(r[5])}</td></tr>")
        parts.append("</table>")
    return "\n".join(parts)


PAGE_STYLE = (
    "body{font:14px sans-serif;margin:1.5em;color:#1f2328}table{border-collapse:collapse;"
    "margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left;"
    "vertical-align:top}th{background:#eee}"
    ".PASS,.IMPROVED{color:#1a7f37}.FAIL,.REGRESSED,.NOT{color:#cf222e;font-weight:bold}"
    "h1 .v{padding:0 .4em;border-radius:4px;color:#fff}.vPASS{background:#1a7f37}"
    ".vFAIL,.vERROR,.vINCOMPLETE{background:#cf222e}.vINCONCLUSIVE{background:#9a6700}")


def html_page(title: str, body: str, style: str = "") -> str:
    """A self-contained page: its style inline, no script, nothing fetched."""
    return "\n".join([
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>", PAGE_STYLE + style,
        "</style></head><body>", body, "</body></html>"])


def summary_html(record: dict) -> str:
    """The summary as a page of its own (the Allure attachment)."""
    return html_page("qual summary", summary_body(record))


def write_summary_globals(alluredir: Path, record: dict, *, drive: str) -> Path:
    """The summary page (and, gated against a baseline, the before/after chart) as the run's
    global attachments: the report's "Global Attachments" tab. Not a test result of its own, so
    Allure's counts are the run record's tests and a failing criterion is listed once."""
    alluredir.mkdir(parents=True, exist_ok=True)
    page = f"{uuid.uuid4()}-attachment.html"
    (alluredir / page).write_text(summary_html(record))
    attachments = [{"name": f"Qualification summary on {drive}", "source": page,
                    "type": "text/html"}]
    compared = [r for t in record["tests"] for r in t.get("regressions", [])]
    if compared:  # gated against a baseline: before/after, metric by metric
        chart = f"{uuid.uuid4()}-attachment.png"
        (alluredir / chart).write_bytes(baseline_chart(compared, f"against {record['baseline']}"))
        attachments.append({"name": f"{drive} against the baseline", "source": chart,
                            "type": "image/png"})
    path = alluredir / f"{uuid.uuid4()}-globals.json"
    path.write_text(json.dumps({"attachments": attachments, "errors": []}, indent=1))
    return path


def write_stopped_results(alluredir: Path, stopped: list[tuple], drive: str) -> None:
    """Allure results for tests a stalled storage stopped, written by qual itself (the
    test's own thread, which would have written them, sits in the kernel): (nodeid, name,
    family, status, message) each, "broken" for the test that stalled, "skipped" after it."""
    import hashlib

    alluredir.mkdir(parents=True, exist_ok=True)
    now = int(time.time() * 1000)
    for nodeid, name, family, status, message in stopped:
        key = hashlib.md5(f"{nodeid}:{drive}".encode()).hexdigest()
        result = {"uuid": str(uuid.uuid4()), "historyId": key, "testCaseId": key,
                  "fullName": nodeid, "name": f"{name} on {drive}", "status": status,
                  "stage": "finished", "statusDetails": {"message": message},
                  "start": now, "stop": now,
                  "labels": [{"name": "epic", "value": family or "qual"},
                             {"name": "framework", "value": "qual"},
                             {"name": NODEID_LABEL, "value": nodeid}],
                  "parameters": [{"name": "drive", "value": drive}]}
        (alluredir / f"{result['uuid']}-result.json").write_text(json.dumps(result, indent=1))


NODEID_LABEL = "qual_test"  # the pytest node id on every qual test's Allure result


def forget_unfinished(alluredir: Path, finished: set[str]) -> int:
    """Before a run resumes: the Allure results of tests its journal does not hold as finished
    (the one in flight when it was killed) and the run's global summary go, so the resumed
    run's results hold each test once and one summary. Returns the files removed."""
    removed = 0
    for path in alluredir.glob("*-result.json"):
        try:
            labels = json.loads(path.read_text()).get("labels", [])
        except (OSError, ValueError):
            labels = []
        ids = {lab.get("value") for lab in labels if lab.get("name") == NODEID_LABEL}
        if not ids & finished:
            path.unlink()
            removed += 1
    for path in alluredir.glob("*-globals.json"):
        with contextlib.suppress(OSError, ValueError):
            for att in json.loads(path.read_text()).get("attachments", []):
                (alluredir / att["source"]).unlink(missing_ok=True)
        path.unlink()
        removed += 1
    return removed


ATTENTION = ("FAIL", "REGRESSED", "INCONCLUSIVE")
NOT_JUDGED = ("NOT JUDGED", "UNVERIFIED")


def front_page(records: list[dict]) -> dict[str, str]:
    """What the Allure report's landing page shows first (its report variables, in this
    order): per run the verdict, the drive, the profile, then each criterion that failed,
    regressed or was inconclusive (the key short, "FAIL 1", so the page does not clip the
    criterion, which leads the value with its measured value, bound, margin and source), then
    how many criteria were not judged (qual's first page lists them)."""
    out: dict[str, str] = {}
    for record in records:
        mine = f"{drive_name(record)}: " if len(records) > 1 else ""
        ident = record["target"].get("identity") or {}
        drive = ", ".join(f"{k} {ident[k]}" for k in ("model", "serial", "firmware")
                          if ident.get(k)) or record["target"].get("spec")
        out[f"{mine}verdict"] = record["summary"]["verdict"]
        out[f"{mine}drive"] = drive
        out[f"{mine}profile"] = f"{record['profile']['name']} ({record['profile']['digest']})"
        seen: dict[str, int] = {}
        missing = 0
        for rows in summary_rows(record).values():
            for criterion, measured, bound, margin, verdict, source in rows:
                if verdict in ATTENTION:
                    seen[verdict] = seen.get(verdict, 0) + 1
                    figures = f"{measured} vs {bound} ({margin})" if measured else ""
                    out[f"{mine}{verdict} {seen[verdict]}"] = f"{criterion}: " + "; ".join(
                        x for x in (figures, source) if x)
                missing += verdict in NOT_JUDGED
        if missing:
            out[f"{mine}not judged"] = f"{missing} criteria (listed on qual's first page)"
    return out


# ------------------------------------------------------------------ charts


def baseline_chart(regressions, title: str) -> bytes:
    """Before/after per compared metric: the new value as a percentage of the baseline's,
    with the tolerance band; red beyond it on the worse side, green beyond it on the better."""
    rows = sorted((types.SimpleNamespace(**r) if isinstance(r, dict) else r for r in regressions),
                  key=lambda r: r.id)
    fig, ax = subplots(figsize=(7.2, max(2.4, 0.32 * len(rows) + 1.2)))
    ys = range(len(rows))
    ratio = [100 * (1 + r.change) for r in rows]  # "better" direction is always to the right
    colours = ["tab:red" if not r.passed else "tab:green" if r.improved else "tab:grey"
               for r in rows]
    ax.barh(list(ys), [v - 100 for v in ratio], left=100, color=colours)
    for y, r in zip(ys, rows):
        ax.plot([100 * (1 - r.tolerance), 100 * (1 + r.tolerance)], [y, y], "k|", markersize=9)
    ax.axvline(100, color="k", linewidth=0.8)
    ax.set_yticks(list(ys), [r.id for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("new run, % of baseline (right is better; bars at the tolerance)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, axis="x", alpha=0.3)
    return png(fig)
