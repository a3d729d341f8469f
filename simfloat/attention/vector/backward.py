"""The vector engine of the flash backward (:func:`simfloat.attention.backward.flash_backward`): the dots on the
row kernels (``row_mma``), the element-wise ops on the lane roundings of :mod:`simfloat._lanes` (the scalar ops
where a format has no lane form); bit for bit the reference engine's (:mod:`simfloat.attention.reference.backward`),
which this module never imports.

:func:`run` rounds the operands into each dot's input format, builds the records (:class:`BwdEngine`,
:class:`BwdOperands`) and runs D2 (:func:`_delta_units`), the dK/dV pass with Q4 in it (:func:`_bwd_units`) and,
when dQ walks its own tiles, Q4 and E3 (:func:`_dq_walk_units`); leading indices run on all threads, bitwise
identical for any thread count.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from simfloat._jit import jit, record_of
from simfloat._lanes import Lane, ladd, lane, lane_of, lmul, lround
from simfloat._parallel import run_rows
from simfloat.accumulate._rows import (
    MMA,
    BStack,
    b_stack,
    for_operands,
    mma,
    operand_powers,
    round_operands,
    row_mma,
    tile_of,
    work,
)
from simfloat.attention._build import dot_output_format
from simfloat.attention._engine import _cast, _exp_of, _scale_by, _scaled, _weights_of
from simfloat.attention._flash_params import NO_TABLE
from simfloat.attention._kernels import add, exp_op, fma, mul, rnd, sub
from simfloat.attention._masks import (
    DENSE_ADD,
    NO_MASK,
    KeyMask,
    key_masked,
    qtile_range,
    visible_keys,
    visible_tiles,
)
from simfloat.attention.backward_plan import BackwardParams, BackwardPlan
from simfloat.formats import FloatFormat

_LOG2E = math.log2(math.e)


class BwdLanes(NamedTuple):
    """Lane forms of the backward's element-wise ops."""

    delta: Lane
    scale: Lane
    exp: Lane
    p: Lane
    ds: Lane
    ds_cast: Lane
    grad_scale: Lane
    grad: Lane
    dq_atomic: Lane


class BwdEngine(NamedTuple):
    """What every unit of work needs besides its operands.

    Attributes:
        pp: :class:`~simfloat.attention.backward_plan.BackwardParams` as a record (:func:`simfloat._jit.record_of`,
            its table apart: ``ex2_tab``). ln: :class:`BwdLanes` as a record.
        qk, dv, dp, dk, dq: the dots as :class:`~simfloat.accumulate._rows.MMA` records (numpy records).
        fma_exact: ``s * qk_scale`` is exact in float64 (the fused B4 shift may use its lane form).
        bm, bn: tile sizes; causal; seq_q, seq_k; group: query heads per key/value head (1: none shared).
        dq_order: (L, n_qt2, n_kv2) int64, when dQ walks its own tiles (``walk``): per query lead and dQ query
            tile the dQ key tiles it sees in the order of their MMAs (or atomic adds, Q4b), then the rest; else
            empty.
        mk: the call's :class:`~simfloat.attention._masks.KeyMask` (per query lead; ``NO_MASK``: none beyond
            ``causal``).
        walk: Q4 is a pass of its own over the stored dS (:func:`_dq_walk_units`): atomic dQ, a dQ order other
            than forward or dQ tiles (bm2, bn2) other than (bm, bn); else Q4 runs in the dK/dV pass.
        bm2, bn2: the dQ kernel's query / key tiles.
        ex2_tab: the plan's ex2.approx table (``BackwardParams.ex2_tab``; empty: correctly rounded exp2).
    """

    pp: object  # (numpy records: simfloat._jit.record_of)
    ln: object
    qk: object
    dv: object
    dp: object
    dk: object
    dq: object
    fma_exact: bool
    bm: int
    bn: int
    causal: bool
    seq_q: int
    seq_k: int
    group: int
    dq_order: np.ndarray
    mk: KeyMask = NO_MASK
    walk: bool = False
    bm2: int = 64
    bn2: int = 64
    ex2_tab: np.ndarray = NO_TABLE  # (a placeholder: run passes the plan's)


