"""Standard (non-flash) attention under a precision plan: full score rows, softmax, then P.V.

Per query row i, over the keys it may see (all; causal: j <= i):

* ``s_j = qk(q_i . k_j)`` (accumulation model, from 0);
* ``t_j = scale(s_j * scale_op(scale))`` (with ``plan.opmath``: ``scale(opmath(s_j * opmath(scale)))``, torch's
  ``tensor * scale``), then ``x_j = softmax(t_j)`` (the softmax's input cast);
* ``m = max_j x_j`` (exact); ``e_j = softmax(exp(softmax(x_j - m)))``;
  ``l = softmax(... softmax(e_0 + e_1) ...)`` summed in key order; ``P_j = softmax(e_j / l)`` (masked keys:
  ``P_j = 0``);
* ``o_d = pv(sum_j P_j v_jd)`` over all keys (accumulation model, from 0); ``out_d = out(o_d)``.

The flash-only plan flags (exp2, contract, normalization, lazy_threshold) do not apply: the baseline uses exp.
Traces use q tiles of 64 rows and one kv block (0); the states are m_i = the row max, l_i = the row sum,
acc = P.V before the output cast.
"""

from __future__ import annotations

import math

import numpy as np

from simfloat._jit import jit
from simfloat._parallel import run_rows
from simfloat.accumulate import dot_acc
from simfloat.attention._build import baseline_engine, check_engine
from simfloat.attention._engine import baseline_units
from simfloat.attention._inputs import check_output, prepare, to_layout
from simfloat.attention._kernels import add, div, dot64, exp, fmax, mul, rnd, sub
from simfloat.attention._masks import DENSE_ADD, NO_MASK, key_masked, mask_of, visible_keys
from simfloat.attention.plan import BASELINE_OPS, Plan
from simfloat.trace import STATES, record

__all__ = ["baseline"]

ROWS = 64  # rows per work unit and per traced q tile
_NINF = -np.inf
# op indices (positions in BASELINE_OPS) and state indices (in simfloat.trace.STATES), looked up by name
QK, SCALE, SOFTMAX, PV, OUT = (BASELINE_OPS.index(n) for n in ("qk", "scale", "softmax", "pv", "out"))
S_M, S_L, S_ACC, S_OUT = (STATES.index(n) for n in ("m_i", "l_i", "acc", "out"))


@jit
def _shadow(b, t, jv, x, ys, ps, tr):
    """The float64 shadow softmax of row i from the float64 scaled scores ``ys``: P into ``ps``, the drift of
    the row max recorded; returns the shadow row sum."""
    ms = _NINF
    for j in range(jv):
        ms = fmax(ms, ys[j])
    if ms == _NINF:  # a row that sees no key (a mask)
        for j in range(jv):
            ps[j] = 0.0
        return 0.0
    ls = 0.0
    for j in range(jv):
        ps[j] = math.exp(ys[j] - ms)
        ls += ps[j]
    for j in range(jv):
        ps[j] = ps[j] / ls
    m = _NINF
    for j in range(jv):
        m = fmax(m, x[j])
    record(tr[1], b, t, 0, S_M, m - ms, ms)
    return ls


