"""Quantities and units: one parser for profiles and flags."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qual import units
from qual.units import UnitError


@pytest.mark.parametrize("text, want", [
    ("4K", 4096), ("4k", 4096), ("4 KiB", 4096), ("4KB", 4000), ("1M", 1 << 20),
    ("1 MiB", 1 << 20), ("1MB", 10**6), ("2 GiB", 2 << 30), ("1GB", 10**9), ("512", 512),
    (512, 512), ("1.5K", 1536), ("1T", 1 << 40),
])
def test_sizes(text, want):
    assert units.parse_size(text) == want


@pytest.mark.parametrize("text, want", [
    ("10 s", 10.0), ("10s", 10.0), ("500ms", 0.5), ("100 us", 1e-4), ("100µs", 1e-4),
    ("50ns", 5e-8), ("2 min", 120.0), (3, 3.0),
])
def test_durations(text, want):
    assert units.parse_duration(text) == pytest.approx(want)


def test_bandwidth_and_ratio():
    assert units.parse_quantity("6.2 GiB/s", "bandwidth") == pytest.approx(6.2 * 2**30)
    assert units.parse_quantity("500 MB/s", "bandwidth") == 5e8
    assert units.parse_quantity("70 %", "ratio") == pytest.approx(0.7)
    assert units.parse_quantity("70%", "ratio") == pytest.approx(0.7)


@pytest.mark.parametrize("zero", ["0", 0, "0.0"])
def test_a_bare_zero_needs_no_unit(zero):
    """Zero is zero in every unit (a help's "0 off"); any other bare ratio is ambiguous (0.6
    or 60 %?) and needs its unit."""
    assert units.parse_quantity(zero, "ratio") == 0.0
    assert units.parse_quantity(zero, "bandwidth") == 0.0
    with pytest.raises(UnitError, match="needs a unit"):
        units.parse_quantity("0.6", "ratio")


@pytest.mark.parametrize("value, dimension, message", [
    ("4 GiB", "time", "measures size, not time"),
    ("ten bytes", "size", "not a number with a unit"),
    ("10 furlongs", "size", "unknown unit"),
    ("", "size", "not a number"),
    (True, "size", "not a quantity"),
    ("nan s", "time", "not a number"),
    ("1e999 s", "time", "not finite"),
    ("6.2", "bandwidth", "needs a unit"),
])
def test_bad_quantities_say_why(value, dimension, message):
    with pytest.raises(UnitError, match=message):
        units.parse_quantity(value, dimension)


@pytest.mark.parametrize("value, message", [
    ("0", "at least"), ("-4K", "at least"), ("1.5", "whole number"), ("4 ms", "measures time"),
])
def test_bad_sizes(value, message):
    with pytest.raises(UnitError, match=message):
        units.parse_size(value)


def test_counts():
    assert units.parse_count(8, name="depth") == 8
    assert units.parse_count("8", name="depth") == 8
    for bad in (0, -1, 1.5, "eight", True):
        with pytest.raises(UnitError):
            units.parse_count(bad, name="depth")
    with pytest.raises(UnitError, match="outside 1..4096"):
        units.parse_count(5000, name="depth", maximum=4096)


@given(st.integers(min_value=1, max_value=2**50))
def test_sizes_round_trip_through_every_size_unit(n):
    for name, unit in units.UNITS.items():
        if unit.dimension == "size" and n % unit.factor == 0:
            assert units.parse_size(f"{n // int(unit.factor)} {name}") == n


@given(st.floats(min_value=1e-9, max_value=1e12, allow_nan=False),
       st.sampled_from(units.DIMENSIONS[:4]))
def test_formatting_then_parsing_keeps_three_digits(value, dimension):
    text = units.format_quantity(value, dimension=dimension)
    assert units.parse_quantity(text, dimension) == pytest.approx(value, rel=5e-3)


@pytest.mark.parametrize("text", ["²", "4²", "٣", "1٣K"])
def test_digits_other_than_ascii_are_a_unit_error(text):
    """Found by the fuzz test: str.isdigit() says yes to "²", which int() refuses."""
    for parse in (lambda v: units.parse_count(v, name="n"), units.parse_size):
        with pytest.raises(units.UnitError):
            parse(text)


@pytest.mark.parametrize("seconds, said", [
    (0.25, "250 ms"), (1.5, "1.5 s"), (2.01, "2 s"), (12.34, "12 s"), (125, "2 min 05 s")])
def test_a_span_for_a_person_keeps_its_half_seconds(seconds, said):
    """A think time of 1.5 s is said as 1.5 s, not rounded to 2 s."""
    assert units.format_duration(seconds) == said
