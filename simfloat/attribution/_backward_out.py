"""What the backward pass's attribution shows: its console tables, CSVs and figures
(:func:`simfloat.attribution.backward.attribute_backward`'s :class:`~simfloat.attribution.Attribution`, and
the row lists of :func:`~simfloat.attribution.backward.backward_steps`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from simfloat.attribution._extras import need, pyplot, save_figure

__all__ = [
    "backward_csv",
    "backward_plot",
    "backward_steps_plot",
    "backward_table",
    "steps_table",
    "write_backward",
    "write_backward_steps",
]

_GRADS = ("dq", "dk", "dv")


class _Backward(Protocol):
    """What these views read of a backward :class:`~simfloat.attribution.Attribution` (the record's module
    imports this one, so the record is named by its fields here)."""

    @property
    def meta(self) -> dict[str, Any]: ...
    @property
    def tiles(self) -> Any: ...
    @property
    def isolation(self) -> Any: ...
    @property
    def ablation(self) -> Any: ...
    @property
    def steps(self) -> Any: ...


def _frame_csv(rows: Sequence[dict[str, Any]], out: Path, name: str) -> tuple[Any, Path, Any]:
    """What both writers start with: pandas and matplotlib (Agg) loaded (a missing one: an ImportError naming
    the extra), ``rows`` as a DataFrame written to ``out/<name>.csv`` (folder created). Returns (the frame, the
    CSV's path, matplotlib.pyplot)."""
    pd = need("pandas", f"simfloat.attribution.backward ({name})")
    plt = pyplot(f"simfloat.attribution.backward ({name})")
    out.mkdir(parents=True, exist_ok=True)
    df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    csv_path = out / f"{name}.csv"
    df.to_csv(csv_path, index=False)
    return df, csv_path, plt


def _curves(df: Any) -> list[tuple[str, Any]]:
    out = []
    for kind in ("full", "forward"):
        out.append((kind, df[df.kind == kind]))
    for op in dict.fromkeys(df[df.kind == "isolation"].op):
        out.append((f"isolated {op}", df[(df.kind == "isolation") & (df.op == op)]))
    return out


def _steps_figure(plt: Any, df: Any, title: str, metric: str) -> Any:
    sweeps = list(dict.fromkeys(df.sweep)) if len(df) else []
    fig, axes = plt.subplots(max(len(sweeps), 1), 3, figsize=(16, 4.6 * max(len(sweeps), 1)), squeeze=False)
    styles = {"full": ("k", "o-"), "forward": ("tab:gray", "s--")}
    palette = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive")
    ops = [label for label, _ in _curves(df) if label not in styles]
    for i, label in enumerate(ops):  # one color per op across all panels (gray and black: full, forward)
        styles[label] = (palette[i % len(palette)], "^:")
    for i, sweep in enumerate(sweeps):
        part = df[df.sweep == sweep].sort_values("steps")
        first = part.iloc[0]
        if sweep == "block_n":
            what = f"block_n sweep: seq_q {first.seq_q}, seq_k {first.seq_k}, block_m {first.block_m}"
        else:
            what = f"length sweep: tile {first.block_m}x{first.block_n}, N = {part.seq_k.min()}..{part.seq_k.max()}"
        for j, g in enumerate(_GRADS):
            ax = axes[i][j]
            for label, c in _curves(part):
                y = c[f"{g}_{metric}"]
                if not (y > 0).any():  # an op that does not touch this gradient (exactly 0): not drawn
                    continue
                color, style = styles[label]
                ax.plot(c.steps[y > 0], y[y > 0], style, color=color, label=label)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("rescaling steps = ceil(seq_k / block_n)")
            ax.set_title(f"{g} {metric} vs rescaling steps ({what})", fontsize=8)
            if ax.get_lines():
                ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3)
    note = f"{metric} of each gradient against the fp64 golden one; exact zeros (an op not on that gradient) not drawn"
    fig.suptitle(f"{title}\n{note}" if title else note, fontsize=10)
    return fig


def write_backward_steps(
    rows: Sequence[dict[str, Any]], out: str | Path, title: str = "", metric: str = "rel_l1"
) -> tuple[Path, Path]:
    """``backward_steps.csv`` (every row of :func:`~simfloat.attribution.backward.backward_steps`) and
    ``backward_steps.png`` (``metric`` of dQ, dK, dV vs rescaling steps: one row of panels per sweep, one curve
    per kind/op; an op whose deviation of a gradient is exactly 0 (it does not touch it) is left out of that
    panel) into ``out``."""
    df, csv_path, plt = _frame_csv(rows, Path(out), "backward_steps")
    return csv_path, save_figure(plt, _steps_figure(plt, df, title, metric), csv_path.with_suffix(".png"), dpi=110)


def steps_table(rows: Sequence[dict[str, Any]] | Any) -> str:
    """The console table of :func:`~simfloat.attribution.backward.backward_steps`: relative L1 and max / max
    |golden| per point, kind and op."""
    lines = [
        f"{'sweep':>7} {'seq':>6} {'tile':>9} {'steps':>5} {'q_tiles':>7} {'kind':>9} {'op':>10} "
        f"{'dq_rel_l1':>9} {'dk_rel_l1':>9} {'dv_rel_l1':>9} {'dq_max':>9} {'dk_max':>9} {'dv_max':>9}"
    ]
    records = rows.to_dict("records") if hasattr(rows, "to_dict") else rows
    for r in records:
        lines.append(
            f"{r['sweep']:>7} {r['seq_k']:>6} {r['block_m']:>4}x{r['block_n']:<4} {r['steps']:>5} "
            f"{r['q_tiles']:>7} {r['kind']:>9} {r['op']:>10} "
            + " ".join(f"{r[f'{g}_rel_l1']:9.2e}" for g in _GRADS)
            + " "
            + " ".join(f"{r[f'{g}_max']:9.2e}" for g in _GRADS)
        )
    return "\n".join(lines)


