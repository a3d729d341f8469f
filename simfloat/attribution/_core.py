"""attribute(): run every plan variant an attribution needs once (deduplicated), then tabulate deviations."""

from __future__ import annotations

import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from simfloat._interrupt import run_jobs
from simfloat.attention import FLASH_OPS, Plan
from simfloat.attention import baseline as _baseline_kernel
from simfloat.attention import flash as _flash_kernel
from simfloat.attention import plan as _plan
from simfloat.attention._inputs import (
    InputFormatWarning,
    check_layout,
    from_layout,
    input_format,
    kv_repeats,
    not_representable,
    operand,
)
from simfloat.attention.tiling import resolve_tiles
from simfloat.attribution._estimate import Estimate, estimate_runs
from simfloat.attribution._extras import need
from simfloat.attribution._plans import (
    ablation_plan,
    baseline_plan_for,
    cache_key,
    describe,
    isolation_plan,
    reference_plan,
)
from simfloat.attribution._result import Attribution
from simfloat.attribution.captured import SdpaCall, load_capture
from simfloat.metrics import error_metrics
from simfloat.trace import Tracer

__all__ = [
    "LITERATURE",
    "METRICS",
    "AttributionInterrupted",
    "attribute",
    "default_block_ns",
    "default_tiles",
    "deviation",
    "literature",
    "select_rows",
]

#: Deviation metrics of every table row (against the float64 golden output).
METRICS = ("max_abs", "mean_abs", "rms", "rel_rms")


#: The literature's metrics (:func:`simfloat.metrics.error_metrics`, per output row along the head dim) that the
#: flash-vs-baseline table adds to :data:`METRICS` (``rms`` is the RMSE already).
LITERATURE = ("std_abs", "mre", "mre_last4", "cos_sim", "rel_l1", "snr_db")


def literature(out: np.ndarray, golden: np.ndarray) -> dict[str, float]:
    """:data:`LITERATURE` of an output against the golden one (NaN for no elements)."""
    if np.size(out) == 0:
        return dict.fromkeys(LITERATURE, math.nan)
    m = error_metrics(out, golden, axis=-1)
    return {k: m[k] for k in LITERATURE}


def deviation(out: np.ndarray, golden: np.ndarray) -> dict[str, float]:
    """``max_abs`` (max |out - golden|, Golden et al.'s metric), ``mean_abs``, ``rms`` and ``rel_rms``
    (rms / rms(golden)) of an output against the golden one (same shape)."""
    d = np.asarray(out, dtype=np.float64) - np.asarray(golden, dtype=np.float64)
    if d.size == 0:
        return dict.fromkeys(METRICS, math.nan)
    a = np.abs(d)
    rms = float(np.sqrt(np.mean(d * d)))
    g = float(np.sqrt(np.mean(np.square(golden))))
    return {
        "max_abs": float(np.max(a)),
        "mean_abs": float(np.mean(a)),
        "rms": rms,
        "rel_rms": rms / g if g > 0 else math.nan,
    }


