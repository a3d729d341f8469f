"""The results store: one SQLite row per finished run, keyed by its config hash, committed as each run comes
back, so that a killed sweep keeps every run it finished and a rerun skips them.

The file is an SQLite database with one table, ``runs``; config and metrics are JSON texts, expanded into
columns by :func:`load`. On a local disk it is in WAL mode and the sweep's client is its one writer. SQLite's
WAL mode does not work on network filesystems (NFS, Lustre, GPFS, ...: its shared-memory index is per host),
where :func:`check_local` refuses it; there a sweep runs with *shards* instead: each worker process commits its
runs to a small SQLite file of its own (rollback journal, one writer) in ``<store>.shards/``, merged into the
store (:func:`merge_shards`) when a sweep starts and ends, and read with it by :func:`load`.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "COLUMNS",
    "NETWORK_FILESYSTEMS",
    "SharedFilesystemError",
    "Store",
    "check_local",
    "filesystem_type",
    "load",
    "merge_shards",
    "shard_dir",
    "write_shard",
]

#: The columns of a row besides the config's and the metrics' (which :func:`load` expands).
COLUMNS = (
    "config_hash",
    "sweep",
    "kind",
    "status",
    "error",
    "start",
    "end",
    "wall_s",
    "worker",
    "hostname",
    "python",
    "numpy",
    "numba",
    "simfloat",
    "cpu_model",
    "cpu",
    "cpu_features",
)

#: Filesystem types (as Linux's mount table names them) on which SQLite's WAL mode does not work: network and
#: cluster filesystems; also every ``fuse.*`` type but :data:`LOCAL_FUSE` (sshfs, s3fs, gcsfuse, ...).
NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "lustre",
        "gpfs",
        "cifs",
        "smb3",
        "smbfs",
        "beegfs",
        "ceph",
        "glusterfs",
        "afs",
        "panfs",
        "orangefs",
        "pvfs2",
        "ocfs2",
        "gfs2",
        "9p",
        "wekafs",
        "fhgfs",
    }
)
#: FUSE filesystems that are local (a container's overlay), so not refused.
LOCAL_FUSE = frozenset({"fuse.fuse-overlayfs", "fuse.lxcfs"})

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    config_hash TEXT PRIMARY KEY,
    sweep TEXT NOT NULL,
    kind TEXT NOT NULL,
    config TEXT NOT NULL,
    metrics TEXT,
    status TEXT NOT NULL CHECK (status IN ('ok', 'failed')),
    error TEXT,
    start REAL,
    "end" REAL,
    wall_s REAL,
    worker TEXT,
    hostname TEXT,
    python TEXT,
    numpy TEXT,
    numba TEXT,
    simfloat TEXT,
    cpu_model TEXT,
    cpu TEXT,
    cpu_features TEXT
)
"""
#: Columns added since the first stores: added to an older store when it is opened.
_ADDED = ("cpu_model", "cpu", "cpu_features")


class SharedFilesystemError(ValueError):
    """The store's folder is on a network filesystem, where SQLite's WAL mode does not work."""


def _unescape(field: str) -> str:
    """A mount table field with its octal escapes (``\\040`` for a space) decoded."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _mounts(text: str) -> list[tuple[str, str]]:
    """``(mount point, filesystem type)`` of each line of ``/proc/self/mountinfo`` or ``/proc/mounts`` text."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if " - " in line:  # mountinfo: ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [OPTIONAL...] - TYPE SOURCE ...
            head, _, tail = line.partition(" - ")
            hf, tf = head.split(), tail.split()
            if len(hf) >= 5 and tf:
                mounts.append((_unescape(hf[4]), tf[0]))
        elif len(fields) >= 3:  # /proc/mounts: SOURCE MOUNT_POINT TYPE OPTIONS DUMP PASS
            mounts.append((_unescape(fields[1]), fields[2]))
    return mounts