def _attribution_figure(plt: Any, df: Any, title: str) -> Any:
    first = df[(df.block_m == df.block_m.iloc[0]) & (df.block_n == df.block_n.iloc[0])]
    fig, ax = plt.subplots(1, 3, figsize=(16, 5.2))
    for i, kind in enumerate(("isolation", "ablation")):
        part = first[first.kind == kind]
        x = np.arange(len(part))
        for j, g in enumerate(_GRADS):
            ax[i].bar(x + (j - 1) * 0.27, part[f"{g}_max"], 0.27, label=g)
        ax[i].set_xticks(x, part.op, rotation=60, fontsize=8)
        ax[i].set_yscale("log")
        ax[i].set_title(
            f"{kind}: max deviation / max |golden| (tile {int(first.block_m.iloc[0])}x{int(first.block_n.iloc[0])})",
            fontsize=9,
        )
        if len(part):
            ax[i].legend(fontsize=8)
    for kind, style in (("full", "o-"), ("forward", "s--")):
        part = df[df.kind == kind]
        labels = [f"{a}x{b}" for a, b in zip(part.block_m, part.block_n, strict=True)]
        for g in _GRADS:
            ax[2].plot(labels, part[f"{g}_max"], style, label=f"{g} {kind}")
    ax[2].set_yscale("log")
    ax[2].set_title("vs tiles: full plan, and the forward's share alone", fontsize=9)
    ax[2].legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def write_backward(rows: Sequence[dict[str, Any]], out: str | Path, title: str = "") -> tuple[Path, Path]:
    """``backward_attribution.csv`` and ``backward_attribution.png`` (isolation and ablation per op, dQ/dK/dV
    max deviation, first tile; full and forward-only deviation per tile) into ``out``."""
    df, csv_path, plt = _frame_csv(rows, Path(out), "backward_attribution")
    return csv_path, save_figure(plt, _attribution_figure(plt, df, title), csv_path.with_suffix(".png"), dpi=110)


def _long(res: _Backward) -> Any:
    """The backward result's attribution rows in one frame: per tile, full and forward, then isolation and
    ablation."""
    import pandas as pd

    parts = [res.tiles, res.isolation, res.ablation]
    df = pd.concat([p for p in parts if len(p)], ignore_index=True)
    order = {t: i for i, t in enumerate(dict.fromkeys(zip(df.block_m, df.block_n, strict=True)))}
    df["_tile"] = [order[t] for t in zip(df.block_m, df.block_n, strict=True)]
    return df.sort_values("_tile", kind="stable").drop(columns="_tile").reset_index(drop=True)


def _head(res: _Backward) -> str:
    m = res.meta
    call = m.get("call")
    src = "" if not call else f"; call {call['index']} ({call['module'] or 'outermost module'}, {call['dtype']})"
    return (
        f"backward attribution: plan {m['plans'][0]} (forward {m['forward_plan']}), q {m['shape_q']}, k "
        f"{m['shape_k']}, v {m['shape_v']}, tiles {m['tiles']}{', causal' if m['causal'] else ''}{src}"
    )


def backward_table(res: _Backward) -> str:
    """The console text of a backward :class:`~simfloat.attribution.Attribution`: per tile, kind and op the
    max deviation of dQ, dK, dV relative to max |golden|; then the steps study, if it ran."""
    lines = [_head(res), f"{'tile':>9} {'kind':>9} {'op':>10} {'dq_max':>9} {'dk_max':>9} {'dv_max':>9}"]
    for r in _long(res).itertuples():
        lines.append(
            f"{r.block_m:>4}x{r.block_n:<4} {r.kind:>9} {r.op:>10} {r.dq_max:9.2e} {r.dk_max:9.2e} {r.dv_max:9.2e}"
        )
    if len(res.steps):
        lines += ["", steps_table(res.steps.drop(columns="plan"))]
    return "\n".join(lines)


def backward_csv(res: _Backward, folder: Path) -> list[Path]:
    """``backward_attribution.csv`` (and ``backward_steps.csv`` with the steps study) in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / "backward_attribution.csv"]
    _long(res).to_csv(paths[0], index=False)
    if len(res.steps):
        paths.append(folder / "backward_steps.csv")
        res.steps.to_csv(paths[-1], index=False)
    return paths


def backward_plot(res: _Backward, path: Path, title: str = "") -> Path:
    """The per-op and per-tile figure of a backward result, saved as ``path``."""
    plt = pyplot("Attribution.plot")
    return save_figure(plt, _attribution_figure(plt, _long(res), title or _head(res)), path, dpi=110)


def backward_steps_plot(res: _Backward, path: Path, title: str = "", metric: str = "rel_l1") -> Path:
    """The steps study's figure of a backward result (it needs ``steps=True``), saved as ``path``.

    Raises:
        ValueError: the result has no steps study.
    """
    if not len(res.steps):
        raise ValueError("this backward attribution has no steps study: run attribute_backward(..., steps=True)")
    plt = pyplot("Attribution.plot_steps")
    return save_figure(plt, _steps_figure(plt, res.steps, title or _head(res), metric), path, dpi=110)
