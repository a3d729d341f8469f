"""Probe 1, **dot**: ``C = tl.dot(A, B, C0)`` on designed test vectors at the flash kernels' tile shapes
(see :mod:`simfloat_gpu.campaign.probes`)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from simfloat_gpu.campaign.probes._shared import KERNELS, raw_bits, run_context, to_format, torch_dtype

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
#: columns of B / C kept in the records (the rest of B is random and not stored)
KEEP_COLS = 16

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


def _dot_kernel() -> Any:
    if "dot" not in KERNELS:
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

        KERNELS["dot"] = _dot_probe
    return KERNELS["dot"]


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

    dt = torch_dtype(fmt)
    ta = torch.from_numpy(inputs["a"].astype(np.float32)).to(dt)
    tb = torch.from_numpy(inputs["b"].astype(np.float32)).to(dt)
    bm, bn = inputs["c0"].shape[1:]
    keep = min(KEEP_COLS, bn)
    return {
        "a_bits": raw_bits(ta),
        "b_bits": raw_bits(tb[:, :, :keep].contiguous()),
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
    dt = torch_dtype(fmt)
    ta = torch.from_numpy(a.astype(np.float32)).to(dt)
    tb = torch.from_numpy(b.astype(np.float32)).to(dt)
    back_a = ta.float().numpy().astype(np.float64)
    if not np.array_equal(back_a, a):
        raise AssertionError(f"dot probe {fmt}: designed A values are not exact in the format")
    prec = "tf32" if fmt == "tf32" else "default"  # 16/8-bit operands: tl.dot's default
    kern = _dot_kernel()
    outs = []
    mma = ""
    with run_context(device, faithful_kwargs):
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
