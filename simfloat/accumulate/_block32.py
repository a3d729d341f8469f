"""Block FMA, float32 form: the bits of :mod:`simfloat.accumulate._block` with twice the lanes per vector, where
the operands allow.

Operands of at most 12 significant bits, shifted by powers of two so that every weight, product and term scale is
a normal float32 (:func:`operand32` for B once per call, :func:`_shift32` per row); terms truncated by the
conversion to int32 and summed in int32 (a block's sum fits: ``MMA.sums32``); the accumulator's own term stays
float64.
"""

from __future__ import annotations

import numpy as np

from simfloat._jit import bits_f64, f64_bits, jit, ljit
from simfloat._lanes import lround_rz_f32, recip_pow2, rz_f32
from simfloat.accumulate._block import _acc_weight, _normalize
from simfloat.accumulate._mma import K_BLOCK, MMA, N_FMA32

_F32_LO = 2.0**-126  # float32's least normal magnitude


_B32_TOP = 2.0**100  # the block float32 form shifts B so that its largest weight is this


@ljit
def _raise32(m, x):
    """:func:`_raise` in float32."""
    return x if x > m else m + np.float32(0.0)


_LOW41 = np.uint64((1 << 41) - 1)  # a float64's fraction bits below its 11 leading ones


_EXP_BITS = np.uint64(0x7FF << 52)  # a float64's exponent field (inf's bits: the least weight of no value)


@ljit
def _span32(x, ex, kk):
    """For the block float32 form: (the largest weight in ``ex[:kk]``, the least weight 2**floor(log2 |x|) of a
    nonzero ``x[:kk]`` (inf if none), whether every value has at most 12 significant bits, so that a product of
    two is exact in float32). Values are zero or normal float64 (tame); the reductions run on the bits (integer
    max, min and or vectorize, float ones do not without fastmath)."""
    hi = np.uint64(0)
    lo = _EXP_BITS
    low = np.uint64(0)
    for k in range(kk):
        bx = f64_bits(x[k])
        pb = bx & _EXP_BITS
        hi = max(hi, f64_bits(ex[k]))
        lo = min(lo, pb if pb != 0 else _EXP_BITS)
        low |= bx & _LOW41
    return bits_f64(hi), bits_f64(lo), low == 0


@ljit
def _shift32(a, ea, kk, mp):
    """The power of two a row ``a`` is scaled by in the block float32 form (its largest weight becomes 1), or 0
    when the form does not apply to it: values with over 12 significant bits, or a nonzero product that would
    not be a normal float32, or whose block's term scale 2**F / emax would pass 2**126, or a weight below
    float32's normal range. With B shifted by ``mp.b_shift`` (largest weight 2**100), every product is below
    2**102 and every weight and product is exact in float32."""
    hi, lo, ok = _span32(a, ea, kk)
    if not ok:
        return 0.0
    if hi == 0.0:
        return 1.0
    sh = recip_pow2(hi)
    need = max(_F32_LO, mp.two_f * 2.0**-126)
    if lo * sh < _F32_LO or lo * sh * mp.b_lo < need:
        return 0.0
    return sh


@ljit
def _load32(a, ea, sh, a32, e32, kk):
    for k in range(kk):
        a32[k] = np.float32(a[k] * sh)
        e32[k] = np.float32(ea[k] * sh)


@ljit
def _weights32(e, EB, em, lo, hi, n):
    """:func:`_weights` (exponent-sum alignment) in float32 on shifted weights."""
    k = lo
    while k + 4 <= hi:
        e0, e1, e2, e3 = e[k], e[k + 1], e[k + 2], e[k + 3]
        r0, r1, r2, r3 = EB[k], EB[k + 1], EB[k + 2], EB[k + 3]
        for j in range(n):
            em[j] = _raise32(em[j], max(max(e0 * r0[j], e1 * r1[j]), max(e2 * r2[j], e3 * r3[j])))
        k += 4
    while k < hi:
        e0, r0 = e[k], EB[k]
        for j in range(n):
            em[j] = _raise32(em[j], e0 * r0[j])
        k += 1


@ljit
def _weights32_2(e, e2, EB, em, em2, lo, hi, n):
    """:func:`_weights32` for two rows (each load of EB serves both)."""
    k = lo
    while k + 4 <= hi:
        e0, e1, e2_, e3 = e[k], e[k + 1], e[k + 2], e[k + 3]
        f0, f1, f2, f3 = e2[k], e2[k + 1], e2[k + 2], e2[k + 3]
        r0, r1, r2, r3 = EB[k], EB[k + 1], EB[k + 2], EB[k + 3]
        for j in range(n):
            x0, x1, x2, x3 = r0[j], r1[j], r2[j], r3[j]
            em[j] = _raise32(em[j], max(max(e0 * x0, e1 * x1), max(e2_ * x2, e3 * x3)))
            em2[j] = _raise32(em2[j], max(max(f0 * x0, f1 * x1), max(f2 * x2, f3 * x3)))
        k += 4
    while k < hi:
        e0, f0, r0 = e[k], e2[k], EB[k]
        for j in range(n):
            em[j] = _raise32(em[j], e0 * r0[j])
            em2[j] = _raise32(em2[j], f0 * r0[j])
        k += 1