@jit
def _units(lo, hi, q, k, v, out, pp, causal, scale64, tr, mk):
    """Work units ``[lo, hi)``: unit u is (lead index u // n_tiles, rows of tile u % n_tiles); ``mk`` the
    call's :class:`~simfloat.attention._masks.KeyMask` (masked keys: score -inf, P 0)."""
    seq_q, seq_k, dv = q.shape[1], k.shape[1], v.shape[2]
    n_qt = (seq_q + ROWS - 1) // ROWS
    x, pr, ys, ps = np.empty(seq_k), np.empty(seq_k), np.empty(seq_k), np.empty(seq_k)
    for u in range(lo, hi):
        b = u // n_qt
        t = u - b * n_qt
        for i in range(t * ROWS, min(seq_q, (t + 1) * ROWS)):
            k_lo, jv = visible_keys(mk, causal, b, i, seq_k)
            for j in range(jv):
                if mk.on and key_masked(mk, b, i, j, k_lo):
                    x[j] = _NINF
                    ys[j] = _NINF
                    continue
                s = dot_acc(q[b, i], k[b, j], 0.0, pp.qk)
                if pp.opmath_on:  # torch's tensor * scale: computed in the opmath type, then cast
                    y = rnd(mul(s, pp.sm_scale, pp.opmath), pp.scale)
                else:
                    y = mul(s, pp.sm_scale, pp.scale)
                y0 = y
                if mk.dense == DENSE_ADD:  # torch's scores + attn_mask (in the opmath type, then cast)
                    bv = mk.bias[mk.bmap[b], i, j]
                    y = rnd(add(y0, bv, pp.opmath), pp.scale) if pp.opmath_on else add(y0, bv, pp.scale)
                z = rnd(y, pp.softmax)
                x[j] = z
                if tr is not None:
                    ex = dot64(q[b, i], k[b, j], 0.0)
                    ys[j] = ex * scale64
                    record(tr[0], b, t, 0, QK, s - ex, ex)
                    record(tr[0], b, t, 0, SCALE, y0 - s * pp.sm_scale, s * pp.sm_scale)
                    if mk.dense == DENSE_ADD:
                        bv = mk.bias[mk.bmap[b], i, j]
                        ys[j] += bv
                        record(tr[0], b, t, 0, SCALE, y - (y0 + bv), y0 + bv)
                    record(tr[0], b, t, 0, SOFTMAX, z - y, y)
            m = _NINF
            for j in range(jv):
                m = fmax(m, x[j])
            for j in range(jv):
                if x[j] == _NINF and mk.on and key_masked(mk, b, i, j, k_lo):
                    pr[j] = 0.0
                    continue
                dj = sub(x[j], m, pp.softmax)
                e = exp(dj, pp.softmax)
                if tr is not None:
                    record(tr[0], b, t, 0, SOFTMAX, dj - (x[j] - m), x[j] - m)
                    record(tr[0], b, t, 0, SOFTMAX, e - math.exp(dj), math.exp(dj))
                pr[j] = e
            tot = 0.0
            for j in range(jv):
                if x[j] == _NINF and mk.on and key_masked(mk, b, i, j, k_lo):
                    continue
                y = add(tot, pr[j], pp.softmax)
                if tr is not None:
                    record(tr[0], b, t, 0, SOFTMAX, y - (tot + pr[j]), tot + pr[j])
                tot = y
            t_div = 1.0 if tot == 0.0 else tot
            for j in range(jv):
                if x[j] == _NINF and mk.on and key_masked(mk, b, i, j, k_lo):
                    continue
                y = div(pr[j], t_div, pp.softmax)
                if tr is not None:
                    record(tr[0], b, t, 0, SOFTMAX, y - pr[j] / t_div, pr[j] / t_div)
                pr[j] = y
            pr[jv:] = 0.0
            if tr is not None:
                ls = _shadow(b, t, jv, x, ys, ps, tr)
                record(tr[1], b, t, 0, S_L, tot - ls, ls)
            for d in range(dv):
                o = dot_acc(pr, v[b, :, d], 0.0, pp.pv)
                y = rnd(o, pp.out)
                out[b, i, d] = y
                if tr is not None:
                    ex = dot64(pr, v[b, :, d], 0.0)
                    sh = dot64(ps[:jv], v[b, :jv, d], 0.0) if jv > 0 else 0.0
                    record(tr[0], b, t, 0, PV, o - ex, ex)
                    record(tr[0], b, t, 1, OUT, y - o, o)
                    record(tr[1], b, t, 0, S_ACC, o - sh, sh)
                    record(tr[1], b, t, 1, S_OUT, y - sh, sh)


