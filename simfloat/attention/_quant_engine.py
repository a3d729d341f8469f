"""The vectorized engine of the quantized (INT8 / FP8) flash attention: the same dataflow, op for op and bit for
bit, as the scalar reference :func:`simfloat.attention.reference.forward.units` (steps listed in
:mod:`simfloat.attention.quantized`), on the float engine's building blocks.

What is shared with float flash (:mod:`simfloat.attention._engine`): the dots are the multi-row kernels of
:mod:`simfloat.accumulate._rows` (a q tile's scores against a key tile are one ``rows_mma`` call whose
innermost loop runs over keys; each key tile's P.V one call over the head dimension; the exact INT8 x INT8 ->
INT32 dot is the float64 multiply-add loop, exact on integer codes), the casts, scalings, divisions,
``fma(s, s_scale, -m)``, exp / exp2 and the sequential row sum are the float engine's element-wise helpers,
and the tiles are walked as there (a q tile's rows meet the key tiles one at a time). What this module adds
are the steps float flash does not have, as branch-free loops over a row segment: the scores' dequantization
by per-key scales, the P quantizer (fixed-scale integer codes, a float cast, or block-scaled codes per key tile:
the reference's :func:`~simfloat.attention._quant_kernels.block_p_codes`), the per-channel V descale and
the four P.V update forms (``separate``, ``into_acc``, ``scaled``, ``two_level``). Running state (m_i, l_i, alpha) stays
scalar, as in the kernel. A block-scaled MMA (NVFP4/MX) is a block-FMA row kernel on scaled operands
(:func:`simfloat.accumulate._rows.scaled_mma`): Q's, K's and V's codes times their block scales and their weights come
from the builder, P's are made per key tile here. Tracing runs on the reference kernel only.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from simfloat._jit import jit, ljit
from simfloat._lanes import Lane, ladd, lfma, lmul, lround
from simfloat.accumulate._rows import MMA, Rows, rows_mma, rows_work, scaled_powers
from simfloat.attention._engine import (
    _cast,
    _divide,
    _exp_of,
    _row_max,
    _scale_by,
    _scaled,
    _seq_sum,
    _weights_of,
    row_keys,
    tile_span,
)
from simfloat.attention._kernels import add, div, exp, exp2, fma, fmax, mul, rnd, sub
from simfloat.attention._quant_kernels import K_BLOCK, block_p_codes

__all__ = ["QEngine", "QLanes", "QOperands", "quant_units"]

_NINF = -np.inf
# QParams codes (simfloat.attention._quant_kernels)
_K_NONE, _K_INT, _K_FLOAT, _K_FFLOAT = range(4)
_R_NEAREST_EVEN, _R_NEAREST_AWAY, _R_TOWARD_ZERO, _R_HALF_UP, _R_HALF_UP_UNFUSED = range(5)
_PV_SEPARATE, _PV_INTO_ACC, _PV_SCALED, _PV_TWO_LEVEL = range(4)
_DELTA_NONE, _DELTA_MMA, _DELTA_SCORES = range(3)


class QLanes(NamedTuple):
    """The lane form (:func:`simfloat._lanes.lane`) of every scalar op of a quantized plan, plus P's quantizer
    casts: ``p_pre`` (its ``pre``), ``p_arith`` (``t * qmax (+ 0.5)``), ``p_code`` (a float code's cast)."""

    dequant: Lane
    scale: Lane
    exp: Lane
    acc: Lane
    l_i: Lane
    pv_dequant: Lane
    normalize: Lane
    out: Lane
    p_pre: Lane
    p_arith: Lane
    p_code: Lane


class QEngine(NamedTuple):
    """Everything a row needs besides its operands.

    Attributes:
        qp: the plan's :class:`~simfloat.attention._quant_kernels.QParams` (scalar ops, quantizer codes, flags).
        ln: :class:`QLanes`.
        qk, pv: the dots as :class:`~simfloat.accumulate._rows.MMA` records (on the codes).
        fma_exact: ``s * s_scale`` is exact in float64 (the contracted scale op may use lane form).
        acc_exact: ``acc * alpha`` is exact (the contracted accumulator update may use lane form).
        pvd_exact: ``pv * v_scale`` is exact (the fused ``scaled`` update may use lane form).
        p_exact: ``t * qmax`` of P's fixed-scale quantizer is exact.
        l_native32: the row sum's additions are float32 additions of float32 values (done as such).
        bm, bn: tile sizes (as requested: per-block scales follow them); causal; seq_k: keys.
        no_tab: an empty ex2 table (the quantized plans' exp2 is correctly rounded).
        pv_scaled: the P.V dot is a block-scaled MMA (``pv`` is its ``scaled_mma`` record):
            P's operand is its codes times their block scales, with ``scaled_powers`` weights.
        pv_scale_lo, pv_elems: those weights' ``scale_lo`` and ``elems``.
    """

    qp: object
    ln: QLanes
    qk: MMA
    pv: MMA
    fma_exact: bool
    acc_exact: bool
    pvd_exact: bool
    p_exact: bool
    l_native32: bool
    bm: int
    bn: int
    causal: bool
    seq_k: int
    no_tab: np.ndarray
    pv_scaled: bool
    pv_scale_lo: float
    pv_elems: bool


class QOperands(NamedTuple):
    """Codes, scales and alignment weights per lead index.

    Attributes:
        q: (L, Sq, D) Q codes (in the qk model's input format; a block-scaled qk: codes times block scales).
            eq: their weights. qs: (L, Sq) per-row scales.
        kt: (L * n_tiles, D, bn) K codes, transposed tile by tile, zero-padded. ekt: weights.
        ks: (L, n_tiles * bn) per-key scales (1 past the sequence).
        v: (L * n_tiles, bn, Dv) V codes tile by tile, zero-padded. ev: weights.
        vs: (L, n_tiles, Dv) V scales per key tile and channel.
        ds: (L, n_q_tiles, n_tiles * bn) Q smoothing's correction delta_s per q tile and key (unused without).
        kt32, ekt32, v32, ev32: ``kt``, ``v`` and their weights in the float32 forms of their dots
            (:func:`simfloat.accumulate._rows.operand32`); else one empty matrix per tile.
    """

    q: np.ndarray
    eq: np.ndarray
    qs: np.ndarray
    kt: np.ndarray
    ekt: np.ndarray
    ks: np.ndarray
    v: np.ndarray
    ev: np.ndarray
    vs: np.ndarray
    ds: np.ndarray
    kt32: np.ndarray
    ekt32: np.ndarray
    v32: np.ndarray
    ev32: np.ndarray


class QScratch(NamedTuple):
    s: np.ndarray  # (bm, bn) scores of the q tile's rows against one key tile
    p: np.ndarray  # (bm, bn) P of that tile
    pc: np.ndarray  # (bm, bn) P's codes (zeros past the visible keys)
    pin: np.ndarray  # (bm, bn) the codes as the P.V dot reads them (its input format)
    ep: np.ndarray  # (bm, bn) their alignment weights
    y: np.ndarray  # (bm, dv) one tile's P.V
    acc: np.ndarray  # (bm, dv): the q tile's accumulators
    m: np.ndarray  # (bm,) running maxima
    l: np.ndarray  # (bm,) running row sums  # noqa: E741
    qss: np.ndarray  # (bm,) folded: qk_scale * q_scale per row
    alpha: np.ndarray  # (bm,) this key tile's alpha per row
    rs: Rows
    psc: np.ndarray  # (bm, bn) a block P quantizer's per-key block scales
    s1: np.ndarray  # (bm,) its per-row first-level scale (1 for one level)


# -- element-wise steps that float flash does not have -----------------------------------------------------------


@jit
def _mul_each(x, y, y0, n, r, o):
    """x[:n] = op(x[:n] * y[y0:y0+n])."""
    if r.fast:
        for j in range(n):
            x[j] = lmul(x[j], y[y0 + j], r)
    else:
        for j in range(n):
            x[j] = mul(x[j], y[y0 + j], o)


@jit
def _acc_update(acc, y, n, alpha, contract, exact, r, o):
    """acc[:n] = op(fma(acc, alpha, y)) (contract) or op(op(acc * alpha) + y)."""
    if contract:
        if exact and r.fast:
            for j in range(n):
                acc[j] = lfma(acc[j], alpha, y[j], r)
        else:
            for j in range(n):
                acc[j] = fma(acc[j], alpha, y[j], o)
    elif r.fast:
        for j in range(n):
            acc[j] = ladd(lmul(acc[j], alpha, r), y[j], r)
    else:
        for j in range(n):
            acc[j] = add(mul(acc[j], alpha, o), y[j], o)


@jit
def _fma_scaled(acc, y, vs, n, exact, r, o):
    """acc[:n] = op(fma(y, vs, acc)) (the ``scaled`` P.V update; acc already holds acc * alpha)."""
    if exact and r.fast:
        for j in range(n):
            acc[j] = lfma(y[j], vs[j], acc[j], r)
    else:
        for j in range(n):
            acc[j] = fma(y[j], vs[j], acc[j], o)


@ljit
def _int_rule(y, qmax, rule):
    """clamp(round_rule(y), +-qmax) (nearest-even, nearest-away, toward zero), branch-free."""
    a = np.floor(np.abs(y) + 0.5)
    away = a if y >= 0.0 else -a
    r = np.trunc(y) + 0.0  # + 0: an integer conversion's zero is +0
    r = np.rint(y) if rule == _R_NEAREST_EVEN else r
    r = away if rule == _R_NEAREST_AWAY else r
    return min(max(r, -qmax), qmax)


@jit
def _p_codes(p, pc, nv, eng):
    """pc[:nv] = P's codes of p[:nv] (quantized.py's p_quant): int: ``t = pre(p)``, half_up
    ``trunc(arith(t * qmax + 0.5))`` (one rounding) or half_up_unfused (two), else
    ``round_rule(arith(t * qmax))``, clamped to +-qmax; float: ``code(pre(p))``; fixed-scale float:
    ``code(clamp(arith(t * qmax), +-qmax))``; none: p."""
    qp, ln = eng.qp, eng.ln
    for j in range(nv):
        pc[j] = p[j]
    if qp.p_kind == _K_NONE:
        return
    if qp.p_pre:
        _cast(pc, 0, nv, ln.p_pre, qp.p_pre_op)
    if qp.p_kind == _K_FLOAT:
        _cast(pc, 0, nv, ln.p_code, qp.p_code)
        return
    qm, rule, r, o = qp.p_qmax, qp.p_rule, ln.p_arith, qp.p_arith
    if qp.p_kind == _K_FFLOAT:
        if r.fast:
            for j in range(nv):
                pc[j] = min(max(lmul(pc[j], qm, r), -qm), qm)
        else:
            for j in range(nv):
                pc[j] = min(max(mul(pc[j], qm, o), -qm), qm)
        _cast(pc, 0, nv, ln.p_code, qp.p_code)
        return
    if rule == _R_HALF_UP:
        if eng.p_exact and r.fast:
            for j in range(nv):
                pc[j] = min(max(np.trunc(lfma(pc[j], qm, 0.5, r)) + 0.0, -qm), qm)
        else:
            for j in range(nv):
                pc[j] = min(max(np.trunc(fma(pc[j], qm, 0.5, o)) + 0.0, -qm), qm)
    elif rule == _R_HALF_UP_UNFUSED:
        if r.fast:
            for j in range(nv):
                pc[j] = min(max(np.trunc(ladd(lmul(pc[j], qm, r), 0.5, r)) + 0.0, -qm), qm)
        else:
            for j in range(nv):
                pc[j] = min(max(np.trunc(add(mul(pc[j], qm, o), 0.5, o)) + 0.0, -qm), qm)
    elif r.fast:
        for j in range(nv):
            pc[j] = _int_rule(lmul(pc[j], qm, r), qm, rule)
    else:
        for j in range(nv):
            pc[j] = _int_rule(mul(pc[j], qm, o), qm, rule)


@jit
def _p_operand(pc, pin, ep, bn, eng):
    """P's codes pc[:bn] as the P.V dot reads them: rounded into its input format (pin) where it has one, and
    their alignment weights (ep) where it aligns by the operands' exponents."""
    src = pc
    if eng.pv.in_round:  # the dot's operand format
        for jj in range(bn):
            pin[jj] = lround(pc[jj], eng.pv.inp)
        src = pin
    if eng.pv.align_sum:
        _weights_of(src, ep, bn, eng.pv.opnd_emin)


@jit
def _block_p_operand(pc, psc, pin, ep, bn, eng):
    """A block P quantizer's codes pc[:bn] with their block scales psc: a block-scaled P.V MMA reads the scaled
    codes pin = pc * psc with ``scaled_powers`` weights; any other dot the values (pc
    becomes pc * psc, exact, as in the reference) as :func:`_p_operand` prepares them."""
    if eng.pv_scaled:
        for jj in range(bn):
            pin[jj] = pc[jj] * psc[jj]
        scaled_powers(pc, psc, ep, bn, eng.pv.opnd_emin, eng.pv_scale_lo, eng.pv_elems)
        return
    for jj in range(bn):
        pc[jj] = pc[jj] * psc[jj]
    _p_operand(pc, pin, ep, bn, eng)


# -- the tile step -------------------------------------------------------------------------------------------------


@ljit
def _quant_row(b, i, r, nv, jt, xs, eng, sc):
    """Row r (query i) of the q tile against key tile jt, up to its P.V dot: dequantization of the scores
    sc.s[r, :nv], softmax state, P's quantizer (sc.pc[r], the dot's operand sc.pin[r] / weights sc.ep[r]), row
    sum; acc[r] rescaled first for the ``into_acc`` form; sc.m/l/alpha[r] updated."""
    qp, ln = eng.qp, eng.ln
    bn = eng.bn
    dv = sc.acc.shape[1]
    s, p, pc, pin, ep = sc.s[r], sc.p[r], sc.pc[r], sc.pin[r], sc.ep[r]
    m_i, l_i = sc.m[r], sc.l[r]
    j0 = jt * bn
    sscale = qp.qk_scale
    if qp.folded:  # FP8 T2: s_scale = qs_scale * k_scale (per key tile)
        sscale = mul(sc.qss[r], xs.ks[b, j0], qp.scale)
    if not qp.folded:  # INT8 T4, T5: the scores dequantized by the row's and each key's scale
        _scale_by(s, nv, xs.qs[b, i], ln.dequant, qp.dequant)
        _mul_each(s, xs.ks[b], j0, nv, ln.dequant, qp.dequant)
        if qp.delta_mode == _DELTA_SCORES:  # Q smoothing's correction on the dequantized scores
            ds = xs.ds[b, i // eng.bm]
            for jj in range(nv):
                s[jj] = add(s[jj], ds[j0 + jj], qp.dequant)
    smax = _row_max(s, 0, nv)
    m_new = m_i
    if smax != _NINF:
        m_new = fmax(m_i, mul(smax, sscale, qp.scale))
        if m_new != m_i:
            m_new = rnd(m_new, qp.m_i)
    m_sub = 0.0 if m_new == _NINF else m_new
    m_x = m_sub if qp.p_shift == 0.0 else sub(m_sub, qp.p_shift, qp.scale)  # SageAttention3's fixed P shift
    _scaled(p, s, nv, sscale, m_x, qp.contract, eng.fma_exact, ln.scale, qp.scale)
    _exp_of(p, nv, qp.exp2, ln.exp, qp.exp, eng.no_tab)
    alpha = 0.0
    if m_i != _NINF:
        dm = sub(m_i, m_sub, qp.alpha)
        alpha = exp2(dm, qp.alpha) if qp.exp2 else exp(dm, qp.alpha)
    if qp.p_kind == K_BLOCK:  # block-scaled codes (keys nv.. get 0) and each key's block scale, as the reference
        sc.s1[r] = block_p_codes(p, nv, pc, sc.psc[r], qp)
    else:
        _p_codes(p, pc, nv, eng)
        for jj in range(nv, bn):
            pc[jj] = 0.0
    if qp.consistent and qp.p_kind == _K_INT:
        isum = 0.0
        for jj in range(nv):
            isum += pc[jj]  # exact: integers < 2**53
        l_ij = div(isum, qp.p_qmax, qp.l_i)
    else:
        l_ij = _seq_sum(pc if qp.consistent else p, nv, ln.l_i, qp.l_i, eng.l_native32)
    if qp.contract:
        l_new = fma(l_i, alpha, l_ij, qp.l_i)
    else:
        l_new = add(mul(l_i, alpha, qp.l_i), l_ij, qp.l_i)
    if qp.p_kind == K_BLOCK:
        _block_p_operand(pc, sc.psc[r], pin, ep, bn, eng)
    else:
        _p_operand(pc, pin, ep, bn, eng)
    if qp.pv_mode == _PV_INTO_ACC:  # acc(acc * alpha) before the dot adds into it
        _scale_by(sc.acc[r], dv, alpha, ln.acc, qp.acc)
    sc.alpha[r] = alpha
    sc.m[r] = m_new
    sc.l[r] = l_new


@ljit
def _quant_update(b, r, jt, xs, eng, sc):
    """Row r's P.V update from this key tile's dot sc.y[r] (every form but ``into_acc``, whose dot added into
    acc itself)."""
    qp, ln = eng.qp, eng.ln
    dv = sc.acc.shape[1]
    acc, y, alpha = sc.acc[r], sc.y[r], sc.alpha[r]
    vs = xs.vs[b, jt]
    if qp.pv_mode == _PV_TWO_LEVEL:  # acc = acc(fma(acc, alpha, pv(c . v))): a fresh P.V per key tile
        if qp.p_kind == K_BLOCK and qp.p_two_level:  # SageAttention3: P's per-row scale first, pv_dequant(pv * s1)
            _scale_by(y, dv, sc.s1[r], ln.pv_dequant, qp.pv_dequant)
        _acc_update(acc, y, dv, alpha, qp.contract, eng.acc_exact, ln.acc, qp.acc)
    elif qp.pv_mode == _PV_SEPARATE:  # INT8 T17..T19
        _mul_each(y, vs, 0, dv, ln.pv_dequant, qp.pv_dequant)
        if qp.p_kind == _K_INT or qp.p_kind == _K_FFLOAT:
            _divide(y, dv, qp.p_qmax, ln.pv_dequant, qp.pv_dequant)
        _acc_update(acc, y, dv, alpha, qp.contract, eng.acc_exact, ln.acc, qp.acc)
    elif qp.pv_mode == _PV_SCALED:  # scaled (FP8 per-block): acc = pv_dequant(fma(pv, v_scale, acc(acc * alpha)))
        _scale_by(acc, dv, alpha, ln.acc, qp.acc)
        _fma_scaled(acc, y, vs, dv, eng.pvd_exact, ln.pv_dequant, qp.pv_dequant)


@jit
def _quant_tile(b, r0, r1, jt, xs, eng, sc):
    """The rows [r0, r1) of a q tile of lead b against key tile jt (INT8 T2..T19 / FP8 T2..T11): the codes'
    dot for all rows in one multi-row call, the steps up to P.V row by row, the P.V dot for all rows, then each
    row's update. Every row's bits are those of a row-at-a-time walk (a row's outputs depend only on its own
    steps; a causal row's scores past its last key are computed but never read)."""
    qp = eng.qp
    bn, seq_k = eng.bn, eng.seq_k
    dv = xs.v.shape[2]
    g = r1 - r0
    tile = b * (xs.kt.shape[0] // xs.q.shape[0]) + jt
    j0, jv, n_top = tile_span(jt, r1, bn, seq_k, eng.causal)
    s = sc.s
    if qp.delta_mode == _DELTA_MMA:  # SageAttention3: Q smoothing's correction is the MMA's initial accumulator
        ds = xs.ds[b, r0 // eng.bm]
        for r in range(g):
            for jj in range(n_top):
                s[r, jj] = ds[j0 + jj]
    else:
        for r in range(g):
            for jj in range(n_top):
                s[r, jj] = 0.0
    kt, ekt, kt32, ekt32 = xs.kt[tile], xs.ekt[tile], xs.kt32[tile], xs.ekt32[tile]
    rows_mma(xs.q[b, r0:r1], xs.eq[b, r0:r1], kt, ekt, kt32, ekt32, s, g, n_top, eng.qk, sc.rs)
    for r in range(g):
        i = r0 + r
        _quant_row(b, i, r, row_keys(i, j0, jv, eng.causal), jt, xs, eng, sc)
    src = sc.pin if eng.pv.in_round or eng.pv_scaled else sc.pc
    if qp.pv_mode == _PV_INTO_ACC:  # acc = pv(acc(acc * alpha) + c . v)
        rows_mma(src, sc.ep, xs.v[tile], xs.ev[tile], xs.v32[tile], xs.ev32[tile], sc.acc, g, dv, eng.pv, sc.rs)
        return
    y = sc.y
    for r in range(g):
        for d in range(dv):
            y[r, d] = 0.0
    rows_mma(src, sc.ep, xs.v[tile], xs.ev[tile], xs.v32[tile], xs.ev32[tile], y, g, dv, eng.pv, sc.rs)
    for r in range(g):
        _quant_update(b, r, jt, xs, eng, sc)


@jit
def quant_units(lo, hi, xs, out, m_out, l_out, eng):
    """Work units ``[lo, hi)``: unit u is (lead index u // n_q_tiles, q tile u % n_q_tiles); a q tile's rows
    meet the key tiles one at a time, then the epilogue (into_acc: V's descale; ``normalize(acc / l)``;
    ``out``)."""
    qp, ln = eng.qp, eng.ln
    bm, bn, seq_k = eng.bm, eng.bn, eng.seq_k
    seq_q, dv = out.shape[1], out.shape[2]
    n_qt = (seq_q + bm - 1) // bm
    sc = QScratch(
        np.zeros((bm, bn)),
        np.zeros((bm, bn)),
        np.zeros((bm, bn)),
        np.zeros((bm, bn)),
        np.zeros((bm, bn)),
        np.zeros((bm, dv)),
        np.zeros((bm, dv)),
        np.empty(bm),
        np.empty(bm),
        np.empty(bm),
        np.zeros(bm),
        rows_work(bm, max(bn, dv)),
        np.ones((bm, bn)),
        np.ones(bm),
    )
    for u in range(lo, hi):
        b = u // n_qt
        t = u - b * n_qt
        r0, r1 = t * bm, min(seq_q, (t + 1) * bm)
        kv_hi = min((t + 1) * bm, seq_k) if eng.causal else seq_k
        n_kv = (kv_hi + bn - 1) // bn
        for r in range(r1 - r0):
            sc.m[r] = _NINF
            sc.l[r] = 0.0
            for d in range(dv):
                sc.acc[r, d] = 0.0
            if qp.folded:  # FP8 K2: qs_scale = qk_scale * q_scale
                sc.qss[r] = mul(qp.qk_scale, xs.qs[b, r0 + r], qp.scale)
        for jt in range(n_kv):
            _quant_tile(b, r0, r1, jt, xs, eng, sc)
        for i in range(r0, r1):
            acc, l_i = sc.acc[i - r0], sc.l[i - r0]
            o = out[b, i]
            for d in range(dv):
                o[d] = acc[d]
            if qp.pv_mode == _PV_INTO_ACC or qp.pv_mode == _PV_TWO_LEVEL:  # V's descale once (E1)
                _mul_each(o, xs.vs[b, 0], 0, dv, ln.pv_dequant, qp.pv_dequant)
                if qp.p_kind == _K_INT or qp.p_kind == _K_FFLOAT:  # then P's fixed scale
                    _divide(o, dv, qp.p_qmax, ln.pv_dequant, qp.pv_dequant)
            _divide(o, dv, 1.0 if l_i == 0.0 else l_i, ln.normalize, qp.normalize)
            _cast(o, 0, dv, ln.out, qp.out)
            m_out[b, i] = sc.m[i - r0]
            l_out[b, i] = l_i
