"""The tables of :func:`simfloat.attribution.attribute`: the deviation metrics, the rows of every table
from the finished runs, and the DataFrames."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from simfloat.attention import Plan
from simfloat.attribution._deviation import LITERATURE, METRICS, deviation, literature
from simfloat.attribution._plans import (
    describe,
    isolation_plan,
)
from simfloat.attribution._request import Request
from simfloat.attribution._result import Attribution
from simfloat.attribution._runner import Runner

#: the tables :func:`tabulate` fills, in :class:`Attribution`'s order
_TABLES = (
    "isolation",
    "ablation",
    "tiles",
    "steps",
    "flash_vs_baseline",
    "input_rounding",
    "by_block",
    "state_by_block",
)


class _PlanRuns(NamedTuple):
    """One plan's finished runs, as its table rows read them: ``keys`` its run keys (:func:`_schedule`), ``golden``
    the golden output of its inputs, ``full``/``ref``/``base`` the deviations of the plan, of every op in float64
    and of its paired baseline."""

    plan: Plan
    keys: dict[str, Any]
    run: Runner
    golden: np.ndarray
    full: dict[str, float]
    ref: dict[str, float]
    base: dict[str, float]

    def dev(self, key: tuple[object, ...]) -> dict[str, float]:
        """The deviation of a run from the golden output of its inputs."""
        return deviation(self.run.out(key), self.golden)


def tabulate(
    run: Runner, req: Request, keys: dict[str, Any], rounding: dict[str, tuple[str, int]]
) -> dict[str, list[Any]]:
    """The rows of every table, plan by plan (by_block/state_by_block: one long frame per traced plan)."""
    rows: dict[str, list[Any]] = {t: [] for t in _TABLES}
    for p in req.plans:
        kk = keys[p.name]
        golden = run.out(run.golden[kk["variant"]])
        full, ref, base = (deviation(run.out(kk[k]), golden) for k in ("main", "ref", "base"))
        pr = _PlanRuns(p, kk, run, golden, full, ref, base)
        _op_rows(rows, pr, req.ops)
        _grid_rows(rows, pr, req)
        _fvb_rows(rows, pr, req)
        if kk["variant"] is not None:
            _input_rows(rows, pr, rounding[p.name])
        tr = run.jobs[kk["traced"]].get("tracer") if kk["traced"] is not None else None
        if tr is not None:
            rows["by_block"].append(_long(tr.by_block, "op", p.name, ("max_abs", "rms", "rel_max")))
            rows["state_by_block"].append(_long(tr.state_by_block, "state", p.name, ("max_abs", "rms", "rel_max")))
    return rows


def _op_rows(rows: dict[str, list[Any]], pr: _PlanRuns, ops: list[str]) -> None:
    """The isolation and ablation rows of a plan: one per op, then the whole plan / every op fp64."""
    p, full = pr.plan, pr.full

    def frac(d: dict[str, float]) -> dict[str, float]:
        return {"frac_max": _ratio(d["max_abs"], full["max_abs"]), "frac_rms": _ratio(d["rms"], full["rms"])}

    for op in ops:
        entry = describe(getattr(p, op))
        d = pr.dev(pr.keys["iso"][op])
        rows["isolation"].append(dict(plan=p.name, op=op, entry=entry, **d, **frac(d)))
        d = pr.dev(pr.keys["abl"][op])
        rows["ablation"].append(dict(plan=p.name, op=op, entry=entry, **d, **frac(d)))
    rows["isolation"].append(dict(plan=p.name, op="all", entry="(the plan)", **full, **frac(full)))
    rows["ablation"].append(dict(plan=p.name, op="all", entry="(every op fp64)", **pr.ref, **frac(pr.ref)))


def _grid_rows(rows: dict[str, list[Any]], pr: _PlanRuns, req: Request) -> None:
    """The tile study's rows (per (block_m, block_n)) and the steps study's (per block_n at block_m)."""
    cells: tuple[tuple[str, list[tuple[object, int, int]]], ...] = (
        ("tiles", [(t, t[0], t[1]) for t in req.tile_list]),
        ("steps", [(b, req.bm, b) for b in req.bns]),
    )
    for what, grid in cells:
        for t, tbm, tbn in grid:
            d = pr.dev(pr.keys[what][t])
            steps = -(-req.seq_k // tbn)
            ratio = _ratio(d["max_abs"], pr.base["max_abs"])
            rows[what].append(dict(plan=pr.plan.name, block_m=tbm, block_n=tbn, steps=steps, **d, ratio_max=ratio))


def _fvb_rows(rows: dict[str, list[Any]], pr: _PlanRuns, req: Request) -> None:
    """The flash-vs-baseline rows of a plan: its flash output and its paired baseline's, with the literature's
    metrics."""
    p, base = pr.plan, pr.base
    flash_side = ("flash", p.name, pr.full, pr.keys["main"], req.bm, req.bn)
    base_side = ("baseline", req.pairs[p.name].name, base, pr.keys["base"], None, None)
    for kernel, kplan, d, key, bm, bn in (flash_side, base_side):
        lit = literature(pr.run.out(key), pr.golden)
        ratios = dict(ratio_max=_ratio(d["max_abs"], base["max_abs"]), ratio_rms=_ratio(d["rms"], base["rms"]))
        rows["flash_vs_baseline"].append(
            dict(plan=p.name, kernel=kernel, kernel_plan=kplan, block_m=bm, block_n=bn, **d, **ratios, **lit)
        )


def _input_rows(rows: dict[str, list[Any]], pr: _PlanRuns, note: tuple[str, int]) -> None:
    """The input-rounding rows of a plan whose input format does not hold the operands."""
    run = pr.run
    given = run.out(run.golden[None])
    fmt, n_changed = note
    for source, out in (
        ("input rounding", pr.golden),
        ("kernel", None),
        ("total", run.out(pr.keys["main"])),
        ("baseline total", run.out(pr.keys["base"])),
    ):
        d = pr.full if out is None else deviation(out, given)
        rows["input_rounding"].append(
            dict(plan=pr.plan.name, source=source, input_format=fmt, values_rounded=n_changed, **d)
        )


def bounds_table(pd: Any, run: Runner, req: Request, keys: dict[str, Any]) -> Any:
    """With ``bounds``: the error bounds of every isolated op and output next to the measured error."""
    from simfloat.bounds import attribution_bounds

    parts = []
    for var in dict.fromkeys(keys[p.name]["variant"] for p in req.plans):
        bruns = []
        for p in req.plans:
            kk = keys[p.name]
            if kk["variant"] != var:
                continue
            bruns += [(p.name, op, "flash", isolation_plan(p, op), run.out(kk["iso"][op])) for op in req.ops]
            bruns += [
                (p.name, "all", "flash", p, run.out(kk["main"])),
                (p.name, "all", "baseline", req.pairs[p.name], run.out(kk["base"])),
            ]
        qv, kv_, vv = run.inputs[var]
        gold = run.out(run.golden[var])
        parts.append(
            attribution_bounds(
                qv, kv_, vv, bruns, gold, block_m=req.bm, block_n=req.bn, causal=req.causal, scale=req.scale
            )
        )
    return pd.concat(parts, ignore_index=True)


def frames(pd: Any, rows: dict[str, list[Any]], meta: dict[str, Any], bound_table: Any) -> Attribution:
    """The tables as DataFrames, in their columns' order."""

    def frame(table: str, cols: Sequence[str]) -> Any:
        return pd.DataFrame(rows[table], columns=list(cols))

    def long(table: str, col: str) -> Any:
        if rows[table]:
            return pd.concat(rows[table], ignore_index=True)
        return pd.DataFrame([], columns=["plan", "kv_block", col, "max_abs", "rms", "rel_max"])

    m = list(METRICS)
    geo = ["plan", "block_m", "block_n", "steps"]
    return Attribution(
        isolation=frame("isolation", ["plan", "op", "entry", *m, "frac_max", "frac_rms"]),
        ablation=frame("ablation", ["plan", "op", "entry", *m, "frac_max", "frac_rms"]),
        tiles=frame("tiles", [*geo, *m, "ratio_max"]),
        steps=frame("steps", [*geo, *m, "ratio_max"]),
        flash_vs_baseline=frame(
            "flash_vs_baseline",
            ["plan", "kernel", "kernel_plan", "block_m", "block_n", *m, "ratio_max", "ratio_rms", *LITERATURE],
        ),
        by_block=long("by_block", "op"),
        state_by_block=long("state_by_block", "state"),
        meta=meta,
        bounds=bound_table,
        input_rounding=frame("input_rounding", ["plan", "source", "input_format", "values_rounded", *m]),
    )


def _ratio(a: float, b: float) -> float:
    if b == 0 or not (math.isfinite(a) and math.isfinite(b)):
        return math.nan if a != 0 or b != 0 else 1.0
    return a / b


def _long(summary: Any, col: str, plan_name: str, stats: Sequence[str]) -> Any:
    """Melt a Tracer's wide (kv_block x op|state) summaries for several stats into one long table."""
    df = None
    for s in stats:
        wide = summary(s)
        part = wide.reset_index().melt(id_vars="kv_block", var_name=col, value_name=s)
        part[col] = part[col].astype(str)
        df = part if df is None else df.merge(part, on=["kv_block", col])
    if df is None:
        raise ValueError("stats must name at least one statistic")
    df = df.dropna(subset=list(stats), how="all").reset_index(drop=True)  # (block, op) pairs never recorded
    df.insert(0, "plan", plan_name)
    return df
