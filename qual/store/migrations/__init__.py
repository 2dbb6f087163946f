"""The store's schema migrations (Alembic): each version in versions/, applied in order by
qual.store.Store when it opens a store behind this qual (docs/store.md). Run with the store's
open connection, inside its transaction; nothing reads an alembic.ini."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

HERE = Path(__file__).parent


def _config(connection=None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(HERE))
    config.attributes["connection"] = connection
    return config


def head() -> str:
    return ScriptDirectory.from_config(_config()).get_current_head()


def known() -> set[str]:
    return {s.revision for s in ScriptDirectory.from_config(_config()).walk_revisions()}


def current(connection) -> str | None:
    """The store's schema version (None: a new, empty store)."""
    return MigrationContext.configure(connection).get_current_revision()


def upgrade(connection) -> None:
    command.upgrade(_config(connection), "head")
