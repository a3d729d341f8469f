"""Flash attention (FA2 online softmax, and FA1 / lazy-rescaling variants) under a precision plan.

The dataflow mirrors ``simfloat_gpu/kernels/flash_attention.py`` step for step (its docstring's T1..T14, E1, E2). Per
query
row of a q tile of ``block_m`` rows, and per key tile of ``block_n`` keys, left to right up to the kernel's
bound (all keys; causal: ``min((tile + 1) * block_m, seq_k)``); ``op(x)`` is x rounded once into op's format:

* T2/T3 ``s_j = qk(q_i . k_j)`` for the keys the row may see (later keys masked; their scores are never used);
* T4 ``m_new = max(m_i, scale(max_j s_j * qk_scale))``, stored as ``m_i``; lazy: keep ``m_i`` unless
  ``m_i(m_new - m_i) > threshold``; with ``tie_shift`` (Qiu & Yao's fix, see :class:`Plan`) a tile max that
  two or more of the tile's scores tie is first shifted (``m_i(beta * max)`` if > 0, 0 if < 0);
  T5 ``m_sub = m_new``, or 0 while no key has been seen (-inf);
* T6 ``x_j = scale(fma(s_j, qk_scale, -m_sub))`` (``contract``),
  else ``scale(scale(s_j * qk_scale) - m_sub)``;
* T7 ``p_j = exp(exp2(x_j))`` (or exp); T8 ``l_ij = l_ij(... l_ij(p_0 + p_1) ...)`` sequentially (a chunked
  ``l_ij`` model: each chunk so from 0 in its inner format, the chunk sums added in the outer one, e.g. once);
* T9 ``alpha = alpha(exp2(alpha(m_i - m_sub)))``, 0 while ``m_i`` is -inf, 1 when lazy rescaling skips;
* T10 ``l_i = l_i(fma(l_i, alpha, l_ij))`` (``contract``), else ``l_i(l_i(l_i * alpha) + l_ij)``;
* T11 ``acc_d = acc(acc_d * alpha)``; per-step normalization (FA1):
  ``acc_d = acc(acc_d * acc(l_old * alpha))``;
* T12 ``p_j = p(p_j)``; T13 ``acc_d = pv(acc_d + sum_j p_j v_jd)`` over the whole tile of ``block_n`` keys
  (masked and padded keys have ``p_j = 0``, padded keys ``v = 0``), as ``tl.dot(p, v, acc)``;
  FA1: ``acc_d = normalize(acc_d / l_i)``; T14 ``m_i = m_new``;
* E1 ``o_d = normalize(acc_d / l_safe)`` with ``l_safe = 1`` if ``l_i == 0`` (FA2); E2 ``out(o_d)``.

A row that saw no key ends with out = 0, m = -inf, l = 0 (as the kernel's guards give); with top-left causal
alignment and seq_k >= 1 no row is ever fully masked.

The GPU's own exp2 (``ex2.approx.ftz.f32``) and row-sum order are plan options (``exp2_impl="h200"``,
``sum_order="h200-mma"``; the ``h200-<fmt>`` presets); docs/results/h200-validation.md reports what they
reproduce. This module holds the scalar reference kernels (the test oracle, and the traced path); the default
engine is :mod:`simfloat.attention._engine`, bit for bit the same.
"""

from __future__ import annotations

import math

import numpy as np

from simfloat._jit import fma64, jit
from simfloat._parallel import run_rows
from simfloat.accumulate import dot_acc
from simfloat.attention._build import check_engine, clamp_blocks
from simfloat.attention._build import engine as build_engine
from simfloat.attention._engine import flash_units
from simfloat.attention._inputs import block, check_output, from_layout, prepare, to_layout
from simfloat.attention._kernels import add, div, dot64, exp, exp2, exp2_hw, fma, fmax, mul, rnd, row_sum, sub
from simfloat.attention.plan import FLASH_OPS, Plan
from simfloat.attention.plan import plan as _plan
from simfloat.attention.quantized import quant_flash
from simfloat.attention.tiling import pick_tiles
from simfloat.hardware import ex2_approx_f32, mma_sum_warps
from simfloat.trace import STATES, record