def _mount_table() -> str | None:
    """This machine's mount table (Linux), or None."""
    for table in ("/proc/self/mountinfo", "/proc/mounts"):
        try:
            with open(table) as f:
                return f.read()
        except OSError:
            continue
    return None


def filesystem_type(path: str | Path, mountinfo: str | None = None) -> tuple[str, str] | None:
    """The filesystem a path lives on: the mount whose mount point is the longest prefix of the path.

    Args:
        path: a file or folder (need not exist; resolved to an absolute path, symbolic links followed).
        mountinfo: the mount table's text (``/proc/self/mountinfo`` or ``/proc/mounts`` format); None: read
            it from ``/proc`` (Linux).

    Returns:
        ``(filesystem type, mount point)``, e.g. ``("nfs4", "/home")``; None where no mount table can be read
        (not Linux).
    """
    if mountinfo is None:
        mountinfo = _mount_table()
        if mountinfo is None:
            return None
    p = Path(os.path.realpath(path)).as_posix()
    best: tuple[str, str] | None = None
    for point, fstype in _mounts(mountinfo):  # a later mount over the same point hides the earlier one
        inside = p == point or p.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[1])):
            best = (fstype, point)
    return best


def _is_network(fstype: str) -> bool:
    return fstype in NETWORK_FILESYSTEMS or (fstype.startswith("fuse.") and fstype not in LOCAL_FUSE)


def check_local(path: str | Path, mountinfo: str | None = None) -> None:
    """Refuse a store on a network filesystem (where SQLite's WAL mode does not work).

    Args:
        path: the store's file.
        mountinfo: the mount table's text (see :func:`filesystem_type`); None: this machine's.

    Raises:
        SharedFilesystemError: the store's folder is on one of :data:`NETWORK_FILESYSTEMS` (or a remote
            ``fuse.*``); the message names the filesystem, the mount point and the alternative.
    """
    found = filesystem_type(Path(path).parent, mountinfo)
    if found is not None and _is_network(found[0]):
        fstype, point = found
        raise SharedFilesystemError(
            f"store {path}: its folder is on a {fstype} filesystem (mounted at {point}), where SQLite's WAL mode "
            "does not work (its shared-memory index is per host). Run the sweep with shards (--shards; "
            "run_sweep(..., shards=True)): each worker commits its runs to a file of its own in "
            f"{shard_dir(path)}/, merged into the store at the start and end of every sweep; or put the store on "
            "a local disk"
        )


def shard_dir(store: str | Path) -> Path:
    """The folder of a store's shards: ``<store>.shards`` next to it."""
    p = Path(store)
    return p.with_name(p.name + ".shards")


def _connect(path: Path, wal: bool | None) -> sqlite3.Connection:
    """The store's connection, its table made or brought up to date; ``wal`` None: the file's journal mode as
    it is."""
    db = sqlite3.connect(path, timeout=60.0)
    if wal is not None:
        db.execute(f"PRAGMA journal_mode={'WAL' if wal else 'DELETE'}")
        db.execute(f"PRAGMA synchronous={'NORMAL' if wal else 'FULL'}")
    db.execute(_SCHEMA)
    have = {r[1] for r in db.execute("PRAGMA table_info(runs)")}
    for col in _ADDED:
        if col not in have:
            db.execute(f"ALTER TABLE runs ADD COLUMN {col} TEXT")
    db.commit()
    return db


def _insert(db: sqlite3.Connection, row: Mapping[str, Any]) -> None:
    cols = [*COLUMNS, "config", "metrics"]
    values = [row.get(c) for c in COLUMNS]
    values.append(json.dumps(row["config"], sort_keys=True))
    metrics = row.get("metrics")
    values.append(None if metrics is None else json.dumps(metrics, sort_keys=True))
    quoted = ", ".join(f'"{c}"' for c in cols)
    marks = ", ".join("?" for _ in cols)
    with db:  # one transaction, committed on exit
        db.execute(f"INSERT OR REPLACE INTO runs ({quoted}) VALUES ({marks})", values)


