"""Where the results store is (docs/store.md): its URL from --store, $QUAL_STORE or the
embedded default, checked without opening anything, and printed without its password. The
package (qual.store) and its database (qual.store.db) both read it from here."""

from __future__ import annotations

import os
import re
from pathlib import Path

ENV = "QUAL_STORE"
OFF = "off"  # --store off, QUAL_STORE=off: no store
WHERE = "default: $QUAL_STORE, else ~/.local/share/qual/qual-store.sqlite; docs/store.md"
SCHEME = re.compile(r"^(?P<scheme>[A-Za-z][\w+.-]*)://")


class StoreError(Exception):
    """The store cannot be opened, read or written (the reason is the message)."""


def default_path() -> Path:
    """The embedded store: $XDG_DATA_HOME/qual/qual-store.sqlite (~/.local/share/...)."""
    home = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                           "share")
    return Path(home) / "qual" / "qual-store.sqlite"


def url_of(given: str | None = None) -> str:
    """The store a command uses: `given` (--store), else $QUAL_STORE, else the embedded default.
    A plain path is an SQLite file."""
    given = given or os.environ.get(ENV) or str(default_path())
    if given == OFF:
        return OFF
    if "://" not in given:
        return f"sqlite:///{Path(given).expanduser().resolve()}"
    return given


def check_url(given: str | None) -> str | None:
    """The store a command will use (None: off), or StoreError for one that cannot be (not a
    URL, or a URL of another database); nothing is opened."""
    url = url_of(given)
    if url == OFF:
        return None
    found = SCHEME.match(url)
    if not found:
        raise StoreError(f"{given!r} is not a database URL (sqlite:///PATH, "
                         "postgresql://USER@HOST:PORT/DB, or a path)")
    backend = found["scheme"].split("+")[0].lower()
    if backend not in ("sqlite", "postgresql", "postgres"):
        raise StoreError(f"{shown(url)}: qual stores in SQLite or PostgreSQL, not {backend}")
    return url


def shown(url: str) -> str:
    """A store's URL as it may be printed (no password)."""
    return re.sub(r"(://[^:/@]+):[^@/]*@", r"\1:***@", url)
