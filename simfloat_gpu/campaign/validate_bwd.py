"""Cross-validation of the backward pass: the Triton backward kernels (simfloat_gpu/kernels/flash_attention_bwd.py)
against the
emulator's ``triton-<fmt>`` backward plan (simfloat.attention.flash_backward), bit for bit on dQ, dK, dV and delta.

For every config (format, BLOCK_M, BLOCK_N, seq, head dim, causal, and ``out``: the forward's output stored in
the input format, "low", or in fp32, "fp32", the "delta from fp32 O" option; ``kv_heads``: grouped-query and
multi-query configs, k and v with fewer heads than q; fp32 inputs with a dot ``precision``, "tf32" against the
``triton-tf32`` plan or "ieee" against ``triton-fp32``), the forward kernel gives o, m, l;
the backward kernels give dq, dk, dv, delta and lse; the emulator gets the same q, k, v, o, dO and the lse of
:func:`simfloat.attention.lse_from_stats` (checked equal to the kernel's) and must reproduce every gradient bit.
A float64 torch autograd of the same inputs gives each side's max relative error. Grids reuse
:mod:`simfloat_gpu.campaign.validate`'s dimensions: "full" (a cost-weighted all-pairs covering array), "ci" (every
value of every dimension), "smoke" (three tiny configs, one multi-query); "full" and "ci" add grouped-query and
multi-query configs (:data:`GROUPS`) and fp32 configs of both precisions. Runs under the faithful interpreter
on a CPU, or on a GPU (then the emulator comparison measures how close the plan is to the hardware).

    python -m simfloat_gpu.campaign.validate --pass backward --out DIR [--grid ci]      # or
    simfloat_gpu.campaign.validate_bwd.run_backward(...)
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import itertools
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from simfloat_gpu.campaign import validate as fwd
from simfloat_gpu.campaign.records import BackwardRecord

__all__ = [
    "BWD_FIELDS",
    "GROUPS",
    "BackwardRecord",
    "backward_grid",
    "emulator_plan",
    "run_backward",
    "validate_backward_config",
]

#: the columns of backward.csv: the fields of :class:`BackwardRecord`
BWD_FIELDS = BackwardRecord.csv_fields()


#: (heads, kv_heads) of the grouped-query (GQA) and multi-query (MQA) configs
GROUPS = ((4, 2), (4, 1))


def _gqa(fmt: str, bm: int, bn: int, seq: int, causal: bool, out: str, heads: int, kv_heads: int) -> fwd.Config:
    return fwd.Config("flash", fmt, seq, 32, bm, bn, causal, out, heads=heads, kv_heads=kv_heads)


def _fp32(precision: str, bm: int, bn: int, seq: int, d: int, causal: bool) -> fwd.Config:
    return fwd.Config("flash", "fp32", seq, d, bm, bn, causal, "fp32", heads=2, precision=precision)


def _extra(name: str) -> list[fwd.Config]:
    """The grouped-query and fp32 configs of a grid (head_dim 32 and short sequences: the interpreter's cost
    grows with heads, and fp32 "ieee" dots are FMA loops)."""
    if name == "ci":
        gqa = [_gqa("bf16", 32, 16, 97, False, "low", 4, 2), _gqa("fp16", 16, 32, 64, True, "fp32", 4, 1)]
        f32 = [_fp32("tf32", 32, 16, 97, 32, True), _fp32("ieee", 16, 32, 64, 16, False)]
        return gqa + f32
    tiles = ((16, 32, 97, "low"), (32, 16, 64, "fp32"), (64, 32, 97, "fp32"), (32, 64, 64, "low"))  # bm bn seq out
    gqa = [
        _gqa(fmt, *tiles[i % len(tiles)][:3], causal, tiles[i % len(tiles)][3], h, hk)
        for i, (fmt, (h, hk), causal) in enumerate(itertools.product(fwd.FORMATS, GROUPS, fwd.CAUSAL))
    ]
    f32 = [
        _fp32(prec, bm, bn, seq, d, causal)
        for prec in fwd.PRECISIONS
        for bm, bn, seq, d, causal in ((16, 32, 97, 16, True), (32, 16, 64, 32, False), (64, 64, 97, 16, False))
    ]
    return gqa + f32


def backward_grid(name: str = "ci") -> list[fwd.Config]:
    """The backward grid ("full", "ci" or "smoke"; see the module docstring)."""
    dims = (fwd.FORMATS, fwd.BLOCKS, fwd.BLOCKS, fwd.SEQS, fwd.HEAD_DIMS, fwd.CAUSAL, fwd.OUTS)
    if name == "full":
        return fwd._dedupe(fwd._all_pairs(dims, fwd._flash) + _extra(name))
    if name == "ci":
        return fwd._dedupe(fwd._all_values(dims, fwd._flash) + _extra(name))
    if name == "smoke":
        return [
            fwd._flash("bf16", 16, 32, 40, 16, True, "low"),
            fwd._flash("fp16", 32, 16, 33, 16, False, "fp32"),
            fwd.Config("flash", "bf16", 33, 16, 16, 16, True, "low", heads=2, kv_heads=1),
        ]
    raise ValueError(f"unknown grid {name!r}; known: full, ci, smoke")


def emulator_plan(cfg: fwd.Config) -> str:
    """The backward plan a config's kernels are compared with: ``triton-<fmt>``; fp32 inputs: ``triton-tf32``
    (tf32 tensor cores) or ``triton-fp32`` ("ieee" FMA loops) by the config's precision."""
    if cfg.fmt == "fp32":
        return "triton-tf32" if cfg.precision == "tf32" else "triton-fp32"
    return f"triton-{cfg.fmt}"


def _grads64(q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray, causal: bool) -> list[np.ndarray]:
    """float64 autograd; k and v with fewer heads are repeated per query head (their gradients summed)."""
    import torch

    qq, kk, vv = (torch.tensor(np.asarray(x, dtype=np.float64), requires_grad=True) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    kr, vr = kk.repeat_interleave(group, dim=1), vv.repeat_interleave(group, dim=1)
    s = (qq @ kr.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
    (torch.softmax(s, -1) @ vr).backward(torch.tensor(np.asarray(do, dtype=np.float64)))
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
        kv_heads=cfg.kv_heads or cfg.heads,
        precision=cfg.precision,
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
    precision = cfg.precision or None
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
                input_precision=precision,
            )
            dq, dk, dv, delta, lse = flash_attention_backward(
                tq,
                tk,
                tv,
                o,
                tdo,
                m,
                l,
                causal=cfg.causal,
                block_m=cfg.block_m,
                block_n=cfg.block_n,
                input_precision=precision,
                return_stats=True,
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

    plan = emulator_plan(cfg)
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
