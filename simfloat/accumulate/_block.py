"""Block FMA (tensor cores), float64 form: ``c[j] = round(c[j] + sum of the block's truncated, aligned products)``
for a row of outputs at once, one block of k per step.

Per block of k, the alignment exponent of every output (the largest exponent among the incoming accumulator and
the block's products, a product counting with its own exponent or with the sum of its operands' exponents) is found
first; then each term, scaled exactly by ``2**-(emax - F)``, is truncated toward zero and summed exactly (integers
held in float64); the sum is scaled back (exact) and rounded into the accumulator format by
:func:`simfloat._lanes.lround`. Alignment weights are powers of two held as float64, so every loop runs over the
independent outputs ``j`` (contiguous in B and c) and vectorizes.
"""

from __future__ import annotations

import numpy as np

from simfloat._jit import jit, ljit
from simfloat._lanes import lane_of, lround, lround_ne, lround_rz, lround_rz_f32, pow2_of, recip_pow2, rz_f32
from simfloat.rounding import RoundingMode


@ljit
def _raise(m, x):
    """max(m, x) for weights (non-negative, never NaN) as a select whose result is not ``m`` itself: LLVM turns
    ``p[j] = max(p[j], x)`` into a masked store, which is slow on some CPUs; ``m + 0.0`` (the same value) keeps
    the store unconditional."""
    return x if x > m else m + 0.0


@ljit
def _weights(a, ea, B, EB, em, lo, hi, n, align_sum):
    """em[j] = max(em[j], weight of the product a[k] * B[k, j]) over k in [lo, hi); four k per pass over j."""
    k = lo
    if align_sum:
        while k + 4 <= hi:
            e0, e1, e2, e3 = ea[k], ea[k + 1], ea[k + 2], ea[k + 3]
            r0, r1, r2, r3 = EB[k], EB[k + 1], EB[k + 2], EB[k + 3]
            for j in range(n):
                em[j] = _raise(em[j], max(max(e0 * r0[j], e1 * r1[j]), max(e2 * r2[j], e3 * r3[j])))
            k += 4
        while k < hi:
            e0, r0 = ea[k], EB[k]
            for j in range(n):
                em[j] = _raise(em[j], e0 * r0[j])
            k += 1
    else:
        while k + 4 <= hi:
            a0, a1, a2, a3 = a[k], a[k + 1], a[k + 2], a[k + 3]
            r0, r1, r2, r3 = B[k], B[k + 1], B[k + 2], B[k + 3]
            for j in range(n):
                w01 = max(pow2_of(a0 * r0[j]), pow2_of(a1 * r1[j]))
                w23 = max(pow2_of(a2 * r2[j]), pow2_of(a3 * r3[j]))
                em[j] = _raise(em[j], max(w01, w23))
            k += 4
        while k < hi:
            a0, r0 = a[k], B[k]
            for j in range(n):
                em[j] = _raise(em[j], pow2_of(a0 * r0[j]))
            k += 1


@ljit
def _terms(a, B, sc, tot, lo, hi, n):
    """tot[j] += sum over k in [lo, hi) of trunc(a[k] * B[k, j] * sc[j]): integers, so the sum is exact in any
    order; four k per pass over j."""
    k = lo
    while k + 4 <= hi:
        a0, a1, a2, a3 = a[k], a[k + 1], a[k + 2], a[k + 3]
        r0, r1, r2, r3 = B[k], B[k + 1], B[k + 2], B[k + 3]
        for j in range(n):
            s = sc[j]
            t01 = np.trunc((a0 * r0[j]) * s) + np.trunc((a1 * r1[j]) * s)
            t23 = np.trunc((a2 * r2[j]) * s) + np.trunc((a3 * r3[j]) * s)
            tot[j] += t01 + t23
        k += 4
    while k < hi:
        a0, r0 = a[k], B[k]
        for j in range(n):
            tot[j] += np.trunc((a0 * r0[j]) * sc[j])
        k += 1


@jit
def _terms_grouped(a, B, sc, tot, part, lo, hi, n, g):
    """:func:`_terms` with the terms summed exactly in groups of ``g`` consecutive k (from ``lo``) before
    truncation: tot[j] += trunc(part[j] * sc[j]), part[j] = the group's sum of a[k] * B[k, j] (exact: the
    block-scaled kinds' scaled fp4 products within a group share their scales; see :func:`scaled_mma`)."""
    for k0 in range(lo, hi, g):
        for j in range(n):
            part[j] = 0.0
        for k in range(k0, min(hi, k0 + g)):
            ak, r = a[k], B[k]
            for j in range(n):
                part[j] += ak * r[j]
        for j in range(n):
            tot[j] += np.trunc(part[j] * sc[j])


