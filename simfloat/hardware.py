"""Hardware-measured models of GPU operations (NVIDIA H200, sm_90; measured with ``simfloat_gpu/campaign/probes.py``).

* :func:`ex2_approx_f32` / :func:`ex2_approx`: the H200's ``ex2.approx.ftz.f32`` (SASS ``MUFU.EX2``), bit for
  bit on the probes (README). The unit works in sign-magnitude fixed point: ``|x| = i + f`` with the fraction
  ``f`` **truncated** to 23 bits, ``2^x = T-(f) * 2^-i`` for x < 0 and ``T+(f) * 2^i`` for x > 0. The two
  2^23-entry tables ``T-`` / ``T+`` were read off the binades (-2, -1] and [1, 2) (every float32 there) and
  are stored as offsets of -2..+1 ulp from the correctly rounded 2^-f / 2^f (2 bits each, xz: 280 KB,
  ``simfloat/data/ex2_h200.bin.xz``). How well it reproduces held-out inputs is in README "GPU validation
  (H200)". Positive inputs outside [1, 2) use the same construction without probe data (flash attention
  only feeds x <= 0).
  ``ftz``: subnormal inputs read as 0 (result 1), results below 2^-126 flushed to +0.
* :func:`exp_approx`: ``tl.exp`` = ``ex2.approx.f32(rn32(x * 1.4426950f))`` (not flushed).
* :func:`tl_sum_mma`: the order of ``tl.sum(p, axis=1)`` over a tile in the tensor-core (mma / wgmma)
  accumulator layout with 4 warps stacked along M (Triton's layout for the flash kernel's chained dots,
  and for every probe tile with one warp along N): lane t (t = 0..3) sums its columns ``8r + 2t, 8r + 2t + 1``
  (r = 0, 1, ...) left to right, then the butterfly ``shfl.xor 2`` then ``shfl.xor 1``:
  ``(s0 + s2) + (s1 + s3)``. Measured with the FPRev design on 64x32, 64x64, 128x64, 64x128, 128x128 tiles
  (wgmma and mma.sync).
"""

from __future__ import annotations

import lzma
import math
from functools import lru_cache
from pathlib import Path

import numpy as np

from simfloat._jit import bits_f32, bits_f64, f32_bits, jit

__all__ = [
    "ex2_table",
    "ex2_approx_f32",
    "ex2_approx",
    "exp_approx",
    "tl_sum_mma",
    "tl_sum_mma_f32",
    "tl_sum_mma_array",
    "TWO23",
]

TWO23 = 8388608
_DATA = Path(__file__).resolve().parent / "data" / "ex2_h200.bin.xz"
_MAGIC = b"SFEX2H200v1\n"
_LOG2E_F32 = float(np.float32(1.4426950408889634))


@lru_cache(maxsize=1)
def ex2_table() -> np.ndarray:
    """int8[2^24]: ulp offsets of T-(f) (first 2^23) and T+(f) (last 2^23) from the correctly rounded value,
    f = index * 2^-23."""
    blob = lzma.decompress(_DATA.read_bytes())
    if not blob.startswith(_MAGIC):
        raise ValueError(f"{_DATA}: not an ex2 table")
    packed = np.frombuffer(blob, dtype=np.uint8, offset=len(_MAGIC))
    if packed.size != TWO23 // 2:
        raise ValueError(f"{_DATA}: {packed.size} bytes, expected {TWO23 // 2}")
    out = np.empty(packed.size * 4, dtype=np.int8)
    for k in range(4):
        out[k::4] = ((packed >> (2 * k)) & 3).astype(np.int8) - 2
    out.setflags(write=False)
    return out


@jit
def _step_ulps(base, off):
    """The float32 ``off`` ulps away from the float32 ``base`` > 0 (|off| <= 2): neighbouring positive float32
    values have consecutive bit patterns, across binades too."""
    return np.float64(bits_f32(np.int32(f32_bits(np.float32(base)) + off)))


