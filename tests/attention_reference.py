"""Shared numpy references of the attention tests (tests/attention/): inputs, exact attention, and every op
rounded once from its exact value (Fractions / error-free transforms), independent of simfloat's kernels."""

from __future__ import annotations

import math
from fractions import Fraction

import numba
import numpy as np

import simfloat as sf

RNG = np.random.default_rng(1234)


def _inputs(lead, seq_q, seq_k, d, dv=None, fmt=None, seed=0):
    g = np.random.default_rng(seed)
    q = g.standard_normal(lead + (seq_q, d)) * 1.5
    k = g.standard_normal(lead + (seq_k, d))
    v = g.standard_normal(lead + (seq_k, dv or d))
    if fmt is not None:
        q, k, v = (sf.round(x, fmt) for x in (q, k, v))
    return q, k, v


def exact_attention(q, k, v, causal=False, scale=None):
    """Stable float64 softmax attention (numpy), (..., s, d) arrays."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ np.swapaxes(k, -1, -2)) * scale
    if causal:
        s = np.where(np.arange(k.shape[-2])[None, :] > np.arange(q.shape[-2])[:, None], -np.inf, s)
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    return (p / p.sum(-1, keepdims=True)) @ v


def _r(x, spec):
    """A cast: one rounding of float64 values."""
    return sf.round(np.asarray(x, dtype=np.float64), spec.fmt, spec.mode)


def _round(s, tail, spec):
    """Round the exact value ``s + tail`` once (``s`` its float64 rounding, ``tail`` the rest or its sign):
    float64 round-to-odd first (innocuous before any rounding to <= 51 bits), then simfloat.round."""
    s = np.asarray(s, dtype=np.float64)
    if spec.fmt == sf.float64 and spec.mode == sf.RoundingMode.NEAREST_EVEN:
        return s
    with np.errstate(invalid="ignore"):
        fix = (tail != 0) & np.isfinite(s) & ((s.view(np.int64) & 1) == 0)
        odd = np.where(fix, np.nextafter(s, np.where(tail > 0, np.inf, -np.inf)), s)
    return sf.round(odd, spec.fmt, spec.mode)


def _two_sum(a, b):
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _two_prod(a, b):
    def split(x):
        c = 134217729.0 * x
        hi = c - (c - x)
        return hi, x - hi

    p = a * b
    (ah, al), (bh, bl) = split(np.asarray(a, dtype=np.float64)), split(np.asarray(b, dtype=np.float64))
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def _add(a, b, spec):
    return _round(*_two_sum(a, b), spec)


def _mul(a, b, spec):
    return _round(*_two_prod(a, b), spec)


def _div(a, b, spec):
    q = a / b
    p, e = _two_prod(q, b)
    return _round(q, ((a - p) - e) * np.sign(b), spec)  # the residual a - q*b is exact


def _fma1(a, b, c):
    if not all(map(math.isfinite, (a, b, c))):
        return a * b + c, 0.0
    x = Fraction(a) * Fraction(b) + Fraction(c)
    f = float(x)
    return f, float(np.sign(x - Fraction(f)))


_FMA = np.frompyfunc(_fma1, 3, 2)


def _fma(a, b, c, spec):
    f, sign = _FMA(*np.broadcast_arrays(a, b, c))
    return _round(f.astype(np.float64), sign.astype(np.float64), spec)


def serial(fn):
    """Run ``fn`` with one numba thread: the references make many tiny simfloat.round calls, which a thread
    pool only slows down."""

    def wrapper(*args, **kwargs):
        before = numba.get_num_threads()
        numba.set_num_threads(1)
        try:
            return fn(*args, **kwargs)
        finally:
            numba.set_num_threads(before)

    return wrapper


def _rel(a, b):
    return np.abs(a - b).max() / np.abs(b).max()


def masked_attention(q, k, v, keep=None, bias=None, scale=None):
    """Float64 SDPA math with a mask (numpy): ``softmax(scale * q @ k^T + bias, masked -inf) @ v``; ``keep``
    (bool, True keeps) and ``bias`` (additive) broadcast to (..., seq_q, seq_k). A row that keeps no key
    gives NaN (the softmax of no keys)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ np.swapaxes(k, -1, -2)) * scale
    if bias is not None:
        s = s + bias
    if keep is not None:
        s = np.where(keep, s, -np.inf)
    with np.errstate(invalid="ignore"):
        m = s.max(-1, keepdims=True)
        p = np.exp(s - m)
        return (p / p.sum(-1, keepdims=True)) @ v


def window_keep(seq_q, seq_k, left=-1, right=-1, off=0, kv_len=None):
    """(seq_q, seq_k) bool: flash-attn's window_size (-1: unbounded) with the diagonal shifted by ``off``
    (bottom-right: seq_k - seq_q) and keys past ``kv_len`` dropped, written element by element."""
    keep = np.zeros((seq_q, seq_k), dtype=bool)
    kv = seq_k if kv_len is None else kv_len
    for i in range(seq_q):
        for j in range(kv):
            keep[i, j] = (right < 0 or j <= i + off + right) and (left < 0 or j >= i + off - left)
    return keep
