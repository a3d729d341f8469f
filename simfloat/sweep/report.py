"""``simfloat report``: a results store as tables and plots. Per metric, the finished runs grouped by the
grid axes named with ``by`` (mean, std, min, max and count over the rest, e.g. the seeds): a CSV, a section of
``report.md``, and a plot of the metric against one axis, one line per value of the other axes."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simfloat.sweep.store import load

__all__ = ["Report", "markdown", "report"]

#: The statistics of every group.
STATS = ("mean", "std", "min", "max", "count")


@dataclass
class Report:
    """What :func:`report` wrote.

    Attributes:
        out: the output folder.
        by: the axes the runs were grouped by.
        x: the plots' horizontal axis (None: no plots).
        metrics: the metrics tabulated.
        runs: finished runs used; failed: failed runs left out.
        files: every file written (CSVs, PNGs, ``report.md``).
    """

    out: Path
    by: list[str]
    x: str | None
    metrics: list[str]
    runs: int
    failed: int
    files: list[Path] = field(default_factory=list)


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        if math.isnan(x):
            return ""
        if x == 0 or 1e-3 <= abs(x) < 1e5:
            return f"{x:.4g}"
        return f"{x:.3e}"
    return str(x)


def markdown(df: Any) -> str:
    """A DataFrame as a GitHub markdown table (no index)."""
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(_fmt(v) for v in row) + " |")
    return "\n".join(lines)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def _numeric(series: Any) -> bool:
    import pandas as pd

    return bool(pd.api.types.is_numeric_dtype(series)) and not pd.api.types.is_bool_dtype(series)


def _plot(stats: Any, metric: str, x: str, lines: list[str], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    groups = stats.groupby(lines, dropna=False, sort=True) if lines else [((), stats)]
    for key, g in groups:
        g = g.sort_values(x)
        key = key if isinstance(key, tuple) else (key,)
        label = ", ".join(f"{a}={v}" for a, v in zip(lines, key, strict=True)) or metric
        xs = g[x].to_numpy()
        mean, std = g["mean"].to_numpy(dtype=float), g["std"].fillna(0.0).to_numpy(dtype=float)
        ax.errorbar(xs, mean, yerr=std, marker="o", ms=3, capsize=2, label=label)
    y = stats["mean"].to_numpy(dtype=float)
    y = y[~(y != y)]
    if len(y) and (y > 0).all() and y.max() > 10 * y.min():
        ax.set_yscale("log")
    xv = stats[x]
    if _numeric(xv) and (xv > 0).all() and xv.max() >= 8 * xv.min():
        ax.set_xscale("log", base=2)
    ax.set_xlabel(x)
    ax.set_ylabel(f"{metric} (mean, bars: std)")
    if len(ax.get_lines()) <= 16:
        ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def report(
    store: str | Path,
    out: str | Path | None = None,
    *,
    by: Sequence[str] | None = None,
    metrics: Sequence[str] | None = None,
    x: str | None = None,
    plots: bool = True,
) -> Report:
    """Tables and plots of a results store.

    Args:
        store: the SQLite store of :func:`simfloat.sweep.run_sweep`.
        out: the output folder (default: next to the store, ``<store stem>-report``); created.
        by: config keys to group by (default: every key that varies across the runs, except ``seed``).
        metrics: numeric metrics to tabulate (default: all).
        x: the plots' horizontal axis, one of ``by`` (default: the first numeric one, else the first).
        plots: write the PNGs (matplotlib).

    Returns:
        A :class:`Report` (per metric ``<metric>.csv`` and ``<metric>.png``, and ``report.md``).

    Raises:
        ValueError: no such store, no finished runs, or a ``by``/``metrics``/``x`` name that is not a config
            key / numeric metric of the store (named).
    """
    df = load(store)
    config_cols, metric_cols = df.attrs["config_columns"], df.attrs["metric_columns"]
    failed = int((df["status"] == "failed").sum())
    df = df[df["status"] == "ok"].copy()
    if df.empty:
        raise ValueError(f"store {store}: no finished runs to report ({failed} failed)")
    numeric = [m for m in metric_cols if _numeric(df[m])]
    if metrics is None:
        metrics = numeric
    for m in metrics:
        if m not in numeric:
            raise ValueError(f"metric {m!r}: not a numeric metric of the store ({', '.join(numeric)})")
    varying = [c for c in config_cols if df[c].nunique(dropna=False) > 1]
    by = [c for c in varying if c != "seed"] if by is None else list(by)
    for c in by:
        if c not in config_cols:
            raise ValueError(f"by {c!r}: not a config key of the store ({', '.join(config_cols)})")
    if x is not None and x not in by:
        raise ValueError(f"x {x!r}: must be one of the grouping axes ({', '.join(by) or 'none'})")
    if x is None and by:
        x = next((c for c in by if _numeric(df[c])), by[0])
    folder = Path(out) if out is not None else Path(store).with_name(Path(store).stem + "-report")
    folder.mkdir(parents=True, exist_ok=True)
    rep = Report(out=folder, by=by, x=x if plots else None, metrics=list(metrics), runs=len(df), failed=failed)
    sweeps = ", ".join(sorted(df["sweep"].astype(str).unique()))
    md = [
        f"# Sweep report: {sweeps}",
        "",
        f"{len(df)} finished runs ({failed} failed, left out) from `{Path(store).name}`; grouped by "
        f"{', '.join(by) or '(nothing: one group)'}; statistics over the other config keys "
        f"({', '.join(c for c in varying if c not in by) or 'none'}).",
    ]
    for m in metrics:
        if by:
            stats = df.groupby(by, dropna=False, sort=True)[m].agg(list(STATS)).reset_index()
        else:
            stats = df[m].agg(list(STATS)).to_frame().T
        csv = folder / f"{_safe(m)}.csv"
        stats.to_csv(csv, index=False)
        rep.files.append(csv)
        md += ["", f"## {m}", "", markdown(stats)]
        if plots and x is not None:
            png = _plot(stats, m, x, [c for c in by if c != x], folder / f"{_safe(m)}.png")
            rep.files.append(png)
            md += ["", f"![{m}]({png.name})"]
    path = folder / "report.md"
    path.write_text("\n".join(md) + "\n")
    rep.files.append(path)
    return rep
