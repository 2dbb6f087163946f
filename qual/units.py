"""Quantities with units: parse what profiles and flags say, format what reports show.

Sizes follow fio's convention: a bare K/M/G/T suffix and KiB/MiB/GiB/TiB are binary (1024);
KB/MB/GB/TB are decimal (1000), as drive vendors print them. Values are held in base units:
bytes, bytes per second, seconds, operations per second, samples per second, degrees (a
temperature difference), and plain ratios (70 % = 0.70).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass


class UnitError(ValueError):
    """A quantity or unit that cannot be understood, with the reason."""


@dataclass(frozen=True)
class Unit:
    name: str
    dimension: str  # size | bandwidth | time | rate | samples | tokens | queries | temperature |
    #                 ratio | count
    factor: float  # base units per one of this unit


_SIZE_FACTORS = {
    "B": 1,
    "K": 1024, "KiB": 1024, "KB": 1000,
    "M": 1024**2, "MiB": 1024**2, "MB": 1000**2,
    "G": 1024**3, "GiB": 1024**3, "GB": 1000**3,
    "T": 1024**4, "TiB": 1024**4, "TB": 1000**4,
}
_TIME_FACTORS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0}
_RATE_FACTORS = {"IOPS": 1.0, "kIOPS": 1e3, "MIOPS": 1e6, "/s": 1.0}

UNITS: dict[str, Unit] = {}
for _n, _f in _SIZE_FACTORS.items():
    UNITS[_n] = Unit(_n, "size", _f)
    UNITS[f"{_n}/s"] = Unit(f"{_n}/s", "bandwidth", _f)
for _n, _f in _TIME_FACTORS.items():
    UNITS[_n] = Unit(_n, "time", _f)
for _n, _f in _RATE_FACTORS.items():
    UNITS[_n] = Unit(_n, "rate", _f)
for _n in ("K", "M", "G", "T"):  # fio accepts 4k, 1m: single-letter suffixes in any case
    UNITS[_n.lower()] = Unit(_n.lower(), "size", _SIZE_FACTORS[_n])
    UNITS[f"{_n.lower()}/s"] = Unit(f"{_n.lower()}/s", "bandwidth", _SIZE_FACTORS[_n])
UNITS["%"] = Unit("%", "ratio", 0.01)
UNITS["x"] = Unit("x", "ratio", 1.0)
UNITS["count"] = Unit("count", "count", 1.0)
UNITS["samples/s"] = Unit("samples/s", "samples", 1.0)  # training samples consumed
UNITS["tokens/s"] = Unit("tokens/s", "tokens", 1.0)  # tokens an inference server generated
UNITS["queries/s"] = Unit("queries/s", "queries", 1.0)  # searches a vector index answered
UNITS["QPS"] = Unit("QPS", "queries", 1.0)
UNITS["C"] = Unit("C", "temperature", 1.0)  # a temperature difference (kelvin = degrees C)

DIMENSIONS = ("size", "bandwidth", "time", "rate", "samples", "tokens", "queries", "temperature",
              "ratio", "count")

_QUANTITY = re.compile(r"^\s*([-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)\s*"
                       r"([A-Za-zµ%/]*)\s*$")


def parse_unit(name: str, dimension: str | None = None) -> Unit:
    """The unit called `name`; when `dimension` is given, the unit must measure it."""
    unit = UNITS.get(name.strip())
    if unit is None:
        raise UnitError(f"unknown unit {name!r} (known: {', '.join(_names(dimension))})")
    if dimension and unit.dimension != dimension:
        raise UnitError(
            f"unit {name!r} measures {unit.dimension}, not {dimension} "
            f"(use one of: {', '.join(_names(dimension))})"
        )
    return unit


def _names(dimension: str | None) -> list[str]:
    return [n for n, u in UNITS.items() if dimension is None or u.dimension == dimension]


def parse_quantity(value: object, dimension: str, default_unit: str | None = None) -> float:
    """A number with an optional unit ("4 GiB", "10s", 128) as a value in base units."""
    if isinstance(value, bool):
        raise UnitError(f"{value!r} is not a quantity")
    if isinstance(value, (int, float)):
        number, unit_name = float(value), ""
    elif isinstance(value, str):
        match = _QUANTITY.match(value)
        if not match:
            raise UnitError(f"{value!r} is not a number with a unit")
        number, unit_name = float(match.group(1)), match.group(2)
    else:
        raise UnitError(f"{value!r} is not a quantity")
    if not math.isfinite(number):
        raise UnitError(f"{value!r} is not finite")
    if not unit_name:
        if number == 0:
            return 0.0  # zero in every unit: "0" turns a share off without naming one
        if default_unit is None:
            raise UnitError(f"{value!r} needs a unit of {dimension} ({', '.join(_names(dimension))})")
        unit_name = default_unit
    return number * parse_unit(unit_name, dimension).factor


def parse_size(value: object, *, name: str = "size", minimum: int = 1) -> int:
    """A size in whole bytes (a bare number is bytes), at least `minimum`."""
    size = parse_quantity(value, "size", default_unit="B")
    if size != int(size):
        raise UnitError(f"{name} {value!r} is not a whole number of bytes")
    if size < minimum:
        raise UnitError(f"{name} {value!r} must be at least {format_size(minimum)}")
    return int(size)


def parse_duration(value: object, *, name: str = "duration", minimum: float = 0.0,
                   zero_ok: bool = False) -> float:
    """A duration in seconds (a bare number is seconds), more than `minimum` (or exactly 0
    where `zero_ok`)."""
    seconds = parse_quantity(value, "time", default_unit="s")
    if zero_ok and seconds == 0:
        return 0.0
    if seconds <= minimum:
        allowed = "0 or " if zero_ok else ""
        raise UnitError(f"{name} {value!r} must be {allowed}longer than {minimum} s")
    return seconds


def parse_count(value: object, *, name: str, minimum: int = 1, maximum: int | None = None) -> int:
    """A whole count within [minimum, maximum]."""
    if isinstance(value, bool) or not isinstance(value, int):
        # ASCII digits only: str.isdigit() also takes "²", which int() refuses
        if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
            value = int(value.strip())
        else:
            raise UnitError(f"{name} {value!r} is not a whole number")
    if value < minimum or (maximum is not None and value > maximum):
        upper = f"..{maximum}" if maximum is not None else " or more"
        raise UnitError(f"{name} {value} is outside {minimum}{upper}")
    return value


def convert(value: float, unit: str) -> float:
    """A base-unit value expressed in `unit`."""
    return value / parse_unit(unit).factor


_AUTO = {
    "size": ("B", "KiB", "MiB", "GiB", "TiB"),
    "bandwidth": ("B/s", "KiB/s", "MiB/s", "GiB/s", "TiB/s"),
    "time": ("ns", "us", "ms", "s"),
    "rate": ("IOPS", "kIOPS", "MIOPS"),
    "samples": ("samples/s",),
    "tokens": ("tokens/s",),
    "queries": ("queries/s",),
    "temperature": ("C",),
}


def best_unit(value: float, dimension: str) -> str:
    """The largest unit of the dimension in which |value| is at least 1."""
    if dimension == "ratio":
        return "%"
    if dimension == "count":
        return "count"
    choice = _AUTO[dimension][0]
    for name in _AUTO[dimension]:
        if abs(value) >= UNITS[name].factor:
            choice = name
    return choice


def format_quantity(value: float, unit: str | None = None, *, dimension: str | None = None) -> str:
    """`value` (base units) as text in `unit`, or in the best unit of `dimension`."""
    if unit is None:
        if dimension is None:
            raise UnitError("format_quantity needs a unit or a dimension")
        unit = best_unit(value, dimension)
    shown = convert(value, unit)
    if 0 < abs(shown) < 0.01 and UNITS[unit].dimension in _AUTO:
        unit = best_unit(value, UNITS[unit].dimension)  # 61.2 us, not 6.12e-05 s
        shown = convert(value, unit)
    text = f"{shown:.3g}" if abs(shown) < 1000 else f"{shown:.0f}"
    if unit == "count":
        return text
    return f"{text} {unit}" if unit != "%" else f"{text} %"


def format_size(value: float) -> str:
    return format_quantity(value, dimension="size")


def format_duration(seconds: float) -> str:
    """A span for a person: 850 ms, 1.5 s, 12 s, 3 min 20 s, 1 h 05 min."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 9.95:  # two digits: a think time of 1.5 s is not 2 s
        return f"{seconds:.2g} s"
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"