@jit
def _pow2(k):
    """2**k for -1022 <= k <= 1023 (exact, from bits)."""
    return bits_f64(np.uint64(k + 1023) << np.uint64(52))


@jit
def ex2_approx_f32(x: float, tab: np.ndarray, ftz: bool) -> float:
    """ex2.approx(.ftz).f32 of a float32 value ``x`` (given as a float), as a float (a float32 value)."""
    if x != x:
        return x
    if ftz and abs(x) < 1.1754943508222875e-38:
        x = 0.0
    if x == 0.0:
        return 1.0
    if x >= 128.0:
        return math.inf
    if x < -160.0:
        return 0.0
    a = abs(x)
    i = math.floor(a)
    f = int((a - i) * 8388608.0)  # exact product; truncation
    if x < 0.0:
        base = float(np.float32(math.exp2(-f * 1.1920928955078125e-07)))
        y = _step_ulps(base, tab[f]) * _pow2(-int(i))
    else:
        base = float(np.float32(math.exp2(f * 1.1920928955078125e-07)))
        y = _step_ulps(base, tab[TWO23 + f]) * _pow2(int(i))
    if y < 1.1754943508222875e-38:
        if ftz:
            return 0.0
        return float(np.float32(y))
    if y > 3.4028234663852886e38:
        return math.inf
    return y


@jit
def _ex2_array(x, out, tab, ftz):
    for n in range(x.size):
        out[n] = ex2_approx_f32(float(x[n]), tab, ftz)


def ex2_approx(x: np.ndarray, ftz: bool = True) -> np.ndarray:
    """The H200's ex2.approx(.ftz).f32 on a float32 array (float32 result). Usable as
    ``simfloat_gpu.interpreter.faithful(exp2=ex2_approx)``."""
    xf = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty(xf.size, dtype=np.float64)
    _ex2_array(xf.reshape(-1), out, ex2_table(), bool(ftz))
    return out.astype(np.float32).reshape(xf.shape)


def exp_approx(x: np.ndarray) -> np.ndarray:
    """``tl.exp`` on the H200: ex2.approx.f32(rn32(x * 1.4426950f)), not flushed."""
    xf = np.asarray(x, dtype=np.float32)
    with np.errstate(over="ignore", under="ignore"):
        t = (xf.astype(np.float64) * _LOG2E_F32).astype(np.float32)
    return ex2_approx(t, ftz=False)


@jit
def tl_sum_mma_f32(p: np.ndarray, n: int) -> float:
    """tl.sum of p[:n] (float32 values as floats) in the measured mma-layout order, fp32 additions."""
    s0 = 0.0
    s1 = 0.0
    s2 = 0.0
    s3 = 0.0
    for t in range(4):
        s = 0.0
        first = True
        for base in range(2 * t, n, 8):
            for c in range(base, min(base + 2, n)):
                if first:
                    s = p[c]
                    first = False
                else:
                    s = float(np.float32(s + p[c]))
        if t == 0:
            s0 = s
        elif t == 1:
            s1 = s
        elif t == 2:
            s2 = s
        else:
            s3 = s
    return float(np.float32(float(np.float32(s0 + s2)) + float(np.float32(s1 + s3))))


def tl_sum_mma(p: np.ndarray) -> np.ndarray:
    """tl.sum(p, axis=-1) in the measured mma-layout order (float32)."""
    return tl_sum_mma_array(np.asarray(p, dtype=np.float32))


def tl_sum_mma_array(p: np.ndarray) -> np.ndarray:
    p2 = np.ascontiguousarray(p, dtype=np.float32)
    flat = p2.reshape(-1, p2.shape[-1]).astype(np.float64)
    out = np.empty(flat.shape[0], dtype=np.float64)
    _sum_rows(flat, out)
    return out.astype(np.float32).reshape(p2.shape[:-1])


@jit
def _sum_rows(x, out):
    for r in range(x.shape[0]):
        out[r] = tl_sum_mma_f32(x[r], x.shape[1])
