"""The report's first page (`qual report`'s DIR/index.html): what a person who opens a
qualification report reads first, counted as qual counts it. Per run: the verdict, the drive,
the profile; qual's own counts of criteria (passed, failed, regressed, inconclusive, not
judged); every criterion that failed, regressed or was inconclusive, in full, with the
repetitions behind its median; then the caveats; the criteria nobody judged in one line,
listed below with every other criterion. One self-contained file (no script, nothing
fetched), so it opens from disk as most people open a report someone sent; the Allure report
beside it holds the tests, their measurements, charts and logs."""

from __future__ import annotations

import html
from collections import Counter

from qual import report, units

COUNTED = (("PASS", "passed"), ("FAIL", "failed"), ("REGRESSED", "regressed"),
           ("INCONCLUSIVE", "inconclusive"), ("IMPROVED", "improved beyond tolerance"))


def counts(record: dict) -> dict[str, int]:
    """Each verdict of the run's criteria and baseline comparisons, and how many had it
    (the words of qual.report.summary_rows: PASS, FAIL, REGRESSED, … NOT JUDGED)."""
    return dict(Counter(row[4].split(" ")[0] if row[4].startswith("DEVICE ERROR") else row[4]
                        for rows in report.summary_rows(record).values() for row in rows))


def counts_line(record: dict) -> str:
    c = counts(record)
    said = [f"{c.get(word, 0)} {name}" for word, name in COUNTED
            if c.get(word) or word in ("PASS", "FAIL")]
    missing = sum(c.get(word, 0) for word in report.NOT_JUDGED)
    return f"criteria: {', '.join(said)}; {missing} not judged"


def evidence(test: dict, mid: str) -> str:
    """What stands behind a judged figure: the repetitions its median was taken of, and the
    interval, as the record keeps them ("" for a figure measured once)."""
    m = next((m for m in test.get("measurements", ()) if m["id"] == mid
              and m["context"].get("repetitions")), None)
    if m is None:
        return ""
    shown = [units.format_quantity(v, dimension=m.get("dimension")) for v in
             m["context"]["repetitions"]]
    said = f"the median of {len(shown)} repetitions ({', '.join(shown)})"
    interval = m["context"].get("interval")
    if interval:
        low, high = (units.format_quantity(v, dimension=m.get("dimension")) for v in interval)
        confidence = m["context"].get("interval_confidence", 0) * 100
        said += f", interval {low} .. {high} at {confidence:.0f} % confidence"
    return said


def attention(record: dict) -> list[tuple[str, str]]:
    """(verdict word, the whole sentence) for each criterion that failed, regressed or was
    inconclusive, what a measurement's context asks a person to see (`attention`: (word,
    sentence) pairs, such as each block a power cut lost), the drive's own errors, and a drive
    that stopped the run."""
    out = []
    for key, how in (("stalled", "STALLED"), ("device_gone", "DEVICE GONE")):
        if record.get(key):
            out.append((how, record[key]["what"]))
    for t in record["tests"]:
        for v in t.get("verdicts", ()):
            if not v["passed"] or v.get("inconclusive"):
                word = "INCONCLUSIVE" if v.get("inconclusive") else "FAIL"
                behind = evidence(t, v["id"])
                out.append((word, v["line"].removeprefix("INCONCLUSIVE: ")
                            + (f"; {behind}" if behind else "")))
        for r in t.get("regressions", ()):
            if not r["passed"] or r.get("inconclusive"):
                out.append(("REGRESSED" if not r["passed"] else "INCONCLUSIVE", r["line"]))
    for t in record["tests"]:  # what a family asks a person to see (a power cut's lost block)
        for m in t.get("measurements", ()):
            out += [(word, text) for word, text in m["context"].get("attention", ())]
    for found in record["summary"].get("device_errors", ()):
        out.append((f"DEVICE ERROR {found['errno']}",
                    f"{found['test'].split('::')[-1]}: {found['op']} at offset "
                    f"{found['offset']} on {found['target']}"))
    return out


def caveats(record: dict) -> list[tuple[str, list[str]]]:
    """Each caveat once, with the criteria whose verdict it qualifies (none: the run's)."""
    out: dict[str, list[str]] = {}
    for t in record["tests"]:
        for v in t.get("verdicts", ()):
            for c in v.get("caveats", ()):
                out.setdefault(c, []).append(v["id"])
    for c in record["summary"].get("caveats", ()):
        out.setdefault(c, [])
    return list(out.items())


def not_judged(record: dict) -> list[str]:
    return [row[0] for row in report.summary_rows(record).get("not judged", ())]


def run_section(record: dict, index: int) -> str:
    esc = html.escape
    s = record["summary"]
    ident = record["target"].get("identity") or {}
    drive = ", ".join(f"{k} {ident[k]}" for k in ("model", "serial", "firmware")
                      if ident.get(k)) or record["target"].get("spec")
    facts = [("drive", drive), ("target", record["target"].get("spec")),
             ("profile", f"{record['profile']['name']} ({record['profile']['digest']})"),
             ("started", record.get("started")), ("baseline", record.get("baseline"))]
    parts = [f"<section class='run' id='run-{index}'>",
             f"<p class='verdict v{esc(s['verdict'])}'>{esc(s['verdict'])}</p>",
             "<table class='facts'>",
             *(f"<tr><th>{esc(k)}</th><td>{esc(str(v))}</td></tr>" for k, v in facts if v),
             "</table>", f"<p class='counts'>{esc(counts_line(record))}</p>"]
    flagged = attention(record)
    if flagged:
        parts += ["<h2>Needs a decision</h2><ul class='attention'>",
                  *(f"<li><b class='{esc(word.split()[0])}'>{esc(word)}</b> {esc(text)}</li>"
                    for word, text in flagged), "</ul>"]
    said = caveats(record)
    if said:
        parts += ["<h2>Caveats</h2><ul class='caveats'>",
                  *(f"<li>{esc(c)}" + (f" <i>({esc(', '.join(ids))})</i>" if ids else "")
                    + "</li>" for c, ids in said), "</ul>"]
    missing = not_judged(record)
    if missing:
        parts.append(f"<p class='not-judged'>{len(missing)} criteria not judged (no measurement "
                     f"answered them, or none the device proved): listed below.</p>")
    parts += ["<h2>Every criterion</h2>", report.summary_tables(record), "</section>"]
    return "\n".join(parts)


STYLE = (".verdict{font-size:2em;font-weight:bold;color:#fff;display:inline-block;"
         "padding:.2em .6em;border-radius:6px;margin:.3em 0}"
         ".attention li,.caveats li{margin:.3em 0}.counts{font-size:1.1em}"
         "section.run{border-top:2px solid #d0d7de;padding-top:.5em}")


def page(records: list[dict], allure_href: str | None) -> str:
    """The first page of a report of these runs, linking the Allure report at allure_href."""
    title = report.report_name(records) if records else "qual qualification"
    found = "" if records else ("<p class='verdict vERROR'>NO RECORD</p><p>These results hold "
                                "no qual run record: the run did not finish, so nothing was "
                                "decided.</p>")
    more = (f"<p class='allure'>The tests, their measurements, charts and logs: "
            f"<a href='{html.escape(allure_href)}'>the Allure report</a> (one file; it opens "
            f"from disk too).</p>" if allure_href else "")
    body = "\n".join([f"<h1>{html.escape(title)}</h1>", more, found,
                      *(run_section(r, i) for i, r in enumerate(records))])
    return report.html_page(title, body, STYLE)
