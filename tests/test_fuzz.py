"""Fuzzing the inputs a person types: the unit parser, profile files and `qual io` flags. Every
input either works or is refused with qual's own error; none crashes or shows a traceback."""

from __future__ import annotations

import json
import math
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qual import cli, units
from qual.workloads import registry
from qual.thresholds import ProfileError, load_profile

from testbed import time_limit

FAMILIES = registry()

values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
              st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
              st.sampled_from(["4K", "1 MiB", "10 s", "70 %", "1.5GB", "-1M", "0", "3x", "5 ms",
                               "1e3", "12 kIOPS", "GiB/s", "4k", ""])),
    lambda inner: st.lists(inner, max_size=3), max_leaves=6)


@settings(max_examples=2000, deadline=None)
@given(value=values, dimension=st.sampled_from(units.DIMENSIONS))
@pytest.mark.slow
def test_the_unit_parser_returns_a_number_or_a_unit_error(value, dimension):
    for parse in (lambda v: units.parse_size(v), lambda v: units.parse_duration(v),
                  lambda v: units.parse_count(v, name="n"),
                  lambda v: units.parse_quantity(v, dimension)):
        try:
            out = parse(value)
        except units.UnitError as e:
            assert str(e)
        else:
            assert isinstance(out, (int, float)) and not isinstance(out, bool)
            assert not math.isnan(out)


def _toml(value) -> str | None:
    """value as a TOML value, or None where TOML has no way to write it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value) if -2**63 <= value < 2**63 else None
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ("nan" if math.isnan(value) else
                                                          ("inf" if value > 0 else "-inf"))
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        items = [_toml(v) for v in value if v is not None]
        return None if None in items else f"[{', '.join(items)}]"
    return None


KEYS = sorted({f.name for fam in FAMILIES.values() for f in fam.fields} |
              {"metric", "params", "min", "max", "unit", "source", "severity", "typo"})
METRICS = sorted({m for fam in FAMILIES.values() for m in fam.metrics})


@st.composite
def profiles(draw) -> str:
    lines = ["[profile]", f"description = {json.dumps(draw(st.text(max_size=10)))}"]
    if draw(st.booleans()):
        lines.append(f"tolerance = {_toml(draw(values)) or 0.1}")
    for family in draw(st.lists(st.sampled_from(sorted(FAMILIES) + ["nonsense"]), max_size=3,
                                unique=True)):
        lines.append(f"[{family}]")
        for key in draw(st.lists(st.sampled_from(KEYS), max_size=5, unique=True)):
            text = _toml(draw(values))
            if text is not None:
                lines.append(f"{key} = {text}")
        for _ in range(draw(st.integers(0, 2))):
            lines.append(f"[[{family}.criteria]]")
            lines.append(f"metric = {json.dumps(draw(st.sampled_from(METRICS)))}")
            for key in draw(st.lists(st.sampled_from(["min", "max", "unit", "source", "params",
                                                      "severity"]), max_size=4, unique=True)):
                text = _toml(draw(values))
                if text is not None:
                    lines.append(f"{key} = {text}")
    return "\n".join(lines) + "\n"


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                    HealthCheck.function_scoped_fixture])
@given(text=profiles())
@pytest.mark.slow
def test_a_profile_loads_or_says_what_is_wrong(tmp_path, text):
    path = tmp_path / "fuzz.toml"
    path.write_text(text)
    try:
        profile = load_profile(path, registry())
    except ProfileError as e:
        assert e.problems and all(where for _, where, _ in e.problems), text
        assert "fuzz.toml" in str(e)
    else:
        assert profile.name == "fuzz"


EXAMPLE_LIMIT = 20.0  # seconds: the longest job here reads 1 MiB or runs 5 ms
FLAG_VALUES = {
    "--rw": ["read", "randread", "write", "randwrite", "trim", ""],
    "--bs": ["4k", "64K", "1M", "0", "-4k", "3000", "abc", "1.5k", "1T"],
    "--iodepth": ["1", "8", "0", "-3", "x", "100000"],
    "--numjobs": ["1", "2", "0", "999999"],
    "--size": ["64k", "1M", "0", "2T", "-1", "1Q"],
    "--offset": ["0", "4k", "1M", "-4k", "1000"],
    "--runtime": ["2ms", "5ms", "0", "-1s", "abc", "1h"],
    "--direct": ["0", "1", "2", "yes"],
    "--engine": ["io_uring", "psync", "auto", "spdk"],
    "--iodepth_batch_submit": ["0", "1", "-1", "99999"],
    "--seed": ["1", "-5", "x"],
}


@st.composite
def io_argv(draw) -> list[str]:
    argv = []
    for flag in draw(st.lists(st.sampled_from(sorted(FLAG_VALUES)), max_size=6, unique=True)):
        argv += [flag, draw(st.sampled_from(FLAG_VALUES[flag]))]
    if draw(st.booleans()):
        argv.append(draw(st.sampled_from(["--allow-destructive", "--bogus", "-x"])))
    return argv + ["--json"]  # the document says what the job did


@pytest.fixture(scope="module")
def small_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz-io") / "data.bin"
    path.write_bytes(bytes(range(256)) * 4096)  # 1 MiB, not qual's: it is never written
    return path


def _flag(argv: list[str], flag: str, default: str) -> str:
    return argv[argv.index(flag) + 1] if flag in argv else default


@settings(max_examples=2000, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(argv=io_argv())
@pytest.mark.slow
def test_qual_io_flags_never_crash(small_file, capsys, argv):
    """Every input runs or is refused with qual's own error, and every job it runs ends at its
    bound: without a runtime, with exactly --size in whole blocks; with one, within runtime +
    1 s. The file is 1 MiB, runtimes at most 5 ms, and writes are refused (qual writes only
    files it created). Each example runs under its own time limit, so a job that does not end
    fails that example, with its argv, and not the session."""
    if "1h" in argv:
        argv[argv.index("1h")] = "5ms"
    before = small_file.read_bytes()
    started = time.monotonic()
    with time_limit(EXAMPLE_LIMIT, f"qual io {' '.join(argv)}"):
        try:
            rc = cli.main(["io", "--target", str(small_file), *argv])
        except SystemExit as e:  # argparse's own usage errors
            rc = e.code
    took = time.monotonic() - started
    out = capsys.readouterr()
    assert rc in (0, 1, 2), (argv, rc, out.err)
    assert "Traceback" not in out.err + out.out
    if rc:
        assert out.err.strip(), argv  # a refusal says why
    else:
        doc = json.loads(out.out)
        if "--runtime" in argv:
            runtime = units.parse_duration(_flag(argv, "--runtime", ""))
            assert took <= runtime + 1.0, (argv, took)
        else:
            size = units.parse_size(_flag(argv, "--size", "1G"))
            assert doc["ops"] * doc["bs"] == doc["bytes"] == size - size % doc["bs"], (argv, doc)
    assert small_file.read_bytes() == before
