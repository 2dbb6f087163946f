"""Profiles: every kind of bad file gives its own `file:key: problem` line; inheritance;
verdicts in docs/ARCHITECTURE.md §5's words."""

import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qual import feasibility, thresholds
from qual.workloads import registry
from qual.workloads.checkpoint.plan import MLPERF_LAYOUTS
from qual.thresholds import ProfileError, load_profile

GOOD = """
[profile]
description = "test class"

[bandwidth]
size = "64 MiB"
block_sizes = ["1M", "4K"]
depths = [32, 1]

[bandwidth.latency]
block_size = "4K"
depth = 1

[[bandwidth.criteria]]
metric = "seq_read_bw"
params = { bs = "1M", qd = 32 }
min = 6.0
unit = "GiB/s"
source = "D7-PS1010 6.2 GiB/s"
"""


def write(tmp_path, text, name="p.toml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def problems(tmp_path, text):
    with pytest.raises(ProfileError) as e:
        load_profile(write(tmp_path, text), registry())
    return str(e.value)


def test_good_profile_loads(tmp_path):
    p = load_profile(write(tmp_path, GOOD), registry())
    assert p.name == "p" and p.description == "test class"
    t = p.table("bandwidth")
    assert t["size"] == 64 << 20 and t["block_sizes"] == [1 << 20, 4096] and t["depths"] == [32, 1]
    assert t["runtime"] == 10.0 and t["workers"] == 1 and t["backend"] == "auto"  # defaults
    assert t["latency"] == {"block_size": 4096, "depth": 1, "runtime": 10.0}
    (c,) = p.criteria
    assert c.id == "seq_read_bw[bs=1M,qd=32]" and c.min == pytest.approx(6.0 * 2**30)
    assert c.severity == "normal" and c.origin == "p.toml:bandwidth.criteria[0]"


@pytest.mark.parametrize("mutation, expected", [
    # unknown keys, with a hint when it looks like a typo
    (('min = 6.0', 'mni = 6.0'), "p.toml:bandwidth.criteria[0].mni: unknown key (did you mean 'min'?)"),
    (('depths = [32, 1]', 'depths = [32, 1]\nramp = "5 s"'), "p.toml:bandwidth.ramp: unknown key"),
    (('[profile]', '[profile]\nowner = "me"'), "p.toml:profile.owner: unknown key"),
    (('[bandwidth]\n', '[bandwith]\nx = 1\n[bandwidth]\n'), "p.toml:bandwith: unknown table"),
    # units
    (('unit = "GiB/s"', 'unit = "GiB"'), "p.toml:bandwidth.criteria[0].unit: unit 'GiB' measures size, not bandwidth"),
    (('unit = "GiB/s"', 'unit = "gigs"'), "p.toml:bandwidth.criteria[0].unit: unknown unit 'gigs'"),
    (('size = "64 MiB"', 'size = "64 ms"'), "p.toml:bandwidth.size: unit 'ms' measures time, not size"),
    (('min = 6.0', 'min = "6.0 GiB/s"'), "p.toml:bandwidth.criteria[0].min: '6.0 GiB/s' must be a number (the unit goes in `unit`)"),
    # negative or zero sizes, depth 0, misaligned or oversized blocks
    (('size = "64 MiB"', 'size = "-1 MiB"'), "p.toml:bandwidth.size: size '-1 MiB' must be at least"),
    (('size = "64 MiB"', 'size = 0'), "p.toml:bandwidth.size: size 0 must be at least"),
    (('depths = [32, 1]', 'depths = [32, 0]'), "p.toml:bandwidth.depths: depths 0 is outside 1..4096"),
    (('depths = [32, 1]', 'depths = []'), "p.toml:bandwidth.depths: must be a non-empty list"),
    (('depths = [32, 1]', 'depths = [32, 32]'), "p.toml:bandwidth.depths: lists a value twice"),
    (('block_sizes = ["1M", "4K"]', 'block_sizes = ["1M", "4K", "128M"]'), "p.toml:bandwidth.block_sizes: 128M is larger than size"),
    (('block_sizes = ["1M", "4K"]', 'block_sizes = ["1M", "4.5 B"]'), "p.toml:bandwidth.block_sizes: block_sizes '4.5 B' is not a whole number"),
    (('size = "64 MiB"', 'size = "64 MiB"\nruntime = "0 s"'), "p.toml:bandwidth.runtime: runtime '0 s' must be longer than 0"),
    (('size = "64 MiB"', 'size = "64 MiB"\nbackend = "aio"'), "p.toml:bandwidth.backend: 'aio' is not one of auto, io_uring, psync"),
    # criteria
    (('metric = "seq_read_bw"', 'metric = "seq_read_speed"'), "p.toml:bandwidth.criteria[0].metric: 'seq_read_speed' is not a metric of [bandwidth]"),
    (('params = { bs = "1M", qd = 32 }', 'params = { bs = "1M" }'), "p.toml:bandwidth.criteria[0].params.qd: missing"),
    (('params = { bs = "1M", qd = 32 }', 'params = { bs = "1M", qd = 32, jobs = 4 }'), "p.toml:bandwidth.criteria[0].params.jobs: unknown key"),
    (('params = { bs = "1M", qd = 32 }', 'params = { bs = "2M", qd = 32 }'), "p.toml:bandwidth.criteria[0]: seq_read_bw[bs=2M,qd=32] is not measured with the [bandwidth] parameters of p.toml"),
    (('source = "D7-PS1010 6.2 GiB/s"', ''), "p.toml:bandwidth.criteria[0].source: missing: cite the figure"),
    (('min = 6.0', ''), "p.toml:bandwidth.criteria[0]: needs a bound: min, max or both"),
    (('min = 6.0', 'min = 6.0\nmax = 5.0'), "p.toml:bandwidth.criteria[0]: min 6.0 is above max 5.0"),
    (('min = 6.0', 'min = -6.0'), "p.toml:bandwidth.criteria[0].min: -6.0 is negative"),
    (('unit = "GiB/s"', 'unit = "GiB/s"\nseverity = "huge"'), "p.toml:bandwidth.criteria[0].severity: 'huge' is not one of blocker"),
    (('unit = "GiB/s"', 'unit = "GiB/s"\ntolerance = "five"'), "p.toml:bandwidth.criteria[0].tolerance: 'five' is not a number"),
    # the profile table
    (('description = "test class"', ''), "p.toml:profile.description: missing"),
    (('description = "test class"', 'description = "test class"\nextends = "nowhere"'), "p.toml:profile.extends: no profile 'nowhere'"),
    (('depths = [32, 1]', 'depths = "32"'), "p.toml:bandwidth.depths: must be a non-empty list"),
    (('block_sizes = ["1M", "4K"]', ''), "p.toml:bandwidth.block_sizes: missing"),
    (('description = "test class"', 'description = "test class"\nlink = "Gen5"'), "p.toml:profile.link: 'Gen5' is not a PCIe link"),
    (('description = "test class"', 'description = "test class"\npeak_read_bw = { "1M" = "6 GiB" }'), "p.toml:profile.peak_read_bw.1M: unit 'GiB' measures size, not bandwidth"),
    # a percentile outside (0, 100] is said to be one, not "not measured"
    (('metric = "seq_read_bw"\nparams = { bs = "1M", qd = 32 }',
      'metric = "rand_read_lat"\nparams = { bs = "4K", qd = 1, pct = 150 }'),
     "p.toml:bandwidth.criteria[0].params.pct: pct 150 is not a percentile: give one above 0 "
     "and at most 100"),
    # TOML itself
    (('[profile]', '[profile'), "p.toml:toml: "),
])
def test_each_kind_of_bad_profile_says_where_and_what(tmp_path, mutation, expected):
    old, new = mutation
    assert old in GOOD
    assert expected in problems(tmp_path, GOOD.replace(old, new, 1))


@pytest.mark.parametrize("line, expected", [
    ("repeats = 101", "p.toml:profile.repeats: repeats 101 is outside 1..100"),
    ("repeats = true", "p.toml:profile.repeats: repeats True is not a whole number"),
    ("tolerance = \"2000 %\"", "p.toml:profile.tolerance: '2000 %' is not a sensible ratio"),
    ("gate = \"huge\"", "p.toml:profile.gate: 'huge' is not one of blocker"),
    ("filesystem_options = [\"-E\", \"\"]", "p.toml:profile.filesystem_options: must be a "
                                              "list of mkfs options"),
    ("colour = 1", "p.toml:profile.colour: unknown key; known: name, description"),
])
def test_the_profile_table_is_checked_by_its_fields(tmp_path, line, expected):
    text = GOOD.replace('description = "test class"', f'description = "test class"\n{line}')
    assert expected in problems(tmp_path, text)


def test_the_profile_table_s_values_are_parsed(tmp_path):
    text = GOOD.replace('description = "test class"', 'description = "test class"\n'
                        'filesystem_options = ["-E", "a", "-E", "b"]\nrepeats = 3\n'
                        'peak_read_bw = { "1M" = "6.2 GiB/s" }\nlink = "32 GT/s x4"')
    p = load_profile(write(tmp_path, text), registry())
    assert p.filesystem_options == ("-E", "a", "-E", "b")  # a mkfs option may come twice
    assert (p.repeats, p.peak_read_bw, p.link) == (3, {1 << 20: 6.2 * (1 << 30)}, "32 GT/s x4")


def test_repeats_has_one_range_the_profile_s_and_the_flag_s(tmp_path):
    """--qual-repeats is parsed by the profile's own field: the same words for the same
    value, from either place."""
    import subprocess
    import sys

    from qual import shipped

    text = GOOD.replace('description = "test class"', 'description = "test class"\nrepeats = 0')
    said = problems(tmp_path, text)
    proc = subprocess.run([sys.executable, "-m", "pytest", str(shipped("suites")), "-p",
                           "no:benchmark", "--qual-repeats", "0", "--collect-only", "-q"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4
    assert "repeats 0 is outside 1..100" in said
    assert "--qual-repeats: repeats 0 is outside 1..100" in proc.stdout + proc.stderr


def test_a_byte_that_is_not_utf8_is_said_by_its_line(tmp_path):
    path = tmp_path / "p.toml"
    path.write_bytes(GOOD.replace('source = "D7-PS1010', 'source = "D7-PS1010 caf\xe9').encode(
        "latin-1"))
    with pytest.raises(ProfileError) as e:
        load_profile(path, registry())
    line = GOOD.splitlines().index('source = "D7-PS1010 6.2 GiB/s"') + 1
    assert f"p.toml:toml: line {line}: a byte that is not UTF-8 (b'\\xe9')" in str(e.value)


def test_every_problem_is_reported_at_once(tmp_path):
    text = GOOD.replace('min = 6.0', 'mni = 6.0').replace('size = "64 MiB"', 'size = "64 ms"')
    message = problems(tmp_path, text)
    assert "bandwidth.criteria[0].mni" in message and "bandwidth.size" in message


def test_duplicate_criterion_is_refused(tmp_path):
    crit = GOOD[GOOD.index("[[bandwidth.criteria]]"):]
    assert "is already judged by bandwidth.criteria[0]" in problems(tmp_path, GOOD + crit)


def test_extends_inherits_and_overrides(tmp_path):
    write(tmp_path, GOOD, "base.toml")
    child = write(tmp_path, """
        [profile]
        extends = "base"
        description = "child class"

        [bandwidth]
        depths = [32, 8, 1]

        [[bandwidth.criteria]]
        metric = "seq_read_bw"
        params = { bs = "1M", qd = 32 }
        min = 7.0
        unit = "GiB/s"
        source = "stricter"

        [[bandwidth.criteria]]
        metric = "rand_read_lat"
        params = { bs = "4K", qd = 1, pct = 99.99 }
        max = 2
        unit = "ms"
        source = "proposal"
        """, "child.toml")
    p = load_profile(child, registry())
    t = p.table("bandwidth")
    assert t["depths"] == [32, 8, 1] and t["size"] == 64 << 20  # overridden, inherited
    assert [c.id for c in p.criteria] == ["seq_read_bw[bs=1M,qd=32]",
                                          "rand_read_lat[bs=4K,qd=1,pct=99.99]"]
    assert p.criteria[0].source == "stricter" and p.criteria[0].file == "child.toml"
    assert p.files == (child.resolve(), (tmp_path / "base.toml").resolve())


def test_extends_cycle_is_refused(tmp_path):
    write(tmp_path, GOOD.replace('description = "test class"',
                                 'description = "a"\nextends = "b"'), "a.toml")
    b = write(tmp_path, GOOD.replace('description = "test class"',
                                     'description = "b"\nextends = "a"'), "b.toml")
    with pytest.raises(ProfileError, match="extends itself through b.toml -> a.toml -> b.toml"):
        load_profile(b, registry())


def test_unknown_profile_name_lists_the_shipped_ones():
    with pytest.raises(ProfileError, match="shipped: .*ci.*gen5-tlc"):
        load_profile("no-such-profile", registry())


def test_shipped_profiles_load_and_cite_their_sources():
    shipped = {name: path for name, _, path in thresholds.list_profiles(registry())}
    assert {"ci", "gen5-tlc", "gen4-qlc", "nvme-rig"} <= shipped.keys()
    for name in shipped:
        p = load_profile(name, registry())
        assert all(c.source for c in p.criteria)
    gen5, gen4 = load_profile("gen5-tlc", registry()), load_profile("gen4-qlc", registry())
    gib = 2**30
    assert gen5.criteria_for("seq_read_bw[bs=1M,qd=128]")[0].min == pytest.approx(6.2 * gib)
    assert gen4.criteria_for("seq_read_bw[bs=1M,qd=128]")[0].min == pytest.approx(4.2 * gib)
    for qd in (64, 128):  # seed 004 gives a ratio between two drives at 128K, no figure
        assert not gen5.criteria_for(f"seq_read_bw[bs=128K,qd={qd}]")
        assert not gen4.criteria_for(f"seq_read_bw[bs=128K,qd={qd}]")
    for p in (gen5, gen4):
        pcts = {dict(c.params).get("pct") for c in p.criteria if c.metric == "rand_read_lat"}
        assert {99, 99.99} <= pcts


def test_nvme_rig_holds_mlperfs_checkpoint_procedure_and_seed_004_drives_their_passes():
    """The rig base runs MLPerf Storage v2.0 as its CLOSED division does (8B in its layout,
    subset mode, 10 writes and 10 reads, 5 runs); the drive classes whose checkpoint criteria
    are seed 004's figures run seed 004's passes; ci runs MLPerf's procedure scaled."""
    rig = load_profile("nvme-rig", registry()).tables["checkpoint"]
    assert (rig["procedure"], rig["per_pass"], rig["runs"], rig["subset"], rig["scale"]) == \
        ("mlperf-v2", 10, 5, True, 1.0)
    assert (rig["tp"], rig["pp"], rig["dp"], rig["zero"]) == MLPERF_LAYOUTS[rig["model"]]
    for name in ("gen5-tlc", "gen4-qlc"):
        seed = load_profile(name, registry()).tables["checkpoint"]
        assert (seed["procedure"], seed["subset"], seed["model"], seed["tp"], seed["pp"],
                seed["dp"], seed["zero"]) == ("passes", False, "llama3.1-405b", 4, 2, 1, 0)
    ci = load_profile("ci", registry()).tables["checkpoint"]
    assert (ci["procedure"], ci["per_pass"], ci["runs"], ci["subset"]) == ("mlperf-v2", 2, 1, True)


def test_verdict_line_reads_as_design_says(tmp_path):
    p = load_profile(write(tmp_path, GOOD.replace("min = 6.0", "min = 6.0\nseverity = \"critical\"")), registry())
    (c,) = p.criteria
    (fail,) = c.judge(5.81 * 2**30)
    assert not fail.passed
    assert fail.line() == ("seq_read_bw[bs=1M,qd=32] = 5.81 GiB/s < min 6 GiB/s (-3.2 %) "
                           "[p.toml: D7-PS1010 6.2 GiB/s]")
    (ok,) = c.judge(6.3 * 2**30)
    assert ok.passed and ok.line().startswith("seq_read_bw[bs=1M,qd=32] = 6.3 GiB/s >= min")


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyz_[]=\"\n .0123456789", max_size=120))
def test_loader_never_crashes_on_garbage(tmp_path_factory, junk):
    """Any text is either a profile or a ProfileError; never an unexplained exception."""
    path = tmp_path_factory.mktemp("junk") / "j.toml"
    path.write_text(junk)
    try:
        load_profile(path, registry())
    except ProfileError as e:
        assert all(f and k and p for f, k, p in e.problems)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from(["size", "runtime", "workers", "depths", "block_sizes",
                                        "patterns", "backend", "bogus"]),
                       st.one_of(st.integers(-5, 10**10), st.text(max_size=8),
                                 st.lists(st.integers(-2, 5000), max_size=3),
                                 st.lists(st.sampled_from(["1M", "4K", "0", "x"]), max_size=3)),
                       max_size=6))
