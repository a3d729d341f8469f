"""The float64 hardware loops (``Sequential("float64")`` with fused or separately rounded products) for four rows at
a time, each load of B serving the four.
"""

from __future__ import annotations

from simfloat._jit import fma64, jit
from simfloat.accumulate._mma import N_FMA64
from simfloat.accumulate._seq import _seq_row


@jit
def _f64_4(a0, a1, a2, a3, B, d0, d1, d2, d3, n, kk, fused):
    """Four rows of the float64 loop: d_i[j] = fma(a_i[k], B[k, j], d_i[j]) (``fused``) or
    d_i[j] + a_i[k] * B[k, j] (product rounded first) for k = 0 .. kk-1 in order; each load of B serves the
    four rows."""
    if fused:
        for k in range(kk):
            x0 = B[k]
            p0, p1, p2, p3 = a0[k], a1[k], a2[k], a3[k]
            for j in range(n):
                y0 = x0[j]
                d0[j] = fma64(p0, y0, d0[j])
                d1[j] = fma64(p1, y0, d1[j])
                d2[j] = fma64(p2, y0, d2[j])
                d3[j] = fma64(p3, y0, d3[j])
    else:
        for k in range(kk):
            x0 = B[k]
            p0, p1, p2, p3 = a0[k], a1[k], a2[k], a3[k]
            for j in range(n):
                y0 = x0[j]
                d0[j] = d0[j] + p0 * y0
                d1[j] = d1[j] + p1 * y0
                d2[j] = d2[j] + p2 * y0
                d3[j] = d3[j] + p3 * y0


@jit
def _f64_rows(a, B, c, g, n, mp, w):
    """The float64 loops of :func:`_seq_row` (``N_FMA64``, ``N_MULADD64``) for the rows a[:g] into c[:g, :n],
    four rows at a time (the same operations per output, in the same order)."""
    kk = a.shape[1]
    fused = mp.native == N_FMA64
    i = 0
    while i + 4 <= g:
        _f64_4(a[i], a[i + 1], a[i + 2], a[i + 3], B, c[i], c[i + 1], c[i + 2], c[i + 3], n, kk, fused)
        i += 4
    while i < g:
        _seq_row(a[i], B, c[i], n, kk - kk, kk, mp, w)  # k0 an int64 (as _inner's), not the literal 0
        i += 1