_TOKEN = uuid.uuid4().hex[:8]  # this process's shard: two processes never share one, even with one pid


def write_shard(shards: str | Path, row: Mapping[str, Any]) -> Path:
    """Commit one run to this process's shard in the folder ``shards`` (created if missing), on a worker.

    The shard is a store of its own (rollback journal, never WAL) that only this process writes, opened for
    this one row: its file is ``<hostname>-<pid>-<token>.db``.

    Args:
        shards: the shards folder (:func:`shard_dir` of the store).
        row: as :meth:`Store.put`'s.

    Returns:
        The shard's path.
    """
    d = Path(shards)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{socket.gethostname()}-{os.getpid()}-{_TOKEN}.db"
    db = _connect(path, wal=False)
    try:
        _insert(db, row)
    finally:
        db.close()
    return path


def _shards(store: Path) -> list[Path]:
    d = shard_dir(store)
    return sorted(d.glob("*.db")) if d.is_dir() else []


class Store:
    """An open results store (created on first use; the folder must exist).

    Args:
        path: the SQLite file.
        wal: WAL mode (one writer, many readers, on a local disk); False: SQLite's rollback journal, for a
            store on a network filesystem that a sweep with shards writes only when it merges them. None: the
            journal mode the file has (readers; a new file: SQLite's rollback journal).

    Raises:
        ValueError: ``path`` is a folder, its folder does not exist, or the file is not a simfloat store.
        SharedFilesystemError: ``wal`` is True and the folder is on a network filesystem (:func:`check_local`).
    """

    def __init__(self, path: str | Path, *, wal: bool | None = True) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise ValueError(f"store {self.path}: is a folder; give the SQLite file's path")
        if not self.path.parent.is_dir():
            raise ValueError(f"store {self.path}: folder {self.path.parent} does not exist")
        if wal:
            check_local(self.path)
        try:
            self._db = _connect(self.path, wal)
        except sqlite3.DatabaseError as err:
            raise ValueError(f"store {self.path}: not a simfloat results store: {err}") from None

    def close(self) -> None:
        """Close the connection (every row is already committed)."""
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def statuses(self) -> dict[str, str]:
        """``{config_hash: status}`` of every stored run (``"ok"`` or ``"failed"``)."""
        return dict(self._db.execute("SELECT config_hash, status FROM runs"))

    def put(self, row: Mapping[str, Any]) -> None:
        """Write one run and commit at once (a rerun of a failed run replaces its row).

        Args:
            row: the :data:`COLUMNS` values plus ``config`` and ``metrics`` (dicts of JSON values; ``metrics``
                None for a failed run).
        """
        _insert(self._db, row)

    def merge(self, shard: str | Path) -> int:
        """Copy a shard's runs into the store, in one transaction: a run the store lacks, or whose stored row
        ended earlier (a failed run retried), is taken; merging twice changes nothing.

        Returns:
            The rows added or replaced.
        """
        quoted = ", ".join(f'"{c}"' for c in (*COLUMNS, "config", "metrics"))
        update = ", ".join(f'"{c}" = excluded."{c}"' for c in (*COLUMNS, "config", "metrics") if c != "config_hash")
        try:
            self._db.execute("ATTACH DATABASE ? AS shard", (str(shard),))
        except sqlite3.DatabaseError as err:
            raise ValueError(f"shard {shard}: cannot open it: {err}") from None
        try:
            before = self._db.total_changes
            with self._db:
                self._db.execute(
                    f"INSERT INTO main.runs ({quoted}) SELECT {quoted} FROM shard.runs WHERE true "
                    f'ON CONFLICT (config_hash) DO UPDATE SET {update} WHERE excluded."end" > runs."end"'
                )
            return self._db.total_changes - before
        except sqlite3.DatabaseError as err:
            raise ValueError(f"shard {shard}: not a simfloat results store: {err}") from None
        finally:
            self._db.execute("DETACH DATABASE shard")

    def rows(self) -> Iterable[dict[str, Any]]:
        """Every stored run as a dict: the :data:`COLUMNS`, ``config`` and ``metrics`` (decoded)."""
        return _rows(self._db)