def test_loader_validates_any_bandwidth_table(tmp_path_factory, table):
    import json

    lines = [f"{k} = {json.dumps(v)}" for k, v in table.items()]
    text = '[profile]\ndescription = "x"\n[bandwidth]\n' + "\n".join(lines) + "\n"
    path = tmp_path_factory.mktemp("tbl") / "t.toml"
    path.write_text(text)
    try:
        p = load_profile(path, registry())
    except ProfileError as e:
        assert all(k.startswith(("bandwidth", "profile", "toml")) for _, k, _ in e.problems)
    else:
        t = p.table("bandwidth")
        assert t["size"] >= 4096 and all(1 <= d <= 4096 for d in t["depths"])
        assert all(0 < bs <= t["size"] for bs in t["block_sizes"])


# ------------------------------------------------------------------ feasibility


def test_every_shipped_profile_can_be_met_by_a_drive_of_its_class():
    for name, _, _ in thresholds.list_profiles(registry()):
        assert feasibility.problems(load_profile(name, registry()), registry()) == [], name
    for name in ("gen4-qlc", "gen5-tlc"):  # drive classes say what their link and peak are
        p = load_profile(name, registry())
        assert feasibility.link_bandwidth(p.link) and p.peak_read_bw


def test_feasibility_of_the_pcie_links():
    assert feasibility.link_bandwidth("32 GT/s x4") == pytest.approx(15.75e9, rel=1e-3)
    assert feasibility.link_bandwidth("16 GT/s x4") == pytest.approx(7.88e9, rel=1e-3)
    assert feasibility.link_bandwidth(None) is None