class BwdOperands(NamedTuple):
    """Operands, rounded into each dot's input format, tile by tile where a dot reads tiles, with their
    alignment weights (``e*``; :func:`simfloat.accumulate._rows.operand_powers`); a dot's B operands as a
    :class:`simfloat.accumulate._rows.BStack` (with their float32 forms).

    Attributes:
        q: (L, Sq, D) rows for B2. kt: (Lk * n_kv, D, bn) K^T tiles for B2.
        do: (L, Sq, Dv) rows for B6. vt: (Lk * n_kv, Dv, bn) V^T tiles for B6.
        do_t: (L * n_qt, bm, Dv) dO tiles for B5. q_t: (L * n_qt, bm, D) Q tiles for B9.
        k_t: (Lk * n_kv2, bn2, D) K tiles for Q4 (the dQ kernel's key tiles).
        lse, delta: (L, Sq). L = Lk * group query leads, Lk key/value leads.
    """

    q: np.ndarray
    eq: np.ndarray
    kt: BStack
    do: np.ndarray
    edo: np.ndarray
    vt: BStack
    do_t: BStack
    q_t: BStack
    k_t: BStack
    lse: np.ndarray
    delta: np.ndarray


@jit
def _delta_units(lo, hi, o, do, delta, r, op):
    """D2 for rows [lo, hi) of the flattened (lead, query) grid."""
    seq_q, d = o.shape[1], o.shape[2]
    for u in range(lo, hi):
        b = u // seq_q
        i = u - b * seq_q
        s = 0.0
        if r.fast:
            for c in range(d):
                s = ladd(s, lmul(o[b, i, c], do[b, i, c], r), r)
        else:
            for c in range(d):
                s = add(s, mul(o[b, i, c], do[b, i, c], op), op)
        delta[b, i] = s


@jit
def _ds_of(y, p, dp, n, delta, r, op):
    """B7: y[:n] = ds(p * ds(dp - delta))."""
    if r.fast:
        for j in range(n):
            y[j] = lmul(p[j], ladd(dp[j], -delta, r), r)
    else:
        for j in range(n):
            y[j] = mul(p[j], sub(dp[j], delta, op), op)


@jit
def _operand_row(x, n, mp, xin, ex):
    """x[:n] as the dot reads it (its input format) into xin[:n], with its weights in ex[:n]; returns xin."""
    if mp.in_round:
        inp = lane_of(mp.inp)  # (a record's lane, read once)
        for j in range(n):
            xin[j] = lround(x[j], inp)
    else:
        for j in range(n):
            xin[j] = x[j]
    if mp.align_sum:
        _weights_of(xin, ex, n, mp.opnd_emin)
    return xin


@jit
def _epilogue(x, n, w, eng):
    """E1..E3: x[:n] = grad(grad_scale(x * w)) (w > 0: sm_scale or dq_scale), else (w = 0) grad(x)."""
    pp, ln = eng.pp, eng.ln
    if w > 0.0:
        _scale_by(x, n, w, ln.grad_scale, pp.grad_scale)
    _cast(x, 0, n, ln.grad, pp.grad)


@jit
def _mask_scores(s, nv, b, i, j0, lo, pp, mk):
    """B3: row i's masked keys get -inf; with an additive mask the scores become
    ``scale(fma(s, qk_scale, bias'))`` (``contract``; else ``scale(scale(s * qk_scale) + bias')``), ``bias' =
    scale(bias * scale(log2 e))`` under exp2, as the forward's T3."""
    l2e = rnd(_LOG2E, pp.scale)
    for jj in range(nv):
        if key_masked(mk, b, i, j0 + jj, lo):
            s[jj] = -np.inf
        elif mk.dense == DENSE_ADD:
            bv = mk.bias[mk.bmap[b], i, j0 + jj]
            b2 = mul(bv, l2e, pp.scale) if pp.exp2 else bv
            if pp.contract:
                s[jj] = fma(s[jj], pp.qk_scale, b2, pp.scale)
            else:
                s[jj] = add(mul(s[jj], pp.qk_scale, pp.scale), b2, pp.scale)