@ljit
def _weights2(a, ea, a2, ea2, B, EB, em, em2, lo, hi, n, align_sum):
    """:func:`_weights` for two rows ``a``, ``a2`` at once (each load of B or EB serves both)."""
    k = lo
    if align_sum:
        while k + 4 <= hi:
            e0, e1, e2, e3 = ea[k], ea[k + 1], ea[k + 2], ea[k + 3]
            f0, f1, f2, f3 = ea2[k], ea2[k + 1], ea2[k + 2], ea2[k + 3]
            r0, r1, r2, r3 = EB[k], EB[k + 1], EB[k + 2], EB[k + 3]
            for j in range(n):
                x0, x1, x2, x3 = r0[j], r1[j], r2[j], r3[j]
                em[j] = _raise(em[j], max(max(e0 * x0, e1 * x1), max(e2 * x2, e3 * x3)))
                em2[j] = _raise(em2[j], max(max(f0 * x0, f1 * x1), max(f2 * x2, f3 * x3)))
            k += 4
        while k < hi:
            e0, f0, r0 = ea[k], ea2[k], EB[k]
            for j in range(n):
                em[j] = _raise(em[j], e0 * r0[j])
                em2[j] = _raise(em2[j], f0 * r0[j])
            k += 1
    else:
        while k + 4 <= hi:
            a0, a1, a2_, a3 = a[k], a[k + 1], a[k + 2], a[k + 3]
            b0, b1, b2, b3 = a2[k], a2[k + 1], a2[k + 2], a2[k + 3]
            r0, r1, r2, r3 = B[k], B[k + 1], B[k + 2], B[k + 3]
            for j in range(n):
                x0, x1, x2, x3 = r0[j], r1[j], r2[j], r3[j]
                w01 = max(pow2_of(a0 * x0), pow2_of(a1 * x1))
                w23 = max(pow2_of(a2_ * x2), pow2_of(a3 * x3))
                em[j] = _raise(em[j], max(w01, w23))
                v01 = max(pow2_of(b0 * x0), pow2_of(b1 * x1))
                v23 = max(pow2_of(b2 * x2), pow2_of(b3 * x3))
                em2[j] = _raise(em2[j], max(v01, v23))
            k += 4
        while k < hi:
            a0, b0, r0 = a[k], a2[k], B[k]
            for j in range(n):
                em[j] = _raise(em[j], pow2_of(a0 * r0[j]))
                em2[j] = _raise(em2[j], pow2_of(b0 * r0[j]))
            k += 1


@ljit
def _terms2(a, a2, B, sc, sc2, tot, tot2, lo, hi, n):
    """:func:`_terms` for two rows ``a``, ``a2`` at once (each load of B serves both)."""
    k = lo
    while k + 4 <= hi:
        a0, a1, a2_, a3 = a[k], a[k + 1], a[k + 2], a[k + 3]
        b0, b1, b2, b3 = a2[k], a2[k + 1], a2[k + 2], a2[k + 3]
        r0, r1, r2, r3 = B[k], B[k + 1], B[k + 2], B[k + 3]
        for j in range(n):
            x0, x1, x2, x3 = r0[j], r1[j], r2[j], r3[j]
            s, s2 = sc[j], sc2[j]
            t01 = np.trunc((a0 * x0) * s) + np.trunc((a1 * x1) * s)
            t23 = np.trunc((a2_ * x2) * s) + np.trunc((a3 * x3) * s)
            tot[j] += t01 + t23
            u01 = np.trunc((b0 * x0) * s2) + np.trunc((b1 * x1) * s2)
            u23 = np.trunc((b2 * x2) * s2) + np.trunc((b3 * x3) * s2)
            tot2[j] += u01 + u23
        k += 4
    while k < hi:
        a0, b0, r0 = a[k], a2[k], B[k]
        for j in range(n):
            x0 = r0[j]
            tot[j] += np.trunc((a0 * x0) * sc[j])
            tot2[j] += np.trunc((b0 * x0) * sc2[j])
        k += 1


