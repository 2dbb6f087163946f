"""A drive-class qualification at rig scale: nothing of the project's own test set-up reaches
it, a subset judges what it selects."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from qual import shipped
from qual.plan import cpu_share, time_limit
from qual.plugin.progress import Eta, Inner
from qual.plugin.records import STALL_NOTE
from qual.targets import Target
from qual.thresholds import family_table
from qual.workloads import bandwidth
from testbed import (KILL, TINY_ALL, TINY_PROFILE, blank, cells_profile, detach_loop,
                     load_record, needs_root, qual, run_suite, serial_of, sh)


@pytest.mark.slow
def test_a_clones_own_test_timeout_never_reaches_a_qualification(tmp_path):
    """A clone whose test configuration cuts every test at 1 s: a suite test of 3 s still
    passes, whether pytest is pointed at the clone's suites or `qual run` runs from there, and
    no timeout of the clone's is announced."""
    clone = tmp_path / "clone"
    shutil.copytree(shipped("suites"), clone / "suites")
    (clone / "pyproject.toml").write_text("[tool.pytest.ini_options]\ntimeout = 1\n")
    profile = cells_profile(tmp_path / "slow.toml", "one cell of 3 s", ["seq_read"],
                            runtime="3 s", minimum=["seq_read_bw"])
    pytest_run = subprocess.run(
        [sys.executable, "-m", "pytest", str(clone / "suites" / "test_bandwidth.py"),
         f"--qual-profile={profile}", f"--qual-results={tmp_path / 'a'}", "-k", "test_cell",
         "--timeout=1"],  # the plan's own limit (a marker) outranks even this
        cwd=clone, capture_output=True, text=True, timeout=300)
    qual_run = subprocess.run(
        ["qual", "run", "--profile", str(profile), "--results", str(tmp_path / "b"),
         "-k", "test_cell"], cwd=clone, capture_output=True, text=True, timeout=300)
    for proc, results in ((pytest_run, tmp_path / "a"), (qual_run, tmp_path / "b")):
        header = proc.stdout.split("collected")[0]
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "Timeout" not in proc.stdout, proc.stdout[-3000:]
        assert proc is pytest_run or "timeout:" not in header, header
        assert "configfile: pytest.ini" in header
        (cell,) = load_record(results)["tests"]
        assert cell["outcome"] == "passed" and cell["duration_s"] > 2.5


