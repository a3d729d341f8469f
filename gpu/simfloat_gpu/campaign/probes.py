"""Hardware fingerprint probes: small Triton kernels whose outputs pin down what the GPU computes.

Each probe is a kernel plus a host driver returning a dict of compact numpy arrays (inputs where they cannot
be regenerated, outputs, design metadata); :mod:`simfloat_gpu.campaign.gpu_run` runs them on the device and
:mod:`simfloat_gpu.campaign.fit`
analyses them on a CPU.

1. **dot** (:func:`dot_variant`): ``C = tl.dot(A, B, C0)`` for bf16, fp16, tf32 (fp32 operands,
   ``input_precision="tf32"``), fp8 e4m3 and e5m2, at the tile shapes the flash kernels use (BLOCK_M 16..128 x
   N x K 16..128; BLOCK_M >= 64 compiles to wgmma on sm_90, smaller tiles to mma.sync). Each row of A is a
   designed test vector (one big product and tiny ones at chosen positions, cancelling pairs, sums that need
   more than 24 bits, random and wide-range rows, tf32 conversion patterns, subnormals; bf16 and tf32, whose
   products can leave fp32's range at both ends: sums beyond it (``overflow``) and one negative product below
   fp32's smallest step (``negtiny``), which ask ``BlockFMA.overflow`` and ``BlockFMA.zero_sign``); the columns
   of B multiply it by 1, -1, 1/8, 3, 1 + ulp, 2^-20 (bf16/tf32, column 6) and random values; C0 is zero
   (launch 0) or a designed accumulator (launch 1: re-entry). Stored: A and the first 16 columns of B, C0 and
   C, as raw bits.
2. **exp** (:func:`exp_probe`): tl.math.exp2 and tl.exp of float32 inputs: every 8th bit pattern of [-32,
   -2^-30] (36.7M inputs), every float32 of [1, 2) and of [-2, -1) (2^23 each), tl.exp every 64th of [-64,
   -2^-30], and edge inputs (zeros, subnormals, the flush range, infinities, NaN, large positives). The inputs
   are implicit (bit-pattern ranges); a result is stored as its int8 distance in ulps from the correctly
   rounded value (computed on the device in float64), except where the float64 value lies within 2^-20 ulp of
   a rounding boundary (``amb``) or the distance does not fit int8 (``clip``): there the raw result bits are
   stored.
3. **isa** (:func:`isa_probe`): PTX and SASS of the flash kernel (bf16, BLOCK 64 and 32), the fp16 16 x 16
   tile and the int8 kernel, and facts read from them (is ``qk*scale - m`` an FFMA feeding the exp2, which
   exp2 and division instructions, wgmma vs mma shapes, shuffle counts). Real launches on a GPU (the exact
   specialization, read back from a fresh TRITON_CACHE_DIR); a cross-compile for sm_90 without one.
4. **sum** (:func:`sum_variant`): the reduction tree of ``tl.sum(p, 1)`` over a BLOCK_M x BLOCK_N fp32 tile in
   the layout of the flash kernel's P (p = tl.dot(x_bf16, identity): the accumulator layout of
   ``tl.dot(q, k)``), and of a plain loaded tile, FPRev-style: row r holds +M at i, -M at j and ones elsewhere
   (M = 2^40), so the sum is the number of ones outside the smallest subtree holding i and j; every pair
   (i, j), twice, at different rows.

Without a GPU the drivers run under the faithful interpreter (``TRITON_INTERPRET=1`` set before triton is
imported), which is how ``gpu_run --cpu-smoke`` and the tests exercise them; ``simfloat_gpu.campaign.fit`` then
recovers the
interpreter's own models.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "DOT_VARIANTS",
    "DOT_SMOKE_VARIANTS",
    "SUM_VARIANTS",
    "SUM_SMOKE_VARIANTS",
    "DOT_PARAMS",
    "dot_designs",
    "dot_b_columns",
    "dot_c0",
    "dot_inputs",
    "dot_record",
    "dot_variant",
    "sum_design",
    "sum_variant",
    "exp_segments",
    "exp_probe",
    "isa_probe",
    "isa_facts",
    "KEEP_COLS",
    "SUM_M",
    "RANGE_FORMATS",
    "TINY_COL",
    "TINY_B",
]

#: (dtype, BLOCK_M, N, K): the shapes of tl.dot(q, k) (BLOCK_M x BLOCK_N x HEAD_DIM) and tl.dot(p, v)
#: (BLOCK_M x HEAD_DIM x BLOCK_N) in the flash kernels.
DOT_VARIANTS = (
    ("bf16", 64, 64, 64),
    ("bf16", 128, 64, 64),
    ("bf16", 64, 128, 128),
    ("bf16", 128, 128, 128),
    ("bf16", 16, 16, 16),
    ("bf16", 16, 64, 64),
    ("bf16", 32, 32, 128),
    ("bf16", 64, 16, 16),
    ("fp16", 64, 64, 64),
    ("fp16", 16, 16, 64),
    ("fp16", 128, 128, 128),
    ("tf32", 64, 64, 64),
    ("tf32", 16, 16, 16),
    ("e4m3", 64, 64, 64),
    ("e4m3", 64, 64, 128),
    ("e4m3", 16, 32, 32),
    ("e5m2", 64, 64, 64),
)
DOT_SMOKE_VARIANTS = (("bf16", 16, 16, 32), ("tf32", 16, 16, 16), ("e4m3", 16, 16, 32))
#: (BLOCK_M, BLOCK_N) of the sum probe
SUM_VARIANTS = ((64, 64), (32, 32), (16, 16), (128, 128), (128, 64), (64, 32), (32, 64), (64, 128))
SUM_SMOKE_VARIANTS = ((16, 16),)
#: columns of B / C kept in the records (the rest of B is random and not stored)
KEEP_COLS = 16
#: the big value of the sum probe: 1 + 2^40 == 2^40 in fp32
SUM_M = float(2**40)

#: per operand format: (exponent of the big product, relative exponents of the tiny products, lo, hi exponent
#: of the wide-range rows, exponent of the smallest subnormal)
DOT_PARAMS = {
    "bf16": (0, tuple(range(-20, -30, -1)), -30, 30, -133),
    "fp16": (4, tuple(range(-20, -29, -1)), -14, 14, -24),
    "tf32": (0, tuple(range(-20, -30, -1)), -30, 30, -149),
    "e4m3": (8, tuple(range(-8, -18, -1)), -6, 8, -9),
    "e5m2": (8, tuple(range(-8, -21, -1)), -14, 15, -16),
}
#: the operand formats whose products reach beyond fp32's range at both ends (the overflow / negtiny rows)
RANGE_FORMATS = ("bf16", "tf32")
#: the largest finite operand of those formats (tf32: fp32's exponent range, 10 fraction bits)
RANGE_MAX = {"bf16": (2 - 2.0**-7) * 2.0**127, "tf32": (2 - 2.0**-10) * 2.0**127}
#: the column of B that holds TINY_B for those formats: a product of a subnormal operand and TINY_B lies below
#: fp32's smallest step (2^-149)
TINY_COL = 6
TINY_B = 2.0**-20


# ----------------------------------------------------------------------------------------------------
# format helpers (numpy only)
# ----------------------------------------------------------------------------------------------------


def _round_fp(x: np.ndarray, mant: int, emin: int, emax_val: float) -> np.ndarray:
    """Round float64 values to nearest even into a binary format with ``mant`` fraction bits and minimum
    normal exponent ``emin`` (subnormals kept), saturating at ``emax_val``."""
    x = np.asarray(x, dtype=np.float64)
    e = np.floor(np.log2(np.maximum(np.abs(x), 2.0**emin)))
    e = np.maximum(e, emin)
    q = 2.0 ** (e - mant)
    r = np.round(x / q) * q  # np.round: half to even
    return np.clip(r, -emax_val, emax_val)


def to_format(x: np.ndarray, fmt: str) -> np.ndarray:
    """float64 values rounded (RNE) to fmt and returned as float64."""
    if fmt == "bf16":
        return _round_fp(x, 7, -126, 3.3895313892515355e38)
    if fmt == "fp16":
        return _round_fp(x, 10, -14, 65504.0)
    if fmt == "tf32":
        return np.asarray(x, dtype=np.float32).astype(np.float64)  # tf32 operands are fp32 in memory
    if fmt == "e4m3":
        return _round_fp(x, 3, -6, 448.0)
    if fmt == "e5m2":
        return _round_fp(x, 2, -14, 57344.0)
    raise ValueError(f"unknown format {fmt!r}")


def _torch_dtype(fmt: str) -> Any:
    import torch

    return {
        "bf16": torch.bfloat16,
        "fp16": torch.float16,
        "tf32": torch.float32,
        "e4m3": torch.float8_e4m3fn,
        "e5m2": torch.float8_e5m2,
    }[fmt]


def _bits(t: Any) -> np.ndarray:
    """Raw bits of a CPU torch tensor as a numpy unsigned array."""
    import torch

    size = t.element_size()
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[size]
    a = t.contiguous().view(view).numpy()
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[size])


# ----------------------------------------------------------------------------------------------------
# 1. dot
# ----------------------------------------------------------------------------------------------------


def dot_designs(fmt: str, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Designed rows of A for operand format ``fmt`` and length ``k``: (rows (R, k) float64 values of fmt,
    family index per row (R,), family names)."""
    big_e, rel, lo_e, hi_e, sub_e = DOT_PARAMS[fmt]
    rng = np.random.default_rng(seed + 1000 * k)
    big = 2.0**big_e
    fams: list[str] = []
    rows: list[np.ndarray] = []
    fam_of: list[int] = []

    def add(name: str, r: np.ndarray) -> None:
        if name not in fams:
            fams.append(name)
        rows.append(r)
        fam_of.append(fams.index(name))

    k0s = sorted({0, k - 1, k // 2 + 1 if k > 2 else 0})
    for f in rel:  # one big product and one tiny one: fraction bits kept below the largest exponent
        for k0 in k0s:
            for k1 in range(k):
                if k1 == k0:
                    continue
                r = np.zeros(k)
                r[k0] = big
                r[k1] = (1 if (k1 + f) % 2 else -1) * big * 2.0**f
                add("tiny1", r)
    for f in rel[::2] + (rel[-1] - 2,):  # one big product among tiny ones: block boundaries
        for k0 in range(k):
            r = np.full(k, big * 2.0**f)
            r[k0] = big
            add("tinyall", r)
    small = big * 2.0 ** (rel[len(rel) // 2])
    for k0 in sorted({0, k // 2 + 1 if k > 2 else 0}):  # a cancelling pair among small ones
        for k1 in range(k):
            if k1 == k0:
                continue
            r = np.full(k, small)
            r[k0], r[k1] = big, -big
            add("cancel", r)
    for _ in range(128):  # sums needing more bits than fp32 has: output rounding
        r = np.zeros(k)
        r[0] = big
        pos = rng.choice(np.arange(1, k), size=min(3, k - 1), replace=False)
        r[pos] = (
            rng.choice([-1.0, 1.0], size=pos.size) * big * 2.0 ** rng.integers(rel[0] - 4, rel[0] + 1, size=pos.size)
        )
        add("round", r)
    for _ in range(128):
        add("random", rng.standard_normal(k))
    for _ in range(128):
        add("wide", rng.choice([-1.0, 1.0], size=k) * 2.0 ** rng.uniform(lo_e, hi_e, size=k))
    for _ in range(32):  # subnormal operands
        r = np.zeros(k)
        pos = rng.choice(k, size=min(4, k), replace=False)
        r[pos] = rng.integers(1, 8, size=pos.size) * 2.0**sub_e * rng.choice([-1.0, 1.0], size=pos.size)
        add("subnormal", r)
    if fmt in RANGE_FORMATS:
        top = RANGE_MAX[fmt]
        for k0, k1 in sorted({(0, 1), (0, k - 1), (k // 2, k // 2 + 1)}):  # beyond fp32's range: one step, two
            r = np.zeros(k)
            r[k0], r[k1] = top, top * 0.75
            add("overflow", r)
            add("overflow", -r)
        for lo in (0, k // 2):
            r = np.zeros(k)
            r[lo:] = top * 2.0 ** -rng.integers(0, 3, size=k - lo)
            add("overflow", r * rng.choice([-1.0, 1.0]))
        tiny = (-(2.0**-131), -1.5 * 2.0**-131, -(2.0**-132), -(2.0**-133))  # subnormal in both formats
        for i in range(24):  # one negative product below fp32's smallest step in column TINY_COL (< 2^-150),
            r = np.zeros(k)  # in the last 4 k (the last step of any block size >= 4), or anywhere (then a -0.0
            j = k - 1 - i % 4 if i < 16 else int(rng.integers(0, k))  # accumulator meets zero products)
            r[j] = tiny[i % 4]
            if i % 8 == 1:  # and a smaller positive one: the exact sum still negative
                r[k - 1 - (i + 1) % 4] = 2.0**-133
            add("negtiny", r)
    if fmt == "tf32":  # fp32 operands between tf32 values: truncation or rounding on conversion
        ds = [0, 1, 2**12 - 1, 2**12, 2**12 + 1, 2**13 - 1, 3 * 2**12, 3 * 2**12 + 1, 2**11, 2**12 + 2**11]
        ds += list(rng.integers(0, 2**13, size=246))
        for i, d in enumerate(ds):
            r = np.zeros(k)
            r[i % k] = (1.0 + d * 2.0**-23) * (1 if i % 3 else -1)
            add("conv", r)
    a = np.array(rows)
    return to_format(a, fmt), np.array(fam_of, dtype=np.int16), fams


def dot_b_columns(fmt: str, k: int, n: int, seed: int = 0) -> np.ndarray:
    """B (k, n): columns 1, -1, 1/8, 3, 1 + ulp, then random normal (values of fmt); bf16 / tf32: column
    :data:`TINY_COL` is :data:`TINY_B`."""
    rng = np.random.default_rng(seed + 7 * k + n)
    b = to_format(rng.standard_normal((k, n)), fmt)
    ulp = {"bf16": 2.0**-7, "fp16": 2.0**-10, "tf32": 2.0**-10, "e4m3": 2.0**-3, "e5m2": 2.0**-2}[fmt]
    fixed = [1.0, -1.0, 0.125, 3.0, 1.0 + ulp]
    for j, val in enumerate(fixed[:n]):
        b[:, j] = val
    if fmt == "tf32" and n > 5:  # fp32 operand bits below tf32 on the B side too
        b[:, 5] = (1.0 + rng.integers(0, 2**13, size=k) * 2.0**-23).astype(np.float32)
    if fmt in RANGE_FORMATS and n > TINY_COL:  # products below fp32's smallest step (the negtiny rows)
        b[:, TINY_COL] = TINY_B
    return b


def dot_c0(m: int, n: int) -> np.ndarray:
    """The designed incoming accumulator of launch 1 (fp32 values)."""
    vals = np.array(
        [
            1.0,
            -1.0,
            1.0 + 2.0**-23,
            2.0**-30,
            2.0**20,
            0.75 + 2.0**-24,
            -3.0 - 2.0**-22,
            2.0**-10,
            1.0 - 2.0**-24,
            12345.678,
            -0.1,
            2.0**30,
        ],
        dtype=np.float32,
    )
    i = np.arange(m)[:, None]
    j = np.arange(n)[None, :]
    return vals[(i * 7 + j) % vals.size].astype(np.float32)


_KERNELS: dict[str, Any] = {}


def _dot_kernel() -> Any:
    if "dot" not in _KERNELS:
        import triton
        import triton.language as tl

        @triton.jit
        def _dot_probe(A, B, C0, C, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr):
            t = tl.program_id(0).to(tl.int64)
            om = tl.arange(0, BM)
            on = tl.arange(0, BN)
            ok = tl.arange(0, K)
            a = tl.load(A + t * BM * K + om[:, None] * K + ok[None, :])
            b = tl.load(B + t * K * BN + ok[:, None] * BN + on[None, :])
            c = tl.load(C0 + t * BM * BN + om[:, None] * BN + on[None, :])
            if PREC == "tf32":
                c = tl.dot(a, b, c, input_precision="tf32")
            else:
                c = tl.dot(a, b, c)
            tl.store(C + t * BM * BN + om[:, None] * BN + on[None, :], c)

        _KERNELS["dot"] = _dot_probe
    return _KERNELS["dot"]


def _ctx(device: str, faithful_kwargs: dict[str, Any] | None) -> Any:
    if device == "cuda":
        return contextlib.nullcontext()
    from simfloat_gpu.interpreter import faithful

    return faithful(**(faithful_kwargs or {}))


def _mma_instructions(compiled: Any) -> str:
    """The MMA instruction names in a compiled kernel's PTX ("" if unavailable)."""
    try:
        ptx = compiled.asm["ptx"]
    except Exception:
        return ""
    found = sorted(set(re.findall(r"\b(wgmma\.mma_async[\w.]*|mma\.sync[\w.]*)", ptx)))
    return " ".join(found)


def dot_inputs(fmt: str, bm: int, bn: int, k: int, *, max_rows: int | None = None) -> dict[str, Any]:
    """The operands of one dot variant, as :func:`dot_variant` launches them: ``a`` (T, bm, k) the designed
    rows (:func:`dot_designs`, zero-padded to whole tiles), ``b`` (T, k, bn) each tile's B
    (:func:`dot_b_columns`), ``c0`` (T, bm, bn) the designed accumulator, ``rows``, ``family``, ``families``
    (float64 values of ``fmt``; ``max_rows``: that many rows spread over the designs)."""
    rows, fam, fams = dot_designs(fmt, k)
    if max_rows is not None:
        sel = np.linspace(0, len(rows) - 1, min(max_rows, len(rows))).astype(int)
        rows, fam = rows[sel], fam[sel]
    r = len(rows)
    t = -(-r // bm)
    a = np.zeros((t * bm, k))
    a[:r] = rows
    b = np.stack([dot_b_columns(fmt, k, bn, seed=ti % 4) for ti in range(t)])
    c0 = np.broadcast_to(dot_c0(bm, bn), (t, bm, bn)).copy()
    return {"a": a.reshape(t, bm, k), "b": b, "c0": c0, "rows": r, "family": fam, "families": fams}


def dot_record(fmt: str, inputs: dict[str, Any], outs: np.ndarray, mma: str = "") -> dict[str, np.ndarray]:
    """A dot variant's stored arrays (see the module docstring) from :func:`dot_inputs` and the outputs ``outs``
    (2, T, bm, bn): launch 0 (zero accumulator) and launch 1 (``c0``)."""
    import torch

    dt = _torch_dtype(fmt)
    ta = torch.from_numpy(inputs["a"].astype(np.float32)).to(dt)
    tb = torch.from_numpy(inputs["b"].astype(np.float32)).to(dt)
    bm, bn = inputs["c0"].shape[1:]
    keep = min(KEEP_COLS, bn)
    return {
        "a_bits": _bits(ta),
        "b_bits": _bits(tb[:, :, :keep].contiguous()),
        "c0": inputs["c0"][:, :, :keep].astype(np.float32),
        "c": np.asarray(outs, dtype=np.float32)[..., :keep],
        "rows": np.array([inputs["rows"]]),
        "family": inputs["family"],
        "families": np.array(inputs["families"]),
        "shape": np.array([bm, bn, inputs["a"].shape[2]]),
        "mma": np.array([mma]),
    }


def dot_variant(
    fmt: str,
    bm: int,
    bn: int,
    k: int,
    *,
    device: str = "cuda",
    max_rows: int | None = None,
    faithful_kwargs: dict[str, Any] | None = None,
) -> dict[str, np.ndarray]:
    """Run the dot probe for one (format, BLOCK_M, N, K); arrays keyed without a prefix (see module doc)."""
    import torch

    inp = dot_inputs(fmt, bm, bn, k, max_rows=max_rows)
    a, b, c0 = inp["a"], inp["b"], inp["c0"]
    t = a.shape[0]
    dt = _torch_dtype(fmt)
    ta = torch.from_numpy(a.astype(np.float32)).to(dt)
    tb = torch.from_numpy(b.astype(np.float32)).to(dt)
    back_a = ta.float().numpy().astype(np.float64)
    if not np.array_equal(back_a, a):
        raise AssertionError(f"dot probe {fmt}: designed A values are not exact in the format")
    prec = "tf32" if fmt == "tf32" else "default"  # 16/8-bit operands: tl.dot's default
    kern = _dot_kernel()
    outs = []
    mma = ""
    with _ctx(device, faithful_kwargs):
        da, db = ta.to(device), tb.to(device)
        for launch, c_in in enumerate((np.zeros_like(c0), c0)):
            dc0 = torch.from_numpy(c_in.astype(np.float32)).to(device)
            dc = torch.empty_like(dc0)
            compiled = kern[(t,)](da, db, dc0, dc, K=k, BM=bm, BN=bn, PREC=prec, num_warps=4)
            if launch == 0 and device == "cuda":
                mma = _mma_instructions(compiled)
            outs.append(dc.cpu().numpy())
    if device == "cuda":
        torch.cuda.synchronize()
    return dot_record(fmt, inp, np.stack(outs), mma)


# ----------------------------------------------------------------------------------------------------
# 4. sum
# ----------------------------------------------------------------------------------------------------


def sum_design(n: int) -> tuple[np.ndarray, np.ndarray]:
    """FPRev rows for a length-n sum: (pairs (P, 2) int, rows (2P, n) float32); row r < P holds pair r, row
    P + r holds pair P - 1 - r (so every pair also sits at another row index)."""
    pairs = np.array([(i, j) for i in range(n) for j in range(i + 1, n)], dtype=np.int32).reshape(-1, 2)
    order = np.concatenate([np.arange(len(pairs)), np.arange(len(pairs))[::-1]])
    x = np.ones((order.size, n), dtype=np.float32)
    x[np.arange(order.size), pairs[order, 0]] = SUM_M
    x[np.arange(order.size), pairs[order, 1]] = -SUM_M
    return pairs, x


def _sum_kernel() -> Any:
    if "sum" not in _KERNELS:
        import triton
        import triton.language as tl

        @triton.jit
        def _sum_probe(A, EYE, X, YM, YB, BM: tl.constexpr, BN: tl.constexpr):
            t = tl.program_id(0).to(tl.int64)
            om = tl.arange(0, BM)
            on = tl.arange(0, BN)
            a = tl.load(A + t * BM * BN + om[:, None] * BN + on[None, :])
            eye = tl.load(EYE + on[:, None] * BN + on[None, :])
            # p = A @ I: exactly the designed values (one nonzero product per element), in the accumulator
            # layout of tl.dot(q, k) -- the layout the flash kernel's P and its row sum l_ij have
            p = tl.dot(a, eye)
            tl.store(YM + t * BM + om, tl.sum(p, 1))
            x = tl.load(X + t * BM * BN + om[:, None] * BN + on[None, :])
            tl.store(YB + t * BM + om, tl.sum(x, 1))

        _KERNELS["sum"] = _sum_probe
    return _KERNELS["sum"]


def sum_variant(
    bm: int, bn: int, *, device: str = "cuda", faithful_kwargs: dict[str, Any] | None = None
) -> dict[str, np.ndarray]:
    """Run the sum probe for one (BLOCK_M, BLOCK_N): outputs ``y_mma`` (a tile produced by tl.dot, in its
    accumulator layout) and ``y_blocked`` (a loaded fp32 tile), one per design row (:func:`sum_design`)."""
    import torch

    _, x = sum_design(bn)
    r = x.shape[0]
    t = -(-r // bm)
    xp = np.ones((t * bm, bn), dtype=np.float32)
    xp[:r] = x
    kern = _sum_kernel()
    with _ctx(device, faithful_kwargs):
        dx = torch.from_numpy(xp).to(device)
        da = dx.to(torch.bfloat16)  # 1 and +-2^40 are bf16 values
        eye = torch.eye(bn, dtype=torch.bfloat16, device=device)
        ym = torch.empty(t * bm, dtype=torch.float32, device=device)
        yb = torch.empty(t * bm, dtype=torch.float32, device=device)
        kern[(t,)](da, eye, dx, ym, yb, BM=bm, BN=bn, num_warps=4)
        y_mma, y_blk = ym.cpu().numpy()[:r], yb.cpu().numpy()[:r]
    return {"y_mma": y_mma.astype(np.float32), "y_blocked": y_blk.astype(np.float32), "shape": np.array([bm, bn])}


# ----------------------------------------------------------------------------------------------------
# 2. exp2 / exp
# ----------------------------------------------------------------------------------------------------


def _f32_bits(v: float) -> int:
    return int(np.array(v, dtype=np.float32).view(np.uint32))


def exp_segments(smoke: bool = False) -> list[dict[str, Any]]:
    """The input ranges: name, function (exp2 | exp), sign bit, magnitude bit range [lo, hi] and stride."""
    s = 2**15 if smoke else 1
    return [
        dict(name="exp2_sweep", fn="exp2", sign=1, lo=_f32_bits(2.0**-30), hi=_f32_bits(32.0), stride=8 * s),
        dict(name="exp2_neg_binade", fn="exp2", sign=1, lo=_f32_bits(1.0), hi=_f32_bits(2.0) - 1, stride=s),
        dict(name="exp2_pos_binade", fn="exp2", sign=0, lo=_f32_bits(1.0), hi=_f32_bits(2.0) - 1, stride=s),
        dict(name="exp_sweep", fn="exp", sign=1, lo=_f32_bits(2.0**-30), hi=_f32_bits(64.0), stride=64 * s),
    ]


def segment_inputs(seg: dict[str, Any], start: int = 0, stop: int | None = None) -> np.ndarray:
    """float32 inputs of a segment (elements [start, stop))."""
    mags = np.arange(seg["lo"], seg["hi"] + 1, seg["stride"], dtype=np.int64)[start:stop]
    bits = (mags | (int(seg["sign"]) << 31)).astype(np.uint32)
    return bits.view(np.float32)


def segment_size(seg: dict[str, Any]) -> int:
    return (seg["hi"] - seg["lo"]) // seg["stride"] + 1


def exp_edges() -> np.ndarray:
    """Edge inputs stored with raw outputs."""
    v = [
        0.0,
        -0.0,
        1e-45,
        -1e-45,
        1.1754942e-38,
        -1.1754942e-38,
        1.17549435e-38,
        -1.17549435e-38,
        2.0**-140,
        -(2.0**-140),
        2.0**-126,
        -(2.0**-126),
        np.inf,
        -np.inf,
        np.nan,
        127.0,
        127.99999,
        128.0,
        200.0,
        88.0,
        88.7,
        89.0,
        -87.0,
        -103.0,
        -104.0,
        1e-8,
        -1e-8,
        2.0**-24,
        -(2.0**-24),
        2.0**-25,
        -(2.0**-25),
    ]
    flush = -np.linspace(120.0, 155.0, 701)  # exp2 results from normal through subnormal to zero
    tiny = -(2.0 ** -np.arange(30.0, 150.0, 0.5))  # below the sweep: exp2 ~ 1
    sub = -(np.arange(1, 65, dtype=np.float64) * 2.0**-149)
    return np.concatenate([v, flush, tiny, sub, -sub]).astype(np.float32)


def _unary_kernel() -> Any:
    if "unary" not in _KERNELS:
        import triton
        import triton.language as tl

        @triton.jit
        def _unary_probe(X, Y, N, BLOCK: tl.constexpr, FN: tl.constexpr):
            offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < N
            x = tl.load(X + offs, mask=mask, other=0.0)
            if FN == 0:
                y = tl.math.exp2(x)
            else:
                y = tl.exp(x)
            tl.store(Y + offs, y, mask=mask)

        _KERNELS["unary"] = _unary_probe
    return _KERNELS["unary"]


def _apply(x_dev: Any, fn: str, device: str, faithful_kwargs: dict[str, Any] | None) -> Any:
    import torch
    import triton

    y = torch.empty_like(x_dev)
    n = x_dev.numel()
    block = 1024
    with _ctx(device, faithful_kwargs):
        _unary_kernel()[(triton.cdiv(n, block),)](x_dev, y, n, BLOCK=block, FN=0 if fn == "exp2" else 1)
    return y


AMB_TOL = 2.0**-20


def _offsets(x_dev: Any, y_dev: Any, fn: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """int8 ulp offsets of y from the correctly rounded fn(x) (float64 on the device, then rn to fp32), and
    (amb_idx, amb_bits, clip_idx, clip_bits) where the offset is not trustworthy / does not fit."""
    import torch

    x64 = x_dev.double()
    r64 = torch.exp2(x64) if fn == "exp2" else torch.exp(x64)
    ref = r64.float()
    mant, _ = torch.frexp(r64)  # r64 = mant * 2^e, mant in [0.5, 1)
    scaled = mant * 2.0**24
    frac = scaled - torch.floor(scaled)
    amb = (torch.abs(frac - 0.5) < AMB_TOL) & torch.isfinite(r64) & (r64 >= 2.0**-126)
    amb |= ~torch.isfinite(r64) | (r64 < 2.0**-126)
    yb = y_dev.view(torch.int32).long()
    rb = ref.view(torch.int32).long()
    d = yb - rb
    clip = (d.abs() > 127) & ~amb
    off = torch.where(amb | clip, torch.zeros_like(d), d).to(torch.int8)
    amb_idx = torch.nonzero(amb).flatten()
    clip_idx = torch.nonzero(clip).flatten()
    ybits = y_dev.view(torch.int32)
    return (
        off.cpu().numpy(),
        amb_idx.cpu().numpy(),
        ybits[amb_idx].cpu().numpy().view(np.uint32),
        clip_idx.cpu().numpy(),
        ybits[clip_idx].cpu().numpy().view(np.uint32),
    )


def exp_probe(
    *,
    device: str = "cuda",
    smoke: bool = False,
    chunk: int = 1 << 24,
    deadline: float | None = None,
    faithful_kwargs: dict[str, Any] | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, np.ndarray]:
    """Run every segment of :func:`exp_segments` and the edges; arrays keyed ``<segment>_<field>``."""
    import torch

    out: dict[str, np.ndarray] = {}
    segs = exp_segments(smoke)
    out["segments"] = np.array(json.dumps(segs))
    out["amb_tol"] = np.array([AMB_TOL])
    for seg in segs:
        if deadline is not None and time.monotonic() > deadline:
            log(f"exp probe: time budget reached before {seg['name']}")
            break
        n = segment_size(seg)
        offs, ambs, amb_y, clips, clip_y = [], [], [], [], []
        t0 = time.perf_counter()
        for start in range(0, n, chunk):
            stop = min(n, start + chunk)
            if device == "cuda":
                mags = torch.arange(
                    seg["lo"] + start * seg["stride"],
                    seg["lo"] + stop * seg["stride"],
                    seg["stride"],
                    dtype=torch.int64,
                    device="cuda",
                )
                bits = mags | (int(seg["sign"]) << 31)
                bits = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32)
                x = bits.view(torch.float32)
            else:
                x = torch.from_numpy(segment_inputs(seg, start, stop))
            y = _apply(x, seg["fn"], device, faithful_kwargs)
            o, ai, ay, ci, cy = _offsets(x, y, seg["fn"])
            offs.append(o)
            ambs.append(ai + start)
            amb_y.append(ay)
            clips.append(ci + start)
            clip_y.append(cy)
        name = seg["name"]
        out[f"{name}_off"] = np.concatenate(offs)
        out[f"{name}_amb_idx"] = np.concatenate(ambs).astype(np.int64)
        out[f"{name}_amb_y"] = np.concatenate(amb_y).astype(np.uint32)
        out[f"{name}_clip_idx"] = np.concatenate(clips).astype(np.int64)
        out[f"{name}_clip_y"] = np.concatenate(clip_y).astype(np.uint32)
        o = out[f"{name}_off"]
        log(
            f"exp probe {name}: {n} inputs in {time.perf_counter() - t0:.1f} s; offsets "
            f"{dict(zip(*np.unique(o, return_counts=True), strict=True))}, "
            f"amb {out[f'{name}_amb_idx'].size}, "
            f"clip {out[f'{name}_clip_idx'].size}"
        )
    edges = exp_edges()
    for fn in ("exp2", "exp"):
        x = torch.from_numpy(edges).to(device)
        y = _apply(x, fn, device, faithful_kwargs)
        out[f"edges_{fn}_y"] = y.cpu().numpy().view(np.uint32)
    out["edges_x"] = edges
    return out


# ----------------------------------------------------------------------------------------------------
# 3. isa
# ----------------------------------------------------------------------------------------------------

#: (label, kind, fmt, block_m, block_n, head_dim)
ISA_SPECS = (
    ("flash_bf16_b64", "flash", "bf16", 64, 64, 64),
    ("flash_bf16_b32", "flash", "bf16", 32, 32, 64),
    ("flash_fp16_b16", "flash", "fp16", 16, 16, 16),
    ("int8_b64", "int8", "int8", 64, 64, 64),
)


def _cuobjdump() -> str | None:
    path = shutil.which("cuobjdump")
    if path:
        return path
    try:
        import triton

        cand = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        return str(cand) if cand.exists() else None
    except Exception:
        return None


def sass_of(cubin: bytes) -> str:
    """SASS text of a cubin via cuobjdump ("" if it is not available)."""
    tool = _cuobjdump()
    if tool is None:
        return ""
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "k.cubin"
        p.write_bytes(cubin)
        r = subprocess.run([tool, "-sass", str(p)], capture_output=True, text=True, timeout=120)
        return r.stdout if r.returncode == 0 else f"// cuobjdump failed: {r.stderr[-500:]}"


def _ptx_defs(ptx: str) -> dict[str, str]:
    """PTX register -> the instruction (opcode) that last defines it (straight-line approximation)."""
    defs: dict[str, str] = {}
    for line in ptx.splitlines():
        m = re.match(r"\s*(?:@%p\d+\s+)?([a-z][\w.]*)\s+(%[\w]+)\s*,", line)
        if m:
            defs[m.group(2)] = m.group(1)
    return defs


def isa_facts(ptx: str, sass: str) -> dict[str, Any]:
    """Facts read from a kernel's PTX and SASS."""

    def count(pat: str, text: str) -> int:
        return len(re.findall(pat, text))

    defs = _ptx_defs(ptx)
    ex2_src = []
    for m in re.finditer(r"ex2\.approx[\w.]*\s+%\w+\s*,\s*(%\w+)", ptx):
        ex2_src.append(defs.get(m.group(1), "?"))
    facts: dict[str, Any] = {
        "ptx": {
            "ex2.approx.ftz.f32": count(r"ex2\.approx\.ftz\.f32", ptx),
            "ex2.approx.f32": count(r"ex2\.approx\.f32", ptx),
            "div.rn.f32": count(r"div\.rn\.f32", ptx),
            "div.full.f32": count(r"div\.full\.f32", ptx),
            "div.approx.f32": count(r"div\.approx(\.ftz)?\.f32", ptx),
            "rcp": count(r"\brcp\.", ptx),
            "fma.rn.f32": count(r"fma\.rn\.f32", ptx),
            "mul.f32": count(r"\bmul(\.rn)?\.f32", ptx),
            "add.f32": count(r"\badd(\.rn)?\.f32", ptx),
            "shfl.sync.bfly": count(r"shfl\.sync\.bfly", ptx),
            "cvt.rn.bf16x2.f32": count(r"cvt\.rn\.bf16x2\.f32", ptx),
            "cvt.rn.f16x2.f32": count(r"cvt\.rn\.f16x2\.f32", ptx),
            "mma": sorted(set(re.findall(r"\b(wgmma\.mma_async[\w.]*|mma\.sync[\w.]*)", ptx))),
        },
        "ex2_input_defined_by": {op: ex2_src.count(op) for op in sorted(set(ex2_src))},
    }
    if sass:
        ops = re.findall(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass, flags=re.M)
        hist: dict[str, int] = {}
        for op in ops:
            hist[op] = hist.get(op, 0) + 1
        # what feeds each MUFU.EX2: the last earlier instruction writing its source register
        lines = [ln for ln in sass.splitlines() if re.match(r"^\s*/\*[0-9a-f]+\*/", ln)]
        feeders: dict[str, int] = {}
        for i, ln in enumerate(lines):
            m = re.search(r"MUFU\.EX2\s+R\d+,\s*(-?\|?R\d+)", ln)
            if not m:
                continue
            src = m.group(1).strip("-|")
            for prev in reversed(lines[max(0, i - 40) : i]):
                pm = re.search(r"\s([A-Z][A-Z0-9_.]*)\s+(R\d+)\s*,", prev)
                if pm and pm.group(2) == src:
                    feeders[pm.group(1)] = feeders.get(pm.group(1), 0) + 1
                    break
        facts["sass"] = {
            "MUFU.EX2": hist.get("MUFU.EX2", 0),
            "MUFU.RCP": hist.get("MUFU.RCP", 0),
            "FFMA": sum(v for k, v in hist.items() if k.startswith("FFMA")),
            "FMUL": sum(v for k, v in hist.items() if k.startswith("FMUL")),
            "FADD": sum(v for k, v in hist.items() if k.startswith("FADD")),
            "HGMMA": sum(v for k, v in hist.items() if k.startswith("HGMMA")),
            "HMMA": sum(v for k, v in hist.items() if k.startswith("HMMA")),
            "IMMA": sum(v for k, v in hist.items() if k.startswith("IMMA")),
            "IGMMA": sum(v for k, v in hist.items() if k.startswith("IGMMA")),
            "SHFL.BFLY": sum(v for k, v in hist.items() if k.startswith("SHFL.BFLY")),
            "ex2_input_defined_by": feeders,
            "opcodes": dict(sorted(hist.items(), key=lambda kv: -kv[1])[:40]),
        }
    p = facts["ptx"]
    facts["summary"] = {
        "exp2_instruction": (
            "ex2.approx.ftz.f32" if p["ex2.approx.ftz.f32"] else "ex2.approx.f32" if p["ex2.approx.f32"] else "none"
        ),
        "qk_scale_minus_m_is_fma": bool(facts["ex2_input_defined_by"].get("fma.rn.f32", 0)),
        "division": (
            "div.rn.f32"
            if p["div.rn.f32"]
            else "div.full.f32"
            if p["div.full.f32"]
            else "div.approx"
            if p["div.approx.f32"]
            else "none"
        ),
        "mma": "wgmma" if any(s.startswith("wgmma") for s in p["mma"]) else ("mma.sync" if p["mma"] else "none"),
    }
    return facts


def _cache_artifacts(cache: Path, name: str, seen: set[Path]) -> tuple[str, bytes] | None:
    new = [p for p in cache.rglob(f"{name}.ptx") if p not in seen]
    if not new:
        return None
    p = max(new, key=lambda q: q.stat().st_mtime)
    seen.add(p)
    cubin = p.with_suffix(".cubin")
    return p.read_text(), (cubin.read_bytes() if cubin.exists() else b"")


def _launch_spec(spec: tuple) -> str:
    """Launch one ISA spec on the GPU (small inputs); returns the kernel's function name."""
    import torch

    _, kind, fmt, bm, bn, d = spec
    g = torch.Generator().manual_seed(0)
    shape = (1, 1, 2 * max(bm, bn), d)
    if kind == "flash":
        from simfloat_gpu.kernels.flash_attention import flash_attention

        dt = torch.bfloat16 if fmt == "bf16" else torch.float16
        q, k, v = (torch.randn(shape, generator=g).to(dt).cuda() for _ in range(3))
        flash_attention(q, k, v, block_m=bm, block_n=bn)
        return "_attn_fwd"
    from simfloat_gpu.kernels.int8_attention import int8_attention

    q, k, v = (torch.randn(shape, generator=g).half().cuda() for _ in range(3))
    int8_attention(q, k, v, block_m=bm, block_n=bn, variant="int8")
    return "_int8_attn_fwd"


def _compile_spec(spec: tuple, capability: int = 90) -> tuple[str, bytes]:
    """Cross-compile one ISA spec for sm_<capability> without a GPU (ptx, cubin)."""
    import inspect

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    _, kind, fmt, bm, bn, d = spec
    if kind == "flash":
        import simfloat_gpu.kernels.flash_attention as fa

        fn = fa._attn_fwd
        ptrs = {"Q": f"*{fmt}", "K": f"*{fmt}", "V": f"*{fmt}", "Out": f"*{fmt}", "M": "*fp32", "L": "*fp32"}
        consts = dict(
            HEAD_DIM=d,
            BLOCK_M=bm,
            BLOCK_N=bn,
            IS_CAUSAL=False,
            INPUT_PRECISION="ieee",
            LAZY_RESCALE=False,
            RESCALE_THRESHOLD=0.0,
        )
    else:
        import simfloat_gpu.kernels.int8_attention as ia

        fn = ia._int8_attn_fwd
        ptrs = {
            "Q": "*i8",
            "QS": "*fp32",
            "K": "*i8",
            "KS": "*fp32",
            "V": "*i8",
            "VS": "*fp32",
            "Out": "*fp16",
            "M": "*fp32",
            "L": "*fp32",
        }
        consts = dict(HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, IS_CAUSAL=False, FULL_INT8=True, ROW_SUM_QUANTIZED=False)
    sig = {}
    for name in inspect.signature(fn.fn).parameters:
        if name in consts:
            sig[name] = "constexpr"
        elif name in ptrs:
            sig[name] = ptrs[name]
        elif name == "qk_scale":
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    kernel = triton.compile(
        ASTSource(fn, sig, constexprs=consts),
        target=GPUTarget("cuda", capability, 32),
        options=dict(num_warps=4, num_stages=2),
    )
    return kernel.asm["ptx"], kernel.asm.get("cubin", b"")


def isa_probe(
    out_dir: Path,
    *,
    compile_only: bool | None = None,
    deadline: float | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """PTX/SASS of :data:`ISA_SPECS` into ``out_dir`` (``<label>.ptx``, ``<label>.sass``) and the facts
    (returned and written as ``isa.json``). Must run in a process where TRITON_INTERPRET is unset and
    TRITON_CACHE_DIR points to a fresh directory (the GPU path reads the compiled kernels back from it)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    import torch
    import triton

    gpu = torch.cuda.is_available() if compile_only is None else not compile_only
    cache = Path(os.environ.get("TRITON_CACHE_DIR", Path.home() / ".triton" / "cache"))
    seen: set[Path] = set(cache.rglob("*.ptx")) if cache.exists() else set()
    result: dict[str, Any] = {
        "triton": triton.__version__,
        "mode": "launch" if gpu else "cross-compile sm_90",
        "kernels": {},
    }
    for spec in ISA_SPECS:
        label = spec[0]
        if deadline is not None and time.monotonic() > deadline:
            result["kernels"][label] = {"error": "skipped: time budget"}
            continue
        t0 = time.perf_counter()
        try:
            if gpu:
                name = _launch_spec(spec)
                art = _cache_artifacts(cache, name, seen)
                if art is None:
                    raise RuntimeError(f"no {name}.ptx appeared in TRITON_CACHE_DIR={cache}")
                ptx, cubin = art
            else:
                ptx, cubin = _compile_spec(spec)
            sass = sass_of(cubin) if cubin else ""
            (out_dir / f"{label}.ptx").write_text(ptx)
            if sass:
                (out_dir / f"{label}.sass").write_text(sass)
            facts = isa_facts(ptx, sass)
            facts["spec"] = dict(zip(("label", "kind", "fmt", "block_m", "block_n", "head_dim"), spec, strict=True))
            result["kernels"][label] = facts
            log(f"isa {label}: {facts['summary']} ({time.perf_counter() - t0:.1f} s)")
        except Exception as exc:
            result["kernels"][label] = {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}
            log(f"isa {label}: failed: {type(exc).__name__}: {exc}")
    (out_dir / "isa.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


# ----------------------------------------------------------------------------------------------------
# command line (each probe on its own; simfloat_gpu.campaign.gpu_run runs them all)
# ----------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None, prog: str = "simfloat-gpu probe") -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("probe", choices=("isa", "dot", "exp", "sum"))
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--compile-only", action="store_true", help="isa: cross-compile for sm_90, launch nothing")
    p.add_argument("--smoke", action="store_true", help="tiny sizes (CPU interpreter)")
    p.add_argument("--budget-s", type=float, default=None)
    args = p.parse_args(argv)
    deadline = None if args.budget_s is None else time.monotonic() + args.budget_s
    args.out.mkdir(parents=True, exist_ok=True)
    if args.probe == "isa":
        isa_probe(args.out, compile_only=args.compile_only or None, deadline=deadline)
        return 0
    import torch

    device = "cuda" if torch.cuda.is_available() and not os.environ.get("TRITON_INTERPRET") else "cpu"
    if device == "cpu" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        print("no GPU: set TRITON_INTERPRET=1 to run the probe under the faithful interpreter", file=sys.stderr)
        return 2
    arrays: dict[str, np.ndarray] = {}
    if args.probe == "exp":
        arrays = exp_probe(device=device, smoke=args.smoke, deadline=deadline)
    elif args.probe == "dot":
        for v in DOT_SMOKE_VARIANTS if args.smoke else DOT_VARIANTS:
            res = dot_variant(*v, device=device, max_rows=64 if args.smoke else None)
            arrays.update({f"dot_{'_'.join(map(str, v))}__{k}": a for k, a in res.items()})
    else:
        for v in SUM_SMOKE_VARIANTS if args.smoke else SUM_VARIANTS:
            res = sum_variant(*v, device=device)
            arrays.update({f"sum_{v[0]}_{v[1]}__{k}": a for k, a in res.items()})
    np.savez_compressed(args.out / f"{args.probe}.npz", **arrays)
    return 0


if __name__ == "__main__":
    sys.exit(main())
