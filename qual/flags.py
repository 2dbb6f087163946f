"""A family's command-line flags, generated from the fields of its profile table
(docs/ARCHITECTURE.md §2, `qual/flags.py`): one flag per field, named after it (or its
`flag`), with the spellings users already type as aliases, the field's help, unit, choices and
default in its help line; a bool field's flag alone means yes, and --no-NAME means no. A flag
not given stays out of the table, so a profile's value holds."""

from __future__ import annotations

import argparse

from qual.family import Field
from qual.settings import NEGATED, flag_value, nest

DEST = "field:"  # dest prefix of a generated flag

# what a value of each kind is written as, in every flag's help
UNITS = {
    "size": "bytes, with a unit: 4K, 128KiB, 1M",
    "sizes": "bytes, with a unit: 4K, 128KiB, 1M",
    "duration": "a duration: 500ms, 10s, 2h",
    "ratio": "a share, in %: 60 %, 0.36 %",
    "count": "a whole number",
    "counts": "whole numbers",
    "number": "a number",
    "bool": "yes or no; the flag alone is yes",
}


def flag_name(key: str) -> str:
    """A table key as a flag: `steady_state.max_rounds` -> `--steady-state-max-rounds`."""
    return "--" + key.replace(".", "-").replace("_", "-")


def field_flags(key: str, f: Field) -> list[str]:
    """Every spelling of a field's flag: its own (or --KEY), then its aliases."""
    return [f.flag or flag_name(key), *f.aliases]


def negated_flags(key: str, f: Field) -> list[str]:
    """A bool field's flags that say no: --no-KEY, then the spellings users already type."""
    return [f"--no-{(f.flag or flag_name(key))[2:]}", *f.negations]


def flag_fields(fields: tuple[Field, ...], prefix: str = "") -> list[tuple[str, Field]]:
    """(dotted key, field) of every leaf field, nested tables flattened."""
    out = []
    for f in fields:
        key = f"{prefix}{f.name}"
        if f.kind == "table":
            out += flag_fields(f.fields, f"{key}.")
        else:
            out.append((key, f))
    return out


def renamed(fields: tuple[Field, ...]) -> dict[str, str]:
    """Removed flag spellings (a field's `was`) -> the flag that replaced each."""
    return {old: field_flags(key, f)[0] for key, f in flag_fields(fields) for old in f.was}


def claimed(fields: tuple[Field, ...]) -> set[str]:
    """Every flag the fields' flags use (so the command adds no generic flag of that name)."""
    return {spelling for key, f in flag_fields(fields)
            for spelling in field_flags(key, f) + (negated_flags(key, f) if f.kind == "bool"
                                                   else [])}


def field_help(f: Field) -> str:
    """The field's help, its unit, its choices and its default."""
    default = f.default
    if isinstance(default, list):
        default = ",".join(map(str, default))
    text = f.help or f.name.replace("_", " ")
    if f.kind in UNITS:
        text += f" [{UNITS[f.kind]}{', comma-separated' if f.kind.endswith('s') else ''}]"
    elif f.kind == "choices":
        text += " [comma-separated]"
    if f.choices:
        text += f"; one of {', '.join(f.choices)}" + "".join(f", or {w}" for w, _ in f.words)
    if isinstance(default, bool):
        default = "yes" if default else NEGATED
    parts = [text] + ([f"(default {default})"] if default is not None else [])
    return " ".join(parts)


def add_field_flags(p: argparse.ArgumentParser, fields: tuple[Field, ...]) -> None:
    """Every field's flag on a subcommand's parser; values land as text in args."""
    for key, f in flag_fields(fields):
        dest = DEST + key
        shown = field_help(f).replace("%", "%%")  # argparse formats help with %
        metavar = "NAME" if f.kind in ("choice", "choices") else f.kind.upper().rstrip("S")
        if f.kind == "bool":
            p.add_argument(*field_flags(key, f), dest=dest, default=None, nargs="?",
                           const="yes", metavar="yes|no", help=shown)
            p.add_argument(*negated_flags(key, f), dest=dest, action="store_const",
                           const=NEGATED, help=argparse.SUPPRESS)
        else:
            p.add_argument(*field_flags(key, f), dest=dest, default=None, metavar=metavar,
                           help=shown)


def given(args: argparse.Namespace, fields: tuple[Field, ...]) -> dict:
    """The flags given, as the (nested) table values a profile would hold; the table check
    says what is wrong with any of them."""
    by_key = dict(flag_fields(fields))
    return nest({key[len(DEST):]: flag_value(by_key[key[len(DEST):]], value)
                 for key, value in vars(args).items()
                 if key.startswith(DEST) and value is not None})