@ljit
def _scales(c, n, mp, w):
    """From the alignment weights ``w.em``: the scale 2**F / em of every term, the scale back em / 2**F, and the
    incoming accumulator's own term ``trunc(c * scale)``."""
    em, sc, back, tot = w.em, w.sc, w.back, w.tot
    two_f = mp.two_f
    inv_f = 1.0 / two_f
    for j in range(n):
        e = em[j]
        s = two_f * recip_pow2(e) if e != 0.0 else 0.0
        sc[j] = s
        back[j] = e * inv_f
        tot[j] = np.trunc(c[j] * s) + 0.0


@jit
def _normalize(c, n, lane, w):
    """c[j] = the block sum ``tot[j] * back[j]`` (exact) rounded into the accumulator lane ``lane`` (its mode
    dispatched here, outside the loop)."""
    r = lane_of(lane)  # (a record's fields, read once)
    tot, back = w.tot, w.back
    if rz_f32(r):
        for j in range(n):
            c[j] = lround_rz_f32(tot[j] * back[j])
    elif r.mode == RoundingMode.TOWARD_ZERO:
        for j in range(n):
            c[j] = lround_rz(tot[j] * back[j], r)
    elif r.mode == RoundingMode.NEAREST_EVEN:
        for j in range(n):
            c[j] = lround_ne(tot[j] * back[j], r)
    else:
        for j in range(n):
            c[j] = lround(tot[j] * back[j], r)


@ljit
def _acc_weight(c, acc_lo, zero_w):
    """The alignment weight of the incoming accumulator: 2**exponent, at least ``acc_lo``; ``zero_w`` for 0 (the
    MMA record's fields, read by the caller before its loop)."""
    p = pow2_of(c)
    return (p if p > acc_lo else acc_lo) if p != 0.0 else zero_w


@jit
def _block_step(a, ea, B, EB, c, n, lo, hi, mp, w):
    """One block-FMA step, k in [lo, hi) (at most one block), for outputs c[:n] (updated in place). Alignment
    weights are powers of two held as float64 (``em[j]`` = 2**emax of output j), so every loop vectorizes (see
    simfloat._lanes). The caller has checked that every weight lies within 2**+-450 (see :func:`row_mma`)."""
    em = w.em
    acc_lo, zero_w = mp.acc_lo, mp.zero_w
    for j in range(n):
        em[j] = _acc_weight(c[j], acc_lo, zero_w)
    _weights(a, ea, B, EB, em, lo, hi, n, mp.align_sum)
    _scales(c, n, mp, w)
    if mp.group > 1:
        _terms_grouped(a, B, w.sc, w.tot, w.part, lo, hi, n, mp.group)
    else:
        _terms(a, B, w.sc, w.tot, lo, hi, n)
    _normalize(c, n, mp.acc, w)


@jit
def _block_step2(a, ea, a2, ea2, B, EB, c, c2, n, lo, hi, mp, w, w2):
    """:func:`_block_step` for two rows (``a`` into ``c`` with scratch ``w``, ``a2`` into ``c2`` with ``w2``),
    the same bits as two calls."""
    em, em2 = w.em, w2.em
    acc_lo, zero_w = mp.acc_lo, mp.zero_w
    for j in range(n):
        em[j] = _acc_weight(c[j], acc_lo, zero_w)
        em2[j] = _acc_weight(c2[j], acc_lo, zero_w)
    _weights2(a, ea, a2, ea2, B, EB, em, em2, lo, hi, n, mp.align_sum)
    _scales(c, n, mp, w)
    _scales(c2, n, mp, w2)
    if mp.group > 1:
        _terms_grouped(a, B, w.sc, w.tot, w.part, lo, hi, n, mp.group)
        _terms_grouped(a2, B, w2.sc, w2.tot, w2.part, lo, hi, n, mp.group)
    else:
        _terms2(a, a2, B, w.sc, w2.sc, w.tot, w2.tot, lo, hi, n)
    _normalize(c, n, mp.acc, w)
    _normalize(c2, n, mp.acc, w2)


@jit
def _block_row(a, ea, B, EB, c, n, k0, k1, mp, w):
    """Block-FMA steps over k in [k0, k1) for outputs c[:n] (updated in place), block by block."""
    lo = k0
    while lo < k1:
        hi = min(k1, lo + mp.block)
        _block_step(a, ea, B, EB, c, n, lo, hi, mp, w)
        lo = hi
