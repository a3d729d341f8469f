"""The scalar reference engine of the flash backward (:func:`simfloat.attention.backward.flash_backward`): every
value by the scalar ops and ``dot_acc`` per output, one rounding at a time, in the kernels' order; the test oracle
of the vector engine (:mod:`simfloat.attention.vector.backward`) and where traces are recorded.

:func:`delta_units` is D2, :func:`units` the dK/dV pass (B2..B9, E1/E2) and Q4/E3 per output, :func:`dq_walk`
Q4 over the dQ kernel's own tiles (atomic or in another order), :func:`epilogue` E1/E3 of one value. The traced
ops (:data:`TRACED_BACKWARD_OPS`) and accumulators (:data:`BACKWARD_STATES`) are the columns of a trace.
"""

from __future__ import annotations

import math

import numpy as np

from simfloat._jit import fma64, jit
from simfloat.accumulate import dot_acc
from simfloat.attention._kernels import add, dot64, exp_op, fma, mul, rnd, sub
from simfloat.attention._masks import (
    DENSE_ADD,
    key_masked,
    qtile_range,
    visible_keys,
    visible_tiles,
)
from simfloat.attention.backward_plan import FLASH_BACKWARD_OPS
from simfloat.trace import record

_LOG2E = math.log2(math.e)

#: the ops a traced :func:`flash_backward` records, in the kernels' order (``lse`` is :func:`lse_from_stats`'s)
TRACED_BACKWARD_OPS = tuple(op for op in FLASH_BACKWARD_OPS if op != "lse")
#: the accumulators whose drift from the float64 shadow a traced :func:`flash_backward` records
BACKWARD_STATES = ("dq", "dk", "dv")
# op indices (positions in TRACED_BACKWARD_OPS) and state indices (in BACKWARD_STATES), looked up by name
B_DELTA, B_QK, B_SCALE, B_EXP, B_P, B_DV, B_DP, B_DS, B_DS_CAST, B_DK, B_DQ, B_GRAD_SCALE, B_GRAD = (
    TRACED_BACKWARD_OPS.index(n)
    for n in ("delta", "qk", "scale", "exp", "p", "dv", "dp", "ds", "ds_cast", "dk", "dq", "grad_scale", "grad")
)
S_DQ, S_DK, S_DV = (BACKWARD_STATES.index(n) for n in ("dq", "dk", "dv"))


