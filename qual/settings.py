"""Settings, one parser for them: a family's field values as a profile's table holds them, as a
command-line flag's text gives them (`flag_value`: lists comma-separated, yes/no, a field's
words), or as an argparse argument (`argument`), all parsed by the field's kind
(qual.family.Field) into the value a run reads; each problem is said as `(file, key, what)`."""

from __future__ import annotations

import argparse
import json
import re

from qual import units
from qual.family import Field

NEGATED = "no"  # --no-NAME: a bool field's flag that means no


def unknown_key(key: str, known) -> str:
    close = [k for k in known if similar(key, k)]
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown key{hint}; known: {', '.join(known)}"


def similar(a: str, b: str) -> bool:
    if abs(len(a) - len(b)) > 2:
        return False
    return sum(x != y for x, y in zip(a, b)) + abs(len(a) - len(b)) <= 2 or sorted(a) == sorted(b)


def parse_fields(fields: tuple[Field, ...], table: dict, label, prefix, problems,
                 beside: tuple[str, ...] = ("criteria",)) -> dict:
    """The table's values parsed by their fields; `beside`: the keys the table also holds,
    read elsewhere (a family's criteria), named when a key is unknown."""
    by_name = {f.name: f for f in fields}
    out = {}
    for key, value in table.items():
        where = f"{prefix}.{key}"
        f = by_name.get(key)
        if f is None:
            problems.append((label, where, unknown_key(key, [*by_name, *beside])))
            continue
        try:
            out[key] = parse_value(f, value, label, where, problems)
        except units.UnitError as e:
            problems.append((label, where, str(e)))
    return out


def parse_value(f: Field, value, label, where, problems):
    kind = f.kind
    if kind == "table":
        if not isinstance(value, dict):
            raise units.UnitError("must be a table")
        return parse_fields(f.fields, value, label, where, problems)
    if kind in ("sizes", "counts", "choices"):
        if not isinstance(value, list) or not value:
            raise units.UnitError("must be a non-empty list")
        single = Field(f.name, kind[:-1], choices=f.choices, minimum=f.minimum, maximum=f.maximum)
        items = [parse_value(single, v, label, where, problems) for v in value]
        if len(set(items)) != len(items):
            raise units.UnitError("lists a value twice")
        return items
    if kind == "texts":
        if not isinstance(value, list) or not all(isinstance(t, str) and t for t in value):
            raise units.UnitError(f"must be a list of {f.help or 'non-empty strings'}")
        return tuple(value)
    if kind in ("bandwidths", "ratios"):
        if not isinstance(value, dict):
            raise units.UnitError(f"must be a table of {f.help}")
        key_kind, value_kind = ("size", "bandwidth") if kind == "bandwidths" else ("text",
                                                                                   "ratio")
        out = {}
        for k, v in value.items():
            try:
                key = units.parse_size(k, name="block size") if key_kind == "size" else k
                out[key] = (parse_value(Field(f.name, "ratio", maximum=f.maximum), v, label,
                                        f"{where}.{k}", problems) if value_kind == "ratio"
                            else units.parse_quantity(v, "bandwidth"))
            except units.UnitError as e:
                problems.append((label, f"{where}.{k}", str(e)))
        return out
    if kind == "size":
        return units.parse_size(value, name=f.name, minimum=f.minimum)
    if kind == "duration":
        return units.parse_duration(value, name=f.name, zero_ok=f.minimum == 0)
    if kind == "count":
        return units.parse_count(value, name=f.name, minimum=f.minimum, maximum=f.maximum)
    if kind == "ratio":
        r = units.parse_quantity(value, "ratio")
        if f.maximum is not None and not 0 <= r <= f.maximum:
            raise units.UnitError(f"{value!r} is not a sensible ratio (0 to "
                                  f"{f.maximum * 100:g} %)")
        return r
    if kind == "number":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise units.UnitError(f"{value!r} is not a positive number")
        if f.maximum is not None and value > f.maximum:
            raise units.UnitError(f"{value!r} is above {f.maximum}")
        return float(value)
    if kind == "text":
        if not isinstance(value, str) or not value.strip():
            raise units.UnitError(f"{value!r} is not a non-empty string")
        if f.pattern is not None and not re.match(f.pattern, value):
            raise units.UnitError(f"{value!r} is not {f.help}")
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise units.UnitError(f"{value!r} is not true or false")
        return value
    if kind == "choice":  # no choices: any name, the family's check says which it knows
        if not f.choices and (not isinstance(value, str) or not value.strip()):
            raise units.UnitError(f"{value!r} is not a name")
        if f.choices and value not in f.choices:
            raise units.UnitError(f"{value!r} is not one of {', '.join(f.choices)}")
        return value
    raise AssertionError(f"field kind {kind!r}")


