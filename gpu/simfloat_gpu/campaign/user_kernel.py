"""A flash-attention kernel of one's own against the emulator under a plan, config by config, bit for bit
(:func:`compare_kernel`).

Imports only numpy and the standard library at import time: torch, triton and simfloat are loaded where used.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from simfloat_gpu.campaign.compare import compare_to_emulator, error_stats, error_status, new_record
from simfloat_gpu.campaign.grid import FORMATS, Config, dedupe, grid, make_inputs, reference64
from simfloat_gpu.campaign.kinds import PLAN_FAMILIES
from simfloat_gpu.campaign.records import ValidationRecord
from simfloat_gpu.campaign.report import KERNEL_COLUMNS, cell
from simfloat_gpu.campaign.running import kernel_session, resolve_backend

__all__ = ["KernelComparison", "compare_kernel"]


@dataclasses.dataclass
class KernelComparison:
    """What :func:`compare_kernel` found: one record per config."""

    plan: str
    backend: str
    rows: list[ValidationRecord]

    def summary(self) -> dict[str, Any]:
        """Configs compared, and the min and mean bitwise agreement of the output, m_i and l_i over them."""
        done = [r for r in self.rows if r.status == "ok"]
        out: dict[str, Any] = {"configs": len(self.rows), "compared": len(done)}
        for name, field in (("out", "bitwise_agreement"), ("m", "m_agreement"), ("l", "l_agreement")):
            vals = [v for r in done if (v := getattr(r, field)) is not None]
            out[f"{name}_min"] = min(vals) if vals else None
            out[f"{name}_mean"] = float(np.mean(vals)) if vals else None
        return out

    def table(self) -> str:
        """The agreement table: one line per config, then the summary."""
        lines = [" | ".join(KERNEL_COLUMNS)]
        lines += [" | ".join(r.table_cell(c) for c in KERNEL_COLUMNS) for r in self.rows]
        s = self.summary()
        parts = [
            f"{n} min {s[n + '_min']:.6g} mean {s[n + '_mean']:.6g}"
            for n in ("out", "m", "l")
            if s[n + "_min"] is not None
        ]
        lines.append(
            f"{s['compared']} of {s['configs']} configs compared against plan {self.plan} "
            f"({self.backend}): " + "; ".join(parts)
        )
        return "\n".join(lines)


def _out_kind(fmt: str, out_fmt: str) -> str:
    if out_fmt == "float32":
        return "fp32"
    if out_fmt == {"bf16": "bfloat16", "fp16": "float16"}[fmt]:
        return "low"
    raise ValueError(
        f"compare_kernel compares outputs in float32 or the input format; the plan's output "
        f"format is {out_fmt} for {fmt} inputs"
    )


def compare_kernel(
    kernel: Callable[..., Any],
    plan: Any,
    configs: str | Sequence[Config] = "ci",
    *,
    backend: str = "auto",
    faithful_options: dict[str, Any] | None = None,
    log: Callable[[str], None] = print,
) -> KernelComparison:
    """Run a flash-attention kernel of one's own and the emulator under ``plan`` on each config, bit for bit.

    The kernel is called as ``kernel(q, k, v, causal=..., block_m=..., block_n=...)`` with torch tensors of
    shape (batch, heads, seq, head_dim) in the config's format (bf16 / fp16), on the GPU (backend ``gpu``) or
    the CPU, under :func:`simfloat_gpu.interpreter.faithful` (backend ``faithful``); it must use the softmax scale
    1/sqrt(head_dim) and return the output, or ``(out, m, l)`` with the row statistics ((batch, heads, seq),
    in the plan's units: log2 units with ``plan.exp2``) as the emulator's ``return_stats`` gives them. The
    emulator runs ``simfloat.attention.flash(q, k, v, plan=plan, block_m, block_n, causal)``; outputs are
    compared in the plan's output format (float32 or the input format), m and l in float32.

    Args:
        kernel: the kernel's launcher, as above.
        plan: a :class:`simfloat.attention.Plan` or preset name.
        configs: a grid name of :func:`grid` or :class:`Config` objects; int8 configs are left out, and so
            are flash configs of another input format than the plan's (by its name, ``<family>-<fmt>``).
            Each config's ``out`` is set by the plan's output format.
        backend: ``"auto"`` (the GPU if torch sees one), ``"gpu"`` or ``"faithful"``.
        faithful_options: keyword arguments of :func:`simfloat_gpu.interpreter.faithful` (backend ``faithful``).
        log: called with one line per config.

    Returns:
        A :class:`KernelComparison` (``rows``, ``summary()``, ``table()``).

    Raises:
        ValueError: no config left (configs whose input format is not the plan's, or whose output format would
            be neither float32 nor the input format, are left out), or a bad backend.
        RuntimeError: the backend cannot run (see :func:`resolve_backend`).
    """
    import simfloat.attention as A

    pl = A.plan(plan)
    backend = resolve_backend(backend)
    cfgs = grid(configs, int8=False) if isinstance(configs, str) else list(configs)
    family, _, pfmt = pl.name.rstrip("*").partition("@")[0].partition("-")
    chosen = []
    for c in cfgs:
        if c.kind != "flash" or (family in PLAN_FAMILIES and pfmt in FORMATS and c.fmt != pfmt):
            continue
        try:
            chosen.append(dataclasses.replace(c, out=_out_kind(c.fmt, pl.out.fmt.name)))
        except ValueError:  # an output format the kernel could not have for these inputs
            continue
    chosen = dedupe(chosen)
    if not chosen:
        raise ValueError(
            f"compare_kernel: no flash config of plan {pl.name}'s input format among the configs "
            f"(its output format, {pl.out.fmt.name}, must be float32 or the input format)"
        )
    rows = []
    for cfg in chosen:
        rec = new_record(cfg, backend, plan=pl.name)
        try:
            q, k, v = make_inputs(cfg)
            ref = reference64(q, k, v, cfg.causal)
            t0 = time.perf_counter()
            kern = _run_user_kernel(kernel, cfg, q, k, v, backend, faithful_options or {})
            kernel_s = round(time.perf_counter() - t0, 3)
            err_max, err_rms = error_stats(kern["out"], ref)
            rec = dataclasses.replace(rec, kernel_s=kernel_s, kernel_err_max=err_max, kernel_err_rms=err_rms)
            rec = compare_to_emulator(rec, cfg, (q, k, v), ref, kern, plan=pl)
        except Exception as exc:  # one failing config must not lose the others
            rec = dataclasses.replace(rec, status=error_status(exc))
        rows.append(rec)
        log(
            f"{rec.id}: {rec.status} out {cell(rec.bitwise_agreement)} m {cell(rec.m_agreement)} "
            f"l {cell(rec.l_agreement)}"
        )
    return KernelComparison(pl.name, backend, rows)


def _run_user_kernel(
    kernel: Callable[..., Any],
    cfg: Config,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    backend: str,
    options: dict[str, Any],
) -> dict[str, np.ndarray]:
    with kernel_session(backend, cfg.fmt, q, k, v, faithful_options=options) as (_, (tq, tk, tv)):
        res = kernel(tq, tk, tv, causal=cfg.causal, block_m=cfg.block_m, block_n=cfg.block_n)
    parts = res if isinstance(res, tuple) else (res,)
    if len(parts) not in (1, 3):
        raise ValueError(f"the kernel returned {len(parts)} values; expected out or (out, m, l)")
    out = {key: t.float().cpu().numpy() for key, t in zip(("out", "m", "l"), parts, strict=False)}
    if out["out"].shape != q.shape[:-1] + (v.shape[-1],):
        raise ValueError(f"the kernel's output has shape {out['out'].shape}, expected {q.shape}")
    return out
