"""The `qual` command, run as a user runs it."""

import json
import os
import subprocess
import sys

import pytest

from qual.targets import Target
from testbed import TINY_PROFILE, load_record, needs_root, sha256_of


def qual(*args, cwd=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "qual.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


LAT_KEYS = {"p50", "p90", "p99", "p99.9", "p99.99", "p99.9999", "max", "mean"}


@pytest.mark.parametrize("rw", ["read", "randread", "write", "randwrite", "rw", "randrw"])
def test_io_json_has_the_documented_keys(tmp_path, rw):
    proc = qual("io", "--target", str(tmp_path), "--rw", rw, "--bs", "64k", "--iodepth", "4",
                "--size", "8M", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert {"backend", "bw_bytes", "iops", "lat_ns", "cpu_s", "read", "write"} <= doc.keys()
    assert LAT_KEYS <= doc["lat_ns"].keys()
    assert doc["rw"] == rw and doc["bytes"] == 8 << 20 and doc["backend"] in ("io_uring", "psync")
    for side in ("read", "write"):
        assert {"ops", "bytes", "bw_bytes", "iops", "lat_ns"} <= doc[side].keys()
        assert LAT_KEYS <= doc[side]["lat_ns"].keys()
    assert doc["read"]["bytes"] + doc["write"]["bytes"] == doc["bytes"]
    assert doc["read"]["ops"] + doc["write"]["ops"] == doc["ops"]
    reads = {"read": True, "randread": True, "write": False, "randwrite": False}.get(rw)
    if reads is None:  # mixed: fio's default rwmixread of 50
        assert doc["rwmixread"] == 50 and doc["read"]["ops"] and doc["write"]["ops"]
    else:
        assert bool(doc["read"]["ops"]) == reads and bool(doc["write"]["ops"]) != reads


def test_io_mixed_json_splits_by_rwmixread(tmp_path):
    proc = qual("io", "--target", str(tmp_path), "--rw", "randrw", "--rwmixread", "70", "--bs",
                "4k", "--iodepth", "8", "--size", "16M", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["rwmixread"] == 70 and doc["ops"] == 4096
    assert abs(doc["read"]["ops"] / doc["ops"] - 0.70) <= 0.03
    assert doc["read"]["iops"] + doc["write"]["iops"] == pytest.approx(doc["iops"])


def test_io_human_line_names_backend_and_percentiles(tmp_path):
    proc = qual("io", "--target", str(tmp_path), "--rw", "randread", "--bs", "4k", "--size",
                "4M", "--runtime", "0.3s", "--engine", "psync")
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip()
    assert line.startswith("randread bs=4 KiB iodepth=1 numjobs=1 [psync]:")
    assert "p99.99" in line and "IOPS" in line and "/IO" in line


@pytest.mark.parametrize("args, message", [
    (["--bs", "4 parsecs"], "qual io: error: --bs: unknown unit 'parsecs'"),
    (["--iodepth", "0"], "qual io: error: --iodepth: iodepth 0 is outside"),
    (["--runtime=-1s"], "qual io: error: --runtime: "),
    (["--rw", "trim"], "qual io: error: --rw: 'trim' is not one of read, randread"),
    (["--engine", "aio"], "qual io: error: --ioengine: 'aio' is not one of auto"),
    (["--rwmixread", "x"], "qual io: error: --rwmixread: rwmixread 'x' is not a whole number"),
    (["--direct", "2"], "qual io: error: --direct: direct 2 is outside 0..1"),
    (["--bs", "0", "--numjobs", "0"], "qual io: error: --bs: bs '0' must be at least 1 B\n"
                                      "qual io: error: --numjobs: numjobs 0 is outside"),
])
def test_io_flag_errors_before_any_io(tmp_path, args, message):
    proc = qual("io", "--target", str(tmp_path), *args)
    assert proc.returncode == 2 and message in proc.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("args, message", [
    (["--bs", "1000", "--size", "8M"],
     "block size 1000 is not a multiple of the target's 512-byte logical block"),
    (["--rw", "randrw", "--rwmixread", "101"], "--rwmixread: rwmixread 101 is outside 0..100"),
    (["--rw", "randread", "--rwmixread", "70"], "--rwmixread: applies to rw and randrw"),
])
def test_io_job_errors_before_any_io(tmp_path, args, message):
    """A job's parameters the engine refuses are bad flags too: exit 2, as argparse's."""
    proc = qual("io", "--target", str(tmp_path), *args)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert not list(tmp_path.glob("qual-target.dat"))


@needs_root
@pytest.mark.parametrize("rw", ["write", "randrw"])  # a mixed job writes too
def test_io_refuses_a_write_to_a_mounted_device(loop_device, rw):
    dev = loop_device()
    loop_device.mount(dev, options="ro")  # read-only: ext4's own background writes would
    before = sha256_of(dev)               # change the bytes this test says qual left alone
    proc = qual("io", "--target", dev, "--rw", rw, "--size", "1M", "--allow-destructive",
                "--confirm-serial", Target(dev).identity.serial)
    assert proc.returncode == 1 and "refusing to write: mounted:" in proc.stderr
    assert sha256_of(dev) == before


def test_profiles_lists_shipped_profiles():
    proc = qual("profiles")
    assert proc.returncode == 0
    names = [line.split()[0] for line in proc.stdout.splitlines()]
    assert {"ci", "gen5-tlc", "gen4-qlc", "nvme-rig"} <= set(names)


def test_profiles_check_names_a_bound_no_drive_of_the_class_can_meet(tmp_path):
    proc = qual("profiles", "--check")
    assert proc.returncode == 0 and "gen5-tlc: feasible" in proc.stdout, proc.stdout
    (tmp_path / "p.toml").write_text(
        '[profile]\nextends = "gen4-qlc"\ndescription = "x"\n\n[[bandwidth.criteria]]\n'
        'metric = "seq_read_bw"\nparams = { bs = "1M", qd = 64 }\nmin = 8\nunit = "GB/s"\n'
        'source = "a wish"\n')
    proc = qual("profiles", "--check", str(tmp_path / "p.toml"))
    assert proc.returncode == 1
    assert "more than a 16 GT/s x4 link carries (7.88 GB/s)" in proc.stdout, proc.stdout


def test_profiles_check_reports_a_bad_profile_as_qual_run_does(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[profile]\ndescription = "x"\nbogus = 1\n')
    proc = qual("profiles", "--check", str(bad))
    assert proc.returncode == 4 and "Traceback" not in proc.stderr, proc.stderr
    assert "bad.toml:profile.bogus: unknown key" in proc.stderr


@pytest.mark.parametrize("family, flag, value", [
    ("gnn", "--scale", "2"), ("checkpoint", "--tp", "0"), ("train", "--accelerators", "0")])
def test_a_flag_over_a_profile_is_judged_alone(tmp_path, family, flag, value):
    """The profile's table (parsed when it loaded, ratios included) takes a flag over it: the
    one wrong flag is said, nothing about the profile, before any I/O."""
    proc = qual(family, "--profile", "ci", "--target", str(tmp_path), flag, value)
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert proc.returncode == 2 and len(errors) == 1 and flag in errors[0], proc.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_run_exits_0_on_a_subset_and_6_when_a_selected_criterion_was_not_judged(tmp_path):
    """-k seq_read: the latency criterion is not selected, the run passes. With a health
    criterion on a file (no SMART log there, its test skips), the same subset is INCOMPLETE."""
    proc = qual("run", "--profile", str(TINY_PROFILE), "--results", "out", "-q", "-k", "seq_read",
                cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert load_record(tmp_path / "out")["summary"]["not_selected"] == [
        "rand_read_lat[bs=4K,qd=1,pct=99]"]
    health = tmp_path / "health.toml"
    health.write_text(TINY_PROFILE.read_text() + '\n[[health.criteria]]\nmetric = '
                      '"health_media_errors"\nparams = { family = "bandwidth" }\nmax = 0\n'
                      'unit = "count"\nsource = "tests"\n')
    proc = qual("run", "--profile", str(health), "--results", "out", "-q", "-k",
                "seq_read or health", cwd=tmp_path)
    assert proc.returncode == 6, proc.stdout + proc.stderr
    summary = load_record(tmp_path / "out")["summary"]
    assert summary["verdict"] == "INCOMPLETE" and summary["checks_failed"] == 0
    assert "health_media_errors[family=bandwidth]" in summary["not_judged"]


@pytest.mark.slow
def test_run_wraps_pytest_and_leaves_record_and_allure(tmp_path):
    proc = qual("run", "--profile", str(TINY_PROFILE), "--results", "out", "-q", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert load_record(tmp_path / "out")["summary"]["verdict"] == "PASS"
    assert list((tmp_path / "out" / "allure-results").glob("*-result.json"))
    assert not (tmp_path / ".benchmarks").exists()


def test_io_removes_its_scratch_unless_kept_and_clean_says_what_it_removed(tmp_path):
    gone = qual("io", "--target", str(tmp_path), "--size", "1M")
    assert gone.returncode == 0 and "removed " in gone.stderr
    assert not (tmp_path / "qual-target.dat").exists()
    assert qual("io", "--target", str(tmp_path), "--size", "1M", "--keep").returncode == 0
    (tmp_path / "mine.txt").write_text("keep")
    assert (tmp_path / "qual-target.dat").exists()
    cleaned = qual("clean", str(tmp_path))
    assert cleaned.returncode == 0
    assert f"qual clean: removed {tmp_path / 'qual-target.dat'}" in cleaned.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]
    again = qual("clean", str(tmp_path))
    assert "nothing of qual's on" in again.stdout


def test_checkpoint_plan_json_is_json_with_the_derivation():
    proc = qual("checkpoint", "--plan", "--model", "llama3.1-405b", "--tp", "4", "--pp", "2",
                "--recipe", "bf16-adam8bit", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ranks"] == 8 and doc["model"] == "llama3.1-405b"
    assert abs(doc["bytes"] / 1.636e12 - 1) < 0.01  # seed 004: 1,636 GB
    assert "GB" in doc["derivation"] or "GiB" in doc["derivation"]


# ------------------------------------------------------------------ one vocabulary


def test_version_names_qual_and_its_backends():
    proc = qual("--version")
    assert proc.returncode == 0 and proc.stdout.startswith("qual 0.") and "io_uring:" in \
        proc.stdout


def test_profiles_json_lists_each_profile_with_its_families_and_criteria():
    proc = qual("profiles", "--json")
    assert proc.returncode == 0, proc.stderr
    docs = {d["name"]: d for d in json.loads(proc.stdout)}
    assert {"ci", "gen5-tlc", "gen4-qlc", "nvme-rig"} <= docs.keys()
    assert "bandwidth" in docs["ci"]["families"] and docs["ci"]["file"].endswith("ci.toml")
    assert "seq_read_bw[bs=1M,qd=16]" in docs["ci"]["criteria"]


@pytest.mark.slow
def test_profiles_name_shows_one_profile_s_settings_and_every_criterion(tmp_path):
    """`qual profiles NAME`: what a profile asks, without reading its TOML (and its parents')."""
    proc = qual("profiles", "ci")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("ci: CI and laptops") and "tolerance: 25 %" in out
    assert "repeats: 3" in out and "population (qual accept): at least 3 drives" in out
    (line,) = [x for x in out.splitlines() if x.startswith("seq_read_bw[bs=1M,qd=16] ")]
    assert ">= 20 MiB/s" in line and "critical" in line and "ci.toml:bandwidth.criteria[0]" in line
    doc = json.loads(qual("profiles", "ci", "--json").stdout)
    (c,) = [c for c in doc["criteria"] if c["id"] == "seq_read_bw[bs=1M,qd=16]"]
    assert (c["min"], c["unit"], c["severity"]) == (20 * 2**20, "MiB/s", "critical")
    assert doc["settings"]["repeats"] == 3 and len(doc["criteria"]) == int(
        next(x for x in out.splitlines() if x.endswith(" criteria:")).split()[0])
    # an extending profile shows what it inherits, and from where
    child = tmp_path / "child.toml"
    child.write_text('[profile]\nextends = "ci"\ndescription = "a child"\ntolerance = "10 %"\n')
    out = qual("profiles", str(child)).stdout
    assert "tolerance: 10 %" in out and "ci.toml:bandwidth.criteria[0]" in out
    assert "child.toml <- " in out
    proc = qual("profiles", "nosuch")
    assert proc.returncode == 4 and "no such profile file or name" in proc.stderr


@pytest.mark.parametrize("spelling", [["--qual-results", "X"], ["--qual-results=X"],
                                      ["--results", "X"]])
@pytest.mark.slow
def test_one_results_folder_however_it_is_spelled(tmp_path, spelling):
    """The record and the Allure results of a run land in one folder, whether it is named
    with qual run's --results or the plugin's --qual-results."""
    proc = qual("run", "--profile", str(TINY_PROFILE), "--target", str(tmp_path / "t.dat"),
                *spelling, "-q", "-k", "seq_read", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr
    assert (tmp_path / "X" / "qual-run.json").exists()
    assert list((tmp_path / "X" / "allure-results").glob("*-result.json"))
    assert not (tmp_path / "qual-results").exists()
    both = qual("run", "--profile", str(TINY_PROFILE), "--results", "A", "--qual-results", "B",
                cwd=tmp_path)
    assert both.returncode == 2 and "name two folders" in both.stderr


def test_run_help_lists_the_plugin_options_and_the_exit_codes():
    out = qual("run", "--help").stdout
    for option in ("--qual-allow-destructive", "--qual-confirm-serial", "--qual-repeats",
                   "--qual-baseline", "--qual-fit"):
        assert option in out, option
    assert "exit status:" in out and "6  INCOMPLETE" in out and "5  INCONCLUSIVE" in out


@pytest.mark.parametrize("spelling", ["--ioengine", "--engine"])
def test_io_takes_fios_ioengine_and_the_old_spelling(tmp_path, spelling):
    proc = qual("io", "--target", str(tmp_path), "--size", "1M", spelling, "psync", "--json",
                "-q")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["backend"] == "psync"


@pytest.mark.parametrize("family, args", [
    ("integrity", ("--size", "1M", "--patterns", "sequential")),
    ("checkpoint", ("--tp", "2", "--scale", "1e-4")),
])
@pytest.mark.parametrize("spelling", ["--ioengine", "--backend", "--engine"])
@pytest.mark.slow
def test_families_take_one_backend_flag_in_every_spelling(tmp_path, family, args, spelling):
    proc = qual(family, "--target", str(tmp_path), *args, spelling, "psync", "--json", "-q")
    assert proc.returncode == 0, proc.stderr
    assert '"backend": "psync"' in proc.stdout


@needs_root
@pytest.mark.slow
def test_a_refusal_names_the_flags_of_the_command_that_refused(loop_device, tmp_path):
    dev = loop_device()
    io = qual("io", "--target", dev, "--rw", "write", "--size", "1M")
    assert io.returncode == 1 and "need --allow-destructive" in io.stderr, io.stderr
    assert "confirm the drive with --confirm-serial" in io.stderr
    assert "--qual-" not in io.stderr
    run = qual("run", "--target", dev, "--plan", cwd=tmp_path)
    assert "need --qual-allow-destructive" in run.stdout + run.stderr


def test_a_removed_flag_says_what_replaced_it_with_its_command_s_usage(tmp_path):
    proc = qual("checkpoint", "--keep", "3", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith("usage: qual checkpoint ")
    assert proc.stderr.strip().endswith("qual checkpoint: error: --keep was renamed: use "
                                        "--retention")
    proc = qual("io", "--bogus", "1", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith("usage: qual io ")
    assert "qual io: error: unrecognized arguments: --bogus 1" in proc.stderr
    assert not list(tmp_path.iterdir())  # before any I/O


def test_a_command_line_parses_as_with_every_command_built_and_a_wrong_one_lists_them_all():
    """qual builds only the family subcommand a command line names; a family's flags parse as
    they do with every command built, and a mistyped command's error lists every command."""
    from qual import cli
    from qual.workloads import registry

    argv = ["checkpoint", "--count", "2", "--json"]
    assert vars(cli._parser(registry(), only="checkpoint").parse_known_args(argv)[0]) == \
        vars(cli._parser(registry()).parse_known_args(argv)[0])
    proc = subprocess.run([sys.executable, "-m", "qual.cli", "chekpoint"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "invalid choice: 'chekpoint'" in proc.stderr
    assert all(f"'{f.subcommand}'" in proc.stderr for f in registry().values() if f.run), \
        proc.stderr


def test_every_flag_says_what_it_is_and_every_command_its_exit_statuses():
    """No help that only repeats its flag's name (`--tp COUNT  tp`), none missing; every
    command's help names its exit statuses."""
    import argparse

    from qual.cli import _parser
    from qual.workloads import registry

    parser = _parser(registry())
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    bare = []
    for name, command in sub.choices.items():
        for each in [command, *(p for a in command._actions
                                if isinstance(a, argparse._SubParsersAction)
                                for p in a.choices.values())]:
            text = each.format_help()
            if each is command and "exit" not in text.lower():
                bare.append(f"qual {name}: no exit statuses")
            for action in each._actions:
                if action.help == argparse.SUPPRESS or "-h" in action.option_strings or \
                        isinstance(action, argparse._SubParsersAction):  # its commands say
                    continue
                words = {s.lstrip("-").replace("-", " ").replace("_", " ")
                         for s in action.option_strings} | {action.dest.replace("_", " ")}
                said = (action.help or "").split(" [")[0].strip().lower()
                if not said or said in words:
                    bare.append(f"qual {name} {action.option_strings or action.dest}: "
                                f"{action.help!r}")
    assert not bare, "\n".join(bare)


def test_every_command_s_help_ends_with_its_exit_statuses():
    """Each command's --help lists its exit statuses from qual.exits, a line per code, each
    code one of qual's (a family's command and the store's subcommand group alike)."""
    from qual.exits import Exit

    codes = {str(int(c)) for c in Exit}
    for command in ("io", "run", "report", "compare", "accept", "history", "store",
                    "profiles", "clean", "kvcache"):
        out = qual(command, "--help").stdout
        listed = out.split("exit status:\n", 1)[1].splitlines()
        rows = [line.split(None, 1) for line in listed if line.startswith("  ")]
        assert len(rows) >= 2 and all(code in codes and said for code, said in rows), \
            (command, listed)


@pytest.mark.parametrize("argv, said", [
    (("compare", "--baseline", "serial=S", "a.json", "b.json"),
     "qual compare: error: with --baseline, give only the run record to judge"),
    (("report", "--out", "r"), "qual report: error: give the results folder(s) to report"),
    (("report", "--population", "--out", "r"), "qual report --population: error: give "
                                               "--model and --firmware"),
    (("accept", "--model", "M", "--firmware", "1", "--profile", "nowhere"),
     "qual accept: error: --profile nowhere:"),
    (("history", "--model", "M"), "qual history: error: no stored run of model 'M'"),
    (("bandwidth", "--store", "mysql://x/y", "--profile", "ci"), "qual bandwidth: error: "
                                                                  "--store: "),
])
def test_each_command_says_a_usage_error_in_one_form_and_exits_2(tmp_path, argv, said):
    """`qual COMMAND: error: what`, exit 2, nothing made: the one way every command says a
    bad argument (qual.exits.usage_error)."""
    env = dict(os.environ, QUAL_STORE=f"sqlite:///{tmp_path / 'store.sqlite'}")
    proc = subprocess.run([sys.executable, "-m", "qual.cli", *argv], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith(said), proc.stderr
    assert set(tmp_path.iterdir()) <= {tmp_path / "store.sqlite"}
