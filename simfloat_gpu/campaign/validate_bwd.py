"""Cross-validation of the backward pass: the Triton backward kernels (simfloat_gpu/kernels/flash_attention_bwd.py)
against the
emulator's ``triton-<fmt>`` backward plan (simfloat.attention.flash_backward), bit for bit on dQ, dK, dV and delta.

For every config (format, BLOCK_M, BLOCK_N, seq, head dim, causal, and ``out``: the forward's output stored in
the input format, "low", or in fp32, "fp32", the "delta from fp32 O" option), the forward kernel gives o, m, l;
the backward kernels give dq, dk, dv, delta and lse; the emulator gets the same q, k, v, o, dO and the lse of
:func:`simfloat.attention.lse_from_stats` (checked equal to the kernel's) and must reproduce every gradient bit.
A float64 torch autograd of the same inputs gives each side's max relative error. Grids reuse
:mod:`simfloat_gpu.campaign.validate`'s dimensions: "full" (a cost-weighted all-pairs covering array), "ci" (every
value of every
dimension), "smoke" (two tiny configs). Runs under the faithful interpreter on a CPU, or on a GPU (then the
emulator comparison measures how close the plan is to the hardware).

    python -m simfloat_gpu.campaign.validate --pass backward --out DIR [--grid ci]      # or
    simfloat_gpu.campaign.validate_bwd.run_backward(...)
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from simfloat_gpu.campaign import validate as fwd
from simfloat_gpu.campaign.records import BackwardRecord

__all__ = ["BWD_FIELDS", "BackwardRecord", "backward_grid", "run_backward", "validate_backward_config"]

#: the columns of backward.csv: the fields of :class:`BackwardRecord`
BWD_FIELDS = BackwardRecord.csv_fields()


def backward_grid(name: str = "ci") -> list[fwd.Config]:
    """The backward grid ("full", "ci" or "smoke"; see the module docstring)."""
    dims = (fwd.FORMATS, fwd.BLOCKS, fwd.BLOCKS, fwd.SEQS, fwd.HEAD_DIMS, fwd.CAUSAL, fwd.OUTS)
    if name == "full":
        return fwd._dedupe(fwd._all_pairs(dims, fwd._flash))
    if name == "ci":
        return fwd._dedupe(fwd._all_values(dims, fwd._flash))
    if name == "smoke":
        return [fwd._flash("bf16", 16, 32, 40, 16, True, "low"), fwd._flash("fp16", 32, 16, 33, 16, False, "fp32")]
    raise ValueError(f"unknown grid {name!r}; known: full, ci, smoke")


def _grads64(q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray, causal: bool) -> list[np.ndarray]:
    import torch

    qq, kk, vv = (torch.tensor(np.asarray(x, dtype=np.float64), requires_grad=True) for x in (q, k, v))
    s = (qq @ kk.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
    (torch.softmax(s, -1) @ vv).backward(torch.tensor(np.asarray(do, dtype=np.float64)))
    return [t.grad.numpy() for t in (qq, kk, vv)]


def _rel(x: np.ndarray, ref: np.ndarray) -> float:
    scale = float(np.abs(ref).max()) or 1.0
    return float(np.abs(np.asarray(x, dtype=np.float64) - ref).max() / scale)


def validate_backward_config(cfg: fwd.Config, backend: str, *, emulate: bool = True) -> BackwardRecord:
    """One config: kernels (forward, then backward), the emulator, the float64 gradients; one record."""
    import torch

    from simfloat_gpu.kernels.flash_attention import flash_attention
    from simfloat_gpu.kernels.flash_attention_bwd import flash_attention_backward

    row = BackwardRecord(
        id="bwd-" + cfg.id,
        fmt=cfg.fmt,
        seq=cfg.seq,
        head_dim=cfg.head_dim,
        heads=cfg.heads,
        block_m=cfg.block_m,
        block_n=cfg.block_n,
        causal=cfg.causal,
        out=cfg.out,
        backend=backend,
    )
    q, k, v = fwd.make_inputs(cfg)
    do = fwd.round_to_format(np.random.default_rng(cfg.seed + 1).standard_normal(cfg.shape).astype(np.float32), cfg.fmt)
    device = "cuda" if backend == "gpu" else "cpu"
    dt = fwd._torch_dtype(cfg.fmt)
    tq, tk, tv, tdo = (torch.from_numpy(np.ascontiguousarray(x)).to(dt).to(device) for x in (q, k, v, do))
    ctx: Any = contextlib.nullcontext()
    if backend == "faithful":
        from simfloat_gpu.interpreter import faithful

        ctx = faithful()
    t0 = time.perf_counter()
    try:
        with ctx:
            o, m, l = flash_attention(  # noqa: E741
                tq,
                tk,
                tv,
                causal=cfg.causal,
                block_m=cfg.block_m,
                block_n=cfg.block_n,
                return_stats=True,
                out_dtype=torch.float32 if cfg.out == "fp32" else dt,
            )
            dq, dk, dv, delta, lse = flash_attention_backward(
                tq, tk, tv, o, tdo, m, l, causal=cfg.causal, block_m=cfg.block_m, block_n=cfg.block_n, return_stats=True
            )
        if backend == "gpu":
            torch.cuda.synchronize()
    except Exception as err:  # one broken config must not stop the campaign; the row says why
        return dataclasses.replace(row, status=f"kernel error: {type(err).__name__}: {err}"[:300])
    row = dataclasses.replace(row, kernel_s=round(time.perf_counter() - t0, 2))
    host = [t.float().cpu().numpy().astype(np.float64) for t in (o, m, l, dq, dk, dv, delta, lse)]
    on, mn, ln, dqn, dkn, dvn, deltan, lsen = host
    want = _grads64(q, k, v, do, cfg.causal)
    row = dataclasses.replace(row, dq_err=_rel(dqn, want[0]), dk_err=_rel(dkn, want[1]), dv_err=_rel(dvn, want[2]))
    if not emulate:
        return dataclasses.replace(row, status="kernel only")
    from simfloat.attention import flash_backward, lse_from_stats

    plan = f"triton-{cfg.fmt}"
    t0 = time.perf_counter()
    try:
        lse_e = lse_from_stats(mn, ln, plan=plan)
        got = flash_backward(
            *(np.asarray(x, dtype=np.float64) for x in (q, k, v)),
            on,
            np.asarray(do, dtype=np.float64),
            lse_e,
            plan=plan,
            block_m=cfg.block_m,
            block_n=cfg.block_n,
            causal=cfg.causal,
            return_delta=True,
        )
    except Exception as err:  # the row records it
        return dataclasses.replace(row, status=f"emulator error: {type(err).__name__}: {err}"[:300])
    emulator_s = round(time.perf_counter() - t0, 2)
    lse_equal = bool(np.array_equal(lse_e, lsen))
    agree = {
        f"{name}_agreement": round(float(np.mean(g == w)), 6)
        for name, g, w in zip(("dq", "dk", "dv", "delta"), got, (dqn, dkn, dvn, deltan), strict=True)
    }
    ok = lse_equal and all(a == 1.0 for a in agree.values())
    return dataclasses.replace(
        row,
        status="bitwise" if ok else "differs",
        emulator_s=emulator_s,
        lse_equal=lse_equal,
        emulator_dq_err=_rel(got[0], want[0]),
        emulator_dk_err=_rel(got[1], want[1]),
        emulator_dv_err=_rel(got[2], want[2]),
        **agree,
    )


def run_backward(
    out_dir: Path,
    grid_name: str = "ci",
    backend: str = "auto",
    *,
    emulate: bool = True,
    deadline: float | None = None,
    log: Callable[[str], None] = print,
) -> list[BackwardRecord]:
    """Run a backward grid; writes ``out_dir/backward.csv`` and ``backward.md``; returns the rows. Configs not
    started before ``deadline`` (a time.monotonic() value) are left out (the report says how many)."""
    backend = fwd.resolve_backend(backend)
    configs = backward_grid(grid_name)
    rows: list[BackwardRecord] = []
    start = time.monotonic()
    for i, cfg in enumerate(configs):
        if deadline is not None and time.monotonic() > deadline:
            break
        row = validate_backward_config(cfg, backend, emulate=emulate)
        rows.append(row)
        secs = f"{fwd._cell(row.kernel_s)} s + {fwd._cell(row.emulator_s)} s"
        log(f"[{i + 1}/{len(configs)}] {row.id}: {row.status} ({secs})")
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "backward.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=BWD_FIELDS)
        w.writeheader()
        w.writerows(r.to_csv_row() for r in rows)
    _write_md(out_dir / "backward.md", rows, len(configs), grid_name, backend, time.monotonic() - start)
    return rows


def _write_md(
    path: Path, rows: Sequence[BackwardRecord], n_configs: int, grid_name: str, backend: str, elapsed: float
) -> None:
    cols = (
        "id",
        "status",
        "lse_equal",
        "dq_agreement",
        "dk_agreement",
        "dv_agreement",
        "delta_agreement",
        "dq_err",
        "emulator_dq_err",
    )
    n_bit = sum(r.status == "bitwise" for r in rows)
    lines = [
        f"# Backward kernels ({backend}) vs simfloat flash_backward, {grid_name} grid",
        "",
        f"{n_bit}/{len(rows)} configs bitwise identical (dQ, dK, dV, delta, lse); {n_configs - len(rows)} "
        f"not run; {elapsed:.1f} s.",
        "",
        "| " + " | ".join(cols) + " |",
        "|" + "---|" * len(cols),
    ]
    for r in rows:
        lines.append("| " + " | ".join(_md_cell(getattr(r, c)) for c in cols) + " |")
    path.write_text("\n".join(lines) + "\n")


def _md_cell(value: Any) -> str:
    if value is None:
        return ""
    return f"{value:.3g}" if isinstance(value, float) else str(value)
