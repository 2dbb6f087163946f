"""The results store (qual.store, docs/store.md), each test on an SQLite file and on a real
PostgreSQL server (tests/pgserver.py): a run stored whole and once, the schema its migrations
build, records refused with their reason, eight writers at once, a writer killed mid-write, a
store that cannot be reached when a run ends."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from pgserver import free_port
from testbed import HERE, IS_ROOT, TINY_PROFILE, load_record, qual

from qual import store
from qual.exits import Exit
from qual.measurement import measure, with_repetitions
from qual.record import RunRecord, TestResult, write_record
from qual.store import Store, StoreError
from qual.store.db import _sqlite_engine, utc
from qual.workloads.bandwidth import METRICS

MODEL = "QUALTEST NVMe M1"
SEQ = {"bs": 1 << 20, "qd": 16}


def a_record(serial: str = "S1", firmware: str = "1.0", reads: tuple = (5e9, 5.1e9, 4.9e9), *,
             floor: float = 1e9, model: str = MODEL, started: str = "2026-12-06T03:00:00+0000",
             profile: str = "ci") -> dict:
    """A drive's run record as qual writes it: one repeated, judged bandwidth figure and one
    latency figure measured once."""
    bw = with_repetitions(measure("bandwidth", METRICS["seq_read_bw"], SEQ, reads[-1],
                                  context={"backend": "io_uring", "device_truth": "counted"}),
                          list(reads))
    lat = measure("bandwidth", METRICS["rand_read_lat"], {"bs": 4096, "qd": 1, "pct": 99.0},
                  90e-6)
    passed = bw.value >= floor
    verdict = {"id": bw.id, "metric": bw.metric, "value": bw.value, "passed": passed,
               "inconclusive": False}
    tests = [TestResult("test_bandwidth.py::test_cell[seq_read-1M-qd16]", "d",
                        "passed" if passed else "failed", measurements=[bw.as_dict()],
                        verdicts=[verdict]),
             TestResult("test_bandwidth.py::test_latency", "d", measurements=[lat.as_dict()])]
    return RunRecord(
        target={"spec": "/dev/x", "kind": "block",
                "identity": {"model": model, "serial": serial, "firmware": firmware,
                             "capacity": 1 << 40, "link_speed": "32.0 GT/s PCIe",
                             "link_width": "4"}},
        profile={"name": profile, "digest": "d1"}, engine={}, tests=tests,
        summary={"verdict": "PASS" if passed else "FAIL"}, started=started,
        finished=started, run_id=uuid.uuid4().hex, rig="rig-a").as_dict()


def rows(url: str, sql: str) -> list[tuple]:
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as c:
            return [tuple(r) for r in c.execute(text(sql))]
    finally:
        engine.dispose()


def test_a_run_is_stored_whole_and_once_and_can_be_queried_with_sql(store_url):
    record = a_record()
    with Store.open(store_url) as db:
        run_id, new = db.put(record)
        assert new and run_id == record["run_id"]
        assert db.put(record) == (run_id, False)  # again: nothing changes
        assert db.counts() == {"drives": 1, "runs": 1, "measurements": 2}
    (drive,) = rows(store_url, "SELECT model, serial, firmware, capacity, link FROM drives")
    assert drive == (MODEL, "S1", "1.0", 1 << 40, "32.0 GT/s PCIe x4")
    (run,) = rows(store_url, "SELECT id, rig, profile, verdict, qual_version FROM runs")
    assert run[:4] == (run_id, "rig-a", "ci", "PASS") and run[4]
    # the run's start, in UTC whatever the server's zone (the test server's is New York)
    ((started,),) = rows(store_url, "SELECT started FROM runs")
    started = datetime.fromisoformat(started) if isinstance(started, str) else started  # SQLite
    assert utc(started) == datetime(2026, 12, 6, 3, 0, 0)
    # the docs' first example query: a metric's value per drive and firmware
    found = rows(store_url, """
        SELECT d.serial, d.firmware, m.value, m.unit, m.verdict, m.repetitions
        FROM measurements m JOIN runs r ON r.id = m.run_id JOIN drives d ON d.id = r.drive_id
        WHERE m.metric = 'seq_read_bw' ORDER BY r.started""")
    (serial, firmware, value, unit, verdict, repetitions) = found[0]
    assert (serial, firmware, value, unit, verdict) == ("S1", "1.0", 5e9, "B/s", "PASS")
    reps = repetitions if isinstance(repetitions, list) else json.loads(repetitions)
    assert reps == [5e9, 5.1e9, 4.9e9]
    (stored,) = rows(store_url, "SELECT record FROM runs")
    doc = stored[0] if isinstance(stored[0], dict) else json.loads(stored[0])
    assert doc == json.loads(json.dumps(record))  # the record itself, whole


def test_the_migrations_build_the_schema_the_code_declares(store_url):
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    with Store.open(store_url) as db, db.engine.connect() as c:
        diff = compare_metadata(MigrationContext.configure(c), store.metadata)
    assert diff == []


def test_a_store_of_a_newer_schema_is_refused(store_url):
    Store.open(store_url).close()
    engine = create_engine(store_url.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.begin() as c:
        c.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    engine.dispose()
    with pytest.raises(StoreError, match="newer than this qual's"):
        Store.open(store_url)


def test_what_is_not_a_whole_record_is_refused_with_its_reason_and_nothing_of_it_stored(
        store_url, tmp_path):
    good, newer = a_record(), {**a_record(), "schema": "qual-run/2"}
    write_record(tmp_path / "good" / "qual-run.json", good)
    write_record(tmp_path / "newer.json", newer)
    whole = json.dumps(a_record())
    (tmp_path / "cut.json").write_text(whole[:len(whole) // 2])
    (tmp_path / "other.json").write_text('{"hello": 1}')
    (tmp_path / "parts.json").write_text(json.dumps({**a_record(), "summary": None}))
    given = [str(tmp_path / p) for p in ("good", "newer.json", "cut.json", "other.json",
                                         "parts.json", "missing.json")]
    proc = qual("store", "import", "--store", store_url, *given, cwd=tmp_path, timeout=120)
    assert proc.returncode == Exit.USAGE, proc.stderr
    refused = dict(line.removeprefix("refused: ").split(": ", 1)
                   for line in proc.stderr.splitlines() if line.startswith("refused: "))
    assert set(refused) == set(given[1:]), proc.stderr
    assert "newer than this qual's" in refused[given[1]]
    assert "cut short" in refused[given[2]]
    assert "not a qual run record" in refused[given[3]]
    assert "summary" in refused[given[4]]
    assert "No such file" in refused[given[5]]
    with Store.open(store_url) as db:
        assert db.counts() == {"drives": 1, "runs": 1, "measurements": 2}
    assert rows(store_url, "SELECT id FROM runs") == [(good["run_id"],)]


WRITER = """
import json, sys, uuid
from qual.store import Store
url, template, n = sys.argv[1], json.load(open(sys.argv[2])), int(sys.argv[3])
me = sys.argv[4]
with Store.open(url) as db:
    for i in range(n):
        record = {**template, "run_id": f"{me}-{i}"}
        record["target"] = {**template["target"], "identity": {
            **template["target"]["identity"], "serial": f"{me}-{i % 5}"}}
        db.put(record)
        if len(sys.argv) > 5 and i == int(sys.argv[5]):
            print("stored", flush=True)