def _rows(db: sqlite3.Connection) -> Iterable[dict[str, Any]]:
    cur = db.execute(
        "SELECT " + ", ".join(f'"{c}"' for c in (*COLUMNS, "config", "metrics")) + " FROM runs ORDER BY start"
    )
    for rec in cur:
        row = dict(zip((*COLUMNS, "config", "metrics"), rec, strict=True))
        row["config"] = json.loads(row["config"])
        row["metrics"] = json.loads(row["metrics"]) if row["metrics"] is not None else {}
        yield row


def merge_shards(store: str | Path) -> int:
    """Merge every shard of a store (``<store>.shards/*.db``) into it (:meth:`Store.merge`); the shards stay
    (a worker may still be writing one): merging again is harmless.

    Returns:
        The rows added or replaced.
    """
    with Store(store, wal=None) as st:
        return sum(st.merge(p) for p in _shards(Path(store)))


def _cell(value: Any) -> Any:
    """A config value as a DataFrame cell: lists and tables as their JSON text (hashable, groupable)."""
    return json.dumps(value, sort_keys=True) if isinstance(value, list | dict) else value


def load(store: str | Path) -> pd.DataFrame:
    """The store as a DataFrame: one row per finished run (failed runs too, with ``status == "failed"`` and
    their traceback in ``error``).

    Columns: the config keys (list values as JSON text), the metric names, then :data:`COLUMNS`
    (``config_hash``, ``sweep``, ``kind``, ``status``, ``error``, ``start``/``end`` as UNIX seconds, ``wall_s``,
    ``worker``, ``hostname``, the python/numpy/numba/simfloat versions of the worker, and its CPU:
    ``cpu_model`` as the OS names it, ``cpu`` and ``cpu_features`` the LLVM target numba compiled for).
    ``df.attrs["config_columns"]`` and ``df.attrs["metric_columns"]`` list which columns are which. The runs
    of the store's shards (:func:`shard_dir`) not yet merged are included (the newest row of a config wins);
    nothing is written.

    Raises:
        ValueError: the file does not exist or is not a store.
    """
    import pandas as pd

    path = Path(store)
    if not path.is_file():
        raise ValueError(f"store {path}: no such file")
    with Store(path, wal=None) as s:
        latest = {r["config_hash"]: r for r in s.rows()}
    for shard in _shards(path):  # runs a sweep with shards has not merged yet (nothing is written here)
        try:
            db = sqlite3.connect(shard, timeout=60.0)
            try:
                for r in _rows(db):
                    old = latest.get(r["config_hash"])
                    if old is None or (r["end"] or 0.0) > (old["end"] or 0.0):
                        latest[r["config_hash"]] = r
            finally:
                db.close()
        except sqlite3.DatabaseError as err:
            raise ValueError(f"shard {shard}: not a simfloat results store: {err}") from None
    rows = sorted(latest.values(), key=lambda r: r["start"] or 0.0)
    config_cols = list(dict.fromkeys(k for r in rows for k in r["config"]))
    metric_cols = list(dict.fromkeys(k for r in rows for k in r["metrics"] if k not in config_cols))
    records = []
    for r in rows:
        rec = {k: _cell(r["config"].get(k)) for k in config_cols}
        rec.update({k: r["metrics"].get(k) for k in metric_cols})
        rec.update({c: r[c] for c in COLUMNS})
        records.append(rec)
    df = pd.DataFrame(records, columns=[*config_cols, *metric_cols, *COLUMNS])
    df.attrs["config_columns"] = config_cols
    df.attrs["metric_columns"] = metric_cols
    return df