@jit
def units(lo, hi, q, k, v, do, o, lse, delta, dq, dk, dv, psum, pp, geo, tr, sh, order, mk):
    """The scalar reference (test oracle) for key/value lead indices [lo, hi) and the query heads of their
    groups: every value by the scalar ops and ``dot_acc`` per output, the dots over the kernels' zero-padded
    tiles, in the kernels' order (G1: dK and dV of a key/value head over the group's query heads in order, each
    over its query tiles).

    With a tracer's arrays ``tr`` (local, state), it also records each op's local error at (lead, query tile,
    key tile) and runs a float64 shadow of the same dataflow from the same inputs (``sh``: the float64
    qk_scale and softmax scale), recording the drift of the dq, dk and dv accumulators from it after every
    tile step; key tile ``n_kv`` (``-1`` in the frames) holds D2 and the epilogue E1..E3. A dK/dV step is
    recorded at the query lead it reads; the dK/dV epilogue at the group's first query lead. ``order``: as
    :attr:`BwdEngine.dq_order` (atomic dQ: a step is a key tile's contribution and its add). ``mk``: the
    call's :class:`~simfloat.attention._masks.KeyMask` (masked pairs: p = ds = 0). ``geo``: (bm, bn, causal,
    group, bm2, bn2, walk), bm2 and bn2 the dQ kernel's tiles, ``walk`` as :attr:`BwdEngine.walk` (a dQ step is
    recorded at the tile of the (bm, bn) grid that holds its first row and key)."""
    bm, bn, causal, group, bm2, bn2, walk = geo
    seq_q, d = q.shape[1], q.shape[2]
    seq_k, dvd = v.shape[1], v.shape[2]
    n_qt, n_kv = (seq_q + bm - 1) // bm, (seq_k + bn - 1) // bn
    wk = max(n_kv * bn, ((seq_k + bn2 - 1) // bn2) * bn2)  # the keys padded to both kernels' tiles
    pm, dsm = np.zeros((group, n_qt * bm, wk)), np.zeros((group, n_qt * bm, wk))
    qp, dop = np.zeros((group, n_qt * bm, d)), np.zeros((group, n_qt * bm, dvd))
    kp = np.zeros((wk, d))
    ns = n_qt * bm if tr is not None else 1
    ps, dss, d64 = np.zeros((group, ns, wk)), np.zeros((group, ns, wk)), np.zeros(ns)
    for bk in range(lo, hi):
        pm[:, :, :] = 0.0
        dsm[:, :, :] = 0.0
        kp[:seq_k] = k[bk]
        if tr is not None:
            ps[:, :, :] = 0.0
            dss[:, :, :] = 0.0
        for g in range(group):
            b = bk * group + g
            qp[g, :seq_q] = q[b]
            dop[g, :seq_q] = do[b]
            if tr is not None:  # D2's local errors and the shadow's delta
                traced_delta(o, do, b, bm, n_kv, pp, tr, d64)
            for i in range(seq_q):
                k_lo, jv = visible_keys(mk, causal, b, i, seq_k)
                for j in range(jv):
                    if mk.on and key_masked(mk, b, i, j, k_lo):
                        continue
                    sc = dot_acc(q[b, i], k[bk, j], 0.0, pp.qk)  # B2
                    z, b64 = sc, 0.0
                    if mk.dense == DENSE_ADD:  # B3: the scores scaled and biased (the forward's T3)
                        bv = mk.bias[mk.bmap[b], i, j]
                        b2, b64 = bv, bv
                        if pp.exp2:
                            b2, b64 = mul(bv, rnd(_LOG2E, pp.scale), pp.scale), bv * _LOG2E
                        if pp.contract:
                            z = fma(sc, pp.qk_scale, b2, pp.scale)
                        else:
                            z = add(mul(sc, pp.qk_scale, pp.scale), b2, pp.scale)
                        x = sub(z, lse[b, i], pp.scale)
                    elif pp.contract:  # B4
                        x = fma(sc, pp.qk_scale, -lse[b, i], pp.scale)
                    else:
                        x = sub(mul(sc, pp.qk_scale, pp.scale), lse[b, i], pp.scale)
                    pv = exp_op(x, pp.exp, pp)
                    psum[b, i] += pv
                    dp = dot_acc(do[b, i], v[bk, j], 0.0, pp.dp)  # B6
                    ds = mul(pv, sub(dp, delta[b, i], pp.ds), pp.ds)  # B7
                    if pp.scale_ds:  # B7': dS * scale before the cast
                        ds = mul(ds, pp.sm_scale, pp.ds)
                    dsm[g, i, j] = rnd(ds, pp.ds_cast)  # B8
                    pm[g, i, j] = rnd(pv, pp.p)
                    if tr is not None:
                        t, jt = i // bm, j // bn
                        loc = tr[0]
                        s64 = dot64(q[b, i], k[bk, j], 0.0)
                        record(loc, b, t, jt, B_QK, sc - s64, s64)
                        xr = fma64(sc, pp.qk_scale, -lse[b, i]) if pp.contract else sc * pp.qk_scale - lse[b, i]
                        if mk.dense == DENSE_ADD:
                            xr = z - lse[b, i]
                        record(loc, b, t, jt, B_SCALE, x - xr, xr)
                        er = math.exp2(x) if pp.exp2 else math.exp(x)
                        record(loc, b, t, jt, B_EXP, pv - er, er)
                        record(loc, b, t, jt, B_P, pm[g, i, j] - pv, pv)
                        dp64 = dot64(do[b, i], v[bk, j], 0.0)
                        record(loc, b, t, jt, B_DP, dp - dp64, dp64)
                        dr = pv * (dp - delta[b, i])
                        if pp.scale_ds:
                            dr = mul(pv, sub(dp, delta[b, i], pp.ds), pp.ds) * pp.sm_scale
                        record(loc, b, t, jt, B_DS, ds - dr, dr)
                        record(loc, b, t, jt, B_DS_CAST, dsm[g, i, j] - ds, ds)
                        x64 = fma64(s64, sh[0], -lse[b, i]) if pp.contract else s64 * sh[0] - lse[b, i]
                        if mk.dense == DENSE_ADD:
                            x64 = s64 * sh[0] + b64 - lse[b, i]
                        p64 = math.exp2(x64) if pp.exp2 else math.exp(x64)
                        ps[g, i, j] = p64
                        dss[g, i, j] = p64 * (dp64 - d64[i]) * sh[3]
        b0 = bk * group
        kgeo = (bm, bn, causal, group, seq_q, seq_k, n_qt)
        for j in range(seq_k):  # B5, B9 over the group's query heads (G1) and their query tiles; E1, E2
            jt = j // bn
            for c in range(dvd):
                acc, a64 = kv_step_sum(pm, dop, ps, j, c, b0, jt, mk, kgeo, pp.dv, tr, (B_DV, S_DV))
                dv[bk, j, c] = rnd(acc, pp.grad)
                if tr is not None:
                    record(tr[0], b0, 0, n_kv, B_GRAD, dv[bk, j, c] - acc, acc)
                    record(tr[1], b0, 0, n_kv, S_DV, dv[bk, j, c] - a64, a64)
            for c in range(d):
                acc, a64 = kv_step_sum(dsm, qp, dss, j, c, b0, jt, mk, kgeo, pp.dk, tr, (B_DK, S_DK))
                w = 0.0 if pp.scale_ds else pp.sm_scale
                dk[bk, j, c] = epilogue(acc, a64, w, pp, tr, b0, 0, n_kv, S_DK, sh[1])  # sh: see flash_backward
        wq = 0.0 if pp.scale_ds else pp.dq_scale
        for g in range(group):
            b = b0 + g
            for i in range(seq_q):  # Q4 over the key tiles; E3
                t, t2 = i // bm, i // bm2
                jt_lo, jt_hi = visible_tiles(mk, causal, b, t2, bm2, bn2, seq_k)  # the dQ query tile's key tiles
                for c in range(d):
                    acc, a64 = 0.0, 0.0
                    if walk:  # the dQ kernel's tiles in its order (atomic: tiles below jt_lo add zeros: exact)
                        tiles = (order[b, t2], jt_lo, jt_hi, bn2, bn)
                        acc, a64 = dq_walk(dsm[g, i], dss[g], kp, c, tiles, pp, tr, b, t, i)
                        dq[b, i, c] = epilogue(acc, a64, wq, pp, tr, b, t, n_kv, S_DQ, sh[2])
                        continue
                    for jt in range(jt_lo, jt_hi):
                        k0, k1 = jt * bn, (jt + 1) * bn
                        new = dot_acc(dsm[g, i, k0:k1], kp[k0:k1, c], acc, pp.dq)
                        if tr is not None:
                            ex = dot64(dsm[g, i, k0:k1], kp[k0:k1, c], acc)
                            record(tr[0], b, t, jt, B_DQ, new - ex, ex)
                            a64 = dot64(dss[g, i, k0:k1], kp[k0:k1, c], a64)
                            record(tr[1], b, t, jt, S_DQ, new - a64, a64)
                        acc = new
                    dq[b, i, c] = epilogue(acc, a64, wq, pp, tr, b, t, n_kv, S_DQ, sh[2])


@jit
def traced_delta(o, do, b, bm, n_kv, pp, tr, d64):
    """D2 of query lead b traced: each product's and each add's local error (the ops of :func:`delta_units`)
    at (b, the row's query tile, key tile ``n_kv``), and the shadow's float64 delta per row into ``d64``."""
    for i in range(o.shape[1]):
        s, s64 = 0.0, 0.0
        for c in range(o.shape[2]):
            x = mul(o[b, i, c], do[b, i, c], pp.delta)
            rec = o[b, i, c] * do[b, i, c]
            record(tr[0], b, i // bm, n_kv, B_DELTA, x - rec, rec)
            y = add(s, x, pp.delta)
            record(tr[0], b, i // bm, n_kv, B_DELTA, y - (s + x), s + x)
            s = y
            s64 += o[b, i, c] * do[b, i, c]
        d64[i] = s64


@jit
def kv_step_sum(a, x, a64s, j, c, b0, jt, mk, kgeo, model, tr, ids):
    """B5 (dV: ``a`` P, ``x`` dO) or B9 (dK: ``a`` dS, ``x`` Q) for key j and column c: per query head g of
    the group from ``b0`` (G1) and per query tile t that sees key tile jt, in order, ``acc = model(acc +
    sum_{r in t} a[g, r, j] x[g, r, c])`` (one MMA over the tile's zero-padded rows, from the accumulator).
    ``kgeo``: (bm, bn, causal, group, seq_q, seq_k, n_qt). Traced: each step's local error (op ``ids[0]``)
    at (b0 + g, t, jt), and the shadow (``a64s``, the float64 P or dS) accumulated in the same order, its
    drift (state ``ids[1]``). Returns (the sum, the shadow's)."""
    bm, bn, causal, group, seq_q, seq_k, n_qt = kgeo
    t0 = (jt * bn) // bm if causal else 0
    acc, a64 = 0.0, 0.0
    for g in range(group):
        t_lo, t_hi = qtile_range(mk, causal, b0 + g, jt, bm, bn, seq_q, seq_k) if mk.on else (t0, n_qt)
        for t in range(t_lo, t_hi):
            r0, r1 = t * bm, (t + 1) * bm
            new = dot_acc(a[g, r0:r1, j], x[g, r0:r1, c], acc, model)
            if tr is not None:
                ex = dot64(a[g, r0:r1, j], x[g, r0:r1, c], acc)
                record(tr[0], b0 + g, t, jt, ids[0], new - ex, ex)
                a64 = dot64(a64s[g, r0:r1, j], x[g, r0:r1, c], a64)
                record(tr[1], b0 + g, t, jt, ids[1], new - a64, a64)
            acc = new
    return acc, a64


@jit
def dq_walk(ds, dss, kp, c, tiles, pp, tr, b, t, i):
    """Q4 for one value ``dq[b, i, c]`` by the scalar ops over the dQ kernel's key tiles: ``tiles`` = (order,
    jt_lo, n_t, bn2, bn): the tiles ``order[:n_t]`` of width bn2, each a ``dot_acc`` over the row ``ds`` and
    column c of the padded K ``kp``: in-MMA from the accumulator (tiles below jt_lo skipped, as the kernel's
    walk starts there), or atomic (Q4a from zero, then Q4b: added into ``dq_atomic`` from 0). Traced: a step's
    local error (the contribution's and the add's together, against the float64 dot from the same
    accumulator) at (b, t, the bn-wide key tile of its first key), and the shadow (``dss[i]``, the float64 dS)
    accumulates in the same order. Returns (the sum, the shadow's)."""
    order, jt_lo, n_t, bn2, bn = tiles
    acc, a64 = 0.0, 0.0
    for u in range(n_t):
        jt = order[u]
        if jt < jt_lo and not pp.atomic:
            continue
        k0, k1 = jt * bn2, (jt + 1) * bn2
        if pp.atomic:
            part = dot_acc(ds[k0:k1], kp[k0:k1, c], 0.0, pp.dq)
            new = add(acc, part, pp.dq_atomic)
        else:
            new = dot_acc(ds[k0:k1], kp[k0:k1, c], acc, pp.dq)
        if tr is not None:
            ex = dot64(ds[k0:k1], kp[k0:k1, c], acc)
            record(tr[0], b, t, k0 // bn, B_DQ, new - ex, ex)
            a64 = dot64(dss[i, k0:k1], kp[k0:k1, c], a64)
            record(tr[1], b, t, k0 // bn, S_DQ, new - a64, a64)
        acc = new
    return acc, a64


@jit
def epilogue(acc, a64, w, pp, tr, b, t, kv, state, sm64):
    """E1/E3 for one value: ``grad(grad_scale(acc * w))`` (w = 0: ``grad(acc)``, the scale applied to dS),
    recording the ops' local errors and the final gradient's drift from the shadow's ``a64 * sm64`` at
    (b, t, kv) when tracing."""
    x = mul(acc, w, pp.grad_scale) if w > 0.0 else acc
    g = rnd(x, pp.grad)
    if tr is not None:
        if w > 0.0:
            record(tr[0], b, t, kv, B_GRAD_SCALE, x - acc * w, acc * w)
        record(tr[0], b, t, kv, B_GRAD, g - x, x)
        record(tr[1], b, t, kv, state, g - a64 * sm64, a64 * sm64)
    return g


@jit
def delta_units(lo, hi, o, do, delta, op):
    """D2 by the scalar ops, rows [lo, hi) of the flattened (lead, query) grid."""
    seq_q = o.shape[1]
    for u in range(lo, hi):
        b = u // seq_q
        i = u - b * seq_q
        s = 0.0
        for c in range(o.shape[2]):
            s = add(s, mul(o[b, i, c], do[b, i, c], op), op)
        delta[b, i] = s