@ljit
def _terms32(a, B, s, t, lo, hi, n):
    """:func:`_terms` in float32: each product (exact) times its scale (exact: a power of two, no overflow, a
    normal product) truncated toward zero by the conversion to int32, summed in int32 (exact: ``mp.sums32``)."""
    k = lo
    while k + 4 <= hi:
        a0, a1, a2, a3 = a[k], a[k + 1], a[k + 2], a[k + 3]
        r0, r1, r2, r3 = B[k], B[k + 1], B[k + 2], B[k + 3]
        for j in range(n):
            sj = s[j]
            t01 = np.int32((a0 * r0[j]) * sj) + np.int32((a1 * r1[j]) * sj)
            t23 = np.int32((a2 * r2[j]) * sj) + np.int32((a3 * r3[j]) * sj)
            t[j] += t01 + t23
        k += 4
    while k < hi:
        a0, r0 = a[k], B[k]
        for j in range(n):
            t[j] += np.int32((a0 * r0[j]) * s[j])
        k += 1


@ljit
def _terms32_2(a, a2, B, s, s2, t, t2, lo, hi, n):
    """:func:`_terms32` for two rows (each load of B serves both)."""
    k = lo
    while k + 4 <= hi:
        a0, a1, a2_, a3 = a[k], a[k + 1], a[k + 2], a[k + 3]
        b0, b1, b2, b3 = a2[k], a2[k + 1], a2[k + 2], a2[k + 3]
        r0, r1, r2, r3 = B[k], B[k + 1], B[k + 2], B[k + 3]
        for j in range(n):
            x0, x1, x2, x3 = r0[j], r1[j], r2[j], r3[j]
            sj, sj2 = s[j], s2[j]
            t[j] += (np.int32((a0 * x0) * sj) + np.int32((a1 * x1) * sj)) + (
                np.int32((a2_ * x2) * sj) + np.int32((a3 * x3) * sj)
            )
            t2[j] += (np.int32((b0 * x0) * sj2) + np.int32((b1 * x1) * sj2)) + (
                np.int32((b2 * x2) * sj2) + np.int32((b3 * x3) * sj2)
            )
        k += 4
    while k < hi:
        a0, b0, r0 = a[k], a2[k], B[k]
        for j in range(n):
            x0 = r0[j]
            t[j] += np.int32((a0 * x0) * s[j])
            t2[j] += np.int32((b0 * x0) * s2[j])
        k += 1


@ljit
def _scales32(c, n, mp, w, sh):
    """:func:`_scales` for the float32 form of a row shifted by ``sh`` (its products by ``sh * mp.b_shift``):
    the alignment weight from the accumulator's (float64) and the shifted products' largest (``w.em32``), the
    term scale both in float64 and shifted into float32 (0 where it would pass 2**126: then every product of
    the block is zero), the accumulator's own term; the int32 term sums ``w.t32`` cleared."""
    em32, s32, t32, back, tot = w.em32, w.s32, w.t32, w.back, w.tot
    shift = sh * mp.b_shift
    inv = 1.0 / shift
    two_f = mp.two_f
    inv_f = 1.0 / two_f
    acc_lo, zero_w = mp.acc_lo, mp.zero_w
    for j in range(n):
        e = max(_acc_weight(c[j], acc_lo, zero_w), np.float64(em32[j]) * inv)
        s = two_f * recip_pow2(e) if e != 0.0 else 0.0
        back[j] = e * inv_f
        tot[j] = np.trunc(c[j] * s) + 0.0
        v = s * inv
        s32[j] = np.float32(v if v <= 2.0**126 else 0.0)
        t32[j] = 0


@ljit
def _sum32(n, w):
    tot, t32 = w.tot, w.t32
    for j in range(n):
        tot[j] += np.float64(t32[j])


@jit
def _block_step32(a, e, sh, B32, EB32, c, n, lo, hi, mp, w):
    """:func:`_block_step` in the float32 form: ``a``, ``e`` the row's values and weights shifted by ``sh``
    (float32), ``B32``, ``EB32`` B's shifted by ``mp.b_shift``; the same bits."""
    em = w.em32
    for j in range(n):
        em[j] = np.float32(0.0)
    _weights32(e, EB32, em, lo, hi, n)
    _scales32(c, n, mp, w, sh)
    _terms32(a, B32, w.s32, w.t32, lo, hi, n)
    _sum32(n, w)
    _normalize(c, n, mp.acc, w)