@jit
def _bwd_units(lo, hi, xs, dq, dk, dv, psum, eng, dsf):
    """Key/value lead indices [lo, hi): every key tile with the query tiles of every query head of its group
    (see the module docstring); query head ``bk * group + g`` reads key/value head ``bk``. With ``eng.walk``
    B8's dS goes to ``dsf`` (L, seq_q, seq_k), zeros on entry, and dq is left to :func:`_dq_walk_units`."""
    pp, ln, mk = eng.pp, eng.ln, eng.mk
    bm, bn, seq_q, seq_k, group = eng.bm, eng.bn, eng.seq_q, eng.seq_k, eng.group
    d, dvd = xs.q.shape[2], xs.do.shape[2]
    n_qt, n_kv = (seq_q + bm - 1) // bm, (seq_k + bn - 1) // bn
    sscale = 1.0 if mk.dense == DENSE_ADD else pp.qk_scale  # an additive mask's scores are scaled already
    s, x, dpr, y = np.zeros(bn), np.zeros(bn), np.zeros(bn), np.zeros(bn)
    yin, ey = np.zeros(bn), np.zeros(bn)
    pt, dst = np.zeros((bn, bm)), np.zeros((bn, bm))
    rin, er = np.zeros(bm), np.zeros(bm)
    dka, dva = np.zeros((bn, d)), np.zeros((bn, dvd))
    w = work(max(bn, bm, d, dvd))
    for bk in range(lo, hi):
        for g in range(group):
            for i in range(seq_q):
                for c in range(d):
                    dq[bk * group + g, i, c] = 0.0
        for jt in range(n_kv):
            j0 = jt * bn
            nk = min(bn, seq_k - j0)
            ktile = bk * n_kv + jt
            dka[:, :] = 0.0
            dva[:, :] = 0.0
            t0 = j0 // bm if eng.causal else 0
            t1 = n_qt
            for g in range(group):  # G1: the group's query heads in order, each over its query tiles
                b = bk * group + g
                if mk.on:  # the query tiles with a row that may see the key tile (the backward's m_block range)
                    t0, t1 = qtile_range(mk, eng.causal, b, jt, bm, bn, seq_q, seq_k)
                for t in range(t0, t1):
                    r0 = t * bm
                    nr = min(bm, seq_q - r0)
                    pt[:, :] = 0.0
                    dst[:, :] = 0.0
                    for r in range(nr):
                        i = r0 + r
                        k_lo, k_hi = visible_keys(mk, eng.causal, b, i, seq_k)  # the row's keys [k_lo, k_hi)
                        nv = max(0, min(nk, k_hi - j0))
                        if k_lo >= j0 + nv:
                            nv = 0
                        if nv == 0:
                            continue
                        for jj in range(nv):  # B2
                            s[jj] = 0.0
                            dpr[jj] = 0.0
                        kt, ekt, kt32, ekt32 = tile_of(xs.kt, ktile)
                        row_mma(xs.q[b, i], xs.eq[b, i], kt, ekt, kt32, ekt32, s, nv, eng.qk, w)
                        lse_i = xs.lse[b, i]
                        if mk.on:
                            _mask_scores(s, nv, b, i, j0, k_lo, pp, mk)
                        _scaled(x, s, nv, sscale, lse_i, pp.contract, eng.fma_exact, ln.scale, pp.scale)  # B4
                        if pp.exp_tl:  # tl.exp: exp2 of the product with log2 e
                            for jj in range(nv):
                                x[jj] = exp_op(x[jj], pp.exp, pp, eng.ex2_tab)
                        else:
                            _exp_of(x, nv, pp.exp2, ln.exp, pp.exp, eng.ex2_tab)
                        if mk.on:  # masked pairs: p = 0
                            for jj in range(nv):
                                if key_masked(mk, b, i, j0 + jj, k_lo):
                                    x[jj] = 0.0
                        tot = 0.0
                        for jj in range(nv):
                            tot += x[jj]
                        psum[b, i] += tot
                        vt, evt, vt32, evt32 = tile_of(xs.vt, ktile)
                        row_mma(xs.do[b, i], xs.edo[b, i], vt, evt, vt32, evt32, dpr, nv, eng.dp, w)  # B6
                        _ds_of(y, x, dpr, nv, xs.delta[b, i], ln.ds, pp.ds)  # B7
                        if pp.scale_ds:  # B7': dS * scale before the cast
                            _scale_by(y, nv, pp.sm_scale, ln.ds, pp.ds)
                        if mk.on:  # masked pairs: ds = 0
                            for jj in range(nv):
                                if key_masked(mk, b, i, j0 + jj, k_lo):
                                    y[jj] = 0.0
                        _cast(y, 0, nv, ln.ds_cast, pp.ds_cast)  # B8
                        _cast(x, 0, nv, ln.p, pp.p)  # B5's cast
                        for jj in range(nv):
                            pt[jj, r] = x[jj]
                            dst[jj, r] = y[jj]
                        if eng.walk:  # Q4 in its own pass, over the dQ kernel's tiles
                            for jj in range(nv):
                                dsf[b, i, j0 + jj] = y[jj]
                            continue
                        for jj in range(nv, bn):
                            y[jj] = 0.0
                        a = _operand_row(y, bn, eng.dq, yin, ey)  # Q4
                        k_t, ek_t, k_t32, ek_t32 = tile_of(xs.k_t, ktile)
                        row_mma(a, ey, k_t, ek_t, k_t32, ek_t32, dq[b, i], d, eng.dq, w)
                    qtile = b * n_qt + t
                    do_t, edo_t, do_t32, edo_t32 = tile_of(xs.do_t, qtile)
                    q_t, eq_t, q_t32, eq_t32 = tile_of(xs.q_t, qtile)
                    for jj in range(nk):  # B5, B9: one MMA per key over the tile's rows
                        a = _operand_row(pt[jj], bm, eng.dv, rin, er)
                        row_mma(a, er, do_t, edo_t, do_t32, edo_t32, dva[jj], dvd, eng.dv, w)
                        a = _operand_row(dst[jj], bm, eng.dk, rin, er)
                        row_mma(a, er, q_t, eq_t, q_t32, eq_t32, dka[jj], d, eng.dk, w)
            for jj in range(nk):  # E1, E2
                _epilogue(dka[jj], d, 0.0 if pp.scale_ds else pp.sm_scale, eng)
                _epilogue(dva[jj], dvd, 0.0, eng)
                for c in range(d):
                    dk[bk, j0 + jj, c] = dka[jj, c]
                for c in range(dvd):
                    dv[bk, j0 + jj, c] = dva[jj, c]
        if eng.walk:  # Q4 and E3 in _dq_walk_units
            continue
        for g in range(group):
            for i in range(seq_q):  # E3
                _epilogue(dq[bk * group + g, i], d, 0.0 if pp.scale_ds else pp.dq_scale, eng)