@pytest.mark.parametrize("criterion, expected", [
    # the defects issue 18 found in the shipped profiles, each caught
    ('metric = "train_au"\nparams = { accelerators = 8, epochs = 5 }\nmin = 90\nunit = "%"',
     "AU 90 % x 8 accelerators x 3.45 GB/s each needs 24.8 GB/s, more than a 32 GT/s x4 link"),
    ('metric = "train_dataset_share"\nparams = { accelerators = 32 }\nmin = 100\nunit = "%"',
     "the profile's dataset holds 4 % of 500 steps of 32 accelerators"),
    ('metric = "seq_read_bw"\nparams = { bs = "128K", qd = 64 }\nmin = 6.2\nunit = "GiB/s"',
     "at 128 KiB, where nothing is published; the class peaks at 6.2 GiB/s with larger blocks"),
    ('metric = "seq_read_bw"\nparams = { bs = "1M", qd = 128 }\nmin = 7\nunit = "GiB/s"',
     "above the class's published 6.2 GiB/s at 1 MiB"),
    ('metric = "train_bw"\nparams = { accelerators = 6, epochs = 5 }\nmin = 16\nunit = "GB/s"',
     "at least 16 GB/s, more than a 32 GT/s x4 link carries (15.8 GB/s)"),
])
def test_an_infeasible_bound_is_named_with_its_arithmetic(tmp_path, criterion, expected):
    section = "training" if "train" in criterion else "bandwidth"
    path = write(tmp_path, f"""
        [profile]
        extends = "gen5-tlc"
        description = "a Gen5 class with one impossible bound"

        [[{section}.criteria]]
        {criterion.replace(chr(10), chr(10) + "        ")}
        source = "test"
        """)
    problems = feasibility.problems(load_profile(path, registry()), registry())
    assert len(problems) == 1 and expected in problems[0], problems
