"""The forward flash loop of the vector engine: one loop for every plan, bit for bit the reference loop
(:mod:`simfloat.attention.reference.forward`; steps listed in :mod:`simfloat.attention.flash` and
:mod:`simfloat.attention.quantized`). The steps that differ between plans (the dots' forms among them) are
:class:`~simfloat.attention.vector._steps.Steps`, kernel values chosen per call from the plan's FlashParams,
each called once per tile for all its rows.

Shaped so that the work vectorizes: a q tile's rows go together, their scores against a key tile are one call
of the multi-row kernel ``Steps.qk_rows`` (the innermost loop runs over keys) and their P.V one call over the head
dimension; the element-wise ops (scale, exp, the casts and quantizers, rescaling, normalization) are loops of
the branch-free lane functions of :mod:`simfloat._lanes` (the reference's scalar ops where an op's format or
mode has no lane form). Running state (m_i, l_i, alpha) and the sequential row sum stay scalar, as in the
kernel. A plan without quantizers is the dataflow with no quantizer steps: its scores are not dequantized, its
P cast is the float code kind with op ``p``, its P.V is ``into_acc`` (``tl.dot(p, v, acc)``). A block-scaled
MMA (NVFP4/MX) is a block-FMA row kernel on scaled operands (:func:`simfloat.accumulate._rows.scaled_mma`): Q's,
K's and V's codes times their block scales and their weights come from the builder
(:func:`simfloat.attention._build.flash_engine`), P's are made per key tile (``Steps.p_codes``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import types

from simfloat._jit import Kernel, fingerprint, jit, kernel, kjit, ljit, type_of
from simfloat._parallel import run_rows
from simfloat.accumulate._rows import rows_work
from simfloat.attention._engine import _row_max, row_keys, tile_span
from simfloat.attention._kernels import add, exp_op, fma, fmax, kv_tile, log, mul, rnd, sub
from simfloat.attention._masks import DENSE_ADD, key_masked, row_span, visible_tiles
from simfloat.attention._quant_kernels import DELTA_MMA, PV_INTO_ACC
from simfloat.attention.vector._records import Engine, Lanes, Operands, rows_type, scratch, scratch_type
from simfloat.attention.vector._steps import Steps, steps, variants

__all__ = ["Engine", "Lanes", "Operands", "Steps", "run", "steps", "units"]

_NINF = -np.inf
_LOG2E = math.log2(math.e)


# -- a row's steps (direct calls) ----------------------------------------------------------------------------------


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
def _row(b, i, r, jt, xs, eng, sc, mk_on, st):
    """T3..T6 and T9 for row r (query i) of the q tile against key tile jt, its scores sc.s[r, :nv] already
    dequantized (``Steps.dequant``): the mask, the running max (sc.m[r], T14's), P's exponent argument (sc.p[r],
    which ``Steps.exp`` then takes, T7), alpha (sc.alpha[r])."""
    pp, ln = eng.pp, eng.ln
    bn = eng.bn
    s, p, nv = sc.s[r], sc.p[r], sc.nv[r]
    m_i = sc.m[r]
    j0 = jt * bn
    sscale = pp.qk_scale
    if pp.folded:  # FP8 T2: s_scale = qs_scale * k_scale (per key tile)
        sscale = mul(mul(pp.qk_scale, xs.qs[b, i], pp.scale), xs.ks[b, j0], pp.scale)  # (K2: qs_scale, per row)
    if mk_on:  # (xs.mk.on, read once per tile)
        sc.lo[r] = _mask_scores(s, nv, b, i, j0, sscale, xs, eng)
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
    st.scaled(p, s, nv, sscale, m_x, fused, eng.fma_exact, ln.scale, pp.scale)  # T6: exp's argument
    for jj in range(nv, bn):  # P past the row's keys (T7 writes p[:nv] only)
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
            alpha = exp_op(dm, pp.alpha, pp, eng.ex2_tab)
    sc.alpha[r] = alpha
    sc.m[r] = m_new  # T14 (T10..T13 read m_new and alpha from here, l_i from sc.l)


@ljit
def _p_masked(b, i, r, j0, mk, sc):
    """Row r's P after T7: 0 at the keys the mask ``mk`` drops."""
    p, s, lo = sc.p[r], sc.s[r], sc.lo[r]
    for jj in range(sc.nv[r]):
        if s[jj] == _NINF and key_masked(mk, b, i, j0 + jj, lo):
            p[jj] = 0.0


@ljit
def _row_end(r, l_ij, eng, sc, st):
    """T10, T11 of row r after its row sum l_ij: the running l_i (or lse_i), acc rescaled first for the
    ``into_acc`` form; sc.l/l_new[r]."""
    pp, ln = eng.pp, eng.ln
    dv = sc.acc.shape[1]
    l_i, alpha, m_new = sc.l[r], sc.alpha[r], sc.m[r]
    m_sub = 0.0 if m_new == _NINF else m_new
    if pp.lse:  # T10, the lse form: l_i = exp(lse_i - m_ij) + l_ij, lse_i = m_ij + log(l_i)
        lse_i = sc.lse[r]
        e = 0.0 if lse_i == _NINF else exp_op(sub(lse_i, m_sub, pp.alpha), pp.alpha, pp, eng.ex2_tab)
        l_new = add(e, l_ij, pp.l_i)
        if m_new != _NINF:
            sc.lse[r] = add(m_sub, log(l_new, pp.l_i), pp.m_i)
    elif pp.contract:  # T10
        l_new = fma(l_i, alpha, l_ij, pp.l_i)
    else:
        l_new = add(mul(l_i, alpha, pp.l_i), l_ij, pp.l_i)
    if pp.pv_mode == PV_INTO_ACC:  # T11: acc(acc * alpha) before the dot adds into it; FA1: acc * acc(l * alpha)
        wgt = mul(l_i, alpha, pp.acc) if pp.per_step else alpha
        if pp.pv_acc:  # an accumulator held in pv_acc's format: acc(acc * pv_acc(alpha))
            wgt = rnd(wgt, pp.pv_acc_op)
        st.acc_scale(sc.acc[r], dv, wgt, ln.acc, pp.acc)
    sc.l[r] = l_new
    sc.l_new[r] = l_new


# -- the tile step -------------------------------------------------------------------------------------------------


@kjit
def _tile(b, r0, r1, jt, xs, eng, sc, rs, st):
    """The rows [r0, r1) of a q tile of lead b against key tile jt (T2..T14), step after step for all rows:
    the codes' dot in one multi-row call, the rows' max and P, their row sums, the P.V dot, each row's update
    (or FA1's division). Every row's bits are those of a row-at-a-time walk (a row's outputs depend only on its
    own steps; a causal row's scores past its last key are computed but never read)."""
    pp, ln = eng.pp, eng.ln
    bn, seq_k = eng.bn, eng.seq_k
    dv = xs.v.shape[2]
    g = r1 - r0
    tile = b * (xs.kt.shape[0] // xs.q.shape[0]) + jt
    j0, jv, n_top = tile_span(jt, r1, bn, seq_k, eng.causal)
    mk_on = xs.mk.on
    if mk_on:  # the widest row is the last one (the structured mask's end grows with the row)
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
    st.qk_rows(xs.q[b, r0:r1], xs.eq[b, r0:r1], kt, ekt, kt32, ekt32, s, g, n_top, eng.qk, rs)  # T2, T3
    for r in range(g):
        i = r0 + r
        nv = row_keys(i, j0, jv, eng.causal)
        if mk_on:
            nv = max(0, min(jv, row_span(xs.mk, eng.causal, b, i, seq_k)[1]) - j0)
        sc.nv[r] = nv
    st.dequant(g, b, r0, j0, xs, eng, sc)  # T4, T5 of the quantizers
    for r in range(g):
        _row(b, r0 + r, r, jt, xs, eng, sc, mk_on, st)  # T3..T6, T9
    st.exp(g, eng, sc)  # T7
    if mk_on:  # masked keys: p = 0
        mk = xs.mk
        for r in range(g):
            _p_masked(b, r0 + r, r, j0, mk, sc)
    st.p_codes(g, eng, sc)  # T12: P's cast or quantizer (keys nv.. get 0)
    st.row_sums(g, n_top, eng, sc)  # T8
    for r in range(g):
        _row_end(r, sc.lij[r], eng, sc, st)  # T10, T11
    st.p_operand(g, eng, sc)
    src = sc.pin if eng.pv.in_round or eng.pv_scaled else sc.pc
    if pp.pv_mode == PV_INTO_ACC:  # T13: acc = pv(acc(acc * alpha) + c . v)
        st.pv_rows(src, sc.ep, xs.v[tile], xs.ev[tile], xs.v32[tile], xs.ev32[tile], sc.acc, g, dv, eng.pv, rs)
        if pp.per_step:
            for r in range(g):
                l_new = sc.l_new[r]
                st.normalize(sc.acc[r], dv, 1.0 if l_new == 0.0 else l_new, ln.normalize, pp.normalize)
        return
    y = sc.y
    for r in range(g):
        for d in range(dv):
            y[r, d] = 0.0
    st.pv_rows(src, sc.ep, xs.v[tile], xs.ev[tile], xs.v32[tile], xs.ev32[tile], y, g, dv, eng.pv, rs)
    st.update(g, xs.vs[b, jt], eng, sc)  # T14


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
    sc, rs = scratch(bm, bn, dv), rows_work(bm, max(bn, dv))
    for u in range(lo, hi):
        b = u // n_qt
        t = u - b * n_qt
        r0, r1 = t * bm, min(seq_q, (t + 1) * bm)
        jt_lo, n_kv = visible_tiles(xs.mk, eng.causal, b, t, bm, bn, seq_k)  # FA2's n_block_min / max
        for r in range(r1 - r0):
            sc.m[r] = _NINF
            sc.mr[r] = _NINF
            sc.l[r] = 0.0
            sc.lse[r] = _NINF
            for d in range(dv):
                sc.acc[r, d] = 0.0
        for pos in range(n_kv):
            jt = kv_tile(pos, n_kv, t, bm, bn, eng.causal, pp.kv_order)
            if jt >= jt_lo:  # (masks: the tiles before FA2's n_block_min are skipped)
                tile(b, r0, r1, jt, xs, eng, sc, rs, st)
        for i in range(r0, r1):
            acc, l_i = sc.acc[i - r0], sc.l[i - r0]
            o = out[b, i]
            for d in range(dv):
                o[d] = acc[d]
            st.v_epilogue(o, b, xs, eng)  # the quantizers' V descale once (E1), or nothing
            m_i = sc.m[i - r0]
            if pp.lse:  # E1 of the lse form: o = normalize(acc * exp(m_i - lse_i))
                lse_i = sc.lse[i - r0]
                if m_i != _NINF:
                    st.lse_scale(o, m_i, lse_i, eng)
                m_i, l_i = lse_i, (0.0 if m_i == _NINF else 1.0)  # the stats: m = lse, l = 1
            elif not pp.per_step:  # E1
                st.normalize(o, dv, 1.0 if l_i == 0.0 else l_i, ln.normalize, pp.normalize)
            st.out_cast(o, 0, dv, ln.out, pp.out)  # E2
            m_out[b, i] = m_i
            l_out[b, i] = l_i


# (Steps, the tile kernel) per (operands' type, engine's type, variants): a call's kernels found in microseconds
_CALLS: dict[tuple[Any, ...], tuple[Steps, Kernel]] = {}


def _kernels(xs: Operands, eng: Engine) -> tuple[Steps, Kernel]:
    fx, fe = fingerprint(xs), fingerprint(eng)
    key = (fx, fe, variants(eng)) if fx is not None and fe is not None else None
    hit = _CALLS.get(key) if key is not None else None
    if hit is None:
        st = steps(xs, eng)
        i64 = types.int64
        void: Any = types.void
        sig = void(i64, i64, i64, i64, type_of(xs), type_of(eng), scratch_type(), rows_type(), type_of(st))
        hit = (st, kernel(_tile, sig))
        if key is not None:
            _CALLS[key] = hit
    return hit


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
