"""Acceptance on a population (qual accept, qual.accept): a drive model's drives from the
store, on SQLite and on a real PostgreSQL server. An outlier among passing drives is named and
no other; the model is accepted once it is run again in line; too few drives decide nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_store import MODEL, a_record
from testbed import Chromium, qual

from qual.exits import Exit
from qual.store import Store
from qual.thresholds import ProfileError, load_profile
from qual.workloads import registry

SEQ = "seq_read_bw[bs=1M,qd=16]"
LAT = "rand_read_lat[bs=4K,qd=1,pct=99]"
# four drives of one model read within 2 % of each other, each run three times
SIBLINGS = {"S1": (5.00e9, 5.08e9, 4.93e9), "S2": (5.05e9, 4.96e9, 5.02e9),
            "S3": (4.97e9, 5.04e9, 4.99e9), "S4": (5.06e9, 5.01e9, 4.95e9)}


def profile(tmp_path, population: str = "min_drives = 4") -> str:
    path = tmp_path / "acceptance.toml"  # the profile the drives ran
    path.write_text(f'[profile]\nextends = "ci"\ndescription = "a vendor acceptance"\n\n'
                    f"[population]\n{population}\n")
    return str(path)


def store_drives(url: str, reads: dict, firmware: str = "2.1", day: int = 1) -> None:
    with Store.open(url) as db:
        for serial, r in reads.items():
            db.put(a_record(serial, firmware, r, started=f"2026-12-0{day}T00:00:00+0000",
                            profile="acceptance"))


def accept(url: str, tmp_path, prof: str, firmware: str = "2.1") -> tuple[int, dict]:
    proc = qual("accept", "--store", url, "--model", MODEL, "--firmware", firmware,
                "--profile", prof, "--json", cwd=tmp_path, timeout=120)
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.slow
def test_an_outlier_among_passing_drives_is_rejected_by_name_then_accepted_in_line(
        store_url, tmp_path):
    prof = profile(tmp_path)
    slow = {**SIBLINGS, "S3": (3.00e9, 3.04e9, 2.97e9)}  # 60 % of its siblings' reads
    store_drives(store_url, slow)
    code, doc = accept(store_url, tmp_path, prof)
    assert code == Exit.FAIL and doc["answer"] == "REJECT"
    assert all(d["verdict"] == "PASS" for d in doc["drives"])  # each passed its own bounds
    figures = {f["id"]: f for f in doc["figures"]}
    assert figures[SEQ]["outliers"] == ["S3"] and figures[LAT]["outliers"] == []
    assert figures[SEQ]["median"] == pytest.approx(5.0e9, rel=0.01)
    assert [r for r in doc["reasons"] if "outlier" in r] == [
        r for r in doc["reasons"] if r.startswith("drive S3 is an outlier on " + SEQ)]
    # S3 run again, in line with its siblings: its latest run is the one judged
    store_drives(store_url, {"S3": SIBLINGS["S3"]}, day=2)
    code, doc = accept(store_url, tmp_path, prof)
    assert (code, doc["answer"], doc["reasons"]) == (Exit.PASS, "ACCEPT", [])
    (s3,) = [d for d in doc["drives"] if d["serial"] == "S3"]
    assert s3["started"].startswith("2026-12-02")
    proc = qual("accept", "--store", store_url, "--model", MODEL, "--firmware", "2.1",
                "--profile", prof, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1] == "verdict: ACCEPT"


def test_a_drive_that_failed_rejects_the_model(store_url, tmp_path):
    store_drives(store_url, {**SIBLINGS, "S2": (0.5e9, 0.5e9, 0.5e9)})  # below ci's floor
    code, doc = accept(store_url, tmp_path, profile(tmp_path))
    assert code == Exit.FAIL
    assert any(r.startswith("drive S2 failed: its run") and r.endswith("is FAIL")
               for r in doc["reasons"])


def test_too_few_drives_decide_nothing(store_url, tmp_path):
    store_drives(store_url, {s: SIBLINGS[s] for s in ("S1", "S2", "S3")})
    code, doc = accept(store_url, tmp_path, profile(tmp_path))
    assert (code, doc["answer"]) == (Exit.INCOMPLETE, "INCOMPLETE")
    assert "the profile asks for at least 4" in doc["reasons"][-1]


def test_a_tight_population_s_noise_is_no_outlier(store_url, tmp_path):
    """Drives 0.2 % apart but one 1.5 % off: its z-score is large (the MAD is tiny), yet it
    is within min_deviation of the median, so it is no outlier."""
    tight = {"S1": (5.000e9,) * 3, "S2": (5.010e9,) * 3, "S3": (4.995e9,) * 3,
             "S4": (5.075e9,) * 3}
    store_drives(store_url, tight)
    code, doc = accept(store_url, tmp_path, profile(tmp_path))
    (seq,) = [f for f in doc["figures"] if f["id"] == SEQ]
    assert abs(seq["z"]["S4"]) > 3.5 and seq["outliers"] == []
    assert code == Exit.PASS
    code, doc = accept(store_url, tmp_path, profile(tmp_path, 'min_drives = 4\n'
                                                              'min_deviation = "1 %"'))
    assert code == Exit.FAIL and [f["outliers"] for f in doc["figures"] if f["id"] == SEQ] == \
        [["S4"]]


def test_the_robust_z_is_scaled_to_a_standard_deviation(store_url, tmp_path):
    """z = 0.6745 (x - median) / MAD: five drives, one 0.4 GB/s above the median of 5.0 with a
    MAD of 0.1: its z is 2.70, inside the bound of 3.5, and the model is accepted (unscaled,
    it would read 4.0, an outlier)."""
    drives = {"S1": 5.00e9, "S2": 5.10e9, "S3": 4.90e9, "S4": 5.00e9, "S5": 5.40e9}
    store_drives(store_url, {s: (v,) * 3 for s, v in drives.items()})
    code, doc = accept(store_url, tmp_path, profile(tmp_path, "min_drives = 5"))
    (seq,) = [f for f in doc["figures"] if f["id"] == SEQ]
    assert (seq["median"], seq["mad"]) == (5.0e9, pytest.approx(0.1e9))
    assert seq["z"]["S5"] == pytest.approx(0.6745 * 4) and seq["z"]["S3"] == pytest.approx(
        -0.6745)
    assert seq["outliers"] == [] and (code, doc["answer"]) == (Exit.PASS, "ACCEPT")


def test_history_s_median_of_a_firmware_is_the_median_of_its_runs(store_url, tmp_path):
    """Three runs of one firmware at 5.0, 4.0 and 1.0 GB/s, stored in that order: the median
    is 4.0 (their mean is 3.33, the first 5.0)."""
    store_drives(store_url, {"S1": (5.0e9,) * 3, "S2": (4.0e9,) * 3, "S3": (1.0e9,) * 3},
                 firmware="3.0")
    proc = qual("history", "--store", store_url, "--model", MODEL, "--metric", "seq_read_bw",
                "--json", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(proc.stdout)["figures"]
    assert (row["firmware"], row["runs"], row["median"]) == ("3.0", 3, 4.0e9)


def test_the_strip_plot_names_the_outlier_and_only_it():
    """The population page's strip plot labels each outlier with its serial and z, and no
    other drive; its alt text says the outlier too."""
    from qual.accept import Figure
    from qual.charts import pyplot
    from qual.population_page import _plot_text, strip_figure

    f = Figure(SEQ, "B/s", {"S1": 5.0e9, "S2": 5.1e9, "S3": 3.0e9}, 0.1, median=5.0e9,
               mad=0.1e9, z={"S1": 0.0, "S2": 0.67, "S3": -13.5}, outliers=["S3"])
    fig = strip_figure(f)
    try:
        labels = [t.get_text() for t in fig.axes[0].texts]
    finally:
        pyplot().close(fig)
    assert labels == ["S3 (z -13.5)"]
    assert _plot_text(f) == f"{SEQ}: the drives' values; outlier S3"


def test_a_spread_beyond_its_bound_rejects(store_url, tmp_path):
    store_drives(store_url, SIBLINGS)
    rules = f'min_drives = 4\nspreads = {{ "{SEQ}" = "0.1 %" }}'
    code, doc = accept(store_url, tmp_path, profile(tmp_path, rules))
    assert code == Exit.FAIL
    assert [r for r in doc["reasons"] if "spread" in r] == [
        f"{SEQ}: spread {next(f['cv'] for f in doc['figures'] if f['id'] == SEQ) * 100:.1f} % "
        "over 4 drives, beyond its max_spread 0.1 %"]


@pytest.mark.parametrize("rules, problem", [
    ("min_drives = 0", "min_drives 0 is outside 1..10000"),
    ("outlier_z = -1", "-1 is not a positive number"),
    ("max_spread = \"many\"", "many"),
    ("colour = 1", "unknown"),
    ('spreads = { "seq_write_bw[bs=9M,qd=1]" = "5 %" }', "not a figure this profile judges"),
])
def test_a_population_table_is_checked_like_the_rest(tmp_path, rules, problem):
    with pytest.raises(ProfileError, match=problem):
        load_profile(profile(tmp_path, rules), registry())


def test_no_run_of_the_model_is_a_usage_error(store_url, tmp_path):
    store_drives(store_url, SIBLINGS)
    proc = qual("accept", "--store", store_url, "--model", "NOTHING", "--firmware", "2.1",
                "--profile", "ci", cwd=tmp_path, timeout=120)
    assert proc.returncode == Exit.USAGE and "no run of profile ci in the store is of model " \
        "'NOTHING'" in proc.stderr


@pytest.mark.slow
def test_history_shows_each_firmware_s_median_and_charts_every_figure(store_url, tmp_path):
    store_drives(store_url, SIBLINGS, firmware="2.0", day=1)
    slower = {s: tuple(v * 0.8 for v in r) for s, r in SIBLINGS.items()}
    store_drives(store_url, {s: slower[s] for s in ("S1", "S2")}, firmware="2.1", day=2)
    charts = tmp_path / "charts"
    proc = qual("history", "--store", store_url, "--model", MODEL, "--metric", "seq_read_bw",
                "--charts", str(charts), "--json", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    rows = {r["firmware"]: r for r in doc["figures"]}
    assert list(rows) == ["2.0", "2.1"] and {r["figure"] for r in doc["figures"]} == {SEQ}
    assert (rows["2.0"]["runs"], rows["2.0"]["drives"]) == (4, 4)
    assert (rows["2.1"]["runs"], rows["2.1"]["drives"]) == (2, 2)
    assert rows["2.0"]["median"] == pytest.approx(5.005e9, rel=1e-3)
    assert rows["2.1"]["median"] == pytest.approx(0.8 * 5.01e9, rel=2e-3)
    (chart,) = doc["charts"]
    assert Path(chart).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    proc = qual("history", "--store", store_url, "--model", MODEL, "--charts", str(charts),
                cwd=tmp_path, timeout=120)
    assert proc.returncode == 0 and "2 chart(s)" in proc.stdout  # every figure: read, latency
    assert sorted(p.name for p in charts.iterdir()) == [
        "rand_read_lat_bs=4K,qd=1,pct=99.png", "seq_read_bw_bs=1M,qd=16.png"]
    proc = qual("history", "--store", store_url, "--model", "NOTHING", "--charts",
                str(charts), cwd=tmp_path, timeout=120)
    assert proc.returncode == Exit.USAGE and "no stored run of model 'NOTHING'" in proc.stderr


def test_the_population_report_opens_from_disk_verdict_first(store_url, tmp_path):
    """`qual report --population`, opened from disk in a headless Chromium as a person opens a
    report someone sent: the verdict, then the reasons naming the outlier, a strip plot per
    figure (drawn: the images decoded), the table of drives with the outlier marked."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("no chromium to open the report (Debian: apt-get install chromium)")
    prof = profile(tmp_path)
    store_drives(store_url, {**SIBLINGS, "S3": (3.00e9, 3.04e9, 2.97e9)})
    out = tmp_path / "population"
    proc = qual("report", "--population", "--store", store_url, "--model", MODEL,
                "--firmware", "2.1", "--profile", prof, "--out", str(out), cwd=tmp_path,
                timeout=120)
    assert proc.returncode == Exit.FAIL and "verdict: REJECT" in proc.stdout, proc.stderr
    chrome = Chromium(browser)
    try:
        page = chrome.loaded((out / "index.html").as_uri(), timeout=120)  # beside other workers
        shown = chrome.evaluate(page, "document.body.innerText")
        drawn = chrome.evaluate(page, "[...document.images].map(i => i.complete && "
                                      "i.naturalWidth > 100)")
        marked = chrome.evaluate(page, "[...document.querySelectorAll('tr.bad td:first-child')]"
                                       ".map(td => td.innerText)")
        outliers = chrome.evaluate(page, "[...[...document.querySelectorAll('table')].pop()"
                                         ".querySelectorAll('tbody tr')].map(tr => [tr.cells[0]"
                                         ".innerText, tr.cells[tr.cells.length - 1].innerText])")
        alts = chrome.evaluate(page, "[...document.images].map(i => i.alt)")
    finally:
        chrome.close()
    lines = [x for x in shown.splitlines() if x.strip()]
    assert lines[1] == "REJECT"  # after the title, before anything else
    assert f"drive S3 is an outlier on {SEQ}" in shown
    assert drawn == [True, True]  # a strip plot per judged figure (read, latency)
    assert marked == ["S3", SEQ]  # the outlying drive, and the figure it is outlying on
    assert dict(outliers) == {LAT: "-", SEQ: "S3"}  # the figures table names it
    assert sorted(alts) == [f"{LAT}: the drives' values", f"{SEQ}: the drives' values; "
                                                            "outlier S3"]
