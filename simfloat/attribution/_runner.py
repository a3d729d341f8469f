"""The runs of :func:`simfloat.attribution.attribute`: collected, deduplicated by what determines the output,
then made once each (concurrently, interruptible)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from simfloat._interrupt import run_jobs
from simfloat.attention import Plan
from simfloat.attention import baseline as _baseline_kernel
from simfloat.attention import flash as _flash_kernel
from simfloat.attention import plan as _plan
from simfloat.attribution._deviation import deviation
from simfloat.attribution._estimate import Estimate, estimate_runs
from simfloat.attribution._extras import need
from simfloat.attribution._plans import (
    cache_key,
)
from simfloat.trace import Tracer


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


class Runner:
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
    """(report(done, total), close) for :meth:`Runner.run`."""
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
