"""The bound of :func:`simfloat.attention.flash` (B5-B12): the tiled online softmax's chains per (row, key)."""

from __future__ import annotations

import math

import numpy as np

from simfloat.accumulate import Chunked, Sequential
from simfloat.attention._build import clamp_blocks
from simfloat.attention._inputs import block, prepare
from simfloat.attention.plan import OpSpec, Plan
from simfloat.bounds._chains import (
    _LIBM,
    _LOG2E,
    _Chain,
    _has_nearest,
    _holds_float32,
    _op,
    _scale_chain,
    ex2_h200_error,
    rounding,
)
from simfloat.bounds._dots import _dot, _dot_abs, _exact_inputs, _with_inputs
from simfloat.bounds._rows import (
    AttentionBound,
    _check_fp,
    _exponent_check,
    _lam,
    _lemma,
    _not_covered,
    _overflow,
    _Rows,
    _scores,
    _softmax_parts,
)
from simfloat.hardware import h200_ex2


def _exp_rounding(pl: Plan, op: OpSpec) -> tuple[_Chain, float]:
    """The chain of one exp/exp2 evaluation into ``op`` (B6, B7) and its absolute term."""
    if pl.exp_impl == "tl.exp":
        raise _not_covered(
            "exp_impl='tl.exp' (the argument x * log2(e) is rounded to float32 before the exp2: an error "
            "relative to |x| that these bounds do not model)"
        )
    r = _op(op)
    c = _Chain()
    if pl.exp2 and pl.exp2_impl == h200_ex2():  # the shipped H200 table, a value in every plan
        c.add(1, (ex2_h200_error(), False))
        eta = 2.0**-126  # results below 2^-126 flushed (ftz) (B7)
        if not _holds_float32(op.fmt):
            c.add(1, r)
            eta = eta * (1 + r.u) + r.eta
        return c, eta
    c.add(1, (r.u * (1 + _LIBM) + _LIBM, r.nearest))  # (B6): correctly rounded; the libm term stays as a margin
    return c, r.eta


