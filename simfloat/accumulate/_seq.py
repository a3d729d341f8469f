"""Sequential accumulation for a row of outputs at once: one exact ``c + a*b`` per step (products exact in float64,
or rounded first into the product format), rounded once by :func:`simfloat._lanes.ladd`; float32 nearest-even
with exact products on float32 values as the hardware's own float32 FMA (four rows at a time in
:func:`_fma32_rows`).
"""

from __future__ import annotations

import numpy as np

from simfloat._jit import fma32, fma64, jit
from simfloat._lanes import ladd, lane_of, lround, lround_ne
from simfloat.accumulate._mma import N_FMA32, N_FMA64, N_MULADD64, N_NONE
from simfloat.rounding import RoundingMode


@jit
def _on_grid(c, n, r):
    """Whether c[:n] are values of the lane's format (NaN aside)."""
    ok = True
    for j in range(n):
        v = c[j]
        ok &= (lround(v, r) == v) | (v != v)
    return ok


@jit
def _fits32(c, n):
    for j in range(n):
        if np.float64(np.float32(c[j])) != c[j] and c[j] == c[j]:
            return False
    return True


@jit
def _seq_row(a, B, c, n, k0, k1, mp, w):
    """Sequential steps over k in [k0, k1): c[j] = round(c[j] + a[k] * B[k, j]) for j < n (``w``: scratch)."""
    native = mp.native
    if native == N_FMA32 and not _fits32(c, n):
        native = N_NONE  # an accumulator that is not a float32 value: round the exact sums instead
    if native == N_FMA64:
        for k in range(k0, k1):
            ak, r = a[k], B[k]
            for j in range(n):
                c[j] = fma64(ak, r[j], c[j])
    elif native == N_MULADD64:
        for k in range(k0, k1):
            ak, r = a[k], B[k]
            for j in range(n):
                c[j] = c[j] + ak * r[j]
    elif native == N_FMA32:  # the accumulators held as float32 (exact: they are float32 values) in between
        c32 = w.c32
        for j in range(n):
            c32[j] = np.float32(c[j])
        k = k0
        while k + 4 <= k1:  # four steps per pass over j, in order
            a0, a1, a2, a3 = np.float32(a[k]), np.float32(a[k + 1]), np.float32(a[k + 2]), np.float32(a[k + 3])
            r0, r1, r2, r3 = B[k], B[k + 1], B[k + 2], B[k + 3]
            for j in range(n):
                t = fma32(a1, np.float32(r1[j]), fma32(a0, np.float32(r0[j]), c32[j]))
                c32[j] = fma32(a3, np.float32(r3[j]), fma32(a2, np.float32(r2[j]), t))
            k += 4
        while k < k1:
            ak, r = np.float32(a[k]), B[k]
            for j in range(n):
                c32[j] = fma32(ak, np.float32(r[j]), c32[j])
            k += 1
        for j in range(n):
            c[j] = np.float64(c32[j])
    else:  # the rounded forms: the record's lanes read once (see lane_of)
        acc, prod = lane_of(mp.acc), lane_of(mp.prod)
        if mp.round_products and mp.plain_sum and acc.mode == RoundingMode.NEAREST_EVEN and _on_grid(c, n, acc):
            for k in range(k0, k1):
                ak, r = a[k], B[k]
                for j in range(n):
                    c[j] = lround_ne(c[j] + lround_ne(ak * r[j], prod), acc)
        elif mp.round_products and mp.plain_sum and _on_grid(c, n, acc):
            for k in range(k0, k1):
                ak, r = a[k], B[k]
                for j in range(n):
                    c[j] = lround(c[j] + lround(ak * r[j], prod), acc)
        elif mp.round_products:
            for k in range(k0, k1):
                ak, r = a[k], B[k]
                for j in range(n):
                    c[j] = ladd(c[j], lround(ak * r[j], prod), acc)
        else:
            for k in range(k0, k1):
                ak, r = a[k], B[k]
                for j in range(n):
                    c[j] = ladd(c[j], ak * r[j], acc)