__all__ = ["flash"]

_NINF = -np.inf
# op indices (positions in FLASH_OPS) and state indices (in simfloat.trace.STATES), looked up by name
QK, SCALE, EXP, M_I, ALPHA, L_IJ, L_I, ACC, P, PV, NORMALIZE, OUT = (
    FLASH_OPS.index(n)
    for n in ("qk", "scale", "exp", "m_i", "alpha", "l_ij", "l_i", "acc", "p", "pv", "normalize", "out")
)
S_M, S_L, S_ACC, S_OUT = (STATES.index(n) for n in ("m_i", "l_i", "acc", "out"))


@jit
def _ex(x, pp):
    return math.exp2(x) if pp.exp2 else math.exp(x)


_LOG2E = math.log2(math.e)


@jit
def _exp_op(x, o, pp):
    """T7 / T9's exponential into op ``o``: exp2 (``pp.exp2``; ex2.approx.ftz with ``pp.ex2_tab``), tl.exp
    (``pp.exp_tl``: ``o(exp2(o(x * o(log2 e))))``, the H200's ex2.approx not flushed), else ``o(e**x)``."""
    if pp.exp2:
        return exp2_hw(x, o, pp.ex2_tab)
    if pp.exp_tl:
        t = mul(x, rnd(_LOG2E, o), o)
        if pp.ex2_tab.size == 0:
            return exp2(t, o)
        return rnd(ex2_approx_f32(t, pp.ex2_tab, False), o)
    return exp(x, o)


@jit
def _shadow(b, t, jt, nv, rescale, tied, m_lp, l_lp, ms, ls, acc, accs, ss, ps, vt, pp, tr):
    """One key tile of the float64 shadow (same dataflow, same lazy and tie-shift decisions), then the state
    drift."""
    smax = _NINF
    for jj in range(nv):
        smax = fmax(smax, ss[jj])
    mx = smax * pp.qk_scale64
    if tied:
        mx = mx * pp.tie_beta if mx > 0.0 else (0.0 if mx < 0.0 else mx)
    m_new = fmax(ms, mx) if rescale else ms
    m_sub = 0.0 if m_new == _NINF else m_new
    lij = 0.0
    for jj in range(nv):
        x = fma64(ss[jj], pp.qk_scale64, -m_sub) if pp.contract else ss[jj] * pp.qk_scale64 - m_sub
        ps[jj] = _ex(x, pp)
        lij += ps[jj]
    alpha = 1.0
    if rescale:
        alpha = 0.0 if ms == _NINF else _ex(ms - m_sub, pp)
    l_new = fma64(ls, alpha, lij) if pp.contract else ls * alpha + lij
    w = ls * alpha if pp.per_step else alpha
    l_div = 1.0 if l_new == 0.0 else l_new
    for d in range(accs.shape[0]):
        a = accs[d] * w
        for jj in range(nv):
            a += ps[jj] * vt[jj, d]
        accs[d] = a / l_div if pp.per_step else a
        record(tr[1], b, t, jt, S_ACC, acc[d] - accs[d], accs[d])
    if m_new != _NINF:
        record(tr[1], b, t, jt, S_M, m_lp - m_new, m_new)
    record(tr[1], b, t, jt, S_L, l_lp - l_new, l_new)
    return m_new, l_new


@jit
def _seq(p, lo, hi, o, b, t, jt, tr):
    """T8's sequential sum of p[lo:hi] from 0, each addition rounded by ``o`` (traced as l_ij)."""
    s = 0.0
    for jj in range(lo, hi):
        y = add(s, p[jj], o)
        if tr is not None:
            record(tr[0], b, t, jt, L_IJ, y - (s + p[jj]), s + p[jj])
        s = y
    return s


