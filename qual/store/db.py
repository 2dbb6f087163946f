"""The results store's database (docs/store.md): one SQL layer (SQLAlchemy Core) over SQLite and
PostgreSQL, the schema versioned by migrations (Alembic, qual/store/migrations) applied when a
store is opened, so a store outlives qual versions.

A run is stored whole or not at all (one transaction), once (its `run_id` is the key: storing
it again stores nothing). Every wait is bounded: SQLite waits at most BUSY_S for another writer,
PostgreSQL at most CONNECT_S to connect and STATEMENT_S for a statement or a lock."""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from sqlalchemy import create_engine, event, func, select
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, SQLAlchemyError

from qual.measurement import is_final, repetitions_of
from qual.record import check_record, read_record, record_paths, run_id_of
from qual.store.url import StoreError, check_url, shown
from qual.store.schema import drives, measurements, metadata, runs

BUSY_S = 60  # SQLite: the longest a writer waits for another
CONNECT_S = 10  # PostgreSQL: to connect
STATEMENT_S = 60  # PostgreSQL: for one statement, or a lock
MIGRATION_LOCK = 0x7175616C  # PostgreSQL advisory lock key ("qual")



# ------------------------------------------------------------------ what a record stores


@dataclass(frozen=True)
class Row:
    """A run record as the store's rows: its drive, its run, its measurements."""

    run_id: str
    drive: dict
    run: dict
    measurements: list[dict]


def _when(text: str | None) -> datetime | None:
    """A record's time (2026-12-06T03:00:00+0000) in UTC, as both databases keep it."""
    if not text:
        return None
    try:
        t = datetime.strptime(text, "%Y-%m-%dT%H:%M:%S%z")
    except ValueError:
        t = datetime.fromisoformat(text)
    return utc(t)


def _verdict(verdicts: list[dict]) -> str | None:
    if not verdicts:
        return None
    if not all(v.get("passed") for v in verdicts):
        return "FAIL"
    return "INCONCLUSIVE" if any(v.get("inconclusive") for v in verdicts) else "PASS"


def rows_of(record: dict) -> Row:
    """What a (checked) record stores: ValueError where it lacks what the store keys on."""
    ident = record["target"].get("identity") or {}
    link = " x".join(str(ident[k]) for k in ("link_speed", "link_width") if ident.get(k))
    drive = {"model": ident.get("model") or "", "serial": ident.get("serial") or "",
             "firmware": ident.get("firmware") or "", "capacity": ident.get("capacity"),
             "link": link or None}
    run_id = run_id_of(record)
    profile = record["profile"]
    run = {"id": run_id, "started": _when(record["started"]),
           "finished": _when(record.get("finished")),
           "host": record.get("host", {}).get("hostname") or "",
           "rig": record.get("rig") or record.get("host", {}).get("hostname") or "",
           "qual_version": record.get("qual_version") or "", "profile": profile.get("name") or "",
           "profile_digest": profile.get("digest") or "",
           "verdict": record["summary"]["verdict"], "schema": record["schema"],
           "record": record}
    out = []
    for t in record["tests"]:
        verdicts: dict[str, list] = {}
        for v in t.get("verdicts", ()):
            verdicts.setdefault(v["id"], []).append(v)
        for m in t["measurements"]:
            if not is_final(m.get("context", {})):
                continue
            interval = m.get("context", {}).get("interval") or [None, None]
            out.append({"run_id": run_id, "test": t["nodeid"], "measurement": m["id"],
                        "metric": m["metric"], "params": m.get("params", {}), "unit": m["unit"],
                        "value": float(m["value"]), "repetitions": repetitions_of(m),
                        "interval_low": interval[0], "interval_high": interval[1],
                        "comparable": bool(m.get("comparable", True)),
                        "verdict": _verdict(verdicts.get(m["id"], []))})
    return Row(run_id, drive, run, out)


# ------------------------------------------------------------------ the store


# filesystems on which SQLite's WAL cannot work: its index is shared memory, a mapping of the
# -shm file every process must see at once, which a network or host-shared filesystem does not
# give (SQLite answers "disk I/O error" when it first needs it: a rig's home on NFS, a guest's
# 9p folder)
SHARED_FILESYSTEMS = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "virtiofs", "ceph",
                      "glusterfs", "lustre", "afs", "gpfs", "beegfs", "fuse.sshfs"}


