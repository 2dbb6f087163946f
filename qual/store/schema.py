"""The results store's tables (SQLAlchemy Core), as a person queries them with SQL
(docs/store.md): `drives` (a drive model's sample at one firmware), `runs` (one drive's run
record, whole, with what selects it), `measurements` (each final figure of a run: the median of
its repetitions, every repetition, its interval and its verdict). The migrations
(qual/store/migrations) build exactly these; a test compares them."""

from __future__ import annotations

from sqlalchemy import (JSON, BigInteger, Boolean, Column, DateTime, Float, ForeignKey, Index,
                        Integer, MetaData, String, Table, Text, UniqueConstraint)
from sqlalchemy.dialects.postgresql import JSONB

metadata = MetaData()
DOCUMENT = JSON().with_variant(JSONB(), "postgresql")

# '' where a drive does not say (a virtio disk has no firmware): a unique key with NULL in it
# would not be unique
drives = Table(
    "drives", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("model", String(200), nullable=False),
    Column("serial", String(200), nullable=False),
    Column("firmware", String(100), nullable=False),
    Column("capacity", BigInteger),
    Column("link", String(100)),
    UniqueConstraint("model", "serial", "firmware", name="drives_model_serial_firmware"),
)

runs = Table(
    "runs", metadata,
    Column("id", String(64), primary_key=True),  # the record's run_id (older ones: its digest)
    Column("drive_id", Integer, ForeignKey("drives.id"), nullable=False),
    Column("started", DateTime(timezone=True), nullable=False),  # UTC
    Column("finished", DateTime(timezone=True)),
    Column("host", String(200), nullable=False),
    Column("rig", String(200), nullable=False),
    Column("qual_version", String(50), nullable=False),
    Column("profile", String(200), nullable=False),
    Column("profile_digest", String(100), nullable=False),
    Column("verdict", String(20), nullable=False),
    Column("schema", String(50), nullable=False),
    Column("record", DOCUMENT, nullable=False),
    Index("runs_drive_started", "drive_id", "started"),
    Index("runs_profile", "profile"),
)

measurements = Table(
    "measurements", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(64), ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("test", Text, nullable=False),
    Column("measurement", String(300), nullable=False),  # its id: seq_read_bw[bs=1M,qd=16]
    Column("metric", String(100), nullable=False),
    Column("params", DOCUMENT, nullable=False),
    Column("unit", String(20), nullable=False),
    Column("value", Float, nullable=False),
    Column("repetitions", DOCUMENT, nullable=False),
    Column("interval_low", Float),
    Column("interval_high", Float),
    Column("comparable", Boolean, nullable=False),
    Column("verdict", String(20)),  # PASS or FAIL where the profile judges it, else NULL
    Index("measurements_run", "run_id"),
    Index("measurements_metric", "metric"),
)