"""


@pytest.mark.slow
def test_eight_rigs_store_fifty_runs_each_at_once_every_run_once(store_url, tmp_path):
    template = tmp_path / "record.json"
    template.write_text(json.dumps(a_record()))
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, store_url, str(template), "50",
                                 f"rig{w}"], stderr=subprocess.PIPE, text=True)
               for w in range(8)]
    for w in writers:
        _, err = w.communicate(timeout=300)
        assert w.returncode == 0, err
    with Store.open(store_url) as db:
        assert db.counts() == {"drives": 40, "runs": 400, "measurements": 800}
    assert rows(store_url, "SELECT count(DISTINCT id) FROM runs") == [(400,)]
    # none partial: every run has both its measurements
    assert rows(store_url, "SELECT count(*) FROM runs r WHERE (SELECT count(*) FROM "
                           "measurements m WHERE m.run_id = r.id) <> 2") == [(0,)]


@pytest.mark.slow
def test_a_writer_killed_mid_write_leaves_no_partial_run(store_url, tmp_path):
    """SIGKILL while runs are being stored, again and again: every run there is whole."""
    template = tmp_path / "record.json"
    big = a_record()
    # many measurements a run, so the kill lands inside a run's transaction
    big["tests"] = big["tests"] * 200
    template.write_text(json.dumps(big))
    Store.open(store_url).close()
    for attempt in range(5):
        w = subprocess.Popen([sys.executable, "-c", WRITER, store_url, str(template), "100",
                              f"k{attempt}", "0"], stdout=subprocess.PIPE, text=True)
        assert w.stdout.readline().strip() == "stored"  # one run in, others on their way
        time.sleep(0.05 * attempt)
        w.send_signal(signal.SIGKILL)
        w.wait(timeout=30)
    counts = rows(store_url, "SELECT r.id, (SELECT count(*) FROM measurements m WHERE "
                             "m.run_id = r.id) FROM runs r")
    assert len(counts) >= 5 and {n for _, n in counts} == {400}, counts


@pytest.mark.slow
def test_a_run_whose_store_cannot_be_reached_keeps_its_record_and_its_exit_status(tmp_path,
                                                                                 postgres):
    """The store is down when the run ends: the record stays on disk, the run says `not
    stored: <reason>` and keeps its exit status; `qual store import` stores it later."""
    results = tmp_path / "results"
    down = f"postgresql://postgres@127.0.0.1:{free_port()}/nothing"
    proc = qual("run", "--profile", str(TINY_PROFILE), "--target", str(tmp_path / "t.dat"),
                "--results", str(results), "--store", down, "-k", "test_cell", cwd=tmp_path,
                timeout=300)
    assert proc.returncode == Exit.PASS, proc.stdout[-3000:]
    said = [line for line in proc.stdout.splitlines() if "stored" in line]
    assert said and said[-1].startswith("not stored: store postgresql://postgres@127.0.0.1")
    assert "Connection refused" in said[-1] or "connection failed" in said[-1]
    record = load_record(results)
    url = postgres.new_database()
    proc = qual("store", "import", "--store", url, str(results), cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert rows(url, "SELECT id, verdict FROM runs") == [(record["run_id"], "PASS")]


@pytest.mark.slow
def test_a_run_stores_its_record_as_it_ends(tmp_path, store_url):
    results = tmp_path / "results"
    proc = qual("run", "--profile", str(TINY_PROFILE), "--target", str(tmp_path / "t.dat"),
                "--results", str(results), "--store", store_url, "-k", "test_cell",
                cwd=tmp_path, timeout=300)
    assert proc.returncode == Exit.PASS, proc.stdout[-3000:]
    record = load_record(results)
    assert f"as run {record['run_id']}" in proc.stdout
    assert rows(store_url, "SELECT id, verdict, profile FROM runs") == \
        [(record["run_id"], "PASS", "tiny")]
    stored = rows(store_url, "SELECT measurement FROM measurements")
    final = [m["id"] for t in record["tests"] for m in t["measurements"]
             if (m["context"].get("repetition") or [1, 1])[0] ==
             (m["context"].get("repetition") or [1, 1])[1]]
    assert sorted(m for (m,) in stored) == sorted(final) and final


def test_a_store_named_wrongly_is_refused_before_any_io(tmp_path):
    target = tmp_path / "t.dat"
    proc = qual("run", "--profile", str(TINY_PROFILE), "--target", str(target), "--results",
                str(tmp_path / "r"), "--store", "mysql://db/qual", cwd=tmp_path, timeout=120)
    assert proc.returncode == Exit.USAGE
    assert "qual run: error: --store: mysql://db/qual: qual stores in SQLite or PostgreSQL" in \
        proc.stderr
    assert not target.exists() and not (tmp_path / "r").exists()


def test_a_store_named_wrongly_exits_alike_through_pytest_itself(tmp_path):
    """The plugin, run by pytest without `qual run`, refuses the same store with the same exit
    status (2, a bad argument of qual's), before any I/O."""
    target = tmp_path / "t.dat"
    proc = subprocess.run([sys.executable, "-m", "pytest", str(HERE.parent / "suites"),
                           "-p", "no:cacheprovider", f"--qual-profile={TINY_PROFILE}",
                           f"--qual-target={target}", f"--qual-results={tmp_path / 'r'}",
                           "--qual-store=mysql://db/qual"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == Exit.USAGE, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "--qual-store: mysql://db/qual: qual stores in SQLite or PostgreSQL" in \
        proc.stdout + proc.stderr
    assert not target.exists() and not (tmp_path / "r").exists()


def test_the_documented_queries_run_on_both_databases(store_url):
    """The README's example queries, as written, answer from a store with two firmwares."""
    doc = (HERE.parent / "README.md").read_text()
    queries = [q for block in re.findall(r"```sql\n(.*?)```", doc, re.S)
               for q in block.split(";") if "SELECT" in q]
    model = re.search(r"d\.model = '([^']+)'", doc).group(1)
    with Store.open(store_url) as db:
        db.put(a_record("S1", "1.0", model=model, started="2026-12-01T00:00:00+0000"))
        db.put(a_record("S1", "1.1", reads=(0.5e9, 0.5e9, 0.5e9), model=model,
                        started="2026-12-02T00:00:00+0000"))
    first, second = (rows(store_url, q) for q in queries)
    assert [(r[2], round(r[4], 2), r[5]) for r in first] == [("1.0", 5.0, "PASS"),
                                                             ("1.1", 0.5, "FAIL")]
    assert second == [("1.0", 1, 0), ("1.1", 1, 1)]


def test_a_selector_picks_a_model_s_firmware_one_drive_or_the_newest_runs(store_url):
    made = {}
    with Store.open(store_url) as db:
        for day, (serial, fw) in enumerate([("S1", "1.0"), ("S2", "1.0"), ("S1", "1.1"),
                                            ("S3", "1.0")], start=1):
            record = a_record(serial, fw, started=f"2026-12-0{day}T00:00:00+0000")
            db.put(record)
            made[(serial, fw)] = record["run_id"]
        db.put(a_record("S9", "1.0", model="OTHER"))
        db.put(a_record("S1", "1.0", profile="nvme-rig"))

        def picked(text: str, **kw) -> list[str]:
            return [r["run_id"] for r in db.select(store.parse_selector(text), **kw)]

        # newest first; of the profile asked for (a profile= in the selector wins)
        assert picked(f"model='{MODEL}' firmware=1.0", profile="ci") == \
            [made["S3", "1.0"], made["S2", "1.0"], made["S1", "1.0"]]
        assert picked("serial=S1", profile="ci") == [made["S1", "1.1"], made["S1", "1.0"]]
        assert picked(f"model='{MODEL}' last=2", profile="ci") == \
            [made["S3", "1.0"], made["S1", "1.1"]]
        assert len(picked("serial=S1 profile=nvme-rig", profile="ci")) == 1
        assert picked("serial=S1", profile="ci", exclude=made["S1", "1.1"]) == \
            [made["S1", "1.0"]]
    for bad, why in (("firmware=1.0", "name the drives"), ("model=X colour=red", "not one of"),
                     ("model=X last=0", "a count of runs"), ("model='X", "quotation"),
                     ("model=X model=Y", "given twice")):
        with pytest.raises(ValueError, match=why):
            store.parse_selector(bad)


@pytest.mark.slow
def test_the_gate_pools_its_baseline_from_the_store(store_url, tmp_path):
    """`qual compare --store … --baseline 'model=X firmware=1.0' NEW`: every run of the old
    firmware pooled (their repetitions together), the same three answers as with files."""
    with Store.open(store_url) as db:
        for serial, reads in (("S1", (5.0e9, 5.1e9, 4.9e9)), ("S2", (5.05e9, 4.95e9, 5.0e9)),
                              ("S3", (5.1e9, 5.0e9, 4.9e9))):
            db.put(a_record(serial, "1.0", reads))
    slower = tmp_path / "slower.json"
    write_record(slower, a_record("S1", "1.1", (4.0e9, 4.05e9, 3.95e9)))
    same = tmp_path / "same.json"
    write_record(same, a_record("S1", "1.1", (5.0e9, 5.05e9, 4.95e9)))
    selector = f"model='{MODEL}' firmware=1.0"
    proc = qual("compare", "--store", store_url, "--baseline", selector, str(slower), "--json",
                cwd=tmp_path, timeout=120)
    assert proc.returncode == Exit.FAIL, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    (bw,) = [m for m in doc["metrics"] if m["id"].startswith("seq_read_bw")]
    assert bw["answer"] == "regressed" and bw["repetitions"] == [3, 9]  # three runs pooled
    assert bw["baseline"] == pytest.approx(5.0e9)
    assert doc["refresh_baseline"] == f"qual store import {slower}"
    proc = qual("compare", "--store", store_url, "--baseline", selector, str(same),
                cwd=tmp_path, timeout=120)
    assert proc.returncode in (Exit.PASS, Exit.INCONCLUSIVE), proc.stdout + proc.stderr
    assert f"{selector}: model {MODEL}" in proc.stdout and "and 2 more run(s)" in proc.stdout
    proc = qual("compare", "--store", store_url, "--baseline", "model=NOTHING", str(same),
                cwd=tmp_path, timeout=120)
    assert proc.returncode == Exit.USAGE and "no run of profile ci" in proc.stderr


@pytest.mark.slow
def test_a_run_gates_against_the_store_s_runs_of_its_drive(tmp_path, store_url):
    """`qual run --store … --qual-baseline serial=S`: the baseline is the store's runs of that
    drive; the record says where it came from and holds the gate's answers."""
    first, second = tmp_path / "first", tmp_path / "second"
    run = ("run", "--profile", str(TINY_PROFILE), "--target", str(tmp_path / "t.dat"),
           "--store", store_url, "-k", "test_cell")
    proc = qual(*run, "--results", str(first), cwd=tmp_path, timeout=300)
    assert proc.returncode == Exit.PASS, proc.stdout[-3000:]
    serial = load_record(first)["target"]["identity"]["serial"]
    proc = qual(*run, "--results", str(second), f"--qual-baseline=serial='{serial}'",
                cwd=tmp_path, timeout=300)
    assert proc.returncode in (Exit.PASS, Exit.INCONCLUSIVE, Exit.IMPROVED, Exit.FAIL), \
        proc.stdout[-3000:]
    record = load_record(second)
    assert record["baseline"].endswith(f"serial='{serial}'")
    gated = [r for t in record["tests"] for r in t["regressions"]]
    assert gated and all(f"[baseline: store serial='{serial}'" in r["line"] for r in gated)


@pytest.mark.slow
def test_a_family_command_with_a_profile_stores_its_run_judged_on_its_own_criteria(
        tmp_path, store_url):
    proc = qual("integrity", "--profile", "ci", "--target", str(tmp_path / "t"), "--store",
                store_url, "-q", cwd=tmp_path, timeout=300)
    assert proc.returncode == Exit.PASS, proc.stderr
    (said,) = [x for x in proc.stderr.splitlines() if "stored" in x]
    (run_id, verdict, doc) = rows(store_url, "SELECT id, verdict, record FROM runs")[0]
    assert said.startswith("qual integrity: stored in ") and said.endswith(f"as run {run_id}")
    record = doc if isinstance(doc, dict) else json.loads(doc)
    # the profile's other families' criteria are not selected: it is judged on its own
    assert verdict == "PASS" and record["tests"][0]["nodeid"] == "qual integrity"
    assert set(record["summary"]["not_selected"]) and not record["summary"]["not_judged"]
    judged = rows(store_url, "SELECT measurement, verdict FROM measurements WHERE verdict "
                             "IS NOT NULL")
    assert sorted(judged) == [("integrity_bad_blocks[pattern=random]", "PASS"),
                              ("integrity_bad_blocks[pattern=sequential]", "PASS")]
    proc = qual("integrity", "--target", str(tmp_path / "t"), "--store", store_url, "-q",
                cwd=tmp_path, timeout=300)  # no profile: nothing judged, nothing stored
    assert proc.returncode == Exit.PASS and "stored" not in proc.stderr
    assert len(rows(store_url, "SELECT id FROM runs")) == 1


def test_a_resumed_run_s_record_replaces_the_one_its_stop_stored(store_url):
    """A run stopped (a stall, Ctrl-C) stores its record; resumed, it ends again with the same
    run id: the later record replaces the earlier, and the earlier never comes back."""
    stopped = {**a_record(reads=(5e9,) * 3), "finished": "2026-12-06T03:10:00+0000"}
    stopped["summary"] = {"verdict": "ERROR"}
    stopped["tests"] = stopped["tests"][:1]
    resumed = {**a_record(reads=(4e9,) * 3), "run_id": stopped["run_id"],
               "finished": "2026-12-06T04:00:00+0000"}
    with Store.open(store_url) as db:
        assert db.put(stopped) == (stopped["run_id"], True)
        assert db.put(resumed) == (stopped["run_id"], True)
        assert db.put(stopped) == (stopped["run_id"], False)  # the earlier word: nothing
        assert db.counts() == {"drives": 1, "runs": 1, "measurements": 2}
    assert rows(store_url, "SELECT verdict FROM runs") == [("PASS",)]
    assert rows(store_url, "SELECT value FROM measurements WHERE metric = 'seq_read_bw'") == \
        [(4e9,)]


def test_where_the_store_is_said_without_its_password_and_off_stores_nothing(tmp_path,
                                                                            monkeypatch):
    monkeypatch.setenv("QUAL_STORE", str(tmp_path / "lab.sqlite"))
    assert store.url_of(None) == f"sqlite:///{tmp_path / 'lab.sqlite'}"
    assert store.url_of("postgresql://u@h/db") == "postgresql://u@h/db"  # a flag beats $QUAL_STORE
    assert store.shown("postgresql://qual:s3cret@db.lab:5432/qual") == \
        "postgresql://qual:***@db.lab:5432/qual"
    assert store.check_url("off") is None
    assert store.store_record(a_record(), "off") == "not stored: the store is off"
    assert not (tmp_path / "lab.sqlite").exists()
    for bad in ("mysql://db/qual", "nothing://"):
        with pytest.raises(StoreError, match="qual stores in SQLite or PostgreSQL"):
            store.check_url(bad)


OPENER = """
import os, sys, time
from qual.store import Store
url, go = sys.argv[1], sys.argv[2]
while not os.path.exists(go):
    time.sleep(0.001)
Store.open(url).close()
"""


@pytest.mark.slow
def test_eight_rigs_opening_a_new_store_at_once_migrate_it_once(store_url, tmp_path, request):
    """Rigs started together on a store nobody opened yet: one migrates it, the others wait
    for it (SQLite's BEGIN IMMEDIATE, PostgreSQL's advisory lock), and none fails."""
    go = tmp_path / "go"
    for attempt in range(3):
        url = store_url if attempt == 0 else (
            f"sqlite:///{tmp_path / f'store{attempt}.sqlite'}" if store_url.startswith("sqlite")
            else request.getfixturevalue("postgres").new_database())
        go.unlink(missing_ok=True)
        openers = [subprocess.Popen([sys.executable, "-c", OPENER, url, str(go)],
                                    stderr=subprocess.PIPE, text=True) for _ in range(8)]
        time.sleep(1.0)  # every interpreter up and waiting
        go.touch()
        for o in openers:
            _, err = o.communicate(timeout=120)
            assert o.returncode == 0, err[-2000:]
        with Store.open(url) as db:
            assert db.version() == "0001"


def test_connections_turning_a_new_sqlite_store_to_wal_at_once_all_open(tmp_path):
    """Eight connections at once on each of 200 new SQLite stores: each waits while another
    turns the store to WAL, where SQLite itself answers "database is locked" at once (53 of
    8,000 openers failed so before qual waited for it, and once the eight rigs' test)."""
    def connect(path: Path, gate: threading.Barrier, failed: list) -> None:
        gate.wait()
        try:
            engine = _sqlite_engine(make_url(f"sqlite:///{path}"))
            with engine.connect():
                pass
            engine.dispose()
        except Exception as e:  # noqa: BLE001 - every failure is counted and shown
            failed.append(repr(e))

    failed: list[str] = []
    for n in range(200):
        gate = threading.Barrier(8)
        path = tmp_path / f"s{n}.sqlite"
        threads = [threading.Thread(target=connect, args=(path, gate, failed)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    assert not failed, (len(failed), failed[0])


@pytest.mark.slow
def test_the_test_server_whose_port_is_taken_starts_on_another(postgres):
    """A port found free may be taken before the tests' server binds it: held by anything, or
    by another test's server (whose answer must not pass for this one's), the server starts
    on a new port and answers there with its own data."""
    from pgserver import PostgresServer

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        for taken in (held.getsockname()[1], postgres.port):
            server = PostgresServer()
            server.port = taken
            try:
                server.start()
                assert server.port != taken
                (answering,), = rows(server.url(), "SHOW data_directory")
                assert Path(answering).resolve() == server.data.resolve()
            finally:
                server.stop()


@pytest.mark.skipif(not hasattr(signal, "SIGKILL") or sys.platform != "linux", reason="Linux")
def test_the_test_server_dies_with_the_tests_however_they_end(tmp_path):
    """The PostgreSQL server the store's tests start is their own child: a test process killed
    outright (no finalizer runs) leaves no server behind, nor any of its workers; removing its
    folder then leaves none of its shared memory (in /dev/shm or System V)."""
    from pgserver import binaries, remove

    if binaries() is None or not IS_ROOT:
        pytest.skip("needs PostgreSQL's binaries and root (scripts/setup)")
    tests = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; sys.path.insert(0, sys.argv[1]); "
         "from pgserver import PostgresServer; s = PostgresServer().start(); "
         "print(s.server.pid, s.folder, flush=True); time.sleep(120)", str(HERE)],
        stdout=subprocess.PIPE, text=True)
    try:
        pid, folder = tests.stdout.readline().split()
        server = [int(pid)] + [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children")
                               .read_text().split()]  # the postmaster and its workers
    finally:
        tests.kill()
        tests.wait(10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        left = [p for p in server if Path(f"/proc/{p}").exists()
                and Path(f"/proc/{p}/stat").read_text().split()[2] != "Z"]
        if not left:
            break
        time.sleep(0.1)
    data = Path(folder) / "data"
    shmid = (data / "postmaster.pid").read_text().splitlines()[6].split()[1]
    dynamic = list((data / "pg_dynshmem").iterdir())  # in its folder, not /dev/shm
    remove(Path(folder))
    assert len(server) > 1 and not left, f"the server's {left} outlived the tests"
    assert dynamic and not Path(folder).exists()
    shown = subprocess.run(["ipcs", "-m", "-i", shmid], capture_output=True, text=True).stdout
    assert f"shmid={shmid}" not in shown, shown  # its System V segment is gone too