@jit
def _dq_walk_units(lo, hi, dsf, k_t, dq, eng):
    """Q4 as a pass of its own for query leads [lo, hi), over the dQ kernel's tiles (bm2, bn2): row i of dQ
    query tile t walks the key tiles ``eng.dq_order[b, t, :n]`` (n: the tiles it sees), each an MMA of its dS
    row (``dsf`` (L, seq_q, seq_k)) with the K tile (``k_t``): in-MMA ``dq_i = dq(dq_i + sum_j ds_ij k_j)``
    (tiles before the first the query tile walks are skipped), or atomic Q4a ``c = dq(sum_j ds_ij k_j)`` from
    zero then Q4b ``dq_i = dq_atomic(dq_i + c)``; then E3. Compiled only when a call uses it."""
    pp, r, mk = eng.pp, eng.ln.dq_atomic, eng.mk
    bm2, bn2, seq_k = eng.bm2, eng.bn2, eng.seq_k
    seq_q, d = dq.shape[1], dq.shape[2]
    n_kv2 = (seq_k + bn2 - 1) // bn2
    y, yin, ey, part = np.zeros(bn2), np.zeros(bn2), np.zeros(bn2), np.zeros(d)
    w = work(max(bn2, d))
    for b in range(lo, hi):
        bk = b // eng.group
        for i in range(seq_q):
            t = i // bm2
            for c in range(d):
                dq[b, i, c] = 0.0
            jt_lo, n_seen = visible_tiles(mk, eng.causal, b, t, bm2, bn2, seq_k)
            for u in range(n_seen):
                jt = eng.dq_order[b, t, u]
                if jt < jt_lo and not pp.atomic:
                    continue
                j0 = jt * bn2
                nk = min(bn2, seq_k - j0)
                for jj in range(nk):
                    y[jj] = dsf[b, i, j0 + jj]
                for jj in range(nk, bn2):
                    y[jj] = 0.0
                a = _operand_row(y, bn2, eng.dq, yin, ey)
                kt, ekt, kt32, ekt32 = tile_of(k_t, bk * n_kv2 + jt)
                if not pp.atomic:
                    row_mma(a, ey, kt, ekt, kt32, ekt32, dq[b, i], d, eng.dq, w)
                    continue
                for c in range(d):
                    part[c] = 0.0
                row_mma(a, ey, kt, ekt, kt32, ekt32, part, d, eng.dq, w)  # Q4a
                if r.fast:  # Q4b
                    for c in range(d):
                        dq[b, i, c] = ladd(dq[b, i, c], part[c], r)
                else:
                    for c in range(d):
                        dq[b, i, c] = add(dq[b, i, c], part[c], pp.dq_atomic)
            _epilogue(dq[b, i], d, 0.0 if pp.scale_ds else pp.dq_scale, eng)