@jit
def _tile(b, t, i, jt, m_i, l_i, ms, ls, acc, accs, s, p, ss, ps, q, k, v, pp, causal, tr, wn):
    """T2..T14 for row ``i`` and key tile ``jt``; returns the new (m_i, l_i) and the shadow's."""
    bn = s.shape[0]
    j0 = jt * bn
    jv = min(j0 + bn, k.shape[1])
    if causal:
        jv = min(jv, i + 1)
    nv = max(0, jv - j0)
    qi = q[b, i]
    smax = _NINF
    tied = False  # T4's tie shift fired (the shadow takes the same decision)
    for jj in range(nv):  # T2, T3
        x = dot_acc(qi, k[b, j0 + jj], 0.0, pp.qk)
        s[jj] = x
        smax = fmax(smax, x)
        if tr is not None:
            ss[jj] = dot64(qi, k[b, j0 + jj], 0.0)
            record(tr[0], b, t, jt, QK, x - ss[jj], ss[jj])
    m_new = m_i  # T4
    if smax != _NINF:
        mx = mul(smax, pp.qk_scale, pp.scale)
        if tr is not None:
            record(tr[0], b, t, jt, SCALE, mx - smax * pp.qk_scale, smax * pp.qk_scale)
        if pp.tie:  # Plan.tie_shift: count the keys tied with the tile max, shift the max if two or more
            thr = sub(mx, pp.tie_tol, pp.scale)
            n_tied = 0
            for jj in range(nv):
                y = mul(s[jj], pp.qk_scale, pp.scale)
                if tr is not None:
                    record(tr[0], b, t, jt, SCALE, y - s[jj] * pp.qk_scale, s[jj] * pp.qk_scale)
                if y >= thr:
                    n_tied += 1
            if n_tied >= 2:
                tied = True
                if mx > 0.0:
                    y = mul(mx, pp.tie_beta, pp.m_i)
                    if tr is not None:
                        record(tr[0], b, t, jt, M_I, y - mx * pp.tie_beta, mx * pp.tie_beta)
                    mx = y
                elif mx < 0.0:
                    mx = 0.0
        m_new = fmax(m_i, mx)
        if m_new != m_i:
            y = rnd(m_new, pp.m_i)
            if tr is not None:
                record(tr[0], b, t, jt, M_I, y - m_new, m_new)
            m_new = y
    rescale = True
    if pp.lazy:
        if m_i == _NINF:
            rescale = m_new > _NINF
        else:
            dm = sub(m_new, m_i, pp.m_i)
            if tr is not None:
                record(tr[0], b, t, jt, M_I, dm - (m_new - m_i), m_new - m_i)
            rescale = dm > pp.threshold
        if not rescale:
            m_new = m_i
    m_sub = 0.0 if m_new == _NINF else m_new  # T5
    for jj in range(nv):  # T6, T7
        sj = s[jj]
        if pp.contract:
            x = fma(sj, pp.qk_scale, -m_sub, pp.scale)
            if tr is not None:
                ex = fma64(sj, pp.qk_scale, -m_sub)
                record(tr[0], b, t, jt, SCALE, x - ex, ex)
        else:
            y = mul(sj, pp.qk_scale, pp.scale)
            x = sub(y, m_sub, pp.scale)
            if tr is not None:
                record(tr[0], b, t, jt, SCALE, y - sj * pp.qk_scale, sj * pp.qk_scale)
                record(tr[0], b, t, jt, SCALE, x - (y - m_sub), y - m_sub)
        pj = _exp_op(x, pp.exp, pp)
        if tr is not None:
            ex = _ex(x, pp)
            record(tr[0], b, t, jt, EXP, pj - ex, ex)
        p[jj] = pj
    for jj in range(nv, bn):
        p[jj] = 0.0
    l_ij = 0.0  # T8
    if pp.sum_order != 0:  # the plan's tree order over the whole tile (masked / padded p are 0)
        l_ij = row_sum(p, bn, pp.l_ij, pp.sum_order, wn)
        if tr is not None:
            ex = 0.0
            for jj in range(nv):
                ex += p[jj]
            record(tr[0], b, t, jt, L_IJ, l_ij - ex, ex)
    elif pp.l_ij_chunk == 0:
        l_ij = _seq(p, 0, nv, pp.l_ij, b, t, jt, tr)
    else:
        for c0 in range(0, nv, pp.l_ij_chunk):
            cs = _seq(p, c0, min(nv, c0 + pp.l_ij_chunk), pp.l_ij, b, t, jt, tr)
            y = add(l_ij, cs, pp.l_ij_out)
            if tr is not None:
                record(tr[0], b, t, jt, L_IJ, y - (l_ij + cs), l_ij + cs)
            l_ij = y
    alpha = 1.0  # T9
    if rescale:
        if m_i == _NINF:
            alpha = 0.0
        else:
            dm = sub(m_i, m_sub, pp.alpha)
            alpha = _exp_op(dm, pp.alpha, pp)
            if tr is not None:
                record(tr[0], b, t, jt, ALPHA, dm - (m_i - m_sub), m_i - m_sub)
                record(tr[0], b, t, jt, ALPHA, alpha - _ex(dm, pp), _ex(dm, pp))
    if pp.contract:  # T10
        l_new = fma(l_i, alpha, l_ij, pp.l_i)
        if tr is not None:
            ex = fma64(l_i, alpha, l_ij)
            record(tr[0], b, t, jt, L_I, l_new - ex, ex)
    else:
        y = mul(l_i, alpha, pp.l_i)
        l_new = add(y, l_ij, pp.l_i)
        if tr is not None:
            record(tr[0], b, t, jt, L_I, y - l_i * alpha, l_i * alpha)
            record(tr[0], b, t, jt, L_I, l_new - (y + l_ij), y + l_ij)
    w = alpha  # T11
    if pp.per_step:
        w = mul(l_i, alpha, pp.acc)
        if tr is not None:
            record(tr[0], b, t, jt, ACC, w - l_i * alpha, l_i * alpha)
    for d in range(acc.shape[0]):
        y = mul(acc[d], w, pp.acc)
        if tr is not None:
            record(tr[0], b, t, jt, ACC, y - acc[d] * w, acc[d] * w)
        acc[d] = y
    for jj in range(nv):  # T12
        y = rnd(p[jj], pp.p)
        if tr is not None:
            record(tr[0], b, t, jt, P, y - p[jj], p[jj])
        p[jj] = y
    vt = v[b, j0 : j0 + bn]
    l_div = 1.0 if l_new == 0.0 else l_new
    for d in range(acc.shape[0]):  # T13 (+ FA1 normalization)
        y = dot_acc(p, vt[:, d], acc[d], pp.pv)
        if tr is not None:
            ex = dot64(p, vt[:, d], acc[d])
            record(tr[0], b, t, jt, PV, y - ex, ex)
        if pp.per_step:
            z = div(y, l_div, pp.normalize)
            if tr is not None:
                record(tr[0], b, t, jt, NORMALIZE, z - y / l_div, y / l_div)
            y = z
        acc[d] = y
    if tr is not None:
        ms, ls = _shadow(b, t, jt, nv, rescale, tied, m_new, l_new, ms, ls, acc, accs, ss, ps, vt, pp, tr)
    return m_new, l_new, ms, ls