def filesystem_of(path: Path) -> str | None:
    """The type of the filesystem `path` is on (the longest mount point above it), from
    /proc/self/mountinfo; None where that cannot be read."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    path = path.resolve()
    best, kind = -1, None
    for line in lines:
        left, _, right = line.partition(" - ")
        point = left.split()[4].encode().decode("unicode_escape")  # \040 for a space
        if (path == Path(point) or Path(point) in path.parents) and len(point) > best:
            best, kind = len(point), right.split()[0]
    return kind


def journal_mode(path: Path) -> str:
    """WAL (readers do not wait for the writer), except on a filesystem where it cannot work:
    there the rollback journal (DELETE), which needs only file locks."""
    return "DELETE" if filesystem_of(path) in SHARED_FILESYSTEMS else "WAL"


def _wal(dbapi, mode: str = "WAL") -> None:
    """Turn the store to `mode` (a no-op once it is), waiting at most BUSY_S as a writer does:
    while another connection turns a new store to WAL, SQLite answers "database is locked" at
    once, without its busy timeout (rigs opening a new store together met it)."""
    deadline = time.monotonic() + BUSY_S
    while True:
        try:
            dbapi.execute(f"PRAGMA journal_mode={mode}")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.005)


def _sqlite_engine(url) -> Engine:
    path = Path(url.database)
    path.parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"timeout": BUSY_S})
    mode = journal_mode(path.parent)

    @event.listens_for(engine, "connect")
    def _connect(dbapi, _record):
        dbapi.isolation_level = None  # qual begins its own transactions
        _wal(dbapi, mode)
        dbapi.execute("PRAGMA foreign_keys=ON")
        dbapi.execute("PRAGMA synchronous=FULL")  # a stored run survives a power loss

    @event.listens_for(engine, "begin")
    def _begin(conn):
        # a writer takes the write lock at once (waiting at most BUSY_S), so two writers never
        # deadlock upgrading their read locks
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def _postgresql_engine(url) -> Engine:
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    return create_engine(url, pool_pre_ping=True, connect_args={
        "connect_timeout": CONNECT_S,
        # times go in as UTC: the session's zone must be UTC whatever the server's is
        "options": f"-c statement_timeout={STATEMENT_S * 1000} "
                   f"-c lock_timeout={STATEMENT_S * 1000} -c timezone=UTC"})


class Store:
    """An open results store (`open`): `put` a record, `import_paths` of record files, and the
    queries the gate, acceptance and history read."""

    def __init__(self, url: str, engine: Engine):
        self.url, self.engine = url, engine

    @classmethod
    def open(cls, given: str | None = None) -> Store:
        """The store at `given` (a URL or an SQLite path; else $QUAL_STORE, else the default),
        migrated to this qual's schema: StoreError saying why it cannot be."""
        url = check_url(given)
        if url is None:
            raise StoreError("the store is off (--store off, or QUAL_STORE=off)")
        try:
            parsed = make_url(url)
        except ArgumentError:
            raise StoreError(f"{shown(url)} is not a database URL (sqlite:///PATH, "
                             "postgresql://USER@HOST:PORT/DB, or a path)") from None
        backend = parsed.get_backend_name()
        try:
            engine = _sqlite_engine(parsed) if backend == "sqlite" else _postgresql_engine(parsed)
            store = cls(url, engine)
            store._migrate()
        except (SQLAlchemyError, OSError) as e:
            raise StoreError(f"store {shown(url)}: {_reason(e)}") from None
        return store

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- the schema's version

    def _migrate(self) -> None:
        """Bring the store to this qual's schema (the migrations it lacks, under a lock, so
        rigs that open a new store at once migrate it once); refuse a store newer than qual."""
        from qual.store import migrations

        head = migrations.head()
        with self.engine.connect() as c:
            current = migrations.current(c)
            c.rollback()
        if current == head:
            return
        if current is not None and current not in migrations.known():
            raise StoreError(f"store {shown(self.url)}: its schema (version {current}) is newer "
                             f"than this qual's ({head}): use a newer qual")
        # one migrator at a time, the others wait and then find nothing to do: SQLite's
        # BEGIN IMMEDIATE holds the write lock, PostgreSQL an advisory lock, for the transaction
        with self.engine.begin() as c:
            if self.engine.dialect.name == "postgresql":
                c.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK})")
            migrations.upgrade(c)

    def version(self) -> str | None:
        from qual.store import migrations

        with self.engine.connect() as c:
            return migrations.current(c)

    # ---- writing

    def put(self, record: dict) -> tuple[str, bool]:
        """Store a run record (ValueError: not a whole one): its run id, and whether the store
        changed (False: it was stored before, and nothing changed). A record of a run stored
        before that finished later (the run was stopped, stored, then resumed) replaces it;
        an earlier one changes nothing. All of it or nothing: one transaction."""
        check_record(record)
        row = rows_of(record)
        try:
            return self._put(row)
        except SQLAlchemyError as e:
            raise StoreError(f"store {shown(self.url)}: {_reason(e)}") from None

    def _put(self, row: Row) -> tuple[str, bool]:
        ins = self._insert_ignoring_duplicates
        with self.engine.begin() as c:
            c.execute(ins(drives, ("model", "serial", "firmware")).values(**row.drive))
            drive_id = c.execute(select(drives.c.id).where(
                drives.c.model == row.drive["model"], drives.c.serial == row.drive["serial"],
                drives.c.firmware == row.drive["firmware"])).scalar_one()
            added = c.execute(ins(runs, ("id",)).values(drive_id=drive_id, **row.run)
                              .returning(runs.c.id)).first() is not None
            if not added:  # stored before: a later word on the run (resumed) replaces it
                before = c.execute(select(runs.c.finished).where(runs.c.id == row.run_id)
                                   ).scalar_one()
                if not _later(row.run["finished"], before):
                    return row.run_id, False
                c.execute(measurements.delete().where(measurements.c.run_id == row.run_id))
                c.execute(runs.update().where(runs.c.id == row.run_id)
                          .values(drive_id=drive_id, **row.run))
            if row.measurements:
                c.execute(measurements.insert(), row.measurements)
        return row.run_id, True

    def _insert_ignoring_duplicates(self, table, keys: tuple[str, ...]):
        if self.engine.dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        else:
            from sqlalchemy.dialects.sqlite import insert
        return insert(table).on_conflict_do_nothing(index_elements=list(keys))

    def import_paths(self, paths: list[str]) -> tuple[list[tuple[str, str, bool]],
                                                      list[tuple[str, str]]]:
        """Store the run records at `paths` (files, or folders searched for qual-run.json):
        (path, run id, new) for each stored, (path, reason) for each refused (nothing of a
        refused one is stored)."""
        stored, refused = [], []
        for given in paths:
            try:
                found = record_paths([given])
            except ValueError as e:
                refused.append((given, str(e)))
                continue
            for path in found:
                try:
                    record = read_record(path)
                    run_id, new = self.put(record)
                except ValueError as e:
                    refused.append((str(path), str(e).removeprefix(f"{path}: ")))
                    continue
                stored.append((str(path), run_id, new))
        return stored, refused

    # ---- reading

    def select(self, where: dict, *, profile: str | None = None,
               exclude: str | None = None) -> list[dict]:
        """The records of the runs a parsed selector picks (newest first; `last` of them), of
        its profile or else `profile`, never the run `exclude`."""
        q = select(runs.c.record).join(drives, drives.c.id == runs.c.drive_id)
        for key in ("model", "serial", "firmware"):
            if key in where:
                q = q.where(drives.c[key] == where[key])
        if where.get("rig"):
            q = q.where(runs.c.rig == where["rig"])
        if where.get("profile", profile):
            q = q.where(runs.c.profile == where.get("profile", profile))
        if exclude:
            q = q.where(runs.c.id != exclude)
        q = q.order_by(runs.c.started.desc(), runs.c.id)
        if where.get("last"):
            q = q.limit(where["last"])
        with self.engine.connect() as c:
            return [r for (r,) in c.execute(q)]

    def latest_runs(self, model: str, firmware: str, profile: str) -> list[dict]:
        """Each drive's latest run of a profile, of a model at a firmware (by serial)."""
        q = (select(drives.c.serial, runs.c.id, runs.c.started, runs.c.rig, runs.c.verdict)
             .join(drives, drives.c.id == runs.c.drive_id)
             .where(drives.c.model == model, drives.c.firmware == firmware,
                    runs.c.profile == profile)
             .order_by(drives.c.serial, runs.c.started.desc(), runs.c.id.desc()))
        out: dict[str, dict] = {}
        with self.engine.connect() as c:
            for serial, run_id, started, rig, verdict in c.execute(q):
                out.setdefault(serial, {"serial": serial, "run_id": run_id,
                                        "started": utc(started).strftime("%Y-%m-%d %H:%M:%S"),
                                        "rig": rig, "verdict": verdict})
        return list(out.values())

    def history(self, model: str, *, metric: str | None = None,
                profile: str | None = None) -> list[dict]:
        """Every stored final figure of a model's runs (of one metric, one profile), oldest
        first: measurement, unit, firmware, serial, rig, run, started (UTC), value."""
        q = (select(measurements.c.measurement, measurements.c.unit, drives.c.firmware,
                    drives.c.serial, runs.c.rig, runs.c.id, runs.c.started,
                    measurements.c.value)
             .join(runs, runs.c.id == measurements.c.run_id)
             .join(drives, drives.c.id == runs.c.drive_id)
             .where(drives.c.model == model)
             .order_by(runs.c.started, runs.c.id))
        if metric:
            q = q.where(measurements.c.metric == metric)
        if profile:
            q = q.where(runs.c.profile == profile)
        keys = ("measurement", "unit", "firmware", "serial", "rig", "run_id", "started", "value")
        with self.engine.connect() as c:
            return [{**dict(zip(keys, row)), "started": utc(row.started)} for row in c.execute(q)]

    def newest_profile(self, model: str, firmware: str) -> str | None:
        """The profile of the newest run of a model at a firmware: its file where that is
        still there, else its name (a shipped one); None: no such run."""
        q = (select(runs.c.profile, runs.c.record).join(drives, drives.c.id == runs.c.drive_id)
             .where(drives.c.model == model, drives.c.firmware == firmware)
             .order_by(runs.c.started.desc(), runs.c.id.desc()).limit(1))
        with self.engine.connect() as c:
            found = c.execute(q).first()
        if found is None:
            return None
        path = (found.record.get("profile") or {}).get("path")
        return path if path and Path(path).is_file() else found.profile

    def values(self, run_ids: list[str], ids: list[str]) -> dict[str, dict[str, tuple]]:
        """The stored value and unit of each measurement id of each run:
        {run: {id: (value, unit)}}."""
        out: dict[str, dict[str, tuple]] = {}
        if not run_ids or not ids:
            return out
        q = (select(measurements.c.run_id, measurements.c.measurement, measurements.c.value,
                    measurements.c.unit)
             .where(measurements.c.run_id.in_(run_ids), measurements.c.measurement.in_(ids)))
        with self.engine.connect() as c:
            for run_id, mid, value, unit in c.execute(q):
                out.setdefault(run_id, {})[mid] = (value, unit)
        return out

    def counts(self) -> dict[str, int]:
        """How many rows each table holds."""
        with self.engine.connect() as c:
            return {t.name: c.execute(select(func.count()).select_from(t)).scalar_one()
                    for t in (drives, runs, measurements)}


def utc(t: datetime | None) -> datetime | None:
    """A time as the store gives it back (PostgreSQL: aware; SQLite: naive UTC) in naive UTC,
    as the store is given times."""
    if t is not None and t.tzinfo is not None:
        return t.astimezone(timezone.utc).replace(tzinfo=None)
    return t


def _later(finished: datetime | None, before: datetime | None) -> bool:
    """Whether a run's record that finished at `finished` is later than the stored one's."""
    return finished is not None and (before is None or finished > utc(before))


def _reason(e: Exception) -> str:
    """A database error as one line a person can act on."""
    if isinstance(e, DBAPIError) and e.orig is not None:
        return " ".join(str(e.orig).split())
    if isinstance(e, SQLAlchemyError):
        return " ".join(str(e).split("\n")[0].split())
    return str(e)




__all__ = ["Store", "metadata", "rows_of"]