def baseline(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    plan: Plan | str = "pytorch-bf16",
    causal: bool = False,
    scale: float | None = None,
    trace: object = None,
    engine: str | None = None,
    layout: str = "bhsd",
    attn_mask: np.ndarray | None = None,
    key_lengths: object = None,
    window: tuple[int, int] | None = None,
    causal_align: str = "top-left",
    empty_rows: str = "zero",
) -> np.ndarray:
    """Emulated standard attention ``softmax(scale * q @ k^T [mask]) @ v`` under a precision plan.

    Args:
        q: (..., seq_q, head_dim) float32/float64 (or float16) array (values used as they are; values outside
            the plan's input format are warned about).
        k: (..., seq_k, head_dim); v: (..., seq_k, head_dim_v). Leading dims broadcast; seq_k >= 1. Grouped-
            query / multi-query attention: k and v (..., kv_heads, seq_k, d) with q (..., q_heads, seq_q, d),
            q_heads a multiple of kv_heads; query head h reads kv head h // (q_heads // kv_heads) (the bits of
            k and v repeated per query head).
        plan: a :class:`~simfloat.attention.Plan` or preset name (default ``"pytorch-bf16"``; ``"fp64"``,
            ...); uses the ops qk, scale, softmax, pv, out.
        causal: top-left aligned mask: query i sees keys j <= i.
        scale: softmax scale, finite and > 0 (default 1/sqrt(head_dim)), rounded into the scale op's format.
        trace: a :class:`simfloat.Tracer` or None.
        engine: ``"vector"`` (:mod:`simfloat.attention._engine`) or ``"reference"`` (the scalar kernel of this
            module, which also records traces); None: vector, reference when tracing. The same bits.
        layout: ``"bhsd"`` or ``"bshd"``, as :func:`~simfloat.attention.flash`.
        attn_mask: None, or a bool (True keeps) or float (additive) array broadcastable to
            (..., heads, seq_q, seq_k), SDPA's meaning: masked keys have P = 0; an additive mask is rounded
            into the ``scale`` op's format and added to the scaled scores as torch does
            (``scale(opmath(y + mask))`` with ``plan.opmath``, else ``scale(y + mask)``), before the softmax's
            input cast.
        key_lengths, window, causal_align, empty_rows: as :func:`~simfloat.attention.flash` (a row that sees
            no key: out 0 with ``"zero"``, as torch's safe softmax gives; ``"nan"``: SDPA's math without it).

    Returns:
        (..., seq_q, head_dim_v) float64 array of values of ``plan.out``'s format.

    Raises:
        TypeError, ValueError: bad arrays, shapes, scale, plan, tracer, engine or layout.

    Warns:
        InputFormatWarning, KernelOverflowWarning: as :func:`~simfloat.attention.flash`.
    """
    x = prepare(q, k, v, plan_=plan, causal=causal, scale=scale, trace=trace, layout=layout)
    x.mask = mask_of(x, attn_mask, key_lengths, window, causal_align, empty_rows)
    mk = NO_MASK if x.mask is None else x.mask.mask
    which = check_engine(engine, x.trace is not None)
    pp = x.plan.params(x.scale)
    n_lead, seq_q = x.q.shape[:2]
    dv = x.v.shape[2]
    n_qt = -(-seq_q // ROWS)
    out = np.zeros((n_lead, seq_q, dv))
    if which == "vector":
        eng, xs = baseline_engine(x.plan, pp, q=x.q, k=x.k, v=x.v, causal=x.causal)
        if n_lead * seq_q > 0:
            run_rows(baseline_units, n_lead * seq_q, xs._replace(mk=mk), out, eng, min_rows=16)
        check_output(out, x, baseline)
        if x.mask is not None:
            x.mask.finish(out)
        return to_layout(out.reshape(x.lead + (seq_q, dv)), layout)
    tr = None
    if x.trace is not None:
        tr = x.trace._start(
            "baseline", x.plan.name, BASELINE_OPS, n_lead, n_qt, 1, lead=x.lead, causal=x.causal, scale=x.scale
        )
    if n_lead * n_qt > 0:
        run_rows(_units, n_lead * n_qt, x.q, x.k, x.v, out, pp, int(x.causal), x.scale, tr, mk)
    check_output(out, x, baseline)
    if x.mask is not None:
        x.mask.finish(out)
    return to_layout(out.reshape(x.lead + (seq_q, dv)), layout)
