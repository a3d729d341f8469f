"""The forward flash loop of the vector engine: one loop for every plan, bit for bit the reference loop
(:mod:`simfloat.attention.reference.forward`; steps listed in :mod:`simfloat.attention.flash` and
:mod:`simfloat.attention.quantized`). The steps that differ between plans (the dots' forms among them) are
:class:`Steps`, kernel values chosen per call from the plan's FlashParams (:func:`steps`).

Shaped so that the work vectorizes: a q tile's rows go together, their scores against a key tile are one call
of the multi-row kernel ``Steps.qk_rows`` (the innermost loop runs over keys) and their P.V one call over the head
dimension; the element-wise ops (scale, exp, the casts and quantizers, rescaling, normalization) are loops of
the branch-free lane functions of :mod:`simfloat._lanes` (the reference's scalar ops where an op's format or
mode has no lane form). Running state (m_i, l_i, alpha) and the sequential row sum stay scalar, as in the
kernel. A plan without quantizers is the dataflow with no quantizer steps: its scores are not dequantized, its
P cast is the float code kind with op ``p``, its P.V is ``into_acc`` (``tl.dot(p, v, acc)``). A block-scaled
MMA (NVFP4/MX) is a block-FMA row kernel on scaled operands (:func:`simfloat.accumulate._rows.scaled_mma`): Q's,
K's and V's codes times their block scales and their weights come from the builder
(:func:`simfloat.attention._build.flash_engine`), P's are made per key tile here.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
from numba import types

from simfloat._jit import Kernel, fingerprint, jit, kernel, kjit, ljit, type_of
from simfloat._lanes import Lane, ladd, lfma, lmul, lround
from simfloat._parallel import run_rows
from simfloat.accumulate._rows import MMA, Rows, rows_form, rows_kernel, rows_work, scaled_powers
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
from simfloat.attention._kernels import (
    add,
    div,
    exp2_hw,
    exp_op,
    fma,
    fmax,
    kv_tile,
    log,
    mul,
    rnd,
    row_sum,
    sub,
)
from simfloat.attention._masks import DENSE_ADD, NO_MASK, KeyMask, key_masked, row_span, tile_range
from simfloat.attention._quant_kernels import (
    DELTA_MMA,
    DELTA_SCORES,
    K_BLOCK,
    K_FFLOAT,
    K_FLOAT,
    K_INT,
    K_NONE,
    PV_INTO_ACC,
    PV_SCALED,
    PV_SEPARATE,
    PV_TWO_LEVEL,
    R_HALF_UP,
    R_HALF_UP_UNFUSED,
    R_NEAREST_AWAY,
    R_NEAREST_EVEN,
    block_p_codes,
)
from simfloat.hardware import ex2_ftz_neg, ex2_poly_f32, tl_sum_mma_f32, tl_sum_mma_rows_f32

__all__ = ["Engine", "Lanes", "Operands", "run", "units"]

_NINF = -np.inf
_LOG2E = math.log2(math.e)


class Lanes(NamedTuple):
    """The lane form (:func:`simfloat._lanes.lane`) of every scalar op of the loop, plus P's cast or quantizer:
    ``p_pre`` (its ``pre``), ``p_arith`` (``t * qmax (+ 0.5)``), ``p_code`` (a float code's cast; the float
    plans' ``p``)."""

    dequant: Lane
    scale: Lane
    exp: Lane
    l_ij: Lane  # the additions of the in-tile row sum (a chunked model's inner ones)
    l_i: Lane
    acc: Lane
    pv_dequant: Lane
    normalize: Lane
    out: Lane
    p_pre: Lane
    p_arith: Lane
    p_code: Lane


class Engine(NamedTuple):
    """Everything a row needs besides its operands.

    Attributes:
        pp: the plan's :class:`~simfloat.attention._flash_params.FlashParams`.
        ln: :class:`Lanes`.
        qk, pv: the dots as :class:`~simfloat.accumulate._rows.MMA` records (on the codes).
        fma_exact: ``s * s_scale`` is exact in float64 (the contracted scale op may use lane form).
        acc_exact: ``acc * alpha`` is exact (the contracted accumulator update may use lane form).
        pvd_exact: ``pv * v_scale`` is exact (the fused ``scaled`` update may use lane form).
        p_exact: ``t * qmax`` of P's fixed-scale quantizer is exact.
        l_native32: the row sum's additions are float32 additions of float32 values (done as such).
        bm, bn: tile sizes; causal; wn: warps along the keys of the measured tl.sum layout; seq_k: keys.
        pv_scaled: the P.V dot is a block-scaled MMA (``pv`` is its ``scaled_mma`` record): P's operand is its
            codes times their block scales, with ``scaled_powers`` weights.
        pv_scale_lo, pv_elems: those weights' ``scale_lo`` and ``elems``.
        ex2_val: the measured ex2 table's values (:func:`simfloat.hardware.ex2_values` of ``pp.ex2_tab``; empty
            without one): T7's ex2.approx.ftz as a table load per score.
    """

    pp: object
    ln: Lanes
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
    wn: int
    seq_k: int
    pv_scaled: bool
    pv_scale_lo: float
    pv_elems: bool
    ex2_val: np.ndarray


class Operands(NamedTuple):
    """Codes, scales and alignment weights per lead index (a plan without quantizers: the values, and
    placeholder scales the loop never reads).

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
        mk: the call's :class:`~simfloat.attention._masks.KeyMask` (``NO_MASK``: none beyond ``causal``).
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
    mk: KeyMask = NO_MASK


class _Scratch(NamedTuple):
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
    l_new: np.ndarray  # (bm,) the row sums after this key tile (FA1's per-step division)
    rs: Rows
    psc: np.ndarray  # (bm, bn) a block P quantizer's per-key block scales
    s1: np.ndarray  # (bm,) its per-row first-level scale (1 for one level)
    lse: np.ndarray  # (bm,) the lse form's running lse_i (Plan.state="lse")
    mr: np.ndarray  # (bm,) the unscaled running maxima (Plan.alpha_raw)
    pt: np.ndarray  # (bn, bm) float32: P transposed, for the rows' tl.sum trees at once
    tw: np.ndarray  # (16, bm) float32: the trees' lane sums
    lij: np.ndarray  # (bm,) l_ij of each row


@jit
def _scratch(bm, bn, dv):
    """One thread's :class:`_Scratch` for q tiles of ``bm`` rows, key tiles of ``bn`` and ``dv`` channels."""
    return _Scratch(
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
        np.empty(bm),
        rows_work(bm, max(bn, dv)),
        np.ones((bm, bn)),
        np.ones(bm),
        np.full(bm, _NINF),
        np.empty(bm),
        np.zeros((bn, bm), dtype=np.float32),
        np.zeros((16, bm), dtype=np.float32),
        np.zeros(bm),
    )


# -- the plan's optional steps, one kernel per variant (see Steps) ------------------------------------------------


@kjit
def _exp_lib(p, nv, eng):
    """T7: p[:nv] = exp(p) or exp2(p) of the plan's exp op (libm's value rounded, or the measured ex2 table)."""
    pp = eng.pp
    _exp_of(p, nv, pp.exp2, eng.ln.exp, pp.exp, pp.ex2_tab)


@kjit
def _exp_tl(p, nv, eng):
    """T7 of ``exp_impl="tl.exp"``: p[:nv] = tl.exp(p), one op each."""
    pp = eng.pp
    for jj in range(nv):
        p[jj] = exp_op(p[jj], pp.exp, pp)


@kjit
def _exp_table(p, nv, eng):
    """T7 of the measured ex2.approx.ftz by its value table (:func:`simfloat.hardware.ex2_ftz_neg`, a table load
    per score; ``Engine.ex2_val``), rounded into the exp op's format as :func:`_exp_lib` rounds."""
    pp, ln = eng.pp, eng.ln
    ex2_ftz_neg(p, nv, eng.ex2_val, pp.ex2_tab)
    _cast(p, 0, nv, ln.exp, pp.exp)


@kjit
def _exp_mixed(p, nv, eng):
    """T7 under FlashAttention-4's exp2 mix: p[:nv] = exp(2**x) by the polynomial where ``pp.ex2_poly`` says so,
    else by the plan's exp2 (``exp2_impl``), as the reference loop."""
    pp = eng.pp
    for jj in range(nv):
        x = p[jj]
        p[jj] = rnd(ex2_poly_f32(x), pp.exp) if pp.ex2_poly[jj] != 0 else exp2_hw(x, pp.exp, pp.ex2_tab)


@kjit
def _sum_tree(p, nv, eng):
    """T8 in the kernel's tl.sum tree (``sum_order`` measured): the in-tile row sum of p over the whole tile."""
    # the kernel's tree runs over the whole tile (p = 0 past nv: set by the caller), as the reference's: a lane
    # whose first value is p_j and whose next is a padding zero rounds p_j into l_ij's format. Over nv alone the
    # bits are the same only when that rounding is exact: float32 additions of float32 values
    if eng.l_native32:  # fp32 nearest-even on fp32 values: the native addition, zeros change nothing
        return tl_sum_mma_f32(p, nv, eng.wn)
    return row_sum(p, eng.bn, eng.pp.l_ij, 1, eng.wn)


@kjit
def _sum_seq(p, nv, eng):
    """T8: the in-tile row sum of p[:nv] left to right under the plan's l_ij model (chunked: per chunk)."""
    pp, ln = eng.pp, eng.ln
    c = pp.l_ij_chunk
    if c == 0:
        return _seq_sum(p, nv, ln.l_ij, pp.l_ij, eng.l_native32)
    s = 0.0
    for c0 in range(0, nv, c):
        s = add(s, _seq_sum(p[c0:], min(c, nv - c0), ln.l_ij, pp.l_ij, eng.l_native32), pp.l_ij_out)
    return s


# -- element-wise steps of the quantizers ------------------------------------------------------------------------


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
    r = np.rint(y) if rule == R_NEAREST_EVEN else r
    r = away if rule == R_NEAREST_AWAY else r
    return min(max(r, -qmax), qmax)


@jit
def _p_codes(p, pc, nv, eng):
    """pc[:nv] = P's codes of p[:nv] (quantized.py's p_quant): int: ``t = pre(p)``, half_up
    ``trunc(arith(t * qmax + 0.5))`` (one rounding) or half_up_unfused (two), else
    ``round_rule(arith(t * qmax))``, clamped to +-qmax; float: ``code(pre(p))``; fixed-scale float:
    ``code(clamp(arith(t * qmax), +-qmax))``; none: p."""
    pp, ln = eng.pp, eng.ln
    for j in range(nv):
        pc[j] = p[j]
    if pp.p_kind == K_NONE:
        return
    if pp.p_pre:
        _cast(pc, 0, nv, ln.p_pre, pp.p_pre_op)
    if pp.p_kind == K_FLOAT:
        _cast(pc, 0, nv, ln.p_code, pp.p_code)
        return
    qm, rule, r, o = pp.p_qmax, pp.p_rule, ln.p_arith, pp.p_arith
    if pp.p_kind == K_FFLOAT:
        if r.fast:
            for j in range(nv):
                pc[j] = min(max(lmul(pc[j], qm, r), -qm), qm)
        else:
            for j in range(nv):
                pc[j] = min(max(mul(pc[j], qm, o), -qm), qm)
        _cast(pc, 0, nv, ln.p_code, pp.p_code)
        return
    if rule == R_HALF_UP:
        if eng.p_exact and r.fast:
            for j in range(nv):
                pc[j] = min(max(np.trunc(lfma(pc[j], qm, 0.5, r)) + 0.0, -qm), qm)
        else:
            for j in range(nv):
                pc[j] = min(max(np.trunc(fma(pc[j], qm, 0.5, o)) + 0.0, -qm), qm)
    elif rule == R_HALF_UP_UNFUSED:
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


@kjit
def _pc_cast(p, pc, psc, nv, eng):
    """T12 of the float plans: pc[:nv] = p(p), zeros past nv."""
    for jj in range(nv):
        pc[jj] = p[jj]
    _cast(pc, 0, nv, eng.ln.p_code, eng.pp.p_code)
    for jj in range(nv, eng.bn):
        pc[jj] = 0.0
    return 1.0


@kjit
def _pc_quant(p, pc, psc, nv, eng):
    """T12 of a scalar quantizer (:func:`_p_codes`), zeros past nv."""
    _p_codes(p, pc, nv, eng)
    for jj in range(nv, eng.bn):
        pc[jj] = 0.0
    return 1.0


@kjit
def _pc_block(p, pc, psc, nv, eng):
    """T12 of a block quantizer: pc its codes (keys nv.. get 0), psc each key's block scale; the row's
    first-level scale returned."""
    return block_p_codes(p, nv, pc, psc, eng.pp)


@kjit
def _pin_plain(pc, psc, pin, ep, bn, eng):
    """P's codes as the P.V dot reads them (:func:`_p_operand`)."""
    _p_operand(pc, pin, ep, bn, eng)


@ljit
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


@kjit
def _pin_block(pc, psc, pin, ep, bn, eng):
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


@jit
def _tie_shifted(mx, s, nv, sscale, pp):
    """T4 with ``Plan.tie_shift``: the tile max ``mx`` as shifted when two or more of s[:nv] tie it (see Plan)."""
    thr = sub(mx, pp.tie_tol, pp.scale)
    n = 0
    for jj in range(nv):
        if mul(s[jj], sscale, pp.scale) >= thr:
            n += 1
    if n < 2:
        return mx
    if mx > 0.0:
        return mul(mx, pp.tie_beta, pp.m_i)
    return 0.0 if mx < 0.0 else mx


@kjit
def _no_dequant(s, nv, b, i, j0, xs, eng):
    """T4 of the plans whose scores need no dequantization: nothing."""


@kjit
def _dequant_scores(s, nv, b, i, j0, xs, eng):
    """Quantizers, ``score_scaling="scores"`` (INT8 T4, T5): the scores dequantized by the row's and each key's
    scale (then Q smoothing's correction)."""
    pp, ln = eng.pp, eng.ln
    _scale_by(s, nv, xs.qs[b, i], ln.dequant, pp.dequant)
    _mul_each(s, xs.ks[b], j0, nv, ln.dequant, pp.dequant)
    if pp.delta_mode == DELTA_SCORES:  # Q smoothing's correction on the dequantized scores
        ds = xs.ds[b, i // eng.bm]
        for jj in range(nv):
            s[jj] = add(s[jj], ds[j0 + jj], pp.dequant)


_LOG2E = 1.4426950408889634


@ljit
def _mask_scores(s, nv, b, i, j0, sscale, xs, eng):
    """T3's mask on row i's scores s[:nv]: keys the mask drops get -inf; an additive mask's scores become
    ``scale(fma(s, sscale, bias'))`` (``contract``; else ``scale(scale(s * sscale) + bias')``), ``bias' =
    scale(bias * scale(log2 e))`` under exp2 (the reference's ``_biased``)."""
    pp, mk = eng.pp, xs.mk
    lo = row_span(mk, eng.causal, b, i, eng.seq_k)[0]
    l2e = rnd(_LOG2E, pp.scale)
    for jj in range(nv):
        if key_masked(mk, b, i, j0 + jj, lo):
            s[jj] = _NINF
        elif mk.dense == DENSE_ADD:
            bv = mk.bias[mk.bmap[b], i, j0 + jj]
            b2 = mul(bv, l2e, pp.scale) if pp.exp2 else bv
            if pp.contract:
                s[jj] = fma(s[jj], sscale, b2, pp.scale)
            else:
                s[jj] = add(mul(s[jj], sscale, pp.scale), b2, pp.scale)
    return lo


@ljit
def _row(b, i, r, nv, jt, xs, eng, sc, st):
    """T4..T7, T9 and T12's codes for row r (query i) of the q tile against key tile jt: the scores
    sc.s[r, :nv] (dequantized), the running max, P (sc.p[r], 0 past nv), its cast or quantizer (sc.pc[r]),
    alpha; sc.m/alpha[r]. Its row sum (T8, :func:`_l_ij` or :func:`_tree_rows`) and :func:`_row_end` follow."""
    pp, ln = eng.pp, eng.ln
    bn = eng.bn
    s, p, pc = sc.s[r], sc.p[r], sc.pc[r]
    m_i = sc.m[r]
    j0 = jt * bn
    sscale = pp.qk_scale
    if pp.folded:  # FP8 T2: s_scale = qs_scale * k_scale (per key tile)
        sscale = mul(sc.qss[r], xs.ks[b, j0], pp.scale)
    st.dequant(s, nv, b, i, j0, xs, eng)
    lo = 0
    if xs.mk.on:
        lo = _mask_scores(s, nv, b, i, j0, sscale, xs, eng)
        if xs.mk.dense == DENSE_ADD:  # the scores are scaled already
            sscale = 1.0
    smax = _row_max(s, 0, nv)
    m_base = sc.lse[r] if pp.lse else m_i  # the lse form: m_ij = max(lse_i, rowmax)
    m_new = m_base  # T4
    r_old = sc.mr[r]  # alpha_raw: the unscaled running max
    r_new = fmax(r_old, smax) if smax != _NINF else r_old
    if smax != _NINF:
        mx = mul(smax, sscale, pp.scale)
        if pp.tie:
            mx = _tie_shifted(mx, s, nv, sscale, pp)
        m_new = fmax(m_base, mx)
        if m_new != m_base:
            m_new = rnd(m_new, pp.m_i)
    rescale = True
    if pp.lazy:
        if m_i == _NINF:
            rescale = m_new > _NINF
        elif pp.alpha_raw:  # FA4: keep the max while d = (r_old - r_new) * scale >= -threshold
            rescale = not (mul(sub(r_old, r_new, pp.alpha), sscale, pp.alpha) >= -pp.threshold)
        else:
            rescale = sub(m_new, m_i, pp.m_i) > pp.threshold
        if not rescale:
            m_new = m_i
            r_new = r_old
    sc.mr[r] = r_new
    m_sub = 0.0 if m_new == _NINF else m_new  # T5
    m_x = m_sub if pp.p_shift == 0.0 else sub(m_sub, pp.p_shift, pp.scale)  # SageAttention3's fixed P shift
    fused = pp.contract and not (pp.diag_plain and eng.causal and j0 + bn - 1 > i - r)  # T6 in one rounding
    _scaled(p, s, nv, sscale, m_x, fused, eng.fma_exact, ln.scale, pp.scale)  # T6, T7
    st.exp(p, nv, eng)
    if xs.mk.on:  # masked keys: p = 0
        for jj in range(nv):
            if s[jj] == _NINF and key_masked(xs.mk, b, i, j0 + jj, lo):
                p[jj] = 0.0
    for jj in range(nv, bn):
        p[jj] = 0.0
    alpha = 1.0  # T9
    if rescale:
        if m_i == _NINF:
            alpha = 0.0
        else:
            if pp.alpha_raw:  # FA3/4: exp2(alpha(alpha(r_old - r_new) * scale))
                dm = mul(sub(r_old, r_new, pp.alpha), sscale, pp.alpha)
            else:
                dm = sub(m_i, m_sub, pp.alpha)
            alpha = exp_op(dm, pp.alpha, pp)
    s1 = st.p_codes(p, pc, sc.psc[r], nv, eng)  # T12: P's cast or quantizer (keys nv.. get 0)
    if pp.p_kind == K_BLOCK:  # a block quantizer's first-level scale
        sc.s1[r] = s1
    sc.alpha[r] = alpha
    sc.m[r] = m_new  # T14 (T10..T13 read m_new and alpha from here, l_i from sc.l)


@ljit
def _l_ij(r, nv, eng, sc, st):
    """T8: row r's in-tile row sum l_ij (of its P, or of its codes under a consistent quantizer)."""
    pp = eng.pp
    if pp.consistent and pp.p_kind == K_INT:
        isum = 0.0
        for jj in range(nv):
            isum += sc.pc[r, jj]  # exact: integers < 2**53
        return div(isum, pp.p_qmax, pp.l_ij)
    return st.row_sum(sc.pc[r] if pp.consistent else sc.p[r], nv, eng)


@kjit
def _no_tree(g, n, eng, sc):
    """T8 of the plans whose row sums are taken row by row: nothing here."""


@kjit
def _tree_rows(g, n, eng, sc):
    """T8 for the rows [0, g) at once (:func:`_rows_tree`): sc.lij[:g] = the tl.sum tree of each row's P over the
    tile's first n keys (P = 0 past a row's keys: fp32 additions of fp32 values >= 0, so the zeros change no
    bit), by :func:`simfloat.hardware.tl_sum_mma_rows_f32` on P transposed."""
    p, pt = sc.p, sc.pt
    for r in range(g):
        for jj in range(n):
            pt[jj, r] = np.float32(p[r, jj])  # exact: float32 values
    tl_sum_mma_rows_f32(pt, g, n, eng.wn, sc.tw, sc.lij)


@ljit
def _rows_tree(eng):
    """T8 is the measured tl.sum tree in fp32 additions of P (the H200 plans): done for all rows at once."""
    pp = eng.pp
    return pp.sum_order != 0 and eng.l_native32 and not pp.consistent


@ljit
def _row_end(r, l_ij, eng, sc, st):
    """T10..T12 of row r after its row sum l_ij: the running l_i (or lse_i), P's dot operand, acc rescaled
    first for the ``into_acc`` form; sc.l/l_new[r]."""
    pp, ln = eng.pp, eng.ln
    bn = eng.bn
    dv = sc.acc.shape[1]
    pc, pin, ep = sc.pc[r], sc.pin[r], sc.ep[r]
    l_i, alpha, m_new = sc.l[r], sc.alpha[r], sc.m[r]
    m_sub = 0.0 if m_new == _NINF else m_new
    if pp.lse:  # T10, the lse form: l_i = exp(lse_i - m_ij) + l_ij, lse_i = m_ij + log(l_i)
        lse_i = sc.lse[r]
        e = 0.0 if lse_i == _NINF else exp_op(sub(lse_i, m_sub, pp.alpha), pp.alpha, pp)
        l_new = add(e, l_ij, pp.l_i)
        if m_new != _NINF:
            sc.lse[r] = add(m_sub, log(l_new, pp.l_i), pp.m_i)
    elif pp.contract:  # T10
        l_new = fma(l_i, alpha, l_ij, pp.l_i)
    else:
        l_new = add(mul(l_i, alpha, pp.l_i), l_ij, pp.l_i)
    st.p_operand(pc, sc.psc[r], pin, ep, bn, eng)
    if pp.pv_mode == PV_INTO_ACC:  # T11: acc(acc * alpha) before the dot adds into it; FA1: acc * acc(l * alpha)
        wgt = mul(l_i, alpha, pp.acc) if pp.per_step else alpha
        _scale_by(sc.acc[r], dv, wgt, ln.acc, pp.acc)
    sc.l[r] = l_new
    sc.l_new[r] = l_new


@kjit
def _no_update(b, r, jt, xs, eng, sc):
    """The ``into_acc`` form's update: none (its dot added into acc)."""


@kjit
def _update(b, r, jt, xs, eng, sc):
    """Row r's P.V update from this key tile's dot sc.y[r] (every form but ``into_acc``, whose dot added into
    acc itself)."""
    pp, ln = eng.pp, eng.ln
    dv = sc.acc.shape[1]
    acc, y, alpha = sc.acc[r], sc.y[r], sc.alpha[r]
    vs = xs.vs[b, jt]
    if pp.pv_mode == PV_TWO_LEVEL:  # acc = acc(fma(acc, alpha, pv(c . v))): a fresh P.V per key tile
        if pp.p_kind == K_BLOCK and pp.p_two_level:  # SageAttention3: P's per-row scale first, pv_dequant(pv * s1)
            _scale_by(y, dv, sc.s1[r], ln.pv_dequant, pp.pv_dequant)
        _acc_update(acc, y, dv, alpha, pp.contract, eng.acc_exact, ln.acc, pp.acc)
    elif pp.pv_mode == PV_SEPARATE:  # INT8 T17..T19
        _mul_each(y, vs, 0, dv, ln.pv_dequant, pp.pv_dequant)
        if pp.p_kind == K_INT or pp.p_kind == K_FFLOAT:
            _divide(y, dv, pp.p_qmax, ln.pv_dequant, pp.pv_dequant)
        _acc_update(acc, y, dv, alpha, pp.contract, eng.acc_exact, ln.acc, pp.acc)
    elif pp.pv_mode == PV_SCALED:  # scaled (FP8 per-block): acc = pv_dequant(fma(pv, v_scale, acc(acc * alpha)))
        _scale_by(acc, dv, alpha, ln.acc, pp.acc)
        _fma_scaled(acc, y, vs, dv, eng.pvd_exact, ln.pv_dequant, pp.pv_dequant)


@kjit
def _tile(b, r0, r1, jt, xs, eng, sc, st):
    """The rows [r0, r1) of a q tile of lead b against key tile jt (T2..T14): the codes' dot for all rows in
    one multi-row call, the steps up to P.V row by row, the P.V dot for all rows, then each row's update (or
    FA1's division). Every row's bits are those of a row-at-a-time walk (a row's outputs depend only on its own
    steps; a causal row's scores past its last key are computed but never read)."""
    pp, ln = eng.pp, eng.ln
    bn, seq_k = eng.bn, eng.seq_k
    dv = xs.v.shape[2]
    g = r1 - r0
    tile = b * (xs.kt.shape[0] // xs.q.shape[0]) + jt
    j0, jv, n_top = tile_span(jt, r1, bn, seq_k, eng.causal)
    if xs.mk.on:  # the widest row is the last one (the structured mask's end grows with the row)
        n_top = max(0, min(jv, row_span(xs.mk, eng.causal, b, r1 - 1, seq_k)[1]) - j0)
    s = sc.s
    if pp.delta_mode == DELTA_MMA:  # SageAttention3: Q smoothing's correction is the MMA's initial accumulator
        ds = xs.ds[b, r0 // eng.bm]
        for r in range(g):
            for jj in range(n_top):
                s[r, jj] = ds[j0 + jj]
    else:
        for r in range(g):
            for jj in range(n_top):
                s[r, jj] = 0.0
    kt, ekt, kt32, ekt32 = xs.kt[tile], xs.ekt[tile], xs.kt32[tile], xs.ekt32[tile]
    st.qk_rows(xs.q[b, r0:r1], xs.eq[b, r0:r1], kt, ekt, kt32, ekt32, s, g, n_top, eng.qk, sc.rs)  # T2, T3
    tree = _rows_tree(eng)
    for r in range(g):
        i = r0 + r
        nv = row_keys(i, j0, jv, eng.causal)
        if xs.mk.on:
            nv = max(0, min(jv, row_span(xs.mk, eng.causal, b, i, seq_k)[1]) - j0)
        _row(b, i, r, nv, jt, xs, eng, sc, st)
        if not tree:
            _row_end(r, _l_ij(r, nv, eng, sc, st), eng, sc, st)
    if tree:  # T8 for all rows at once (every row's P is zero past its keys), then T10..T12
        st.tree_rows(g, n_top, eng, sc)
        for r in range(g):
            _row_end(r, sc.lij[r], eng, sc, st)
    src = sc.pin if eng.pv.in_round or eng.pv_scaled else sc.pc
    if pp.pv_mode == PV_INTO_ACC:  # T13: acc = pv(acc(acc * alpha) + c . v)
        st.pv_rows(src, sc.ep, xs.v[tile], xs.ev[tile], xs.v32[tile], xs.ev32[tile], sc.acc, g, dv, eng.pv, sc.rs)
        if pp.per_step:
            for r in range(g):
                l_new = sc.l_new[r]
                _divide(sc.acc[r], dv, 1.0 if l_new == 0.0 else l_new, ln.normalize, pp.normalize)
        return
    y = sc.y
    for r in range(g):
        for d in range(dv):
            y[r, d] = 0.0
    st.pv_rows(src, sc.ep, xs.v[tile], xs.ev[tile], xs.v32[tile], xs.ev32[tile], y, g, dv, eng.pv, sc.rs)
    for r in range(g):
        st.update(b, r, jt, xs, eng, sc)


@jit
def units(lo, hi, xs, out, m_out, l_out, eng, st, tile):
    """Work units ``[lo, hi)``: unit u is (lead index u // n_q_tiles, q tile u % n_q_tiles); a q tile's rows
    meet the key tiles one at a time (the tile's K^T and V stay in cache for all its rows), then the epilogue
    (quantizers' into_acc / two_level: V's descale; E1 ``normalize(acc / l)``, unless FA1; E2 ``out``).

    Args:
        xs: the :class:`Operands`; eng: the :class:`Engine`.
        out: (L, Sq, Dv); m_out, l_out: (L, Sq), written.
        st: the plan's :class:`Steps`; tile: :func:`_tile` as a :class:`~simfloat._jit.Kernel` (:func:`run`).
    """
    pp, ln = eng.pp, eng.ln
    bm, bn, seq_k = eng.bm, eng.bn, eng.seq_k
    seq_q, dv = out.shape[1], out.shape[2]
    n_qt = (seq_q + bm - 1) // bm
    sc = _scratch(bm, bn, dv)
    for u in range(lo, hi):
        b = u // n_qt
        t = u - b * n_qt
        r0, r1 = t * bm, min(seq_q, (t + 1) * bm)
        kv_hi = min((t + 1) * bm, seq_k) if eng.causal else seq_k
        jt_lo, n_kv = 0, (kv_hi + bn - 1) // bn
        if xs.mk.on:  # the key tiles some row of the q tile may see (FA2's n_block_min / max)
            jt_lo, n_kv = tile_range(xs.mk, eng.causal, b, t, bm, bn, seq_k)
        for r in range(r1 - r0):
            sc.m[r] = _NINF
            sc.mr[r] = _NINF
            sc.l[r] = 0.0
            sc.lse[r] = _NINF
            for d in range(dv):
                sc.acc[r, d] = 0.0
            if pp.folded:  # FP8 K2: qs_scale = qk_scale * q_scale
                sc.qss[r] = mul(pp.qk_scale, xs.qs[b, r0 + r], pp.scale)
        for pos in range(n_kv):
            jt = kv_tile(pos, n_kv, t, bm, bn, eng.causal, pp.kv_order)
            if jt >= jt_lo:  # (masks: the tiles before FA2's n_block_min are skipped)
                tile(b, r0, r1, jt, xs, eng, sc, st)
        for i in range(r0, r1):
            acc, l_i = sc.acc[i - r0], sc.l[i - r0]
            o = out[b, i]
            for d in range(dv):
                o[d] = acc[d]
            if pp.v_epilogue:  # V's descale once (E1)
                _mul_each(o, xs.vs[b, 0], 0, dv, ln.pv_dequant, pp.pv_dequant)
                if pp.p_kind == K_INT or pp.p_kind == K_FFLOAT:  # then P's fixed scale
                    _divide(o, dv, pp.p_qmax, ln.pv_dequant, pp.pv_dequant)
            m_i = sc.m[i - r0]
            if pp.lse:  # E1 of the lse form: o = normalize(acc * o_scale), o_scale = exp(m_i - lse_i)
                lse_i = sc.lse[i - r0]
                if m_i != _NINF:
                    _scale_by(
                        o, dv, exp_op(sub(m_i, lse_i, pp.normalize), pp.normalize, pp), ln.normalize, pp.normalize
                    )
                m_i, l_i = lse_i, (0.0 if m_i == _NINF else 1.0)  # the stats: m = lse, l = 1
            elif not pp.per_step:  # E1
                _divide(o, dv, 1.0 if l_i == 0.0 else l_i, ln.normalize, pp.normalize)
            _cast(o, 0, dv, ln.out, pp.out)  # E2
            m_out[b, i] = m_i
            l_out[b, i] = l_i


class Steps(NamedTuple):
    """The steps that differ between plans as kernels (:class:`~simfloat._jit.Kernel` values, the variant each
    plan needs chosen by :func:`steps`): the loop is compiled once for every plan, and a variant only when a
    plan first uses it (a float plan never compiles the quantizers)."""

    qk_rows: object  # T2, T3: the scores' dot (simfloat.accumulate._rows.rows_kernel of eng.qk)
    pv_rows: object  # T13: the P.V dot (of eng.pv)
    dequant: object  # T4: the scores' dequantization (quantizers with score_scaling="scores"), or nothing
    exp: object  # T7: libm (or the measured ex2 table's interval search), its value table, tl.exp, or FA4's mix
    p_codes: object  # T12: P's cast, scalar quantizer or block quantizer
    row_sum: object  # T8: l_ij in the tl.sum tree or left to right
    p_operand: object  # P's codes as the P.V dot reads them (plain or block-scaled)
    update: object  # T14: the acc update of the two-level, separate and scaled P.V forms (into_acc: none)
    tree_rows: object  # T8 of every row at once (the H200 plans' fp32 tl.sum tree), or nothing


def _variants(eng: Engine) -> tuple[Any, ...]:
    """The variant of each of :class:`Steps` the plan ``eng.pp`` takes (compiled functions, in Steps' order)."""
    pp: Any = eng.pp
    if pp.exp_tl:
        exp = _exp_tl
    elif pp.ex2_poly.size > 0:  # FA4: its software exp2 at some key positions
        exp = _exp_mixed
    elif pp.exp2 and eng.ex2_val.size > 0 and eng.ln.exp.fast:  # the measured ex2.approx.ftz: a table load
        exp = _exp_table
    else:
        exp = _exp_lib
    if pp.p_kind == K_BLOCK:
        p_codes, p_operand = _pc_block, _pin_block
    else:
        p_codes = _pc_cast if pp.p_kind == K_FLOAT and not pp.p_pre else _pc_quant
        p_operand = _pin_plain
    return (
        rows_form(eng.qk),
        rows_form(eng.pv),
        _dequant_scores if pp.scores_dequant else _no_dequant,
        exp,
        p_codes,
        _sum_tree if pp.sum_order != 0 else _sum_seq,
        p_operand,
        _no_update if pp.pv_mode == PV_INTO_ACC else _update,
        _tree_rows if _rows_tree.py_func(eng) else _no_tree,
    )


def steps(xs: Operands, eng: Engine) -> Steps:
    """The :class:`Steps` of a call: each step's variant for the plan ``eng.pp``, typed for these records."""
    f64, i64 = types.float64[::1], types.int64
    xs_t, eng_t, sc_t = type_of(xs), type_of(eng), _scratch_type()
    void: Any = types.void
    f: Any = types.float64
    _, _, dequant, exp, p_codes, row_sum, p_operand, update, tree_rows = _variants(eng)
    return Steps(
        rows_kernel(eng.qk),
        rows_kernel(eng.pv),
        kernel(dequant, void(f64, i64, i64, i64, i64, xs_t, eng_t)),
        kernel(exp, void(f64, i64, eng_t)),
        kernel(p_codes, f(f64, f64, f64, i64, eng_t)),
        kernel(row_sum, f(f64, i64, eng_t)),
        kernel(p_operand, void(f64, f64, f64, f64, i64, eng_t)),
        kernel(update, void(i64, i64, i64, xs_t, eng_t, sc_t)),
        kernel(tree_rows, void(i64, i64, eng_t, sc_t)),
    )


# (Steps, the tile kernel) per (operands' type, engine's type, variants): a call's kernels found in microseconds
_CALLS: dict[tuple[Any, ...], tuple[Steps, Kernel]] = {}


def _kernels(xs: Operands, eng: Engine) -> tuple[Steps, Kernel]:
    fx, fe = fingerprint(xs), fingerprint(eng)
    key = (fx, fe, _variants(eng)) if fx is not None and fe is not None else None
    hit = _CALLS.get(key) if key is not None else None
    if hit is None:
        st = steps(xs, eng)
        i64 = types.int64
        void: Any = types.void
        sig = void(i64, i64, i64, i64, type_of(xs), type_of(eng), _scratch_type(), type_of(st))
        hit = (st, kernel(_tile, sig))
        if key is not None:
            _CALLS[key] = hit
    return hit


_SCRATCH_TYPE: list[Any] = []


def _scratch_type() -> Any:
    if not _SCRATCH_TYPE:
        _SCRATCH_TYPE.append(type_of(_scratch(1, 1, 1)))
    return _SCRATCH_TYPE[0]


def run(xs: Operands, out: np.ndarray, m_out: np.ndarray, l_out: np.ndarray, eng: Engine) -> None:
    """Every work unit of a call (:func:`units`, on the threads of :func:`simfloat._parallel.run_rows`).

    Args:
        xs: the :class:`Operands`; eng: the :class:`Engine`.
        out: (L, Sq, Dv); m_out, l_out: (L, Sq), written.
    """
    n_units = out.shape[0] * (-(-out.shape[1] // eng.bm))
    if n_units > 0:
        st, tile = _kernels(xs, eng)
        run_rows(units, n_units, xs, out, m_out, l_out, eng, st, tile)