@ljit
def _scales32_2(c, c2, n, mp, w, w2, sh, sh2):
    """:func:`_scales32` for two rows (shifted by ``sh``, ``sh2``) in one pass over the outputs."""
    em32, s32, t32, back, tot = w.em32, w.s32, w.t32, w.back, w.tot
    fm32, f32s, u32, back2, tot2 = w2.em32, w2.s32, w2.t32, w2.back, w2.tot
    inv, inv2 = 1.0 / (sh * mp.b_shift), 1.0 / (sh2 * mp.b_shift)
    two_f = mp.two_f
    inv_f = 1.0 / two_f
    acc_lo, zero_w = mp.acc_lo, mp.zero_w
    for j in range(n):
        e = max(_acc_weight(c[j], acc_lo, zero_w), np.float64(em32[j]) * inv)
        s = two_f * recip_pow2(e) if e != 0.0 else 0.0
        back[j] = e * inv_f
        tot[j] = np.trunc(c[j] * s) + 0.0
        v = s * inv
        s32[j] = np.float32(v if v <= 2.0**126 else 0.0)
        t32[j] = 0
        e2 = max(_acc_weight(c2[j], acc_lo, zero_w), np.float64(fm32[j]) * inv2)
        s2 = two_f * recip_pow2(e2) if e2 != 0.0 else 0.0
        back2[j] = e2 * inv_f
        tot2[j] = np.trunc(c2[j] * s2) + 0.0
        v2 = s2 * inv2
        f32s[j] = np.float32(v2 if v2 <= 2.0**126 else 0.0)
        u32[j] = 0


@jit
def _block_step32_2(a, e, sh, a2, e2, sh2, B32, EB32, c, c2, n, lo, hi, mp, w, w2):
    """:func:`_block_step32` for two rows, the same bits as two calls; an IEEE float32 accumulator rounded toward
    zero (the tensor cores' own, :func:`simfloat._lanes.rz_f32`) is summed and rounded in one pass over the
    outputs (:func:`simfloat._lanes.lround_rz_f32`)."""
    em, em2 = w.em32, w2.em32
    for j in range(n):
        em[j] = np.float32(0.0)
        em2[j] = np.float32(0.0)
    _weights32_2(e, e2, EB32, em, em2, lo, hi, n)
    _scales32_2(c, c2, n, mp, w, w2, sh, sh2)
    _terms32_2(a, a2, B32, w.s32, w2.s32, w.t32, w2.t32, lo, hi, n)
    if rz_f32(mp.acc):
        tot, t32, back = w.tot, w.t32, w.back
        tot2, u32, back2 = w2.tot, w2.t32, w2.back
        for j in range(n):
            c[j] = lround_rz_f32((tot[j] + np.float64(t32[j])) * back[j])
            c2[j] = lround_rz_f32((tot2[j] + np.float64(u32[j])) * back2[j])
    else:
        _sum32(n, w)
        _sum32(n, w2)
        _normalize(c, n, mp.acc, w)
        _normalize(c2, n, mp.acc, w2)


def operand32(mp: MMA, b: np.ndarray, eb: np.ndarray, *, rows: bool = True) -> tuple[MMA, np.ndarray, np.ndarray]:
    """The float32 forms of the B operands ``b`` (L, K, N) with weights ``eb`` for :func:`rows_mma` (``rows``)
    or :func:`row_mma`, and the record that goes with them: for the float32 FMA loop, which only rows_mma runs
    on float32 copies, ``b`` as float32 when ``rows`` (its values are float32 values: :func:`for_operands`
    checked); for block FMA whose block sums fit int32 (``mp.sums32``), ``b`` and ``eb`` shifted by a power of
    two (largest weight 2**100, recorded as ``b_shift`` with the least nonzero weight ``b_lo``) when every value
    has at most 12 significant bits and the shifted ones stay normal float32. Otherwise (L, 0, 0) arrays: the
    float64 forms apply."""
    empty = np.zeros((b.shape[0], 0, 0), dtype=np.float32)
    if not (mp.fast and mp.chunk == 0) or b.size == 0:
        return mp, empty, empty
    if mp.native == N_FMA32:
        return mp, (b.astype(np.float32) if rows else empty), empty
    if not (mp.kind == K_BLOCK and mp.sums32 and mp.tame):
        return mp, empty, empty
    hi, lo, ok = _span32(np.ascontiguousarray(b).reshape(-1), np.ascontiguousarray(eb).reshape(-1), b.size)
    shift = _B32_TOP / hi if hi > 0.0 else 1.0
    if not ok or lo * shift < _F32_LO:
        return mp, empty, empty
    b32 = (b * shift).astype(np.float32)
    return mp._replace(b_shift=float(shift), b_lo=float(lo * shift)), b32, (eb * shift).astype(np.float32)
