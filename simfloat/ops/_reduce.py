"""Sums with an explicit association order, every partial sum rounded into the format (njit slice workers).

Each worker sums a 1-D array slice ``x`` into format ``p`` with ``mode`` and returns a float64. Every element
is first rounded into ``p`` ("loaded"; the identity for values of the format), then the additions happen in
the order below, each one exact and rounded once (:func:`~simfloat.ops.add_scalar`). An empty slice sums
to +0.

Random bits (stochastic rounding only) are counter-based: loading ``x[i]`` uses counter ``counter0 + i``, the
``j``-th addition performed (in the order below, ``j = 0, 1, ...``) uses ``counter0 + n + j``. All counters of
one slice lie in ``[counter0, counter0 + 4n + 4)``, so slices given counter ranges that far apart never share
bits, and results do not depend on threads or chunking.

Orders:

* ``sum_sequential``: ``((x0 + x1) + x2) + ...`` -- a scalar accumulator in a loop.
* ``sum_pairwise(fan_in=f)``: level by level; each level splits its list into consecutive groups of ``f``
  (the last one may be shorter) and sums each group left to right (a group of one passes through unchanged);
  repeat until one value is left. For ``f = 2`` and ``n`` a power of two this is the balanced binary tree
  ``((x0+x1)+(x2+x3))+((x4+x5)+(x6+x7))`` of an in-register tree reduction; for other ``n`` it equals padding
  the list with zeros at the end to the next power of ``f`` (zeros only pass values through).
* ``sum_chunked(chunk=c)``: sequential within consecutive chunks of ``c`` elements, then sequential over the
  chunk sums: ``S = s_0 + s_1 + ...`` -- a blocked kernel that keeps one accumulator per block.
* ``sum_numpy``: numpy's float pairwise summation (``pairwise_sum`` in numpy's ``loops_utils.h.src``) as
  ``np.add.reduce`` runs it on a contiguous axis: ``+0 + P(x, n)`` where ``P(a, n)`` is, for ``n < 8``:
  ``+0`` then add ``a[0..n)`` left to right; for ``8 <= n <= 128``: eight accumulators ``r[j] = a[j]``, then
  ``r[j] += a[i+j]`` for each full block of 8, then ``((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7))``, then add the
  remaining ``n%8`` elements left to right; for ``n > 128``: ``n2 = n//2 - (n//2)%8``, then
  ``P(a, n2) + P(a + n2, n - n2)``. With float32 and round-to-nearest-even this reproduces ``np.sum`` of a 1-D
  float32 array bit for bit (numpy feeds at most 8192 elements per inner-loop call for buffered,
  non-contiguous or casting reductions; this is the contiguous case).
"""

from __future__ import annotations

import numpy as np

from simfloat._jit import jit
from simfloat.formats import FormatParams
from simfloat.ops._scalar import add_scalar, max2
from simfloat.rounding import RoundingMode, rand_bits, round_exact
from simfloat.rounding._exact import TAIL0

__all__ = ["sum_sequential", "sum_pairwise", "sum_chunked", "sum_numpy", "sum_slice", "max_slice"]

_Z = np.uint64(0)


@jit
def _load(x, i: int, p: FormatParams, mode: int, seed: np.uint64, counter0: np.uint64) -> float:
    rb = rand_bits(seed, counter0 + np.uint64(i)) if mode == RoundingMode.STOCHASTIC else _Z
    return round_exact(np.float64(x[i]), TAIL0, p, mode, rb)


@jit
def _add(a: float, b: float, p: FormatParams, mode: int, seed: np.uint64, counter: np.uint64) -> float:
    rb = rand_bits(seed, counter) if mode == RoundingMode.STOCHASTIC else _Z
    return add_scalar(a, b, p, mode, rb)


@jit
def sum_sequential(x: np.ndarray, p: FormatParams, mode: int, seed: np.uint64, counter0: np.uint64) -> float:
    """Left-to-right sum of the 1-D slice ``x`` (see the module docstring)."""
    n = x.shape[0]
    if n == 0:
        return 0.0
    cadd = counter0 + np.uint64(n)
    acc = _load(x, 0, p, mode, seed, counter0)
    for i in range(1, n):
        acc = _add(acc, _load(x, i, p, mode, seed, counter0), p, mode, seed, cadd + np.uint64(i - 1))
    return acc


@jit
def sum_chunked(x: np.ndarray, p: FormatParams, mode: int, seed: np.uint64, counter0: np.uint64, chunk: int) -> float:
    """Sequential within chunks of ``chunk`` elements, then sequential over the chunk sums."""
    n = x.shape[0]
    if n == 0:
        return 0.0
    cadd = counter0 + np.uint64(n)
    j = 0
    total = 0.0
    for c0 in range(0, n, chunk):
        acc = _load(x, c0, p, mode, seed, counter0)
        for i in range(c0 + 1, min(c0 + chunk, n)):
            acc = _add(acc, _load(x, i, p, mode, seed, counter0), p, mode, seed, cadd + np.uint64(j))
            j += 1
        if c0 == 0:
            total = acc
        else:
            total = _add(total, acc, p, mode, seed, cadd + np.uint64(j))
            j += 1
    return total