@jit
def _units(lo, hi, q, k, v, out, m_out, l_out, pp, geo, tr):
    """Rows of work ``[lo, hi)``: unit u is (lead index u // n_q_tiles, q tile u % n_q_tiles)."""
    bm, bn, causal, wn = geo
    seq_q, seq_k, dv = q.shape[1], k.shape[1], v.shape[2]
    n_qt = (seq_q + bm - 1) // bm
    n_kv_all = (seq_k + bn - 1) // bn
    s, p, ss, ps = np.empty(bn), np.empty(bn), np.empty(bn), np.empty(bn)
    acc, accs = np.empty(dv), np.empty(dv)
    for u in range(lo, hi):
        b = u // n_qt
        t = u - b * n_qt
        kv_hi = min((t + 1) * bm, seq_k) if causal else seq_k
        n_kv = (kv_hi + bn - 1) // bn
        for i in range(t * bm, min(seq_q, (t + 1) * bm)):
            m_i, l_i, ms, ls = _NINF, 0.0, _NINF, 0.0
            acc[:] = 0.0
            accs[:] = 0.0
            for jt in range(n_kv):
                m_i, l_i, ms, ls = _tile(
                    b, t, i, jt, m_i, l_i, ms, ls, acc, accs, s, p, ss, ps, q, k, v, pp, causal, tr, wn
                )
            l_div = 1.0 if l_i == 0.0 else l_i  # E1, E2
            ls_div = 1.0 if ls == 0.0 else ls
            for d in range(dv):
                o = acc[d] if pp.per_step else div(acc[d], l_div, pp.normalize)
                y = rnd(o, pp.out)
                out[b, i, d] = y
                if tr is not None:
                    if not pp.per_step:
                        record(tr[0], b, t, n_kv_all, NORMALIZE, o - acc[d] / l_div, acc[d] / l_div)
                    record(tr[0], b, t, n_kv_all, OUT, y - o, o)
                    os = accs[d] if pp.per_step else accs[d] / ls_div
                    record(tr[1], b, t, n_kv_all, S_OUT, y - os, os)
            m_out[b, i] = m_i
            l_out[b, i] = l_i