def complete(fields: tuple[Field, ...], table: dict, label, prefix, problems) -> None:
    """Fill defaults after inheritance; a required field nobody gave is a problem."""
    for f in fields:
        if f.name in table:
            if f.kind == "table":
                complete(f.fields, table[f.name], label, f"{prefix}.{f.name}", problems)
        elif f.required:
            problems.append((label, f"{prefix}.{f.name}", f"missing ({f.help or f.kind})"))
        elif f.default is not None:
            table[f.name] = parse_value(f, f.default, label, f"{prefix}.{f.name}", problems)
            if f.kind == "table":  # a table given by default: its own fields' defaults too
                complete(f.fields, table[f.name], label, f"{prefix}.{f.name}", problems)


def flag_value(f: Field, text: str):
    """A flag's text as the value a profile would hold: lists are comma-separated, booleans
    are yes/no, plain numbers are numbers (sizes and durations keep their units), a field's
    words stand for their values."""
    words = dict(f.words)
    if text in words:
        return words[text]
    if f.kind in ("sizes", "counts", "choices"):
        return [flag_value(Field(f.name, f.kind[:-1]), t.strip()) for t in text.split(",")]
    if f.kind == "bool":
        if text.lower() in ("1", "yes", "true", "on"):
            return True
        if text.lower() in ("0", NEGATED, "false", "off"):
            return False
        return text
    if f.kind in ("count", "number"):
        try:
            return json.loads(text)
        except ValueError:
            return text
    return text


def shown(f: Field, value) -> str:
    """A parsed value as a person writes it in a profile or a flag: 256 KiB, 2 s, 16,64."""
    if isinstance(value, list):
        one = Field(f.name, f.kind.removesuffix("s"))
        return ",".join(shown(one, v) for v in value)
    if isinstance(value, bool):
        return "yes" if value else NEGATED
    if f.kind == "size":
        return units.format_size(value)
    if f.kind == "duration":
        return units.format_duration(value)
    if f.kind == "ratio":
        return f"{value * 100:g} %"
    return str(value)


def described(fields: tuple[Field, ...], settings: dict, prefix: str = "") -> list[str]:
    """`key=value` for every setting a run was given (nested tables' keys dotted), in the
    fields' order: what a command ran."""
    out = []
    for f in fields:
        value = settings.get(f.name)
        if value is None:
            continue
        if f.kind == "table":
            out += described(f.fields, value, f"{prefix}{f.name}.")
        else:
            out.append(f"{prefix}{f.name}={shown(f, value)}")
    return out


def nest(flat: dict[str, object]) -> dict:
    """{"a.b": 1} -> {"a": {"b": 1}}."""
    out: dict = {}
    for key, value in flat.items():
        *tables, leaf = key.split(".")
        into = out
        for t in tables:
            into = into.setdefault(t, {})
        into[leaf] = value
    return out


def argument(field: Field):
    """An argparse type for one value of a field: the flag's text parsed as the field would
    be in a profile (its kind, its range), its problem argparse's error."""
    def parse(text: str):
        try:
            return parse_value(field, flag_value(field, text), "flags", field.name, [])
        except units.UnitError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    parse.__name__ = field.kind  # argparse says "invalid size value: …"
    return parse


size = argument(Field("size", "size"))
duration = argument(Field("duration", "duration"))
positive = argument(Field("value", "count"))