@jit
def sum_pairwise(x: np.ndarray, p: FormatParams, mode: int, seed: np.uint64, counter0: np.uint64, fan_in: int) -> float:
    """Tree sum over groups of ``fan_in`` adjacent values, level by level (see the module docstring)."""
    n = x.shape[0]
    if n == 0:
        return 0.0
    cadd = counter0 + np.uint64(n)
    buf = np.empty(n, dtype=np.float64)
    for i in range(n):
        buf[i] = _load(x, i, p, mode, seed, counter0)
    j = 0
    length = n
    while length > 1:
        m = 0
        for g in range(0, length, fan_in):
            acc = buf[g]
            for i in range(g + 1, min(g + fan_in, length)):
                acc = _add(acc, buf[i], p, mode, seed, cadd + np.uint64(j))
                j += 1
            buf[m] = acc
            m += 1
        length = m
    return buf[0]


@jit
def _np_block(x, lo: int, n: int, p: FormatParams, mode: int, seed: np.uint64, counter0: np.uint64, j: int):
    """numpy's ``pairwise_sum`` over ``x[lo:lo+n]`` for ``n <= 128``; returns (sum, next addition index)."""
    cadd = counter0 + np.uint64(x.shape[0])
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res = _add(res, _load(x, i, p, mode, seed, counter0), p, mode, seed, cadd + np.uint64(j))
            j += 1
        return res, j
    r = np.empty(8, dtype=np.float64)
    for k in range(8):
        r[k] = _load(x, lo + k, p, mode, seed, counter0)
    i = 8
    while i < n - (n % 8):
        for k in range(8):
            r[k] = _add(r[k], _load(x, lo + i + k, p, mode, seed, counter0), p, mode, seed, cadd + np.uint64(j))
            j += 1
        i += 8
    for k in range(4):  # (r0+r1), (r2+r3), (r4+r5), (r6+r7)
        r[k] = _add(r[2 * k], r[2 * k + 1], p, mode, seed, cadd + np.uint64(j))
        j += 1
    for k in range(2):  # (r01+r23), (r45+r67)
        r[k] = _add(r[2 * k], r[2 * k + 1], p, mode, seed, cadd + np.uint64(j))
        j += 1
    res = _add(r[0], r[1], p, mode, seed, cadd + np.uint64(j))
    j += 1
    while i < n:
        res = _add(res, _load(x, lo + i, p, mode, seed, counter0), p, mode, seed, cadd + np.uint64(j))
        j += 1
        i += 1
    return res, j


@jit
def _np_pairwise(x, n: int, p: FormatParams, mode: int, seed: np.uint64, counter0: np.uint64):
    """numpy's recursive ``pairwise_sum`` over ``x[0:n]`` run with an explicit stack (numba's cache does not
    support recursive functions): post-order, so additions happen in the recursion's order."""
    cadd = counter0 + np.uint64(n)
    f_lo = np.empty(64, dtype=np.int64)
    f_n = np.empty(64, dtype=np.int64)
    f_state = np.empty(64, dtype=np.int64)
    vals = np.empty(64, dtype=np.float64)
    sp = 0
    f_lo[0] = 0
    f_n[0] = n
    f_state[0] = 0
    vsp = 0
    j = 0
    while sp >= 0:
        lo = f_lo[sp]
        m = f_n[sp]
        if m <= 128:
            v, j = _np_block(x, lo, m, p, mode, seed, counter0, j)
            vals[vsp] = v
            vsp += 1
            sp -= 1
            continue
        m2 = m // 2
        m2 -= m2 % 8
        st = f_state[sp]
        if st == 0:
            f_state[sp] = 1
            sp += 1
            f_lo[sp] = lo
            f_n[sp] = m2
            f_state[sp] = 0
        elif st == 1:
            f_state[sp] = 2
            sp += 1
            f_lo[sp] = lo + m2
            f_n[sp] = m - m2
            f_state[sp] = 0
        else:
            vals[vsp - 2] = _add(vals[vsp - 2], vals[vsp - 1], p, mode, seed, cadd + np.uint64(j))
            j += 1
            vsp -= 1
            sp -= 1
    return vals[0], j


@jit
def sum_numpy(x: np.ndarray, p: FormatParams, mode: int, seed: np.uint64, counter0: np.uint64) -> float:
    """numpy's pairwise summation order (see the module docstring)."""
    n = x.shape[0]
    if n == 0:
        return 0.0
    s, j = _np_pairwise(x, n, p, mode, seed, counter0)
    return _add(0.0, s, p, mode, seed, counter0 + np.uint64(n) + np.uint64(j))


@jit
def sum_slice(
    x: np.ndarray, p: FormatParams, mode: int, order: int, fan_in: int, chunk: int, seed: np.uint64, counter0: np.uint64
) -> float:
    """Dispatch on ``order``: 0 sequential, 1 pairwise (``fan_in``), 2 chunked (``chunk``), 3 numpy."""
    if order == 0:
        return sum_sequential(x, p, mode, seed, counter0)
    if order == 1:
        return sum_pairwise(x, p, mode, seed, counter0, fan_in)
    if order == 2:
        return sum_chunked(x, p, mode, seed, counter0, chunk)
    return sum_numpy(x, p, mode, seed, counter0)


@jit
def max_slice(x: np.ndarray) -> float:
    """IEEE ``maximum`` over a nonempty 1-D slice: NaN if any element is NaN, and -0 < +0."""
    m: float = np.float64(x[0])
    for i in range(1, x.shape[0]):
        m = max2(m, np.float64(x[i]))
        if m != m:
            return m
    return m
