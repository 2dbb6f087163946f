"""The first schema: drives, runs, measurements (qual.store.schema).

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

DOCUMENT = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "drives",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("serial", sa.String(200), nullable=False),
        sa.Column("firmware", sa.String(100), nullable=False),
        sa.Column("capacity", sa.BigInteger),
        sa.Column("link", sa.String(100)),
        sa.UniqueConstraint("model", "serial", "firmware", name="drives_model_serial_firmware"))
    op.create_table(
        "runs",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("drive_id", sa.Integer, sa.ForeignKey("drives.id"), nullable=False),
        sa.Column("started", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished", sa.DateTime(timezone=True)),
        sa.Column("host", sa.String(200), nullable=False),
        sa.Column("rig", sa.String(200), nullable=False),
        sa.Column("qual_version", sa.String(50), nullable=False),
        sa.Column("profile", sa.String(200), nullable=False),
        sa.Column("profile_digest", sa.String(100), nullable=False),
        sa.Column("verdict", sa.String(20), nullable=False),
        sa.Column("schema", sa.String(50), nullable=False),
        sa.Column("record", DOCUMENT, nullable=False))
    op.create_index("runs_drive_started", "runs", ["drive_id", "started"])
    op.create_index("runs_profile", "runs", ["profile"])
    op.create_table(
        "measurements",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(64), sa.ForeignKey("runs.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("test", sa.Text, nullable=False),
        sa.Column("measurement", sa.String(300), nullable=False),
        sa.Column("metric", sa.String(100), nullable=False),
        sa.Column("params", DOCUMENT, nullable=False),
        sa.Column("unit", sa.String(20), nullable=False),
        sa.Column("value", sa.Float, nullable=False),
        sa.Column("repetitions", DOCUMENT, nullable=False),
        sa.Column("interval_low", sa.Float),
        sa.Column("interval_high", sa.Float),
        sa.Column("comparable", sa.Boolean, nullable=False),
        sa.Column("verdict", sa.String(20)))
    op.create_index("measurements_run", "measurements", ["run_id"])
    op.create_index("measurements_metric", "measurements", ["metric"])


def downgrade() -> None:
    op.drop_table("measurements")
    op.drop_table("runs")
    op.drop_table("drives")