@jit
def _fma32_4(a0, a1, a2, a3, B32, d0, d1, d2, d3, n, kk):
    """Four rows of the float32 FMA loop: d_i[j] = fma(a_i[k], B32[k, j], d_i[j]) for k = 0 .. kk-1 in order;
    two k per pass over j, each load of B serving the four rows."""
    k = 0
    while k + 2 <= kk:
        x0, x1 = B32[k], B32[k + 1]
        p0, q0 = np.float32(a0[k]), np.float32(a0[k + 1])
        p1, q1 = np.float32(a1[k]), np.float32(a1[k + 1])
        p2, q2 = np.float32(a2[k]), np.float32(a2[k + 1])
        p3, q3 = np.float32(a3[k]), np.float32(a3[k + 1])
        for j in range(n):
            y0, y1 = x0[j], x1[j]
            d0[j] = fma32(q0, y1, fma32(p0, y0, d0[j]))
            d1[j] = fma32(q1, y1, fma32(p1, y0, d1[j]))
            d2[j] = fma32(q2, y1, fma32(p2, y0, d2[j]))
            d3[j] = fma32(q3, y1, fma32(p3, y0, d3[j]))
        k += 2
    while k < kk:
        x0 = B32[k]
        p0, p1, p2, p3 = np.float32(a0[k]), np.float32(a1[k]), np.float32(a2[k]), np.float32(a3[k])
        for j in range(n):
            y0 = x0[j]
            d0[j] = fma32(p0, y0, d0[j])
            d1[j] = fma32(p1, y0, d1[j])
            d2[j] = fma32(p2, y0, d2[j])
            d3[j] = fma32(p3, y0, d3[j])
        k += 1


@jit
def _fma32_1(a0, B32, d0, n, kk):
    """One row of the float32 FMA loop (:func:`_fma32_4`), four k per pass over j."""
    k = 0
    while k + 4 <= kk:
        x0, x1, x2, x3 = B32[k], B32[k + 1], B32[k + 2], B32[k + 3]
        p0, p1, p2, p3 = np.float32(a0[k]), np.float32(a0[k + 1]), np.float32(a0[k + 2]), np.float32(a0[k + 3])
        for j in range(n):
            d0[j] = fma32(p3, x3[j], fma32(p2, x2[j], fma32(p1, x1[j], fma32(p0, x0[j], d0[j]))))
        k += 4
    while k < kk:
        x0, p0 = B32[k], np.float32(a0[k])
        for j in range(n):
            d0[j] = fma32(p0, x0[j], d0[j])
        k += 1


@jit
def _fma32_rows(a, B32, c, g, n, rs):
    """The float32 FMA loop (``Sequential("float32")`` on float32 operands, ``B32`` holding B's values) for the
    rows a[:g] into c[:g, :n]: four rows at a time. A row whose incoming accumulators are not all float32 values
    is left as it is and marked False in ``rs.live`` (the caller runs :func:`row_mma` on it, which rounds exact
    sums instead)."""
    kk = a.shape[1]
    c32, live, idx = rs.c32, rs.live, rs.idx
    nl = 0
    for i in range(g):
        live[i] = _fits32(c[i], n)
        if live[i]:
            ci, di = c[i], c32[nl]
            for j in range(n):
                di[j] = np.float32(ci[j])
            idx[nl] = i
            nl += 1
    t = 0
    while t + 4 <= nl:
        i0, i1, i2, i3 = idx[t], idx[t + 1], idx[t + 2], idx[t + 3]
        _fma32_4(a[i0], a[i1], a[i2], a[i3], B32, c32[t], c32[t + 1], c32[t + 2], c32[t + 3], n, kk)
        t += 4
    while t < nl:
        _fma32_1(a[idx[t]], B32, c32[t], n, kk)
        t += 1
    for t in range(nl):
        ci, di = c[idx[t]], c32[t]
        for j in range(n):
            ci[j] = np.float64(di[j])
