"""The results store (docs/store.md): every run's record in a database that a person can query
with SQL, for what one record cannot answer (a drive model's population, a firmware's history).
An SQLite file by default, nothing to set up; a PostgreSQL server that a lab's rigs share
(`--store postgresql://…` or $QUAL_STORE). This module is what every command needs of it
without a database (where the store is, its option, a baseline's selector); the database
itself, `Store` (qual.store.db: SQLAlchemy Core, Alembic migrations), is imported when a store
is opened."""

from __future__ import annotations

import shlex
from pathlib import Path

from qual.record import Baseline
from qual.store.url import (ENV, OFF, WHERE, StoreError, check_url, default_path,  # noqa: F401
                            shown, url_of)


def add_option(parser, what: str, *, off: bool = False) -> None:
    """A command's --store option: `what` the command does with the store."""
    parser.add_argument("--store", default=None, metavar="URL|PATH|off" if off else "URL|PATH",
                        help=f"{what} ({WHERE})")


def open_store(given: str | None = None):
    """The store at `given` (else $QUAL_STORE, else the default), opened and migrated
    (qual.store.db.Store.open)."""
    from qual.store.db import Store

    return Store.open(given)


# ------------------------------------------------------------------ a baseline from the store


SELECTS = ("model", "serial", "firmware", "profile", "rig", "last")


def parse_selector(text: str) -> dict[str, str | int]:
    """`model=X firmware=1.2` (shell quoting for spaces: `model='SAMSUNG MZ…'`), `serial=S`,
    `last=N`, with `profile=` and `rig=`: ValueError naming what is wrong."""
    try:
        words = shlex.split(text)
    except ValueError as e:
        raise ValueError(f"baseline {text!r}: {e}") from None
    out: dict[str, str | int] = {}
    for word in words:
        key, eq, value = word.partition("=")
        if not eq or key not in SELECTS or not value:
            raise ValueError(f"baseline {text!r}: {word!r} is not one of "
                             f"{', '.join(k + '=…' for k in SELECTS)}")
        if key in out:
            raise ValueError(f"baseline {text!r}: {key} given twice")
        out[key] = value
    if not out.keys() & {"model", "serial"}:
        raise ValueError(f"baseline {text!r}: name the drives: model=…, serial=… or both")
    if "last" in out:
        if not str(out["last"]).isdigit() or int(out["last"]) < 1:
            raise ValueError(f"baseline {text!r}: last= takes a count of runs (1 or more)")
        out["last"] = int(out["last"])
    return out


def is_selector(given: str) -> bool:
    """A --baseline that selects runs from the store rather than naming record files."""
    return "=" in given and not Path(given).exists()


def baseline(given: str, store: str | None, *, profile: str | None,
             exclude: str | None = None) -> Baseline:
    """The baseline a --baseline names: record files or folders, or the runs of the store that
    a selector picks (of `profile` unless it names one; never the run `exclude`)."""
    if not is_selector(given):
        return Baseline.from_paths(given)
    where = parse_selector(given)
    with open_store(store) as db:
        records = db.select(where, profile=profile, exclude=exclude)
        name = f"store {given}"
        if not records:
            raise ValueError(f"{name}: no run of profile {where.get('profile', profile)} in "
                             f"{shown(db.url)} matches")
    return Baseline(records, f"{shown(db.url)} {given}", name)


def store_record(record: dict, given: str | None = None) -> str:
    """Store a run's record as the run ends: the line to say (`stored in …`, or
    `not stored: <reason>` when the store cannot take it; the record stays on disk and
    `qual store import` stores it later)."""
    try:
        if check_url(given) is None:
            return "not stored: the store is off"
        with open_store(given) as store:
            run_id, _ = store.put(record)
        return f"stored in {shown(store.url)} as run {run_id}"
    except (StoreError, ValueError, OSError) as e:
        return f"not stored: {e}"




def __getattr__(name: str):
    """`Store` and the schema's `metadata`, from qual.store.db when first asked for."""
    if name in ("Store", "metadata"):
        from qual.store import db

        return getattr(db, name)
    raise AttributeError(name)
