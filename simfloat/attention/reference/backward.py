"""The scalar reference engine of the flash backward (:func:`simfloat.attention.backward.flash_backward`): every
value by the scalar ops and ``dot_acc`` per output, one rounding at a time, in the kernels' order; the test oracle
of the vector engine (:mod:`simfloat.attention.vector.backward`) and where traces are recorded.

:func:`delta_units` is D2; :func:`units` runs, per key/value head, the steps: :func:`scores_grads` (B2..B8 of
one query row and key), :func:`kv_grads` (B5, B9 over the group's query heads; E1, E2) and :func:`dq_grads` (Q4
in the dK/dV kernel's tiles, or :func:`dq_walk` over the dQ kernel's own, atomic or in another order; E3), each
value's :func:`epilogue`. It takes records: the call's :class:`Inputs`, the gradients it fills
(:class:`simfloat.attention.backward._Grads`), the tiles as :class:`Geometry`.

Tracing goes through two hooks, :func:`_rec` (an op's local error) and :func:`_srec` (an accumulator's drift
from the float64 shadow), no-ops when ``tr`` is None (numba prunes them), and the traced steps that cost a dot
or an exponential (:func:`_trace_pair`, :func:`_trace_dot`, :func:`traced_delta`) compute it only when tracing.
The traced ops (:data:`TRACED_BACKWARD_OPS`) and accumulators (:data:`BACKWARD_STATES`) are the columns of a
trace.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from simfloat._jit import fma64, jit
from simfloat.accumulate import dot_acc
from simfloat.attention._kernels import add, dot64, exp_op, fma, mul, rnd, sub
from simfloat.attention._masks import (
    DENSE_ADD,
    KeyMask,
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


class Inputs(NamedTuple):
    """The reference backward's operands, flattened over the leading dims (L query leads, Lk key/value leads).

    Attributes:
        q: (L, Sq, D); k: (Lk, Sk, D); v: (Lk, Sk, Dv); do, o: (L, Sq, Dv); lse, delta: (L, Sq) (delta: D2's).
        order: (L, n_q_tiles2, n_kv2) int64: the dQ kernel's key tiles per lead and query tile in the plan's
            order (:func:`~simfloat.attention._dq_order.dq_orders`; unused unless ``Geometry.walk``).
        mk: the call's :class:`~simfloat.attention._masks.KeyMask` (masked pairs: p = ds = 0).
        ex2_tab: the plan's ex2.approx table (``BackwardParams.ex2_tab``: :func:`units` takes the params as a
            record, :func:`simfloat._jit.record_of`).
    """

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    do: np.ndarray
    o: np.ndarray
    lse: np.ndarray
    delta: np.ndarray
    order: np.ndarray
    mk: KeyMask
    ex2_tab: np.ndarray


class Geometry(NamedTuple):
    """The kernels' tiles: the dK/dV kernel's (bm, bn), the dQ kernel's (bm2, bn2); ``walk``: Q4 walks the dQ
    kernel's tiles in its order (:attr:`BwdEngine.walk`; a dQ step is recorded at the tile of the (bm, bn) grid
    that holds its first row and key); causal; group: query heads per key/value head; seq_q, seq_k."""

    bm: int
    bn: int
    causal: bool
    group: int
    bm2: int
    bn2: int
    walk: bool
    seq_q: int
    seq_k: int


class Work(NamedTuple):
    """One thread's arrays for one key/value head (:func:`_work`): P and dS of the group's query heads over the
    keys padded to both kernels' tiles, the group's Q and dO and the head's K padded to whole tiles; traced, the
    float64 shadow's P (``ps``), dS (``dss``) and delta (``d64``) (else one placeholder row each)."""

    pm: np.ndarray  # (group, n_qt * bm, wk) P (B5's operand, cast by the p op)
    dsm: np.ndarray  # (group, n_qt * bm, wk) dS (B9's and Q4's operand, cast by ds_cast)
    qp: np.ndarray  # (group, n_qt * bm, D)
    dop: np.ndarray  # (group, n_qt * bm, Dv)
    kp: np.ndarray  # (wk, D)
    ps: np.ndarray  # (group, n_qt * bm or 1, wk)
    dss: np.ndarray  # (group, n_qt * bm or 1, wk)
    d64: np.ndarray  # (n_qt * bm or 1,)