def default_tiles(block_m: int = 64, block_n: int = 64) -> list[tuple[int, int]]:
    """The tile grid of the tile study: block_m and block_n each halved and doubled, plus the default."""
    out = {(block_m, block_n)}
    for bm in (max(1, block_m // 2), block_m * 2):
        for bn in (max(1, block_n // 2), block_n * 2):
            out.add((bm, bn))
    return sorted(out)


def default_block_ns(seq_k: int, smallest: int = 16) -> list[int]:
    """block_n values of the rescaling-steps study: powers of two from ``smallest`` up to the first that
    covers all keys in one block (one step)."""
    out = [smallest]
    while out[-1] < seq_k:
        out.append(out[-1] * 2)
    return out


def _positive_int(x: object, what: str) -> int:
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 1:
        raise ValueError(f"{what} must be a positive int, got {x!r}")
    return int(x)


def select_rows(seq_q: int, rows: int | Sequence[int] | None) -> np.ndarray | None:
    """The query rows evaluated: None (all), ``rows`` evenly spaced ones (first and last included), or the
    given indices. Rows are independent in both kernels (without a causal mask), so a row's output is the same
    bits whichever other rows are computed with it."""
    if rows is None:
        return None
    if isinstance(rows, (int, np.integer)) and not isinstance(rows, bool):
        r = _positive_int(rows, "rows")
        if r >= seq_q:
            return None
        return np.unique(np.linspace(0, seq_q - 1, r).round().astype(np.int64))
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence | np.ndarray):
        raise TypeError(f"rows must be None, an int or a sequence of row indices, got {type(rows).__name__}")
    idx = np.asarray(rows, dtype=np.int64).ravel()
    if idx.size == 0 or idx.min() < 0 or idx.max() >= seq_q:
        raise ValueError(f"row indices must be non-empty and within [0, {seq_q}), got {list(rows)[:8]}")
    return np.unique(idx)


class AttributionInterrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`attribute`'s kernel runs (a ``KeyboardInterrupt``, raised within a fraction of a
    second: the runs go on daemon threads).

    Attributes:
        runs: one dict per finished run: ``kernel``, ``plan``, ``block_m``, ``block_n`` (flash), ``traced``,
            ``seconds`` and, once the golden run is among them, its deviation from it (:data:`METRICS`).
        total: the number of distinct runs the tables need.
    """

    def __init__(self, runs: list[dict[str, Any]], total: int) -> None:
        super().__init__(f"interrupted after {len(runs)} of {total} kernel runs")
        self.runs, self.total = runs, total


class _Runner:
    """Collects the (kernel, plan, tiles, inputs) runs the tables need, deduplicated by what determines the
    output, then runs them once each. ``inputs``: the operands by variant (None: as given; a format name: rounded
    into it, for the plans whose input format does not hold them)."""

    def __init__(
        self,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        causal: bool,
        scale: float | None,
        mask: np.ndarray | None = None,
    ) -> None:
        self.inputs: dict[str | None, tuple[np.ndarray, np.ndarray, np.ndarray]] = {None: (q, k, v)}
        self.causal, self.scale = causal, scale
        self.mask = mask  # (..., rows of q, seq_k): a masked call's per-row mask (dense), or None
        self.jobs: dict[tuple[object, ...], dict[str, Any]] = {}
        self.golden: dict[str | None, tuple[object, ...]] = {}

    def variant(self, fmt: str) -> str:
        """The operands rounded into ``fmt`` (made once)."""
        if fmt not in self.inputs:
            from simfloat.rounding import round as _round

            self.inputs[fmt] = tuple(np.asarray(_round(x, fmt), dtype=np.float64) for x in self.inputs[None])  # type: ignore[assignment]
        return fmt

    def need(
        self,
        kernel: str,
        p: Plan,
        bm: int = 0,
        bn: int = 0,
        trace_rows: np.ndarray | None = None,
        variant: str | None = None,
    ) -> tuple[object, ...]:
        """The key of a run; ``trace_rows``: a traced run (reference engine) over those rows of ``q``."""
        key = cache_key(kernel, p) + ((bm, bn) if kernel == "flash" else ()) + (variant,)
        if trace_rows is not None:
            key = key + ("traced", tuple(trace_rows.tolist()))
        self.jobs.setdefault(key, dict(kernel=kernel, plan=p, bm=bm, bn=bn, rows=trace_rows, variant=variant, out=None))
        return key

    def need_golden(self, variant: str | None = None) -> tuple[object, ...]:
        """The golden run (fp64 baseline) of a variant of the inputs."""
        self.golden[variant] = self.need("baseline", _plan("fp64"), variant=variant)
        return self.golden[variant]

    def kernel(self, job: dict[str, Any], q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool) -> Any:
        """Run ``job`` on these operands (its traced rows of q): (output, tracer or None)."""
        traced = job["rows"] is not None
        tr = Tracer() if traced else None
        qs = q[..., job["rows"], :] if traced else q
        kw: dict[str, Any] = dict(plan=job["plan"], causal=causal, scale=self.scale, trace=tr)
        if self.mask is not None and q.shape[-2] == self.mask.shape[-2]:  # (not the estimate's slices)
            kw["attn_mask"] = self.mask[..., job["rows"], :] if traced else self.mask
        if job["kernel"] == "flash":
            return _flash_kernel(qs, k, v, block_m=job["bm"], block_n=job["bn"], **kw), tr
        return _baseline_kernel(qs, k, v, **kw), tr

    def _one(self, job: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        job["out"], job["tracer"] = self.kernel(job, *self.inputs[job["variant"]], self.causal)
        job["seconds"] = time.perf_counter() - t0

    def estimate(self, seq_q: int) -> Estimate:
        """The :class:`Estimate` of the pending runs (timed on calibration slices of the inputs)."""
        q, k, v = self.inputs[None]

        def run_slice(job: dict[str, Any], rows: int, keys: int) -> None:
            qv, kv, vv = self.inputs[job["variant"]]
            lead = (0,) * (qv.ndim - 2)
            qs, ks, vs = (x[lead][None] for x in (qv, kv, vv))
            j = dict(job, rows=np.arange(rows) if job["rows"] is not None else None)
            self.kernel(j, qs[:, :rows], ks[:, :keys], vs[:, :keys], False)

        todo = [j for j in self.jobs.values() if j["out"] is None]
        return estimate_runs(todo, q.shape, v.shape, self.causal, seq_q, run_slice)

    def run(self, progress: bool | Callable[[int, int], None], workers: int) -> None:
        """Run the pending jobs, ``workers`` at a time (the kernels release the GIL; every job is independent,
        so results are the same bits for any number of workers). ``progress``: see :func:`attribute`."""
        todo = [j for j in self.jobs.values() if j["out"] is None]
        if not todo:
            return
        report, close = _progress(progress, len(todo))
        try:  # off the main thread (simfloat._interrupt), so that Ctrl-C stops at once
            report(0, len(todo))
            run_jobs(self._one, todo[:1])  # the golden run first: it checks the arguments before the others
            report(1, len(todo))
            run_jobs(self._one, todo[1:], workers, on_done=lambda _, done: report(done + 1, len(todo)))
        except KeyboardInterrupt:
            raise AttributionInterrupted(self.finished(), len(self.jobs)) from None
        finally:
            close()

    def finished(self) -> list[dict[str, Any]]:
        """The runs finished so far, with their deviation from their inputs' golden run once it is done."""
        out = []
        for j in self.jobs.values():
            if "seconds" not in j:
                continue
            row: dict[str, Any] = dict(
                kernel=j["kernel"],
                plan=j["plan"].name,
                block_m=j["bm"] if j["kernel"] == "flash" else None,
                block_n=j["bn"] if j["kernel"] == "flash" else None,
                traced=j["rows"] is not None,
                inputs=j["variant"] or "as given",
                seconds=round(j["seconds"], 3),
            )
            gold = self.jobs.get(self.golden.get(j["variant"], ()), {})
            if "seconds" in gold:
                ref = gold["out"] if j["rows"] is None else gold["out"][..., j["rows"], :]
                row.update(deviation(j["out"], ref))
            out.append(row)
        return out

    def out(self, key: tuple[object, ...]) -> np.ndarray:
        return self.jobs[key]["out"]


def _progress(progress: object, total: int) -> tuple[Callable[[int, int], None], Callable[[], None]]:
    """(report(done, total), close) for :meth:`_Runner.run`."""
    if callable(progress):
        return progress, lambda: None
    if not progress:
        return (lambda done, total: None), lambda: None
    from simfloat._compiling import BarClock

    tqdm = need("tqdm", "progress=True").tqdm
    bar = BarClock(tqdm(total=total, desc="simfloat attribute", unit="run", file=sys.stderr, leave=False))

    def report(done: int, total: int) -> None:
        bar.update(done - bar.bar.n)

    return report, bar.close


def _plans(p: object) -> list[Plan]:
    items = [p] if isinstance(p, (str, Plan)) else list(p)  # type: ignore[call-overload]  # not iterable: list() raises TypeError
    if not items:
        raise ValueError("attribute needs at least one plan")
    out = [_plan(x) for x in items]
    for p in out:
        if p.quantized:
            raise ValueError(
                f"plan {p.name!r} has quantizers: attribute studies the float flash plans (triton-<fmt>, "
                "h200-<fmt>, all-<fmt>, fp64 or a plan of another name); a plan with quantizers derives its "
                "isolation and ablation plans itself (Plan.isolate, Plan.ablate), to run with flash()"
            )
        if "flash" not in p.kernels():
            raise ValueError(
                f"plan {p.name!r} is a plan of the baseline kernel (torch's eager attention); "
                "attribute studies flash plans (triton-<fmt>, h200-<fmt>, all-<fmt>, fp64 or a plan of "
                f"another name): pass {p.name!r} as baseline= (CLI: --baseline)"
            )
    names = [x.name for x in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"plan names must be distinct (tables are keyed by name), repeated: {dup}")
    return out


def _tiles(tiles: object, d: int) -> list[tuple[int, int]]:
    if isinstance(tiles, (str, bytes)) or not isinstance(tiles, Sequence):
        raise TypeError(f"tiles must be a sequence of (block_m, block_n) pairs, got {type(tiles).__name__}")
    out = []
    for t in tiles:
        if isinstance(t, str):  # a tile rule, e.g. "fa1:M=98304"
            out.append(resolve_tiles(t, d))
            continue
        if isinstance(t, bytes) or not isinstance(t, Sequence) or len(t) != 2:
            raise ValueError(f"each tile must be a (block_m, block_n) pair or a rule such as 'fa1:M=98304', got {t!r}")
        out.append((_positive_int(t[0], "block_m"), _positive_int(t[1], "block_n")))
    return list(dict.fromkeys(out))


def _inputs(
    q: object, k: object, v: object, causal: object, scale: object, call: object, heads: object, layout: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, Any, float | None, SdpaCall | None]:
    """attribute()'s operands: arrays (in ``layout``), or a recorded call (an :class:`SdpaCall`, or a capture
    file's path and ``call``), whose causal mask and scale are the call's. ``heads``: query heads to keep."""
    rec = None
    if isinstance(q, (str, os.PathLike)):
        with load_capture(q) as cap:
            rec = cap[0 if call is None else call]  # type: ignore[index]
    elif isinstance(q, SdpaCall):
        if call is not None and call != q.index:
            raise ValueError(f"call={call} but q is call {q.index} of its capture")
        rec = q
    elif call is not None:
        raise TypeError("call= picks a call of a capture file: pass the file's path (or an SdpaCall) as q")
    if rec is None:
        check_layout(layout)
        q, k, v = (from_layout(x, layout, n) for x, n in ((q, "q"), (k, "k"), (v, "v")))
        if heads is not None:
            arrays = [x for x in (q, k, v) if isinstance(x, np.ndarray)]
            if len(arrays) == 3:
                sel = SdpaCall(0, "", "", "", *arrays).select_heads(heads)  # type: ignore[arg-type]
                q, k, v = sel.q, sel.k, sel.v
        return q, k, v, causal, scale, None  # type: ignore[return-value]
    if k is not None or v is not None:
        raise TypeError("with a recorded call as q, leave k and v out: they are the call's")
    if layout != "bhsd":
        raise ValueError("a recorded call is in torch's layout: leave layout='bhsd'")
    rec.check()
    if causal and not rec.causal:
        raise ValueError(f"causal=True, but {rec.describe()} had no causal mask")
    if scale is not None and scale != rec.scale:
        raise ValueError(f"scale={scale}, but {rec.describe()} had scale {rec.scale}")
    rec = rec.select_heads(heads)  # type: ignore[arg-type]
    return rec.q, rec.k, rec.v, rec.causal, rec.scale, rec


def _rounding_note(plans: list[Plan], q: np.ndarray, k: np.ndarray, v: np.ndarray) -> dict[str, tuple[str, int]]:
    """Per plan whose input format does not hold the operands: (that format, how many values it changes); each
    such format warned about once (:class:`~simfloat.attention.InputFormatWarning`)."""
    out: dict[str, tuple[str, int]] = {}
    counted: dict[str, int] = {}
    for p in plans:
        fmt = input_format(p)
        if fmt is None:
            continue
        if fmt not in counted:
            counted[fmt] = sum(not_representable(x, fmt) for x in (q, k, v))
            if counted[fmt]:
                names = ", ".join(x.name for x in plans if input_format(x) == fmt)
                warnings.warn(
                    f"q, k, v hold {counted[fmt]} of {q.size + k.size + v.size} values that are not {fmt} values "
                    f"(the input format of {names}): attribute rounds them into {fmt} for those plans, as the "
                    f"kernel's caller does, and reports that rounding's own error (the input_rounding table; the "
                    f"other tables hold the kernel's error on the rounded inputs)",
                    InputFormatWarning,
                    stacklevel=3,
                )
        if counted[fmt]:
            out[p.name] = (fmt, counted[fmt])
    return out


def _dense_mask(
    q: np.ndarray,
    k: np.ndarray,
    causal: object,
    attn_mask: object,
    key_lengths: object,
    window: object,
    causal_align: object,
) -> np.ndarray | None:
    """A masked call's mask as one (..., seq_q, seq_k) array every run takes as ``attn_mask``: the visible keys
    (bool), or with an additive mask its values with -inf where a row sees no key; None without a mask."""
    from simfloat.attention._masks import DENSE_ADD, resolve_mask
    from simfloat.rounding import round as _round

    if attn_mask is None and key_lengths is None and window is None and causal_align == "top-left":
        return None
    # the kernels' leading dims: q's heads (grouped-query k, v have fewer), broadcast with the batch dims
    lead = np.broadcast_shapes(q.shape[:-3], k.shape[:-3]) + q.shape[-3:-2] if q.ndim > 2 else ()
    spec = resolve_mask(
        lead=lead,
        seq_q=q.shape[-2],
        seq_k=k.shape[-2],
        causal=bool(causal),
        attn_mask=attn_mask,
        key_lengths=key_lengths,
        window=window,
        causal_align=causal_align,
        fmt_round=lambda a: np.asarray(_round(a, "float64"), dtype=np.float64),
    )
    if spec is None:
        return None
    shape = lead + (q.shape[-2], k.shape[-2])
    if spec.mask.dense != DENSE_ADD:
        return spec.visible.reshape(shape).copy()
    return np.where(spec.visible, spec.mask.bias[spec.mask.bmap], -np.inf).reshape(shape)


def attribute(
    q: np.ndarray | SdpaCall | str | os.PathLike[str],
    k: np.ndarray | None = None,
    v: np.ndarray | None = None,
    plan: Plan | str | Sequence[Plan | str] = "triton-bf16",
    *,
    baseline: object = None,
    block_m: int = 64,
    block_n: int = 64,
    causal: bool = False,
    scale: float | None = None,
    ops: Sequence[str] = FLASH_OPS,
    tiles: Sequence[tuple[int, int]] | None = None,
    block_ns: Sequence[int] | None = None,
    rows: int | Sequence[int] | None = None,
    trace: bool = True,
    trace_rows: int | None = 64,
    progress: bool | Callable[[int, int], None] = False,
    workers: int | None = None,
    bounds: bool = False,
    layout: str = "bhsd",
    call: int | None = None,
    heads: Sequence[int] | None = None,
    estimate: bool | Callable[[Estimate], None] = False,
    attn_mask: np.ndarray | None = None,
    key_lengths: object = None,
    window: tuple[int, int] | None = None,
    causal_align: str = "top-left",
) -> Attribution:
    """Where a flash attention plan's deviation from the float64 golden output comes from.

    The golden output is the *baseline* kernel under the ``fp64`` plan (Golden et al.). For each plan:

    * isolation: only one op in the plan's precision, all others float64 (:func:`isolation_plan`);
    * ablation: only one op raised to float64 (:func:`ablation_plan`);
    * tiles: deviation per (block_m, block_n); steps: per block_n at block_m, i.e. per number of rescaling
      steps ``ceil(seq_k / block_n)`` at the fixed sequence length;
    * flash vs baseline: the plan's flash output and its paired baseline plan's output
      (:func:`baseline_plan_for`), each against the golden one;
    * per kv block (``trace``): the traced run's local error per op and kv block, and the state drift;
    * input rounding: for a plan whose input format (``triton-bf16``: bf16) does not hold the inputs (fp32
      activations), the inputs are rounded into it as the kernel's caller would (with an
      :class:`~simfloat.attention.InputFormatWarning`); every table above is then the kernel's error on the
      rounded inputs (against their golden output), and ``input_rounding`` adds the rounding's own error
      (golden of the rounded inputs against golden of the inputs as given) and the total (the kernel on the
      rounded inputs against the golden of the inputs as given).

    Isolation and ablation keep the plan's algorithm flags (exp2, FMA contraction, normalization, lazy
    rescaling, exp2 implementation, row-sum order: every :class:`Plan` field that is not an op): "all ops
    float64" is :func:`reference_plan`, which is as close to the golden output as float64 arithmetic allows,
    except for what the flags themselves approximate (the hardware ex2 of ``exp2_impl="h200"``). Every
    distinct run is made once (plans equal in every field but their names share it).

    Args:
        q, k, v: (..., seq, head_dim) float arrays, as for :func:`simfloat.attention.flash`; or, as ``q`` alone,
            a recorded call (:class:`~simfloat.attribution.SdpaCall`) or the path of a
            :func:`simfloat.torch.capture_sdpa` file (then ``call`` picks the call, default 0): its q, k, v,
            causal mask and scale.
        plan: a flash plan or preset name, or a sequence of them (distinct names).
        baseline: the baseline plan for the comparison: None (:data:`BASELINE_PAIRS` by plan name), a plan or
            name for all plans, or a mapping {flash plan name: baseline plan}.
        block_m, block_n: the tiles of the isolation, ablation, flash-vs-baseline and traced runs.
        causal, scale: as for :func:`simfloat.attention.flash` (a recorded call's own).
        ops: the ops to attribute (default all of ``FLASH_OPS``).
        tiles: (block_m, block_n) pairs of the tile study, or tile rules such as ``"fa1:M=98304"``
            (:func:`simfloat.attention.tiling.resolve_tiles`, for q's head dim; default :func:`default_tiles`;
            ``()`` skips it).
        block_ns: block_n values of the steps study at ``block_m`` (default :func:`default_block_ns`; ``()``
            skips it).
        rows: query rows to evaluate: None (all), an int (that many, evenly spaced) or row indices. Every
            kernel computes each row independently, so this gives those rows' exact outputs at a fraction of
            the cost; the metrics are then over those rows. Not with ``causal``.
        trace: add a traced default-tile run of each plan (per-kv-block tables). Tracing runs on the scalar
            reference engine, so it covers ``trace_rows`` of the evaluated rows: that many evenly spaced; with
            ``causal`` the first ones (whose masks are those of the full run), at least ``4 * block_n`` of
            them so that they reach four kv blocks; None: all of them.
        progress: ``True``: a tqdm bar on stderr, up before the first run; or a callable
            ``progress(done, total)``, called with ``done = 0`` once the distinct runs are known (before the
            first one starts) and after every run.
        workers: kernel runs made concurrently (default: numba's thread count); results do not depend on it.
        bounds: add the ``bounds`` table: per isolated op and per output (flash plan, paired baseline) the
            worst-case and probabilistic error bounds of :mod:`simfloat.bounds` next to the measured error
            and their ratio (:func:`simfloat.bounds.attribution_bounds`).
        layout: ``"bhsd"`` or ``"bshd"`` (flash-attn's (..., seq, heads, head_dim)) operands; the tables do not
            depend on it.
        call: with a capture file as ``q``: the index of the call to attribute.
        heads: query heads to keep (indices on the head axis; a key/value head goes with each, as grouped-query
            attention maps them); None: all.
        estimate: True or a callable ``estimate(Estimate)``: before the first run, time each kind of run on a
            small slice of the inputs and predict the whole job (:class:`Estimate`, kept in
            ``meta["estimate_s"]``); the callable hears it first (and may raise to stop before any run).
        attn_mask, key_lengths, window, causal_align: a mask, as for :func:`simfloat.attention.flash`, on
            every run (golden, isolation, ablation, tiles, traced rows); a row that sees no key gives 0. Every
            run takes it as each row's dense mask (the bits of the structured mask: skipped tiles are exact
            no-ops), so ``rows`` may be used with it. Not with ``bounds``.

    Returns:
        An :class:`Attribution` (DataFrames ``isolation, ablation, tiles, steps, flash_vs_baseline, by_block,
        state_by_block, input_rounding``; ``plot()``, ``to_csv()``, ``table()``).

    Raises:
        ValueError, TypeError: bad plans, ops, tiles, rows, baseline pairing, or kernel arguments (NaN or
            infinite values in q, k or v are named with their first index).
        NotImplementedError: a recorded call with options the emulator does not model (named).
        AttributionInterrupted: Ctrl-C during the kernel runs (a KeyboardInterrupt holding the finished runs).

    Warns:
        InputFormatWarning: inputs that a plan's input format does not hold (they are rounded, see above).
    """
    pd = need("pandas", "attribute")  # before any work: the tables are DataFrames
    q, k, v, causal, scale, rec = _inputs(q, k, v, causal, scale, call, heads, layout)
    plans = _plans(plan)
    if not (isinstance(progress, bool) or callable(progress)):
        raise TypeError(f"progress must be a bool or a callable progress(done, total), got {type(progress).__name__}")
    ops = list(ops)
    if not ops:
        raise ValueError("ops must name at least one op")
    for op in ops:
        if op not in FLASH_OPS:
            raise ValueError(f"unknown op {op!r}; flash ops: {', '.join(FLASH_OPS)}")
    bm, bn = _positive_int(block_m, "block_m"), _positive_int(block_n, "block_n")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, np.ndarray) or x.ndim < 2:
            raise TypeError(f"{name} must be a numpy array of shape (..., seq, head_dim)")
    q, k, v = (operand(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v")))  # NaN or inf: named by the caller's index
    kv_repeats(q.shape, k.shape, "k"), kv_repeats(q.shape, v.shape, "v")  # heads that do not divide: before any run
    seq_q, seq_k = q.shape[-2], k.shape[-2]
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    sel = select_rows(seq_q, rows)
    if sel is not None and causal:
        raise ValueError(
            "rows (a subset of query rows) cannot be used with causal=True: a causal row's keys "
            "depend on its position; use rows=None"
        )
    tile_list = default_tiles(bm, bn) if tiles is None else _tiles(tiles, int(np.shape(q)[-1]))
    bns = default_block_ns(seq_k) if block_ns is None else [_positive_int(b, "block_n") for b in block_ns]
    bns = list(dict.fromkeys(bns))
    pairs = {p.name: baseline_plan_for(p, baseline) for p in plans}
    n_eval = seq_q if sel is None else len(sel)
    if trace_rows is not None:
        trace_rows = _positive_int(trace_rows, "trace_rows")
    if trace_rows is None or trace_rows >= n_eval:
        t_sel = np.arange(n_eval)
    elif causal:  # the first rows (a subset's mask would not be the full run's), enough to reach 4 kv blocks
        t_sel = np.arange(min(n_eval, max(trace_rows, 4 * bn)))
    else:
        t_sel = np.unique(np.linspace(0, n_eval - 1, trace_rows).round().astype(np.int64))

    qs = q if sel is None else q[..., sel, :]
    rounding = _rounding_note(plans, q, k, v)
    dense = _dense_mask(q, k, causal, attn_mask, key_lengths, window, causal_align)
    if dense is not None and bounds:
        raise ValueError("bounds=True does not model masks: leave attn_mask, key_lengths and window out")
    if dense is not None and sel is not None:
        dense = dense[..., sel, :]
    run = _Runner(qs, k, v, bool(causal), scale, dense)
    run.need_golden()
    keys: dict[str, Any] = {}
    for p in plans:
        var = run.variant(rounding[p.name][0]) if p.name in rounding else None
        if var is not None:
            run.need_golden(var)
        keys[p.name] = dict(
            variant=var,
            main=run.need("flash", p, bm, bn, variant=var),
            traced=run.need("flash", p, bm, bn, trace_rows=t_sel, variant=var) if trace else None,
            ref=run.need("flash", reference_plan(p), bm, bn, variant=var),
            base=run.need("baseline", pairs[p.name], variant=var),
            iso={op: run.need("flash", isolation_plan(p, op), bm, bn, variant=var) for op in ops},
            abl={op: run.need("flash", ablation_plan(p, op), bm, bn, variant=var) for op in ops},
            tiles={t: run.need("flash", p, *t, variant=var) for t in tile_list},
            steps={b: run.need("flash", p, bm, b, variant=var) for b in bns},
        )
    est = None
    if estimate:
        if not (estimate is True or callable(estimate)):
            raise TypeError(f"estimate must be a bool or a callable estimate(Estimate), got {type(estimate).__name__}")
        if callable(progress):  # the number of runs first (as run() would), then the estimate, then the runs
            progress(0, len(run.jobs))
        est = run.estimate(seq_q)
        if callable(estimate):
            estimate(est)
    run.run(progress, _workers(workers))

    def dev(key: tuple[object, ...], variant: str | None) -> dict[str, float]:
        return deviation(run.out(key), run.out(run.golden[variant]))

    iso_rows: list[dict[str, Any]] = []
    abl_rows: list[dict[str, Any]] = []
    tile_rows: list[dict[str, Any]] = []
    step_rows: list[dict[str, Any]] = []
    fvb_rows: list[dict[str, Any]] = []
    inp_rows: list[dict[str, Any]] = []
    blocks: list[Any] = []
    states: list[Any] = []
    for p in plans:
        kk = keys[p.name]
        var = kk["variant"]
        golden = run.out(run.golden[var])
        full, ref, base = dev(kk["main"], var), dev(kk["ref"], var), dev(kk["base"], var)

        def frac(d: dict[str, float], full: dict[str, float] = full) -> dict[str, float]:
            return {"frac_max": _ratio(d["max_abs"], full["max_abs"]), "frac_rms": _ratio(d["rms"], full["rms"])}

        for op in ops:
            entry = describe(getattr(p, op))
            d = dev(kk["iso"][op], var)
            iso_rows.append(dict(plan=p.name, op=op, entry=entry, **d, **frac(d)))
            d = dev(kk["abl"][op], var)
            abl_rows.append(dict(plan=p.name, op=op, entry=entry, **d, **frac(d)))
        iso_rows.append(dict(plan=p.name, op="all", entry="(the plan)", **full, **frac(full)))
        abl_rows.append(dict(plan=p.name, op="all", entry="(every op fp64)", **ref, **frac(ref)))
        for what, table, grid, fixed_m in (("tiles", tile_rows, tile_list, None), ("steps", step_rows, bns, bm)):
            for t in grid:
                tbm, tbn = t if fixed_m is None else (fixed_m, t)  # type: ignore[misc]
                d = dev(kk[what][t], var)
                table.append(
                    dict(
                        plan=p.name,
                        block_m=tbm,
                        block_n=tbn,
                        steps=-(-seq_k // tbn),
                        **d,
                        ratio_max=_ratio(d["max_abs"], base["max_abs"]),
                    )
                )
        bp = pairs[p.name]
        for kernel, kplan, d, key in (("flash", p.name, full, kk["main"]), ("baseline", bp.name, base, kk["base"])):
            is_flash = kernel == "flash"
            lit = literature(run.out(key), golden)
            fvb_rows.append(
                dict(
                    plan=p.name,
                    kernel=kernel,
                    kernel_plan=kplan,
                    block_m=bm if is_flash else None,
                    block_n=bn if is_flash else None,
                    **d,
                    ratio_max=_ratio(d["max_abs"], base["max_abs"]),
                    ratio_rms=_ratio(d["rms"], base["rms"]),
                    **lit,
                )
            )
        if var is not None:
            given = run.out(run.golden[None])
            fmt, n_changed = rounding[p.name]
            for source, out in (
                ("input rounding", golden),
                ("kernel", None),
                ("total", run.out(kk["main"])),
                ("baseline total", run.out(kk["base"])),
            ):
                d = full if out is None else deviation(out, given)
                inp_rows.append(dict(plan=p.name, source=source, input_format=fmt, values_rounded=n_changed, **d))
        tr = run.jobs[kk["traced"]].get("tracer") if kk["traced"] is not None else None
        if tr is not None:
            blocks.append(_long(tr.by_block, "op", p.name, ("max_abs", "rms", "rel_max")))
            states.append(_long(tr.state_by_block, "state", p.name, ("max_abs", "rms", "rel_max")))

    def frame(rows: list[dict[str, Any]], cols: Sequence[str]) -> Any:
        return pd.DataFrame(rows, columns=list(cols))

    bound_table = None
    if bounds:
        from simfloat.bounds import attribution_bounds

        parts = []
        for var in dict.fromkeys(keys[p.name]["variant"] for p in plans):
            bruns = []
            for p in plans:
                kk = keys[p.name]
                if kk["variant"] != var:
                    continue
                bruns += [(p.name, op, "flash", isolation_plan(p, op), run.out(kk["iso"][op])) for op in ops]
                bruns += [
                    (p.name, "all", "flash", p, run.out(kk["main"])),
                    (p.name, "all", "baseline", pairs[p.name], run.out(kk["base"])),
                ]
            qv, kv_, vv = run.inputs[var]
            gold = run.out(run.golden[var])
            parts.append(
                attribution_bounds(qv, kv_, vv, bruns, gold, block_m=bm, block_n=bn, causal=bool(causal), scale=scale)
            )
        bound_table = pd.concat(parts, ignore_index=True)
    m = list(METRICS)
    geo = ["plan", "block_m", "block_n", "steps"]
    n_rows = seq_q if sel is None else len(sel)
    golden0 = run.out(run.golden[None])
    meta = dict(
        shape_q=tuple(q.shape),
        shape_k=tuple(k.shape),
        shape_v=tuple(v.shape),
        seq_q=seq_q,
        seq_k=seq_k,
        rows=n_rows,
        row_indices=None if sel is None else sel.tolist(),
        block_m=bm,
        block_n=bn,
        trace_rows=len(t_sel) if trace else 0,
        causal=bool(causal),
        scale=scale,
        plans=[p.name for p in plans],
        baselines={a: b.name for a, b in pairs.items()},
        runs=len(run.jobs),
        kernel_seconds=sum(j["seconds"] for j in run.jobs.values()),
        golden_rms=float(np.sqrt(np.mean(np.square(golden0)))) if golden0.size else math.nan,
        layout=layout,
        call=None if rec is None else rec.meta(),
        input_rounding={a: f for a, (f, _) in rounding.items()},
        estimate_s=None if est is None else est.seconds,
        **{"pass": "forward"},
    )
    return Attribution(
        isolation=frame(iso_rows, ["plan", "op", "entry", *m, "frac_max", "frac_rms"]),
        ablation=frame(abl_rows, ["plan", "op", "entry", *m, "frac_max", "frac_rms"]),
        tiles=frame(tile_rows, [*geo, *m, "ratio_max"]),
        steps=frame(step_rows, [*geo, *m, "ratio_max"]),
        flash_vs_baseline=frame(
            fvb_rows,
            ["plan", "kernel", "kernel_plan", "block_m", "block_n", *m, "ratio_max", "ratio_rms", *LITERATURE],
        ),
        by_block=pd.concat(blocks, ignore_index=True)
        if blocks
        else frame([], ["plan", "kv_block", "op", "max_abs", "rms", "rel_max"]),
        state_by_block=pd.concat(states, ignore_index=True)
        if states
        else frame([], ["plan", "kv_block", "state", "max_abs", "rms", "rel_max"]),
        meta=meta,
        bounds=bound_table,
        input_rounding=frame(inp_rows, ["plan", "source", "input_format", "values_rounded", *m]),
    )


def _workers(workers: int | None) -> int:
    if workers is None:
        import numba

        return numba.get_num_threads()
    return _positive_int(workers, "workers")


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
