"""The results store: one SQLite row per finished run, keyed by its config hash, committed as each run comes
back, so that a killed sweep keeps every run it finished and a rerun skips them.

The file is an SQLite database in WAL mode with one table, ``runs``; config and metrics are JSON texts,
expanded into columns by :func:`load`.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["COLUMNS", "Store", "load"]

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
)

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
    simfloat TEXT
)
"""


class Store:
    """An open results store (created on first use; the folder must exist).

    Args:
        path: the SQLite file.

    Raises:
        ValueError: ``path`` is a folder, its folder does not exist, or the file is not a simfloat store.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise ValueError(f"store {self.path}: is a folder; give the SQLite file's path")
        if not self.path.parent.is_dir():
            raise ValueError(f"store {self.path}: folder {self.path.parent} does not exist")
        try:
            self._db = sqlite3.connect(self.path, timeout=30.0)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(_SCHEMA)
            self._db.commit()
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
        cols = [*COLUMNS, "config", "metrics"]
        values = [row.get(c) for c in COLUMNS]
        values.append(json.dumps(row["config"], sort_keys=True))
        metrics = row.get("metrics")
        values.append(None if metrics is None else json.dumps(metrics, sort_keys=True))
        quoted = ", ".join(f'"{c}"' for c in cols)
        marks = ", ".join("?" for _ in cols)
        with self._db:  # one transaction, committed on exit
            self._db.execute(f"INSERT OR REPLACE INTO runs ({quoted}) VALUES ({marks})", values)

    def rows(self) -> Iterable[dict[str, Any]]:
        """Every stored run as a dict: the :data:`COLUMNS`, ``config`` and ``metrics`` (decoded)."""
        cur = self._db.execute(
            "SELECT " + ", ".join(f'"{c}"' for c in (*COLUMNS, "config", "metrics")) + " FROM runs ORDER BY start"
        )
        for rec in cur:
            row = dict(zip((*COLUMNS, "config", "metrics"), rec, strict=True))
            row["config"] = json.loads(row["config"])
            row["metrics"] = json.loads(row["metrics"]) if row["metrics"] is not None else {}
            yield row


def _cell(value: Any) -> Any:
    """A config value as a DataFrame cell: lists and tables as their JSON text (hashable, groupable)."""
    return json.dumps(value, sort_keys=True) if isinstance(value, list | dict) else value


def load(store: str | Path) -> pd.DataFrame:
    """The store as a DataFrame: one row per finished run (failed runs too, with ``status == "failed"`` and
    their traceback in ``error``).

    Columns: the config keys (list values as JSON text), the metric names, then :data:`COLUMNS`
    (``config_hash``, ``sweep``, ``kind``, ``status``, ``error``, ``start``/``end`` as UNIX seconds, ``wall_s``,
    ``worker``, ``hostname`` and the python/numpy/numba/simfloat versions of the worker).
    ``df.attrs["config_columns"]`` and ``df.attrs["metric_columns"]`` list which columns are which.

    Raises:
        ValueError: the file does not exist or is not a store.
    """
    import pandas as pd

    path = Path(store)
    if not path.is_file():
        raise ValueError(f"store {path}: no such file")
    with Store(path) as s:
        rows = list(s.rows())
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