class Pair(NamedTuple):
    """B2..B8 of one (query row i of lead b, key j of key/value lead bk), g the row's head in the group: the
    emulated values the trace reads (sc B2's score, z the biased score and b64 the bias' float64 value under an
    additive mask, x B4's argument, pv P, dp B6, ds B7)."""

    g: int
    b: int
    bk: int
    i: int
    j: int
    sc: float
    z: float
    b64: float
    x: float
    pv: float
    dp: float
    ds: float


@jit
def _rec(tr, b, t, jt, op, y, ex):
    """The trace hook: op ``op`` (B_*) gave ``y`` where float64 gives ``ex``, at (b, t, jt); nothing when ``tr``
    is None."""
    if tr is not None:
        record(tr[0], b, t, jt, op, y - ex, ex)


@jit
def _srec(tr, b, t, jt, st, y, ex):
    """The shadow's hook: accumulator ``st`` (S_*) is ``y``, the float64 shadow's ``ex``."""
    if tr is not None:
        record(tr[1], b, t, jt, st, y - ex, ex)


@jit
def _work(xs, geo, traced):
    seq_q, d, seq_k, dvd = xs.q.shape[1], xs.q.shape[2], xs.v.shape[1], xs.v.shape[2]
    n_qt, n_kv = (seq_q + geo.bm - 1) // geo.bm, (seq_k + geo.bn - 1) // geo.bn
    wk = max(n_kv * geo.bn, ((seq_k + geo.bn2 - 1) // geo.bn2) * geo.bn2)  # the keys padded to both kernels' tiles
    rows, group = n_qt * geo.bm, geo.group
    ns = rows if traced else 1
    return Work(
        np.zeros((group, rows, wk)),
        np.zeros((group, rows, wk)),
        np.zeros((group, rows, d)),
        np.zeros((group, rows, dvd)),
        np.zeros((wk, d)),
        np.zeros((group, ns, wk)),
        np.zeros((group, ns, wk)),
        np.zeros(ns),
    )


@jit
def units(lo, hi, xs, out, pp, geo, tr, sh):
    """The scalar reference (test oracle) for key/value lead indices [lo, hi) and the query heads of their
    groups: every value by the scalar ops and ``dot_acc`` per output, the dots over the kernels' zero-padded
    tiles, in the kernels' order (G1: dK and dV of a key/value head over the group's query heads in order, each
    over its query tiles).

    Args:
        xs: the :class:`Inputs`; out: the gradients filled in place (``dq``, ``dk``, ``dv`` and ``psum``, each
            row's sum of P; :class:`~simfloat.attention.backward._Grads`); pp: the plan's
            :class:`~simfloat.attention.backward_plan.BackwardParams` as a record (its table: ``xs.ex2_tab``); geo:
            :class:`Geometry`.
        tr: a tracer's arrays (local, state) or None. Traced, it also records each op's local error at (lead,
            query tile, key tile) and runs a float64 shadow of the same dataflow from the same inputs, recording
            the drift of the dq, dk and dv accumulators from it after every tile step; key tile ``n_kv`` (``-1``
            in the frames) holds D2 and the epilogue E1..E3. A dK/dV step is recorded at the query lead it
            reads; the dK/dV epilogue at the group's first query lead.
        sh: the float64 shadow's multipliers (B4's qk_scale, E1's, E3's, B7's).
    """
    w = _work(xs, geo, tr is not None)
    n_kv = (geo.seq_k + geo.bn - 1) // geo.bn
    for bk in range(lo, hi):
        w.pm[:, :, :] = 0.0
        w.dsm[:, :, :] = 0.0
        w.ps[:, :, :] = 0.0
        w.dss[:, :, :] = 0.0
        w.kp[: geo.seq_k] = xs.k[bk]
        for g in range(geo.group):
            b = bk * geo.group + g
            w.qp[g, : geo.seq_q] = xs.q[b]
            w.dop[g, : geo.seq_q] = xs.do[b]
            traced_delta(xs.o, xs.do, b, geo.bm, n_kv, pp, tr, w.d64)  # D2's local errors, the shadow's delta
            for i in range(geo.seq_q):
                k_lo, jv = visible_keys(xs.mk, geo.causal, b, i, geo.seq_k)
                for j in range(jv):
                    if xs.mk.on and key_masked(xs.mk, b, i, j, k_lo):
                        continue
                    scores_grads(xs, w, out, pp, geo, tr, sh, g, b, bk, i, j)  # B2..B8
        kv_grads(xs, w, out, pp, geo, tr, sh, bk)  # B5, B9; E1, E2
        dq_grads(xs, w, out, pp, geo, tr, sh, bk)  # Q4; E3


@jit
def scores_grads(xs, w, out, pp, geo, tr, sh, g, b, bk, i, j):
    """B2..B8 for query row i of lead b (head g of its group) and key j of key/value lead bk: the score, P
    (added to the row's ``psum``), dP and dS, P and dS cast into the work arrays."""
    mk, lse = xs.mk, xs.lse[b, i]
    sc = dot_acc(xs.q[b, i], xs.k[bk, j], 0.0, pp.qk)  # B2
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
        x = sub(z, lse, pp.scale)
    elif pp.contract:  # B4
        x = fma(sc, pp.qk_scale, -lse, pp.scale)
    else:
        x = sub(mul(sc, pp.qk_scale, pp.scale), lse, pp.scale)
    pv = exp_op(x, pp.exp, pp, xs.ex2_tab)  # B5's P
    out.psum[b, i] += pv
    dp = dot_acc(xs.do[b, i], xs.v[bk, j], 0.0, pp.dp)  # B6
    ds = mul(pv, sub(dp, xs.delta[b, i], pp.ds), pp.ds)  # B7
    if pp.scale_ds:  # B7': dS * scale before the cast
        ds = mul(ds, pp.sm_scale, pp.ds)
    w.dsm[g, i, j] = rnd(ds, pp.ds_cast)  # B8
    w.pm[g, i, j] = rnd(pv, pp.p)
    _trace_pair(xs, w, pp, geo, tr, sh, Pair(g, b, bk, i, j, sc, z, b64, x, pv, dp, ds))


@jit
def _trace_pair(xs, w, pp, geo, tr, sh, pr):
    """The trace of :func:`scores_grads` for the pair ``pr`` (:class:`Pair`): each op's local error at (b, the
    row's query tile, the key's tile), and the shadow's float64 P and dS of the pair into ``w.ps``, ``w.dss``."""
    if tr is not None:
        g, b, bk, i, j = pr.g, pr.b, pr.bk, pr.i, pr.j
        t, jt = i // geo.bm, j // geo.bn
        lse, delta, dense = xs.lse[b, i], xs.delta[b, i], xs.mk.dense == DENSE_ADD
        s64 = dot64(xs.q[b, i], xs.k[bk, j], 0.0)
        _rec(tr, b, t, jt, B_QK, pr.sc, s64)
        xr = fma64(pr.sc, pp.qk_scale, -lse) if pp.contract else pr.sc * pp.qk_scale - lse
        if dense:
            xr = pr.z - lse
        _rec(tr, b, t, jt, B_SCALE, pr.x, xr)
        er = math.exp2(pr.x) if pp.exp2 else math.exp(pr.x)
        _rec(tr, b, t, jt, B_EXP, pr.pv, er)
        _rec(tr, b, t, jt, B_P, w.pm[g, i, j], pr.pv)
        dp64 = dot64(xs.do[b, i], xs.v[bk, j], 0.0)
        _rec(tr, b, t, jt, B_DP, pr.dp, dp64)
        dr = pr.pv * (pr.dp - delta)
        if pp.scale_ds:
            dr = mul(pr.pv, sub(pr.dp, delta, pp.ds), pp.ds) * pp.sm_scale
        _rec(tr, b, t, jt, B_DS, pr.ds, dr)
        _rec(tr, b, t, jt, B_DS_CAST, w.dsm[g, i, j], pr.ds)
        x64 = fma64(s64, sh[0], -lse) if pp.contract else s64 * sh[0] - lse
        if dense:
            x64 = s64 * sh[0] + pr.b64 - lse
        p64 = math.exp2(x64) if pp.exp2 else math.exp(x64)
        w.ps[g, i, j] = p64
        w.dss[g, i, j] = p64 * (dp64 - w.d64[i]) * sh[3]


@jit
def kv_grads(xs, w, out, pp, geo, tr, sh, bk):
    """B5 and B9 of key/value lead bk over its group's query heads (G1) and their query tiles, per key and
    channel; E1 (dK's scale and cast) and E2 (dV's cast), recorded at the group's first query lead."""
    b0, n_kv = bk * geo.group, (geo.seq_k + geo.bn - 1) // geo.bn
    wk = 0.0 if pp.scale_ds else pp.sm_scale
    for j in range(geo.seq_k):
        jt = j // geo.bn
        for c in range(xs.v.shape[2]):
            acc, a64 = kv_step_sum(w.pm, w.dop, w.ps, j, c, b0, jt, xs.mk, geo, pp.dv, tr, (B_DV, S_DV))
            out.dv[bk, j, c] = rnd(acc, pp.grad)
            _rec(tr, b0, 0, n_kv, B_GRAD, out.dv[bk, j, c], acc)
            _srec(tr, b0, 0, n_kv, S_DV, out.dv[bk, j, c], a64)
        for c in range(xs.q.shape[2]):
            acc, a64 = kv_step_sum(w.dsm, w.qp, w.dss, j, c, b0, jt, xs.mk, geo, pp.dk, tr, (B_DK, S_DK))
            out.dk[bk, j, c] = epilogue(acc, a64, wk, pp, tr, b0, 0, n_kv, S_DK, sh[1])  # sh: see flash_backward


@jit
def dq_grads(xs, w, out, pp, geo, tr, sh, bk):
    """Q4 of the group of key/value lead bk, per query row and channel over the key tiles its dQ query tile
    walks (:func:`~simfloat.attention._masks.visible_tiles`): in the dK/dV kernel's tiles from the accumulator,
    or (``geo.walk``) :func:`dq_walk` over the dQ kernel's own; E3."""
    n_kv, bn = (geo.seq_k + geo.bn - 1) // geo.bn, geo.bn
    wq = 0.0 if pp.scale_ds else pp.dq_scale
    kp = w.kp
    for g in range(geo.group):
        b = bk * geo.group + g
        for i in range(geo.seq_q):  # Q4 over the key tiles; E3
            t, t2 = i // geo.bm, i // geo.bm2
            jt_lo, jt_hi = visible_tiles(xs.mk, geo.causal, b, t2, geo.bm2, geo.bn2, geo.seq_k)
            ds, srow = w.dsm[g, i], w.dss[g, min(i, w.dss.shape[1] - 1)]  # the shadow's row (untraced: a placeholder)
            for c in range(xs.q.shape[2]):
                acc, a64 = 0.0, 0.0
                if geo.walk:  # the dQ kernel's tiles in its order (atomic: tiles below jt_lo add zeros: exact)
                    tiles = (xs.order[b, t2], jt_lo, jt_hi, geo.bn2, bn)
                    acc, a64 = dq_walk(ds, srow, kp, c, tiles, pp, tr, b, t)
                else:
                    for jt in range(jt_lo, jt_hi):
                        k0, k1 = jt * bn, (jt + 1) * bn
                        new = dot_acc(ds[k0:k1], kp[k0:k1, c], acc, pp.dq)
                        a64 = _trace_dot(
                            tr, b, t, jt, (B_DQ, S_DQ), new, ds[k0:k1], kp[k0:k1, c], acc, srow[k0:k1], a64
                        )
                        acc = new
                out.dq[b, i, c] = epilogue(acc, a64, wq, pp, tr, b, t, n_kv, S_DQ, sh[2])


@jit
def _trace_dot(tr, b, t, jt, ids, new, a, x, acc, s, a64):
    """The trace of one MMA step ``new = model(acc + a . x)`` at (b, t, jt): its local error against the float64
    dot from the same accumulator (op ``ids[0]``), and the shadow ``a64 + s . x`` (``s`` the float64 operand),
    its drift (state ``ids[1]``); returns the shadow's sum (``a64`` when not tracing)."""
    if tr is not None:
        _rec(tr, b, t, jt, ids[0], new, dot64(a, x, acc))
        a64 = dot64(s, x, a64)
        _srec(tr, b, t, jt, ids[1], new, a64)
    return a64


@jit
def traced_delta(o, do, b, bm, n_kv, pp, tr, d64):
    """D2 of query lead b traced: each product's and each add's local error (the ops of :func:`delta_units`)
    at (b, the row's query tile, key tile ``n_kv``), and the shadow's float64 delta per row into ``d64``; nothing
    when ``tr`` is None."""
    if tr is not None:
        for i in range(o.shape[1]):
            s, s64 = 0.0, 0.0
            for c in range(o.shape[2]):
                x = mul(o[b, i, c], do[b, i, c], pp.delta)
                _rec(tr, b, i // bm, n_kv, B_DELTA, x, o[b, i, c] * do[b, i, c])
                y = add(s, x, pp.delta)
                _rec(tr, b, i // bm, n_kv, B_DELTA, y, s + x)
                s = y
                s64 += o[b, i, c] * do[b, i, c]
            d64[i] = s64


@jit
def kv_step_sum(a, x, a64s, j, c, b0, jt, mk, geo, model, tr, ids):
    """B5 (dV: ``a`` P, ``x`` dO) or B9 (dK: ``a`` dS, ``x`` Q) for key j and column c: per query head g of
    the group from ``b0`` (G1) and per query tile t that sees key tile jt, in order, ``acc = model(acc +
    sum_{r in t} a[g, r, j] x[g, r, c])`` (one MMA over the tile's zero-padded rows, from the accumulator).
    Traced: each step's local error (op ``ids[0]``) at (b0 + g, t, jt), and the shadow (``a64s``, the float64 P
    or dS) accumulated in the same order, its drift (state ``ids[1]``). Returns (the sum, the shadow's)."""
    bm, bn = geo.bm, geo.bn
    t0 = (jt * bn) // bm if geo.causal else 0
    n_qt = (geo.seq_q + bm - 1) // bm
    acc, a64 = 0.0, 0.0
    for g in range(geo.group):
        t_lo, t_hi = (t0, n_qt)
        if mk.on:
            t_lo, t_hi = qtile_range(mk, geo.causal, b0 + g, jt, bm, bn, geo.seq_q, geo.seq_k)
        for t in range(t_lo, t_hi):
            r0, r1 = t * bm, (t + 1) * bm
            new = dot_acc(a[g, r0:r1, j], x[g, r0:r1, c], acc, model)
            a64 = _trace_dot(tr, b0 + g, t, jt, ids, new, a[g, r0:r1, j], x[g, r0:r1, c], acc, a64s[g, r0:r1, j], a64)
            acc = new
    return acc, a64


@jit
def dq_walk(ds, srow, kp, c, tiles, pp, tr, b, t):
    """Q4 for one value ``dq[b, i, c]`` by the scalar ops over the dQ kernel's key tiles: ``tiles`` = (order,
    jt_lo, n_t, bn2, bn): the tiles ``order[:n_t]`` of width bn2, each a ``dot_acc`` over the row ``ds`` and
    column c of the padded K ``kp``: in-MMA from the accumulator (tiles below jt_lo skipped, as the kernel's
    walk starts there), or atomic (Q4a from zero, then Q4b: added into ``dq_atomic`` from 0). Traced: a step's
    local error (the contribution's and the add's together, against the float64 dot from the same
    accumulator) at (b, t, the bn-wide key tile of its first key), and the shadow (``srow``, the row's float64
    dS) accumulates in the same order. Returns (the sum, the shadow's)."""
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
        a64 = _trace_dot(tr, b, t, k0 // bn, (B_DQ, S_DQ), new, ds[k0:k1], kp[k0:k1, c], acc, srow[k0:k1], a64)
        acc = new
    return acc, a64


@jit
def epilogue(acc, a64, w, pp, tr, b, t, kv, state, sm64):
    """E1/E3 for one value: ``grad(grad_scale(acc * w))`` (w = 0: ``grad(acc)``, the scale applied to dS),
    recording the ops' local errors and the final gradient's drift from the shadow's ``a64 * sm64`` at
    (b, t, kv) when tracing."""
    x = mul(acc, w, pp.grad_scale) if w > 0.0 else acc
    g = rnd(x, pp.grad)
    if w > 0.0:
        _rec(tr, b, t, kv, B_GRAD_SCALE, x, acc * w)
    _rec(tr, b, t, kv, B_GRAD, g, x)
    _srec(tr, b, t, kv, state, g, a64 * sm64)
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