def flash(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    plan: Plan | str = "triton-bf16",
    block_m: int | None = None,
    block_n: int | None = None,
    tiles: str | None = None,
    causal: bool = False,
    scale: float | None = None,
    trace: object = None,
    return_stats: bool = False,
    engine: str | None = None,
    layout: str = "bhsd",
) -> np.ndarray | tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Emulated flash attention ``softmax(scale * q @ k^T [mask]) @ v`` under a precision plan.

    Args:
        q: (..., seq_q, head_dim) float32/float64 (or float16) array. Values are used as they are: round them
            into the kernel's input format first (``simfloat.round(q, "bf16")``) to emulate low-precision inputs
            (other values are warned about: :class:`~simfloat.attention.InputFormatWarning`).
        k: (..., seq_k, head_dim); v: (..., seq_k, head_dim_v). Leading dims broadcast; seq_k >= 1. Grouped-
            query / multi-query attention: k and v (..., kv_heads, seq_k, d) with q (..., q_heads, seq_q, d),
            q_heads a multiple of kv_heads; query head h reads kv head h // (q_heads // kv_heads) (the bits of
            k and v repeated per query head).
        plan: a :class:`~simfloat.attention.Plan` or preset name (default ``"triton-bf16"``, as
            :func:`simfloat.attribute`). A plan with quantizers (``int8-reference``, ``fp8-e4m3``, ``sage3-fp4``,
            ...) runs :func:`~simfloat.attention.quant_flash` (its defaults: no incoherent processing).
        block_m: query rows per tile; block_n: keys per tile (any length; the last tiles may be partial;
            default 64 each). Tiles larger than the sequence give the bits of tiles clamped to it, and cost as
            much.
        tiles: a tile rule instead of block_m/block_n: ``"fa1:M=<elements>"``, FlashAttention-1's
            ``block_n = ceil(M / (4 d))``, ``block_m = min(block_n, d)`` for head dim d
            (:func:`~simfloat.attention.tiling.fa1_tiles`).
        causal: top-left aligned mask: query i sees keys j <= i.
        scale: softmax scale, finite and > 0 (default 1/sqrt(head_dim)); with ``plan.exp2`` the kernel uses
            ``scale_op(scale_op(scale) * scale_op(log2 e))``.
        trace: a :class:`simfloat.Tracer` to record local errors and state drift, or None (no cost).
        return_stats: also return ``m`` and ``l`` ((..., seq_q) each): the final running max (log2 units with
            exp2) and the softmax denominator relative to it.
        engine: ``"vector"`` (the vectorized engine, :mod:`simfloat.attention._engine`) or ``"reference"``
            (the scalar kernels of this module, which also record traces); None: vector, reference when
            tracing or for ``plan.exp_impl="tl.exp"`` (reference only). Both give the same bits.
        layout: ``"bhsd"`` (q, k, v and the output (..., heads, seq, head_dim), as torch) or ``"bshd"``
            ((..., seq, heads, head_dim), as flash-attn; ``m`` and ``l`` stay (..., heads, seq_q), as its lse).

    Returns:
        (..., seq_q, head_dim_v) float64 array whose values are values of ``plan.out``'s format; with
        ``return_stats`` the tuple (out, m, l). Bitwise deterministic for any thread count.

    Raises:
        TypeError, ValueError: bad arrays, shapes, block sizes, scale, plan, tracer, engine or layout.

    Warns:
        InputFormatWarning: operands that are not values of the plan's input format.
        KernelOverflowWarning: finite inputs whose outputs are not (naming the op that overflowed).
    """
    pl = _plan(plan)
    if pl.quantized:
        return _quantized(q, k, v, pl, block_m, block_n, tiles, causal, scale, trace, return_stats, engine, layout)
    x = prepare(q, k, v, plan_=plan, causal=causal, scale=scale, trace=trace, layout=layout)
    which = check_engine(engine, x.trace is not None)
    if x.plan.exp_impl == "tl.exp" and which == "vector":  # not modelled by the vector engine (yet)
        if engine is not None:
            raise ValueError(
                "the vector engine does not model exp_impl='tl.exp': pass engine='reference' or "
                "engine=None (which runs such plans on the reference engine)"
            )
        which = "reference"
    block_m, block_n = pick_tiles(block_m, block_n, tiles, x.q.shape[-1])
    bm_req, bn_req = block(block_m, "block_m"), block(block_n, "block_n")
    pp = x.plan.params(x.scale)
    n_lead, seq_q = x.q.shape[:2]
    seq_k, dv = x.v.shape[1:]
    bm, bn = clamp_blocks(bm_req, bn_req, seq_q, seq_k, x.plan.pv)
    n_qt, n_kv = -(-seq_q // bm), -(-seq_k // bn)
    out = np.zeros((n_lead, seq_q, dv))
    m = np.empty((n_lead, seq_q))
    l = np.empty((n_lead, seq_q))  # noqa: E741
    wn = mma_sum_warps(bm_req, dv)  # tl.sum layout of the requested tile (see row_sum)
    if which == "vector":
        eng, xs = build_engine(x.plan, pp, q=x.q, k=x.k, v=x.v, bm=bm, bn=bn, causal=x.causal, wn=wn)
        if n_lead * n_qt > 0:
            run_rows(flash_units, n_lead * n_qt, xs, out, m, l, eng)
    else:
        vpad = np.zeros((n_lead, n_kv * bn, dv))
        vpad[:, :seq_k] = x.v
        tr = None
        if x.trace is not None:
            tr = x.trace._start(
                "flash",
                x.plan.name,
                FLASH_OPS,
                n_lead,
                n_qt,
                n_kv,
                lead=x.lead,
                block_m=bm,
                block_n=bn,
                causal=x.causal,
                scale=x.scale,
            )
        if n_lead * n_qt > 0:
            run_rows(_units, n_lead * n_qt, x.q, x.k, vpad, out, m, l, pp, (bm, bn, int(x.causal), wn), tr)
    check_output(out, x, flash, block_m=bm_req, block_n=bn_req)
    out = to_layout(out.reshape(x.lead + (seq_q, dv)), layout)
    if return_stats:
        return out, m.reshape(x.lead + (seq_q,)), l.reshape(x.lead + (seq_q,))
    return out


def _quantized(
    q: object,
    k: object,
    v: object,
    pl: Plan,
    block_m: int | None,
    block_n: int | None,
    tiles: str | None,
    causal: bool,
    scale: float | None,
    trace: object,
    return_stats: bool,
    engine: str | None,
    layout: str,
) -> np.ndarray | tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`flash` under a plan with quantizers: :func:`~simfloat.attention.quant_flash` with the tiles and the
    layout of the call."""
    q, k, v = (from_layout(a, layout, n) for a, n in ((q, "q"), (k, "k"), (v, "v")))
    d = q.shape[-1] if isinstance(q, np.ndarray) and q.ndim else 0
    bm, bn = pick_tiles(block_m, block_n, tiles, d)
    res = quant_flash(
        q,  # type: ignore[arg-type]  # quant_flash checks the arrays
        k,  # type: ignore[arg-type]
        v,  # type: ignore[arg-type]
        plan=pl,
        block_m=bm,
        block_n=bn,
        causal=causal,
        scale=scale,
        trace=trace,  # type: ignore[arg-type]  # checked there
        return_stats=return_stats,
        engine=engine,
    )
    if isinstance(res, tuple):
        return (to_layout(res[0], layout), res[1], res[2])
    return to_layout(res, layout)
