"""Alembic's environment for the store: qual.store.Store hands it the open connection (under
the store's migration lock), so it runs online only and never reads alembic.ini."""

from alembic import context

from qual.store.schema import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata)
with context.begin_transaction():
    context.run_migrations()
