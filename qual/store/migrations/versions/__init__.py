"""One file per schema version of the store, oldest first (Alembic revisions)."""