@pytest.mark.slow
def test_each_test_is_limited_by_its_own_plan(tmp_path):
    proc = subprocess.run(["qual", "run", "--profile", str(TINY_PROFILE), "--plan", "--json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    tests = json.loads(proc.stdout)["tests"]
    assert tests and all(t["time_limit_s"] == time_limit(t["estimate_max_s"]) for t in tests)
    assert all(t["time_limit_s"] > 4 * t["estimate_max_s"] for t in tests)
    said = subprocess.run(["qual", "run", "--profile", str(TINY_PROFILE), "--plan"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300).stdout
    assert "each test's time limit: 4 x its most + 10 min" in said


@pytest.mark.slow
def test_a_subset_judges_what_it_selects(tmp_path):
    """-k keeps the latency test out: its criterion is listed once as not selected and the
    run passes on what it judged; nothing is INCOMPLETE."""
    proc, results = run_suite(tmp_path, "-k", "seq_read")
    assert proc.returncode == 0, proc.stdout[-3000:]
    summary = load_record(results)["summary"]
    assert summary["verdict"] == "PASS" and summary["checks_passed"] == 1
    assert summary["not_selected"] == ["rand_read_lat[bs=4K,qd=1,pct=99]"]
    assert summary["not_judged"] == []
    assert proc.stdout.count("rand_read_lat[bs=4K,qd=1,pct=99]") == 1
    assert "not selected (-k, -m; decides nothing): 1 criteria" in proc.stdout
    assert "not judged" not in proc.stdout


@needs_root
@pytest.mark.slow
def test_a_selected_test_that_cannot_judge_still_leaves_the_run_incomplete(tmp_path, tmpfs):
    """The subset's own criterion is UNVERIFIED (tmpfs has no device counters): INCOMPLETE,
    exit 6, while the criterion it left out is only not selected."""
    proc, results = run_suite(tmp_path, "-k", "seq_read", f"--qual-target={tmpfs / 'd.dat'}")
    assert proc.returncode == 6, proc.stdout[-3000:]
    summary = load_record(results)["summary"]
    assert summary["verdict"] == "INCOMPLETE"
    assert summary["not_judged"] == ["seq_read_bw[bs=64K,qd=4]"]
    assert summary["not_selected"] == ["rand_read_lat[bs=4K,qd=1,pct=99]"]


# ------------------------------------------------------------------ progress


def test_inner_progress_is_a_line_every_interval_and_the_last_at_the_end():
    said = []
    inner = Inner(said.append, None, interval=0.5)
    for i in range(50):  # 50 messages at once: well within the interval even on a loaded
        inner(f"step {i}")  # host (a sleep between them took it past 0.2 s under load)
    assert said == ["step 0"]
    time.sleep(0.55)
    inner("step 50")
    inner("step 51")
    assert said == ["step 0", "step 50"]
    inner.close()  # the test ends: the last message held back is shown
    assert said == ["step 0", "step 50", "step 51"]
    inner("next test")  # a new test's first message is shown at once
    assert said[-1] == "next test"


def test_inner_progress_on_a_terminal_is_one_line_in_place():
    said, rewritten, ended = [], [], []
    inner = Inner(said.append, rewritten.append, lambda: ended.append(True))
    for i in range(5):
        inner(f"step {i}")
    inner.close()
    assert rewritten == [f"step {i}" for i in range(5)] and not said and ended == [True]


@pytest.mark.slow
def test_a_long_cell_says_how_far_it_is_as_it_runs(tmp_path):
    """A bandwidth cell of hours says, while it runs, how long it has run of its runtime and
    its bandwidth so far (the run's Inner shows one of these every 10 s)."""
    table = family_table(bandwidth.FAMILY, {"size": "16 MiB", "runtime": "3 s",
                                            "block_sizes": ["64K"], "depths": [4],
                                            "patterns": ["seq_read"]})
    said = []
    bandwidth.run_cell(Target(tmp_path), table, bandwidth.matrix(table)[0], say=said.append)
    running = [m for m in said if re.fullmatch(r"seq_read-64K-qd4: [\d.]+ s of 3 s, "
                                               r"[\d.]+ [KMG]iB/s so far", m)]
    assert len(running) >= 2, said


def test_the_eta_learns_the_runs_rate():
    eta = Eta()
    eta.plan([{"id": "a", "estimate_s": 10.0}, {"id": "b", "estimate_s": 10.0},
              {"id": "c", "estimate_s": 20.0}])
    first = eta.begin("a")
    assert first.startswith("[1/3] a  elapsed") and first.endswith("ETA 40 s")
    eta.end("a", 20.0)  # twice as slow as planned: the rest is expected twice as long
    line = eta.begin("b")
    assert line.startswith("[2/3] b") and "ETA 1 min 00 s" in line


@pytest.mark.slow
def test_a_run_says_where_it_is_and_keeps_a_familys_progress_short(tmp_path):
    """[i/N] with the elapsed time and an ETA as each test starts; the KV cache's progress
    (a line per batch before) is at most a line every 10 s and the last."""
    proc, _ = run_suite(tmp_path, "-k", "storage", suite="test_kvcache.py",
                        profile=shipped("thresholds") / "ci.toml")
    assert "1 passed" in proc.stdout, proc.stdout[-3000:]  # (the other suites' criteria unjudged)
    starts = re.findall(r"^\[(\d+)/(\d+)\] (\S+)  elapsed .+, ETA .+$", proc.stdout, re.M)
    assert [(i, n) for i, n, _ in starts] == [("1", "1")]
    assert starts[0][2].endswith("test_kvcache.py::test_storage")
    served = [line for line in proc.stdout.splitlines() if "requests served" in line]
    assert 1 <= len(served) <= 3, served  # 3 repetitions of 2 s: the first line, the last
    # a test is its [i/N] line, its progress and its result: no file name, no result letter
    lines = proc.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("[1/1]"))
    assert any(line.startswith("  passed in ") for line in lines[at + 1:at + 6]), \
        lines[at:at + 6]
    assert all(line.startswith("  ") for line in lines[at + 1:at + 4]), lines[at:at + 6]
    assert not any("test_kvcache.py" in line and not line.startswith(("[", "FAILED", "ERROR"))
                   for line in lines), proc.stdout[-2000:]
    (tmp_path / "q").mkdir()
    quiet, _ = run_suite(tmp_path / "q", "-q", "-k", "storage", suite="test_kvcache.py",
                         profile=shipped("thresholds") / "ci.toml")
    assert "requests served" not in quiet.stdout + quiet.stderr
    assert "[1/1]" in quiet.stdout


# ------------------------------------------------------------------ no process outlives its qual


def _tree(root: int) -> dict[int, str]:
    """The live descendants of `root` (itself included): pid -> command line."""
    parents, lines = {}, {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z":
            parents[int(name)], lines[int(name)] = int(fields[1]), cmd
    tree, grew = {root} & parents.keys(), True
    while grew:
        more = {p for p, pp in parents.items() if pp in tree} - tree
        tree |= more
        grew = bool(more)
    return {p: lines[p] for p in tree}


def _killed_midway(args: list[str], cwd: Path, ready) -> tuple[dict[int, str], str]:
    """`qual ARGS` killed with SIGKILL once `ready(tree, output)` holds; returns the processes
    of its tree still alive 2 s later, and what it said."""
    log = cwd / "qual.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "qual.cli", *args], cwd=cwd, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 240
    while not ready(_tree(proc.pid), log.read_text()):
        assert proc.poll() is None, f"qual ended before the phase: {log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)
    tree = _tree(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    time.sleep(2)
    return {p: c for p, c in tree.items() if p in _tree(p)}, log.read_text()


def _running(command: str, count: int = 1):
    """At least `count` processes of the tree run `command`."""
    return lambda tree, said: sum(command in c for c in tree.values()) >= count


def _started(test: str, after: float = 1.0):
    """The test has been running `after` seconds ([i/N] line seen)."""
    seen = {}

    def ready(tree, said):
        if re.search(rf"^\[\d+/\d+\] \S*{re.escape(test)}", said, re.M):
            seen.setdefault("at", time.monotonic())
        return "at" in seen and time.monotonic() - seen["at"] >= after
    return ready


RANKS = "qual.workloads.checkpoint.ranks"
RANKED = 3  # the ranks' parent and both ranks of a tp 2 layout (forked: the same command line)
PHASES = {  # phase -> (qual run -k, profile, when to kill)
    "checkpoint": ("checkpoint", KILL, _running(RANKS, RANKED)),
    "gnn": ("gnn and not gpu", KILL, _running("qual.workloads.gnn.mmap_server")),
    "training": ("training", TINY_ALL, _started("test_training_io.py::", 0.5)),
    "kvcache": ("kvcache", shipped("thresholds") / "ci.toml", _started("test_kvcache.py::")),
    "vectordb": ("vectordb", shipped("thresholds") / "ci.toml",
                 _running("qual.workloads.vectordb.worker")),
}


@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.slow
def test_no_process_outlives_a_killed_qual_on_a_file_target(tmp_path, phase):
    select, profile, ready = PHASES[phase]
    (tmp_path / "drive").mkdir()
    left, said = _killed_midway(["run", "--profile", str(profile), "--target",
                                 str(tmp_path / "drive"), "-k", select], tmp_path, ready)
    assert not left, f"{left} outlived the qual that started them\n{said[-2000:]}"


@pytest.mark.slow
def test_no_rank_outlives_a_killed_checkpoint_restore(misbehaving, tmp_path):
    """The ranks of a restore from a slow drive (each read 50 ms late: some 10 s of reading),
    killed once they have begun to read the checkpoint, die with the qual that started them:
    2 s after kill -9, none is left."""
    storage = misbehaving("--read-delay", "0.05")
    common = ["--model", "llama3.1-8b", "--tp", "2", "--scale", "0.002", "--passes", "1",
              "--per-pass", "1", "--chunk-size", "1M"]
    made = subprocess.run(  # straight into the backing folder; read back through stallfs
        [sys.executable, "-m", "qual.cli", "checkpoint", "--target", str(storage.backing),
         "--write-only", "--json", *common], capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    written = storage.point / "qual-checkpoints" / "ckpt-000001"
    ranks = _running(RANKS, RANKED)

    def reading(tree, said) -> bool:
        return ranks(tree, said) and any(op == "READ" and written.name in path
                                         for op, path in storage.requests())
    left, said = _killed_midway(["checkpoint", "--read-only", str(written), *common], tmp_path,
                                reading)
    assert not left, f"{left} outlived the qual that started them\n{said[-2000:]}"


@pytest.mark.slow
def test_no_kvcache_client_outlives_a_killed_qual(tmp_path):
    """Two KV-cache clients (the release's ranks) in the middle of a 30 s trial: 2 s after
    kill -9 of qual, neither is left."""
    (tmp_path / "drive").mkdir()
    left, said = _killed_midway(["kvcache", "--target", str(tmp_path / "drive"), "--clients",
                                 "2", "--duration", "30s", "--context-tokens", "16,32",
                                 "--block-size", "256K"], tmp_path,
                                _running("qual.workloads.kvcache.clients"))
    assert not left, f"{left} outlived the qual that started them\n{said[-2000:]}"


@needs_root
@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.slow
def test_a_killed_qual_on_a_raw_namespace_leaves_no_process_no_hold_and_a_device_to_clean(
        tmp_path, ram_device, phase):
    """The checkpoint ranks, the GNN gather server and the training readers work on qual's
    filesystem in the run's own mount namespace; the KV cache writes the device itself. 2 s
    after kill -9 nothing of the run is left, the device can be held exclusively again, and
    `qual clean` leaves it blank."""
    select, profile, ready = PHASES[phase]
    dev = ram_device()
    left, said = _killed_midway(["run", "--profile", str(profile), "--target", dev, "-k",
                                 select, "--qual-allow-destructive", "--qual-confirm-serial",
                                 serial_of(dev)], tmp_path, ready)
    assert not left, f"{left} outlived the qual that started them\n{said[-2000:]}"
    os.close(os.open(dev, os.O_RDONLY | os.O_EXCL))  # nothing holds it
    cleaned = qual("clean", dev, cwd=tmp_path)
    assert cleaned.returncode == 0, cleaned.stderr
    assert blank(dev)


# ------------------------------------------------------------------ reads of written blocks

RAW_READS = """[profile]
description = "tests: the read cells of the ci profile's matrix, on a raw namespace"
repeats = 3

[bandwidth]
size = "256 MiB"
runtime = "1 s"
block_sizes = ["1M"]
depths = [16, 1]
patterns = ["seq_read", "rand_read"]
"""


@needs_root
@pytest.mark.slow
def test_raw_reads_read_blocks_the_run_wrote(tmp_path, ram_device):
    """A blank namespace: a drive answers blocks never written without touching its media, so
    the region is written before the first read: the plan says so, every read cell's record
    says all of its region was written before it began, and the device holds the run's data
    there (and nothing past it). (On this RAM stand-in a blank block reads only about 1.5 x as
    fast as a written one, as much as the host's noise moves a repetition: no timing proves it.)"""
    dev = ram_device()
    profile = tmp_path / "reads.toml"
    profile.write_text(RAW_READS)
    args = ["run", "--profile", str(profile), "--target", dev]
    refused = qual(*args, "--plan", cwd=tmp_path)
    assert refused.returncode == 4 and "guard: " in refused.stdout, refused.stdout
    consent = ["--qual-allow-destructive", "--qual-confirm-serial", serial_of(dev)]
    plan = json.loads(qual(*args, *consent, "--plan", "--json", cwd=tmp_path).stdout)
    written = [t["bytes_written"] for t in plan["tests"]]
    assert written[0] == 256 << 20 and not any(written[1:]), written
    proc = qual(*args, *consent, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:]
    cells = [m for t in load_record(tmp_path / "qual-results")["tests"]
             for m in t["measurements"] if m["metric"].endswith("_bw")]
    assert len(cells) == 12, [m["id"] for m in cells]  # 4 cells x 3 repetitions
    assert all(m["context"]["region_written"] == m["context"]["region_bytes"] == 256 << 20
               for m in cells), [(m["id"], m["context"].get("region_written")) for m in cells]
    sh("blockdev", "--flushbufs", dev)  # the guard's probes read it through the page cache
    with open(dev, "rb") as f:  # the region holds the run's data; what lies past it is blank
        assert f.read(4096).count(0) < 4096
        f.seek((256 << 20) - 4096)
        assert f.read(4096).count(0) < 4096
        f.seek(256 << 20)
        assert f.read(1 << 20) == bytes(1 << 20)


# ------------------------------------------------------------------ resume

RESUMED = """[profile]
extends = "{tiny_all}"
description = "tests: repeated cells, a shared-outcome suite and integrity, to kill and resume"
repeats = 2
"""


def _journaled(results: Path) -> int:
    """How many tests the run's journal holds; -1 before it has one."""
    try:
        return len(json.loads((results / "qual-journal.json").read_text())["tests"])
    except (OSError, ValueError):
        return -1


@pytest.mark.slow
def test_a_run_killed_at_any_point_resumes_to_the_same_tests_and_verdict(tmp_path):
    """kill -9 inside the first test, in the middle of the repeated cells and inside the
    training suite (whose tests share one run); each resumed run has the uninterrupted run's
    tests, each once in the record and in the Allure results, and its verdict."""
    profile = tmp_path / "resumed.toml"
    profile.write_text(RESUMED.format(tiny_all=TINY_ALL))
    select = ["-k", "bandwidth or training or integrity"]
    whole = qual("run", "--profile", str(profile), *select, "--results", "whole", cwd=tmp_path)
    assert whole.returncode == 0, whole.stdout[-3000:]
    expected = load_record(tmp_path / "whole")
    ids = [t["nodeid"] for t in expected["tests"]]
    training = next(i for i, n in enumerate(ids) if "test_training_io.py" in n)
    for point in (0, len(ids) // 3, training + 1):
        results = tmp_path / f"killed-at-{point}"
        proc = subprocess.Popen([sys.executable, "-m", "qual.cli", "run", "--profile",
                                 str(profile), *select, "--results", results.name],
                                cwd=tmp_path, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while _journaled(results) < point:
            assert proc.poll() is None and time.monotonic() < deadline, point
            time.sleep(0.02)
        proc.kill()
        proc.wait()
        assert not (results / "qual-run.json").exists()
        kept = _journaled(results)
        assert point <= kept < len(ids)
        resumed = qual("run", "--resume", str(results), cwd=tmp_path)
        assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-2000:]
        record = load_record(results)
        assert sorted(t["nodeid"] for t in record["tests"]) == sorted(ids), point
        assert record["summary"]["verdict"] == expected["summary"]["verdict"] == "PASS"
        assert [r["tests_kept"] for r in record["resumed"]] == [kept]
        assert record["started"] < record["finished"] and record["plan"]["tests"]
        allure = [json.loads(p.read_text()) for p in (results / "allure-results").glob(
            "*-result.json")]
        named = sorted(lab["value"] for d in allure for lab in d["labels"]
                       if lab["name"] == "qual_test")
        assert named == sorted(ids), point
        assert not (results / "qual-journal.json").exists()  # finished: the record stands


def _killed_after_first_test(tmp_path, *args: str) -> Path:
    """`qual run ARGS` killed (SIGKILL) once its journal holds a finished test: its results
    folder."""
    results = tmp_path / "qual-results"
    proc = subprocess.Popen([sys.executable, "-m", "qual.cli", "run", *args], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while _journaled(results) < 1:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    proc.kill()
    proc.wait()
    return results


@pytest.mark.slow
def test_resume_refuses_another_profile_and_a_finished_run(tmp_path):
    results = _killed_after_first_test(tmp_path, "--profile", str(TINY_ALL), "-k", "training")
    other = qual("run", "--resume", str(results), "--profile", str(TINY_PROFILE), cwd=tmp_path)
    assert other.returncode == 4 and "profile name: the journal's is tiny-all, this run's tiny" \
        in other.stdout + other.stderr, other.stdout[-2000:] + other.stderr
    assert _journaled(results) >= 1  # nothing of the journal lost, no record written
    assert not (results / "qual-run.json").exists()
    done = qual("run", "--resume", str(results), cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:]
    again = qual("run", "--resume", str(results), cwd=tmp_path)
    assert again.returncode == 4 and "nothing to resume" in again.stderr


@needs_root
def test_resume_refuses_another_drive_in_the_same_slot(tmp_path, ram_device):
    """A run killed after its first test on a drive; another drive (another serial) then
    answers at the same device name, as when a slot's drive is swapped: --resume is refused
    (exit 4) naming both serials, and nothing is written to the new drive."""
    dev = ram_device(64 << 20)
    first = serial_of(dev)
    results = _killed_after_first_test(tmp_path, "--profile", str(TINY_PROFILE), "--target", dev,
                                       "--qual-allow-destructive", "--qual-confirm-serial", first)
    other = Path(first).with_name(Path(first).name + "-swapped")
    other.write_bytes(b"")
    os.truncate(other, 64 << 20)
    sh("losetup", "-d", dev)
    try:
        deadline = time.monotonic() + 30  # the name is free once udev lets the old drive go
        while subprocess.run(["losetup", dev, str(other)], capture_output=True).returncode:
            assert time.monotonic() < deadline, f"{dev} stayed busy"
            time.sleep(0.1)
        resumed = qual("run", "--resume", str(results), cwd=tmp_path)
        said = resumed.stdout + resumed.stderr
        assert resumed.returncode == 4, said[-3000:]
        assert f"drive serial: the journal's is {first}, this drive's {other}" in said, said
        assert not any(open(other, "rb").read())  # the new drive: nothing written
    finally:
        detach_loop(dev, other)
        other.unlink()


# ------------------------------------------------------------------ a rig of drives

COMMAND_TIMEOUT = 2.0


@needs_root
@pytest.mark.slow
def test_one_drive_of_a_rig_stops_and_fails_alone(tmp_path, ram_device, misbehaving):
    """Three drives under `qual run -n 3`: two RAM-backed namespaces and one that stops
    answering everything after 400 requests. The watchdog of its worker ends that worker: its
    test is ERROR, its record says stalled, its other tests are skipped without touching it,
    and the two other drives run to PASS; exit 1."""
    drives = [ram_device(256 << 20), ram_device(256 << 20)]
    storage = misbehaving("--answer", "400", size=64 << 20)
    profile = cells_profile(tmp_path / "rig.toml", "tests: two read cells a drive",
                            ["seq_read", "rand_read"], runtime="1 s", minimum=["seq_read_bw"],
                            profile='device_truth = "optional"\n',
                            bandwidth=f'command_timeout = "{COMMAND_TIMEOUT:g} s"\n')
    args = ["run", "-n", "3", "--profile", str(profile), "-k", "test_cell",
            "--qual-allow-destructive"]
    for drive in drives:
        args += ["--target", drive, "--qual-confirm-serial", serial_of(drive)]
    args += ["--target", str(storage.file)]
    started = time.monotonic()
    proc = qual(*args, cwd=tmp_path, timeout=300)
    took = time.monotonic() - started
    said = proc.stdout + proc.stderr
    assert proc.returncode == 1, said[-4000:]
    assert took < 120, took
    records = {json.loads(p.read_text())["target"]["spec"]: json.loads(p.read_text())
               for p in (tmp_path / "qual-results").glob("*/qual-run.json")}
    assert set(records) == {*drives, str(storage.file)}, said[-3000:]
    for drive in drives:
        assert records[drive]["summary"]["verdict"] == "PASS", records[drive]["summary"]
        assert "stalled" not in records[drive]
    stalled = records[str(storage.file)]
    assert stalled["summary"]["verdict"] == "ERROR", json.dumps(stalled["tests"]) + said[-5000:]
    assert stalled["stalled"]["what"].startswith(
        "Stalled: ")
    outcomes = sorted(t["outcome"] for t in stalled["tests"])
    assert outcomes == ["broken", "skipped"], stalled["tests"]
    broken = next(t for t in stalled["tests"] if t["outcome"] == "broken")
    assert broken["message"].startswith("Stalled: ")


@pytest.mark.slow
def test_a_stall_an_earlier_run_noted_decides_nothing_now(tmp_path):
    """A rig run that stalled left its note beside a drive's record; the next run on the same
    results folder runs every test of that drive (the note is an earlier run's, not this
    one's), and its record says nothing stalled."""
    drives = [tmp_path / "a", tmp_path / "b"]
    profile = cells_profile(tmp_path / "rig.toml", "tests: one cell a drive", ["seq_read"],
                            runtime="0.3 s", minimum=["seq_read_bw"])
    args = ["run", "-n", "2", "--profile", str(profile), "-k", "test_cell"]
    for drive in drives:
        drive.mkdir()
        args += ["--target", str(drive)]
    results = tmp_path / "qual-results"
    for drive in drives:
        note = results / str(drive).strip("/").replace("/", "-") / STALL_NOTE
        note.parent.mkdir(parents=True)
        note.write_text(json.dumps({"drive": str(drive), "test": "test_bandwidth.py::test_cell"
                                    "[seq_read-64K-qd4]", "what": "Stalled: an old one",
                                    "worker": "gw0"}))
    proc = qual(*args, cwd=tmp_path, timeout=300)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said[-3000:]
    assert "stopped answering" not in said and "an old one" not in said
    for record in results.glob("*/qual-run.json"):
        doc = json.loads(record.read_text())
        assert "stalled" not in doc and doc["summary"]["verdict"] == "PASS", doc["summary"]
        assert {t["outcome"] for t in doc["tests"]} == {"passed"}
        assert not record.with_name(STALL_NOTE).exists()


@needs_root
def test_a_drive_taken_away_is_not_detached_again_once_its_name_is_another_tests(tmp_path):
    """A test that took its drive away frees the loop device's name; another test's
    `losetup --find` may get it before the first test's teardown runs: that teardown must
    leave the other test's drive attached (CI: it found 0 B and no serial)."""
    first, second = tmp_path / "first.img", tmp_path / "second.img"
    for backing in (first, second):
        with open(backing, "wb") as f:
            f.truncate(1 << 20)
    dev = sh("losetup", "--find", "--show", str(first))
    sh("losetup", "--detach", dev)
    sh("losetup", dev, str(second))  # the same name, now the other test's drive
    try:
        detach_loop(dev, first)
        assert serial_of(dev) == str(second)
    finally:
        detach_loop(dev, second)
    assert not Path(f"/sys/block/{Path(dev).name}/loop/backing_file").exists()


def _take_away(dev: str, when) -> threading.Thread:
    """Once `when()` holds, the loop device goes as a lost namespace does: its capacity drops
    to 0 (the backing file emptied, `losetup -c`) and it is detached (`losetup -d`, done
    when its last holder lets go). Between the emptying and the capacity half a second
    passes, as the kernel fails a lost namespace's I/O before it reports the capacity gone:
    what qual records must not depend on which it met first."""
    backing = Path(f"/sys/block/{Path(dev).name}/loop/backing_file").read_text().strip()

    def away():
        deadline = time.monotonic() + 120
        while not when() and time.monotonic() < deadline:
            time.sleep(0.1)
        os.truncate(backing, 0)
        time.sleep(0.5)
        sh("losetup", "--set-capacity", dev)
        sh("losetup", "--detach", dev)
    thread = threading.Thread(target=away, daemon=True)
    thread.start()
    return thread


@needs_root
@pytest.mark.slow
def test_a_drive_that_goes_away_mid_run_fails_alone(tmp_path, ram_device):
    """Three drives under `qual run -n 3`; one goes away (its capacity 0, detached) once its
    first test has finished. The test that meets it is ERROR with `device gone` and what it
    met, its later tests are skipped without touching it, its record says `device_gone`; the
    other two drives run to PASS; exit 1."""
    drives = [ram_device(256 << 20) for _ in range(3)]
    doomed = drives[2]
    profile = cells_profile(tmp_path / "rig.toml", "tests: three cells a drive",
                            ["seq_read", "rand_read", "seq_write"], runtime="2 s",
                            minimum=["seq_read_bw"], profile="repeats = 2\n")
    args = ["run", "-n", "3", "--profile", str(profile), "-k", "test_cell",
            "--qual-allow-destructive"]
    for drive in drives:
        args += ["--target", drive, "--qual-confirm-serial", serial_of(drive)]
    results = tmp_path / "qual-results"
    journal = results / doomed.strip("/").replace("/", "-") / "qual-journal.json"
    taken = _take_away(doomed, lambda: _journaled(journal.parent) >= 1)
    proc = qual(*args, cwd=tmp_path, timeout=300)
    taken.join(timeout=10)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 1, said[-4000:]
    records = {json.loads(p.read_text())["target"]["spec"]: json.loads(p.read_text())
               for p in results.glob("*/qual-run.json")}
    assert set(records) == set(drives), said[-3000:]
    for drive in drives[:2]:
        assert records[drive]["summary"]["verdict"] == "PASS", records[drive]["summary"]
        assert "device_gone" not in records[drive]
    gone = records[doomed]
    assert gone["summary"]["verdict"] == "ERROR", json.dumps(gone["tests"])[-3000:]
    assert "reports a capacity of 0 bytes" in gone["device_gone"]["what"], gone["device_gone"]
    outcomes = [t["outcome"] for t in gone["tests"]]
    met = outcomes.index("broken")
    assert 1 <= met < len(outcomes) - 1, outcomes
    assert set(outcomes[:met]) == {"passed"} and set(outcomes[met + 1:]) == {"skipped"}, outcomes
    broken = gone["tests"][met]
    assert broken["nodeid"] == gone["device_gone"]["test"]
    assert broken["message"].startswith("device gone: "), broken["message"]
    assert all(f"{doomed} is gone" in t["message"] for t in gone["tests"][met + 1:])
    assert f"device gone: {gone['device_gone']['what']}" in proc.stdout


# ------------------------------------------------------------------ the plan's host


def test_the_plan_sees_how_much_cpu_the_hosts_neighbours_leave():
    """Pinned to one core with three busy neighbours, a busy loop gets about a quarter of what
    it got alone (alone: whatever else this host runs leaves it; three more take most of
    that): the plan's CPU-bound estimates (Rates.cpu) grow with them."""
    core = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    try:
        alone = cpu_share(0.3)
        neighbours = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                       preexec_fn=lambda: os.sched_setaffinity(0, {core}))
                      for _ in range(3)]
        try:
            time.sleep(0.2)
            shared = cpu_share(0.6)
        finally:
            for n in neighbours:
                n.kill()
                n.wait()
    finally:
        os.sched_setaffinity(0, before)
    assert shared < 0.75 * alone, (alone, shared)


def test_a_skipped_test_of_a_family_the_subset_cut_into_leaves_its_criteria_not_selected():
    """The drive-health test inside the bandwidth suite skips off NVMe: it judges nothing of
    the cells' criteria, so those the subset left out stay `not selected`; a broken test of
    the family might have judged them, and leaves them not judged."""
    from qual.record import TestResult, summarize
    from qual.thresholds import load_profile
    from qual.workloads import registry

    profile = load_profile(TINY_PROFILE, registry())
    plan = {"left_out": ["bandwidth"], "tests": [
        {"id": "cell", "family": "bandwidth"}, {"id": "health", "family": "bandwidth"}]}
    measured = {"id": "seq_read_bw[bs=64K,qd=4]"}
    verdict = {"id": "seq_read_bw[bs=64K,qd=4]", "passed": True, "line": ""}
    cell = TestResult("cell", "d", measurements=[measured], verdicts=[verdict])
    skipped = summarize([cell, TestResult("health", "d", "skipped")], profile, plan)
    assert skipped["verdict"] == "PASS"
    assert skipped["not_selected"] == ["rand_read_lat[bs=4K,qd=1,pct=99]"]
    broken = summarize([cell, TestResult("health", "d", "broken")], profile, plan)
    assert broken["not_judged"] == ["rand_read_lat[bs=4K,qd=1,pct=99]"]
    assert broken["verdict"] == "ERROR"