def _tiles(x: np.ndarray, width: int) -> np.ndarray:
    """(L, S, C) -> (L * ceil(S / width), width, C), zero-padded past S."""
    n_lead, seq, cols = x.shape
    n = -(-seq // width)
    out = np.zeros((n_lead, n * width, cols))
    out[:, :seq] = x
    return out.reshape(n_lead * n, width, cols)


def _weights(x: np.ndarray, mp: MMA) -> np.ndarray:
    w = np.empty(x.shape)
    operand_powers(np.ascontiguousarray(x).reshape(-1), w.reshape(-1), mp.opnd_emin)
    return w


def _tame(f: FloatFormat) -> bool:
    return f.mantissa_bits <= 25 and f.emin - f.mantissa_bits >= -400 and f.emax <= 400


def _lanes(pl: BackwardPlan) -> BwdLanes:
    return BwdLanes(*(lane(getattr(pl, op).fmt, int(getattr(pl, op).mode)) for op in BwdLanes._fields))


def run(
    pl: BackwardPlan,
    pp: BackwardParams,
    qf: np.ndarray,
    kf: np.ndarray,
    vf: np.ndarray,
    of: np.ndarray,
    dof: np.ndarray,
    lf: np.ndarray,
    delta: np.ndarray,
    dq: np.ndarray,
    dk: np.ndarray,
    dv: np.ndarray,
    psum: np.ndarray,
    tiles: tuple[int, int, int, int, bool],
    causal: bool,
    order: np.ndarray,
    mk: KeyMask = NO_MASK,
) -> None:
    """The vector engine's run: delta, then dq, dk, dv (filled in place) and the row sums of P. ``tiles``:
    (bm, bn, bm2, bn2, walk) as :class:`BwdEngine`'s."""
    bm, bn, bm2, bn2, walk = tiles
    ln = _lanes(pl)
    n_lead, seq_q = qf.shape[:2]
    n_kv_lead, seq_k = kf.shape[:2]
    if n_lead * seq_q:
        run_rows(_delta_units, n_lead * seq_q, of, dof, delta, ln.delta, pp.delta)

    m_qk, m_dv, m_dp, m_dk, m_dq = (mma(getattr(pl, n)) for n in ("qk", "dv", "dp", "dk", "dq"))
    q_qk, k_qk = round_operands(qf, m_qk), round_operands(kf, m_qk)
    m_qk = for_operands(m_qk, q_qk, k_qk)
    do_dp, v_dp = round_operands(dof, m_dp), round_operands(vf, m_dp)
    m_dp = for_operands(m_dp, do_dp, v_dp)
    do_dv = round_operands(dof, m_dv)
    m_dv = for_operands(m_dv, do_dv)
    q_dk = round_operands(qf, m_dk)
    m_dk = for_operands(m_dk, q_dk)
    k_dq = round_operands(kf, m_dq)
    m_dq = for_operands(m_dq, k_dq)
    # a sequential model needs exact float64 products: P and dS (the row operands) of a wide format do not
    # guarantee them, and those dots then take the reference path per output
    m_dv = m_dv._replace(fast=False) if m_dv.fast and m_dv.exact_products and not _tame(pl.p.fmt) else m_dv
    m_dk, m_dq = (
        mp._replace(fast=False) if mp.fast and mp.exact_products and not _tame(pl.ds_cast.fmt) else mp
        for mp in (m_dk, m_dq)
    )
    kt = np.ascontiguousarray(_tiles(k_qk, bn).transpose(0, 2, 1))
    vt = np.ascontiguousarray(_tiles(v_dp, bn).transpose(0, 2, 1))
    do_t, q_t, k_t = _tiles(do_dv, bm), _tiles(q_dk, bm), _tiles(k_dq, bn2)
    m_qk, kt_s = b_stack(m_qk, kt, _weights(kt, m_qk))
    m_dp, vt_s = b_stack(m_dp, vt, _weights(vt, m_dp))
    m_dv, do_s = b_stack(m_dv, do_t, _weights(do_t, m_dv))
    m_dk, q_s = b_stack(m_dk, q_t, _weights(q_t, m_dk))
    m_dq, k_s = b_stack(m_dq, k_t, _weights(k_t, m_dq))
    xs = BwdOperands(q_qk, _weights(q_qk, m_qk), kt_s, do_dp, _weights(do_dp, m_dp), vt_s, do_s, q_s, k_s, lf, delta)
    fma_exact = _tame(dot_output_format(pl.qk)) and _tame(pl.scale.fmt)
    group = n_lead // n_kv_lead if n_kv_lead else 1
    eng = BwdEngine(
        record_of(pp, skip=("ex2_tab",)),
        record_of(ln),
        record_of(m_qk),
        record_of(m_dv),
        record_of(m_dp),
        record_of(m_dk),
        record_of(m_dq),
        bool(fma_exact),
        bm,
        bn,
        causal,
        seq_q,
        seq_k,
        group,
        order,
        mk,
        walk,
        bm2,
        bn2,
        pp.ex2_tab,
    )
    # B8's dS per (query lead, row, key) when dQ walks on its own: L * seq_q * seq_k float64
    dsf = np.zeros((n_lead, seq_q, seq_k)) if walk else np.zeros((0, 0, 0))
    if n_kv_lead:
        run_rows(_bwd_units, n_kv_lead, xs, dq, dk, dv, psum, eng, dsf)
        if walk and n_lead * seq_q:
            run_rows(_dq_walk_units, n_lead, dsf, xs.k_t, dq, eng)
