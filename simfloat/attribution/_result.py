"""The result of :func:`simfloat.attribute`: tables, a console summary, CSVs and one PNG."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Attribution"]

_TABLES = ("isolation", "ablation", "tiles", "steps", "flash_vs_baseline", "by_block", "state_by_block")


def _e(x: object) -> str:
    if isinstance(x, float):
        return "nan" if math.isnan(x) else f"{x:.2e}"
    return str(x)


def _r(x: object) -> str:
    return "nan" if isinstance(x, float) and math.isnan(x) else f"{x:.2f}"


@dataclass
class Attribution:
    """Deviations from the float64 golden output (fp64 baseline attention), one row per run.

    Every table has the metrics ``max_abs`` (max |O - O_golden|), ``mean_abs``, ``rms`` and ``rel_rms``
    (rms / rms(O_golden)) over the evaluated outputs.

    Attributes:
        isolation: per (plan, op): only that op in the plan's precision (``op == "all"``: the plan itself);
            ``frac_max``/``frac_rms``: the metric over the plan's.
        ablation: per (plan, op): only that op raised to float64 (``op == "all"``: every op float64 under the
            plan's flags); ``frac_*`` as above (1 - frac is what raising that op removes).
        tiles: per (plan, block_m, block_n); ``steps`` = ceil(seq_k / block_n) rescaling steps;
            ``ratio_max``: max_abs over the paired baseline's.
        steps: per (plan, block_n) at the default block_m.
        flash_vs_baseline: per (plan, kernel): the flash run and its paired baseline plan's run
            (``kernel_plan``); ratios against the baseline row; and the literature's metrics
            (:data:`~simfloat.attribution.LITERATURE`: std_abs, mre, mre_last4, cos_sim, rel_l1, snr_db).
        by_block: per (plan, kv block, op): the traced run's local rounding error (max_abs, rms, rel_max);
            kv block -1 is the epilogue (normalize, output cast).
        state_by_block: per (plan, kv block, state): drift of m_i, l_i, acc, out from the float64 shadow.
        meta: shapes, rows evaluated, tiles, plans and their baselines, number of distinct runs.
        bounds: with ``attribute(..., bounds=True)``: per (plan, op, kernel) the error bounds of
            :mod:`simfloat.bounds` next to the measured error (:func:`simfloat.bounds.attribution_bounds`);
            else None.
        input_rounding: per plan whose input format did not hold the inputs (which were then rounded into
            it) and ``source``: ``input rounding`` (the golden output of the rounded inputs against that of the
            inputs as given), ``kernel`` (the plan on the rounded inputs against their golden output: the other
            tables' error), ``total`` and ``baseline total`` (the flash and the paired baseline run against the
            golden output of the inputs as given); ``input_format``, ``values_rounded``. Empty when no plan
            rounded them.

    The backward pass (:func:`simfloat.attribution.backward.attribute_backward`, ``meta["pass"] ==
    "backward"``) fills ``isolation``, ``ablation`` (per op), ``tiles`` (per tile, ``kind`` full / forward) and
    ``steps`` (:func:`~simfloat.attribution.backward.backward_steps`) with the gradients' deviations
    (``dq_max``, ``dq_rms``, ... of dq, dk, dv), the other tables empty; ``table()``, ``to_csv()`` and
    ``plot()`` show those.
    """

    isolation: pd.DataFrame
    ablation: pd.DataFrame
    tiles: pd.DataFrame
    steps: pd.DataFrame
    flash_vs_baseline: pd.DataFrame
    by_block: pd.DataFrame
    state_by_block: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)
    bounds: pd.DataFrame | None = None
    input_rounding: pd.DataFrame | None = None

    def __repr__(self) -> str:
        m = self.meta
        kind = "" if m.get("pass", "forward") == "forward" else "pass='backward', "
        return (
            f"Attribution({kind}plans={m.get('plans')}, q={m.get('shape_q')}, rows={m.get('rows')}, "
            f"runs={m.get('runs')})"
        )

    @property
    def backward(self) -> bool:
        """The result of the backward pass's attribution (``meta["pass"] == "backward"``)."""
        return self.meta.get("pass") == "backward"

    def table(self) -> str:
        """The console summary: flash vs baseline, the input rounding, per-op attribution, deviation vs
        rescaling steps and tiles (backward: per op and per tile, then the steps study)."""
        if self.backward:
            from simfloat.attribution._backward_out import backward_table

            return backward_table(self)
        m = self.meta
        rows = m.get("rows")
        seq_q = m.get("seq_q")
        which = "all query rows" if rows == seq_q else f"{rows} of {seq_q} query rows (evenly spaced)"
        call = m.get("call")
        lines = [
            f"q {m.get('shape_q')}, k {m.get('shape_k')}, v {m.get('shape_v')}; {which}; "
            f"tiles {m.get('block_m')}x{m.get('block_n')}"
            + ("; causal" if m.get("causal") else "")
            + f"; {m.get('runs')} distinct kernel runs",
            *(
                [
                    f"inputs: call {call['index']} of a capture, made by {call['module'] or '(the outermost module)'} "
                    f"({call['module_type']}), {call['dtype']}"
                ]
                if call
                else []
            ),  # fmt: skip
            "deviation = O - O_golden, O_golden = fp64 baseline attention; max_abs is Golden et al.'s metric",
            "",
            "flash vs baseline",
        ]
        fvb = self.flash_vs_baseline[
            ["plan", "kernel", "kernel_plan", "max_abs", "mean_abs", "rms", "rel_rms", "ratio_max", "ratio_rms"]
        ]
        lines.append(fvb.to_string(index=False, formatters=_formatters(fvb)))
        if self.input_rounding is not None and len(self.input_rounding):
            t = self.input_rounding[["plan", "source", "input_format", "values_rounded", "max_abs", "rms", "rel_rms"]]
            lines += [
                "",
                "input rounding: the inputs are not values of these plans' input formats, so they were rounded "
                "into them (as the kernel's caller does); every other table is the kernel's error on the rounded "
                "inputs. Here against O_golden of the inputs as given: the rounding alone, the kernel alone, and "
                "both (total)",
                t.to_string(index=False, formatters=_formatters(t)),
            ]
        for name in self.meta.get("plans", []):
            iso = self.isolation[self.isolation["plan"] == name].set_index("op")
            abl = self.ablation[self.ablation["plan"] == name].set_index("op")
            t = iso[["entry"]].copy()
            t["isolated_max"] = iso["max_abs"]
            t["isolated_rms"] = iso["rms"]
            t["ablated_max"] = abl["max_abs"]
            t["ablated_rms"] = abl["rms"]
            t.loc["all", "entry"] = "(all ops)"
            lines += _section(f"{name} per op (isolated: only this op low-precision; ablated: only this op fp64)", t)
        if len(self.steps):
            s = _by_plan(self.steps, ["steps", "block_n"], self.meta.get("plans", [])).sort_index(ascending=False)
            lines += _section(f"deviation vs rescaling steps = ceil(seq_k / block_n) at block_m={m.get('block_m')}", s)
        if len(self.tiles):
            t = _by_plan(self.tiles, ["block_m", "block_n"], self.meta.get("plans", []))
            lines += _section("deviation vs tiles (block_m x block_n)", t)
        if self.bounds is not None:
            b = self.bounds.drop(columns=["note"])
            lines += [
                "",
                "error bounds (simfloat.bounds; docs/bounds.md) vs measured; tightness = bound / measured",
                b.to_string(index=False, formatters=_formatters(b)),
            ]
            lines += [
                f"  not covered: {r.plan} {r.op} {r.kernel}: {r.note}" for r in self.bounds.itertuples() if r.note
            ]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def to_csv(self, folder: str | Path) -> list[Path]:
        """Write each table as ``<folder>/<table>.csv`` (folder created; ``input_rounding.csv`` and
        ``bounds.csv`` when they hold rows; backward: ``backward_attribution.csv`` and, with the steps study,
        ``backward_steps.csv``). Returns the paths."""
        if self.backward:
            from simfloat.attribution._backward_out import backward_csv

            return backward_csv(self, Path(folder))
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        paths = []
        for name in _TABLES:
            path = out / f"{name}.csv"
            getattr(self, name).to_csv(path, index=False)
            paths.append(path)
        for name in ("input_rounding", "bounds"):
            table = getattr(self, name)
            if table is not None and (name == "bounds" or len(table)):
                paths.append(out / f"{name}.csv")
                table.to_csv(paths[-1], index=False)
        return paths

    def plot_steps(self, path: str | Path, title: str | None = None, metric: str = "rel_l1") -> Path:
        """Backward only: save the steps study's PNG (``metric`` of dQ, dK, dV vs rescaling steps; it needs
        ``attribute_backward(..., steps=True)``). Returns the path.

        Raises:
            ValueError: a forward result (its steps are in :meth:`plot`), or no steps study.
        """
        if not self.backward:
            raise ValueError("plot_steps is the backward result's; a forward result draws its steps in plot()")
        from simfloat.attribution._backward_out import backward_steps_plot

        return backward_steps_plot(self, Path(path), title or "", metric)

    def plot(self, path: str | Path, title: str | None = None) -> Path:
        """Save one PNG: per-op isolation/ablation bars (top), deviation vs tiles, vs rescaling steps, and the
        traced accumulator drift per kv block (bottom); each panel says how many query rows it covers, the
        legends sit below the panels. Backward: per-op bars and the tiles (and :meth:`plot_steps`). Returns the
        path."""
        if self.backward:
            from simfloat.attribution._backward_out import backward_plot

            return backward_plot(self, Path(path), title or "")
        import numpy as np

        from simfloat.attribution._extras import pyplot, save_figure

        plt = pyplot("Attribution.plot")

        plans = list(self.meta.get("plans", []))
        colors = {p: plt.get_cmap("tab10")(i % 10) for i, p in enumerate(plans)}
        m = self.meta
        rows = f"{m.get('rows')} query rows"
        fig = plt.figure(figsize=(16, 11.5))
        gs = fig.add_gridspec(2, 3, height_ratios=[1.1, 1])
        ax = fig.add_subplot(gs[0, :])
        ops = [o for o in dict.fromkeys(self.isolation["op"]) if o != "all"]
        x = np.arange(len(ops))
        width = 0.8 / max(1, 2 * len(plans))
        tiny = 1e-300
        for i, p in enumerate(plans):
            iso = self.isolation[self.isolation["plan"] == p].set_index("op")
            abl = self.ablation[self.ablation["plan"] == p].set_index("op")
            off = (2 * i - len(plans)) * width + width / 2
            ax.bar(
                x + off,
                iso.loc[ops, "max_abs"].clip(lower=tiny),
                width,
                color=colors[p],
                label=f"{p}: only this op low-precision",
            )
            ax.bar(
                x + off + width,
                abl.loc[ops, "max_abs"].clip(lower=tiny),
                width,
                color=colors[p],
                alpha=0.35,
                hatch="//",
                edgecolor=colors[p],
                label=f"{p}: only this op fp64",
            )
            ax.axhline(max(iso.loc["all", "max_abs"], tiny), color=colors[p], ls="--", lw=1, label=f"{p}: whole plan")
        ax.set_xticks(x, ops)
        ax.set_yscale("log")
        ax.set_ylabel("max |O - O_fp64|")
        ax.set_title(f"Per-op attribution: isolation (solid) and ablation (hatched); {rows}")
        ax.legend(fontsize=8, ncol=max(1, len(plans)), loc="upper left", bbox_to_anchor=(0, -0.07))
        bases = self.flash_vs_baseline[self.flash_vs_baseline["kernel"] == "baseline"].set_index("plan")

        def baselines(a: Any) -> None:
            for p in plans:
                if p in bases.index:
                    a.axhline(
                        max(bases.loc[p, "max_abs"], tiny),
                        color=colors[p],
                        ls=":",
                        lw=1.2,
                        label=f"baseline {bases.loc[p, 'kernel_plan']} max",
                    )

        below = dict(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)  # under the axes
        a1 = fig.add_subplot(gs[1, 0])
        if len(self.tiles):
            import pandas as pd

            default = (m.get("block_m"), m.get("block_n"))
            main = self.flash_vs_baseline[self.flash_vs_baseline["kernel"] == "flash"]  # the default tile's run
            extra = main.assign(block_m=default[0], block_n=default[1])[
                ["plan", "block_m", "block_n", "max_abs", "rms"]
            ]
            points = pd.concat([self.tiles[["plan", "block_m", "block_n", "max_abs", "rms"]], extra])
            points = points.drop_duplicates(["plan", "block_m", "block_n"]).sort_values(["block_m", "block_n"])
            tiles = list(dict.fromkeys(zip(points["block_m"], points["block_n"], strict=True)))
            names = [f"{bm}x{bn}" for bm, bn in tiles]
            labels = [n + ("\n(default)" if t == default else "") for n, t in zip(names, tiles, strict=True)]
            for p, g in points.groupby("plan", sort=False):
                xs = [names.index(f"{bm}x{bn}") for bm, bn in zip(g["block_m"], g["block_n"], strict=True)]
                a1.plot(xs, g["max_abs"].clip(lower=tiny), marker="o", color=colors.get(p), label=f"{p} max")
                a1.plot(
                    xs,
                    g["rms"].clip(lower=tiny),
                    marker="s",
                    mfc="none",
                    ls="--",
                    color=colors.get(p),
                    label=f"{p} rms",
                )
            baselines(a1)
            a1.set_xticks(range(len(labels)), labels)
        a1.set_yscale("log")
        a1.set_xlabel("tile block_m x block_n")
        a1.set_ylabel("deviation from fp64")
        a1.set_title(f"Deviation vs tile size; {rows}")
        a1.legend(**below)
        a2 = fig.add_subplot(gs[1, 1])
        if len(self.steps):
            for p, g in self.steps.groupby("plan", sort=False):
                g = g.sort_values("steps")
                a2.plot(g["steps"], g["max_abs"].clip(lower=tiny), marker="o", color=colors.get(p), label=f"{p} max")
                a2.plot(
                    g["steps"],
                    g["rms"].clip(lower=tiny),
                    marker="s",
                    mfc="none",
                    ls="--",
                    color=colors.get(p),
                    label=f"{p} rms",
                )
            baselines(a2)
            a2.set_xscale("log", base=2)
        a2.set_yscale("log")
        a2.set_xlabel(
            f"rescaling steps = ceil(seq_k / block_n), seq_k={self.meta.get('seq_k')}, "
            f"block_m={self.meta.get('block_m')}"
        )
        a2.set_ylabel("deviation from fp64")
        a2.set_title(f"Deviation vs number of rescaling steps; {rows}")
        a2.legend(**below)
        a3 = fig.add_subplot(gs[1, 2])
        sb = self.state_by_block
        if len(sb):
            for p in plans:
                for st, ls in (("acc", "-"), ("l_i", "--")):
                    g = sb[(sb["plan"] == p) & (sb["state"] == st) & (sb["kv_block"] >= 0)]
                    if len(g):
                        g = g.sort_values("kv_block")
                        a3.plot(
                            g["kv_block"],
                            g["rel_max"].clip(lower=tiny),
                            ls=ls,
                            marker="o",
                            ms=3,
                            color=colors[p],
                            label=f"{p}: {st}",
                        )
        a3.set_yscale("log")
        a3.set_xlabel("kv block (rescaling step)")
        a3.set_ylabel("max |state - fp64 shadow| / max |shadow|")
        n_tr = m.get("trace_rows")
        first = "the first ones" if m.get("causal") else "evenly spaced"
        a3.set_title(f"State drift along the key sequence\n(traced run: {n_tr} rows, {first})")
        if a3.get_lines():
            a3.legend(**below)
        fig.suptitle(
            title
            or (
                f"Where the error comes from: q {m.get('shape_q')}, {m.get('rows')} query "
                f"rows evaluated, tiles {m.get('block_m')}x{m.get('block_n')}"
            )
        )
        return save_figure(plt, fig, Path(path), dpi=90)


def _section(title: str, table: Any) -> list[str]:
    """A blank line, ``title`` and ``table`` (its index as columns) as console text."""
    return ["", title, table.reset_index().to_string(index=False, formatters=_formatters(table))]


def _by_plan(long: Any, index: list[str], plans: list[str]) -> Any:
    """max_abs and rms of a per-plan table pivoted to one row per ``index`` value and "plan metric" columns,
    plan by plan."""
    wide = long.pivot_table(index=index, columns="plan", values=["max_abs", "rms"], sort=False)
    wide = wide.reorder_levels([1, 0], axis=1)
    cols = [(p, v) for p in plans for v in ("max_abs", "rms") if (p, v) in wide.columns]
    wide = wide[cols]
    wide.columns = [f"{p} {v}" for p, v in cols]
    return wide


def _formatters(df: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for c in df.columns:
        if str(c).startswith(("ratio", "frac")):
            out[c] = _r
        elif df[c].dtype.kind == "f":
            out[c] = _e
    return out