def flash_bound(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    plan: Plan | str,
    block_m: int = 64,
    block_n: int = 64,
    causal: bool = False,
    scale: float | None = None,
    failure_probability: float = 0.01,
) -> AttentionBound:
    """Bounds on the error of :func:`simfloat.attention.flash` under ``plan`` against exact attention.

    Args:
        q: (..., seq_q, head_dim) array; k: (..., seq_k, head_dim); v: (..., seq_k, head_dim_v); as for flash
            (the values the kernel reads).
        plan: a plan or preset name (its flash ops and flags are used).
        block_m, block_n: the tiles (block_m only matters with ``causal``).
        causal: top-left aligned mask.
        scale: softmax scale (default 1/sqrt(head_dim)).
        failure_probability: per query row, for the probabilistic bound (B13).

    Returns:
        An :class:`AttentionBound` with (..., seq_q, head_dim_v) arrays.

    Raises:
        ValueError: a regime the bound does not cover (an intermediate that may overflow, a softmax
            denominator whose lower bound is not positive, a plan with ``exp_impl="tl.exp"`` or ``tie_shift``),
            bad arguments.
        TypeError: bad argument types.
    """
    x = prepare(q, k, v, plan_=plan, causal=causal, scale=scale, trace=None)
    fp = _check_fp(failure_probability)
    pl = x.plan
    if pl.tie_shift is not None:
        raise _not_covered(
            "tie_shift (the shifted max of tied rows: its P may underflow, which these bounds do not model)"
        )
    bm, bn = clamp_blocks(block(block_m, "block_m"), block(block_n, "block_n"), x.q.shape[1], x.k.shape[1], pl.pv)
    pp = pl.params(x.scale)
    n_lead, seq_q, dh = x.q.shape
    seq_k, dv = x.v.shape[1:]
    beta = 2.0 if pl.exp2 else math.e
    lnb = math.log(beta)
    c_exact = x.scale * _LOG2E if pl.exp2 else x.scale
    c_hat = pp.qk_scale
    dc = abs(c_hat - c_exact) + 2.0**-52 * c_exact  # (B5)
    r_sc, r_mi, r_al, r_l, r_acc, r_p, r_norm, r_out = (
        _op(getattr(pl, n)) for n in ("scale", "m_i", "alpha", "l_i", "acc", "p", "normalize", "out")
    )
    exp_c, exp_eta = _exp_rounding(pl, pl.exp)
    al_c, al_eta = _exp_rounding(pl, pl.alpha)
    tau = 0.0 if pl.lazy_threshold is None else pp.threshold * (1 + r_mi.u) + r_mi.eta
    qk = _dot(pl.qk, dh)
    qk_exact = _exact_inputs(x.q, qk, pl.qk) and _exact_inputs(x.k, qk, pl.qk)
    qk_chain = qk.term if qk_exact else _with_inputs(qk)
    pv = _dot(pl.pv, bn)
    pv_term = _with_inputs(pv)  # P is rounded by the plan's p op; the dot's input conversion comes on top
    n_kv_all = -(-seq_k // bn)
    rows = np.arange(seq_q)
    n_kv = np.full(seq_q, n_kv_all)
    if x.causal:
        kv_hi = np.minimum((rows // bm + 1) * bm, seq_k)
        n_kv = -(-kv_hi // bn)
    jt = np.arange(seq_k) // bn  # tile of each key
    later = np.maximum(n_kv[:, None] - 1 - jt[None, :], 0)  # tiles after key j's, per row (B8)
    vis = (np.arange(seq_k)[None, :] <= rows[:, None]) if x.causal else None
    # chains per (row, key): common (exp, alpha), numerator, denominator (B8, B9)
    ce = _Chain().extend(exp_c)
    _scale_chain(ce, al_c, later)
    ca = _Chain().add(1, r_p).extend(pv_term).add(1, r_norm)  # own tile: cast, P.V; FA2 final / FA1 own division
    step = _Chain().add(1, r_acc).extend(pv.acc)  # each later tile: acc rescale, the tile's P.V steps
    if pl.normalization == "per_step":
        step.add(1, r_acc).add(1, r_norm)  # w = l_old * alpha, and the division by l_new
    _scale_chain(ca, step, later)
    cb = _Chain()  # l_ij (bn roundings at most on any path) + the own tile's update
    lij = pl.l_ij
    if isinstance(lij, Chunked):
        assert isinstance(lij.inner, Sequential) and lij.chunk is not None  # checked by Plan.__post_init__
        r_lij = rounding(lij.inner.fmt, lij.inner.mode)
        n_chunks = -(-bn // lij.chunk)
        cb.add(min(bn, lij.chunk), r_lij).add(n_chunks, rounding(lij.outer_fmt, lij.outer_mode)).add(1, r_l)
    else:
        assert lij is not None  # Plan.__post_init__ fills the default
        r_lij = rounding(lij.fmt, lij.mode)
        if r_lij == r_l:
            cb.add(bn + 1, r_l)
        else:
            cb.add(bn, r_lij).add(1, r_l)
    _scale_chain(cb, _Chain().add(1 if pl.contract else 2, r_l), later)
    chains = seq_k * (2 + dv) + (seq_k * dh if _has_nearest(qk_chain) else 0)
    umax = max(r.u for r in (r_sc, r_mi, r_al, r_l, r_lij, r_acc, r_p, r_norm, r_out, qk.out, pv.out))
    lam = _lam(chains, fp, umax)
    s_all, mag_all = _scores(x.q, x.k)
    vmax = float(np.max(np.abs(x.v))) if x.v.size else 0.0
    out = _Rows(n_lead, seq_q, dv)
    qmax, kmax = float(np.max(np.abs(x.q))), float(np.max(np.abs(x.k)))
    n_vis = vis.sum(axis=-1, keepdims=True).astype(np.float64) if vis is not None else np.full((seq_q, 1), float(seq_k))

    def mask(a: np.ndarray) -> np.ndarray:
        return np.where(vis, a, 0.0) if vis is not None else a

    for b in range(n_lead):
        s, mag, vb = s_all[b], mag_all[b], x.v[b]
        sv = np.where(vis, s, -np.inf) if vis is not None else s
        s_max = np.max(sv, axis=-1, keepdims=True)
        s_run = _running_tile_max(sv, bn)  # (B8): S_{t_j}, the exact running max up to key j's tile
        if vis is not None:
            s_run = np.where(vis, s_run, s_max)
        w = np.exp((sv - s_max) * c_exact * lnb)  # exact weights, max 1
        pi, o = _softmax_parts(w, vb, vis)
        wsum = np.sum(w, axis=-1, keepdims=True)
        for which, l_ in ((None, None), ("prob", lam)):
            g_qk = qk_chain.bounds(l_)[0] - 1.0
            ds = mask(g_qk * mag + _dot_abs(qk, qmax, kmax))  # (B5) score errors
            if which is None:
                _overflow("the scores |q||k|", float(np.max(mag + ds)), qk.out)
            r = np.max(ds, axis=-1, keepdims=True)
            em = mask(
                c_hat * r
                + ((1 + r_sc.u) * (1 + r_mi.u) - 1) * c_hat * (np.abs(s_run) + r)
                + r_sc.eta * (1 + r_mi.u)
                + r_mi.eta
            )  # (B8): |m_t - c S_t|
            em_max = np.max(em, axis=-1, keepdims=True)
            xj = mask(c_hat * (s_run - s) + c_hat * ds + em + tau)  # (B8): |s_j c - m_{t_j}|
            yj = mask(c_hat * (s_max - s_run) + 2 * em_max + tau)  # (B8): m_T - m_{t_j}
            if pl.contract:
                xi = r_sc.u * xj + r_sc.eta
            else:
                e1 = r_sc.u * c_hat * (np.abs(s) + ds) + r_sc.eta
                xi = e1 + r_sc.u * (xj + e1) + r_sc.eta
            xi = mask(xi + r_al.u * yj + later * r_al.eta)  # (B8): the alpha subtractions telescope
            zeta = mask(c_hat * ds + dc * (s_max - s))  # (B9)
            rho = (xi + zeta) * lnb  # natural-log units
            _exponent_check(rho)
            _exponent_check((em_max + tau) * lnb)
            kappa_lo = np.exp(-(em_max + tau) * lnb)  # (B9): |K| <= eps_m + tau
            fu_c, fl_c = ce.bounds(l_)
            fu, fl = fu_c * np.exp(rho), fl_c * np.exp(-rho)
            au, _ = ca.bounds(l_)
            bu, bl = cb.bounds(l_)
            a_max, b_max = float(np.max(au)), float(np.max(bu))
            # (B11): every computed p is below p_up; the row sum below l_up (computed units)
            _exponent_check(np.max(tau + 2 * em_max + xi) * lnb)
            p_up = beta ** float(np.max(tau + 2 * em_max + xi)) * float(np.max(exp_c.bounds(None)[0])) + exp_eta
            l_up = p_up * seq_k * b_max
            if which is None:
                _overflow("exp", p_up, _op(pl.exp))
                _overflow("l_i", l_up, r_l)
                _overflow("l_ij", l_up, r_lij)
                _overflow("acc", l_up * a_max * max(vmax, 1.0), r_acc)
            # (B11) absolute terms in computed units (then / kappa, / sum w)
            aw = mask(exp_eta + later * al_eta * p_up)  # per key: exp and alpha underflow
            aw_sum = np.sum(aw, axis=-1, keepdims=True)
            per_tile = r_acc.eta
            if pl.normalization == "per_step":
                per_tile += r_acc.eta * (1 + vmax * a_max) + r_norm.eta * l_up
            abs_num = (
                a_max
                * (
                    n_vis * r_p.eta * vmax
                    + n_kv_all * _dot_abs(pv, p_up * (1 + r_p.u) + r_p.eta, vmax)
                    + n_kv[:, None] * per_tile
                )
                + aw_sum * a_max * vmax
            )
            abs_den = (n_kv[:, None] * (bn + 2) * r_l.eta + aw_sum) * b_max
            lowsum = np.sum(pi * fl * bl, axis=-1, keepdims=True) - abs_den / (kappa_lo * wsum)
            t_w, t_n, t_d, t_a = _lemma(
                pi,
                vb,
                o,
                fu - 1.0,
                fu,
                au - 1.0,
                bu - 1.0,
                lowsum,
                abs_num / (kappa_lo * wsum),
                abs_den / (kappa_lo * wsum),
            )
            # (B12) the final division's underflow (FA2) and the output cast
            div_abs = r_norm.eta if pl.normalization == "deferred" else 0.0
            out.output(which, b, (t_w, t_n, t_d, t_a), div_abs, o, vmax, r_out)
    return out.bound("flash", pl.name, x.lead + (seq_q, dv), fp, lam)


def _running_tile_max(s: np.ndarray, bn: int) -> np.ndarray:
    """Per row and key j: the max of s over the keys of the tiles up to key j's tile."""
    rows, n = s.shape
    nt = -(-n // bn)
    pad = np.full((rows, nt * bn), -np.inf)
    pad[:, :n] = s
    tm = np.maximum.accumulate(pad.reshape(rows, nt, bn).max(axis=2), axis=1)
    return np.repeat(tm, bn, axis=1)[:, :n]
