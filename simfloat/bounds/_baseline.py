"""The bound of :func:`simfloat.attention.baseline` (B5-B12): the unfused softmax's chains per (row, key)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simfloat.attention._inputs import prepare
from simfloat.attention.plan import Plan
from simfloat.bounds._chains import _LIBM, Rounding, _Chain, _has_nearest, _op, _scale_chain, rounding
from simfloat.bounds._dots import _Dot, _dot, _dot_abs, _exact_inputs, _with_inputs
from simfloat.bounds._rows import (
    AttentionBound,
    _check_fp,
    _exponent_check,
    _lam,
    _lemma,
    _overflow,
    _Rows,
    _scores,
    _softmax_parts,
)


@dataclass(frozen=True)
class _Baseline:
    """Everything of one :func:`baseline_bound` call that is the same for every lead index."""

    sc: Rounding  # the scale op
    sm: Rounding  # the softmax op (exp, the row sum, the division)
    out: Rounding
    u_om: float  # torch's opmath rounding of tensor * scale (0 without one)
    eta_om: float
    exp: _Chain  # exp (B6)
    exp_eta: float
    qk: _Dot
    qk_chain: _Chain  # the score dot's chain, with the input conversion unless q and k are values of it
    pv: _Dot
    ca: _Chain  # numerator: P = e / l rounded, then P.V
    cb: _Chain  # denominator: key j in n - j roundings of the row sum
    vis: np.ndarray | None  # (seq_q, seq_k) visible keys (causal), None: all
    n_vis: np.ndarray  # (seq_q, 1) visible keys per row
    seq_k: int
    c_exact: float
    c_hat: float  # the plan's computed scale
    dc: float  # |c_hat - c_exact| (B5)
    qmax: float
    kmax: float
    vmax: float


def _exponent_errors(f: _Baseline, ds: np.ndarray, s: np.ndarray, s_max: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(B8, B9): per (row, key) the error ``nu`` of the exponent exp is evaluated at (the scaled score less the
    computed max, each rounded), and per row the bound ``k_max`` of the common factor the max's error gives."""
    vis, c_hat = f.vis, f.c_hat
    r = np.max(np.where(vis, ds, 0.0) if vis is not None else ds, axis=-1, keepdims=True)
    et = (
        ((1 + f.u_om) * (1 + f.sc.u) * (1 + f.sm.u) - 1) * c_hat * (np.abs(s) + ds)
        + f.eta_om * (1 + f.sc.u) * (1 + f.sm.u)
        + f.sc.eta * (1 + f.sm.u)
        + f.sm.eta
    )  # (B8) |x_j - c s_j|
    if vis is not None:
        et = np.where(vis, et, 0.0)
    et_max = np.max(et, axis=-1, keepdims=True)
    gap = np.where(vis, s_max - s, 0.0) if vis is not None else s_max - s
    xj = c_hat * gap + c_hat * (ds + r) + et + et_max
    nu = c_hat * ds + f.dc * gap + et + f.sm.u * xj + f.sm.eta
    k_max = c_hat * r + et_max
    return nu, k_max


def _lead(f: _Baseline, out: _Rows, b: int, s: np.ndarray, mag: np.ndarray, vb: np.ndarray, lam: float) -> None:
    """The worst-case and the probabilistic bound of lead index ``b``'s rows: scores ``s``, magnitudes ``mag``,
    values ``vb``."""
    vis, vmax = f.vis, f.vmax
    for which, l_ in ((None, None), ("prob", lam)):
        g_qk = f.qk_chain.bounds(l_)[0] - 1.0
        ds = g_qk * mag + _dot_abs(f.qk, f.qmax, f.kmax)  # (B5) score errors
        if which is None:
            _overflow("the scores |q||k|", float(np.max(mag + ds)), f.qk.out)
            _overflow("the scaled scores", float(np.max(f.c_hat * (mag + ds))) * 1.01, f.sc)
        sv = np.where(vis, s, -np.inf) if vis is not None else s
        s_max = np.max(sv, axis=-1, keepdims=True)
        nu, k_max = _exponent_errors(f, ds, s, s_max)
        _exponent_check(nu)
        _exponent_check(k_max)
        kappa_lo = np.exp(-k_max)
        fu_c, fl_c = f.exp.bounds(l_)
        fu = fu_c * np.exp(nu)
        fl = fl_c * np.exp(-nu)
        eps = fu - 1.0
        au, _ = f.ca.bounds(l_)
        bu, bl = f.cb.bounds(l_)
        w = np.exp((sv - s_max) * f.c_exact)  # exact weights, max 1
        pi, o = _softmax_parts(w, vb, vis)
        wsum = np.sum(w, axis=-1, keepdims=True)
        e_up = float(np.max(f.exp.bounds(None)[0])) + f.exp_eta  # exp of a non-positive value
        if which is None:
            _overflow("exp", e_up, f.sm)
            _overflow("the row sum", e_up * f.seq_k * float(np.max(bu)), f.sm)
        # absolute terms (B11): exp underflow (weights units), P division underflow and P.V (output units)
        nv = f.n_vis.astype(np.float64)
        abs_den = (nv * f.sm.eta + nv * f.exp_eta) * float(np.max(bu)) / kappa_lo
        abs_w = nv * f.exp_eta * float(np.max(au)) * vmax / kappa_lo
        lowsum = np.sum(pi * fl * bl, axis=-1, keepdims=True) - abs_den / wsum
        lemma = _lemma(pi, vb, o, eps, fu, au - 1.0, bu - 1.0, lowsum, abs_w / wsum, abs_den / wsum)  # (B10)
        out_abs = (nv * f.sm.eta * vmax + _dot_abs(f.pv, 1.0 + 2 * f.sm.u, vmax)) * float(np.max(au))
        out.output(which, b, lemma, out_abs, o, vmax, f.out)  # (B12)


def baseline_bound(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    plan: Plan | str,
    causal: bool = False,
    scale: float | None = None,
    failure_probability: float = 0.01,
) -> AttentionBound:
    """Bounds on the error of :func:`simfloat.attention.baseline` under ``plan`` against exact attention.

    Args:
        q: (..., seq_q, head_dim); k: (..., seq_k, head_dim); v: (..., seq_k, head_dim_v); as for baseline.
        plan: a plan or preset name (its ops qk, scale, softmax, pv, out).
        causal: top-left aligned mask.
        scale: softmax scale (default 1/sqrt(head_dim)).
        failure_probability: per query row, for the probabilistic bound (B13).

    Returns:
        An :class:`AttentionBound` with (..., seq_q, head_dim_v) arrays.

    Raises:
        ValueError: a regime the bound does not cover (overflow, a non-positive denominator bound), bad
            arguments.
        TypeError: bad argument types.
    """
    x = prepare(q, k, v, plan_=plan, causal=causal, scale=scale, trace=None)
    fp = _check_fp(failure_probability)
    pl = x.plan
    pp = pl.params(x.scale)
    n_lead, seq_q, dh = x.q.shape
    seq_k, dv = x.v.shape[1:]
    c_exact = x.scale
    c_hat = pp.sm_scale
    dc = abs(c_hat - c_exact) + 2.0**-52 * c_exact  # (B5)
    r_sc, r_sm, r_out = _op(pl.scale), _op(pl.softmax), _op(pl.out)
    # torch's tensor * scale (Plan.opmath): rounded into opmath first, then into the scale op (two roundings)
    r_om = rounding(pl.opmath, "nearest_even") if pl.opmath is not None else None
    u_om, eta_om = (r_om.u, r_om.eta) if r_om is not None else (0.0, 0.0)
    exp_c = _Chain().add(1, (r_sm.u * (1 + _LIBM) + _LIBM, r_sm.nearest))  # (B6): the baseline uses exp
    # the two dots (B3); the chains per (row, key) (B9)
    qk = _dot(pl.qk, dh)
    qk_exact = _exact_inputs(x.q, qk, pl.qk) and _exact_inputs(x.k, qk, pl.qk)
    qk_chain = qk.term if qk_exact else _with_inputs(qk)
    pv = _dot(pl.pv, seq_k)
    pv_term = _with_inputs(pv)
    rows = np.arange(seq_q)
    vis = (np.arange(seq_k)[None, :] <= rows[:, None]) if x.causal else None
    pos = np.arange(seq_k)[None, :]
    n_vis = np.minimum(rows + 1, seq_k)[:, None] if x.causal else np.full((seq_q, 1), seq_k)
    cb = _Chain()
    _scale_chain(cb, _Chain().add(1, r_sm), np.maximum(n_vis - pos, 1))  # (B9) key j in n - j roundings
    ca = _Chain().add(1, r_sm).extend(pv_term)  # P = e / l rounded, then P.V
    # the probabilistic bound's lambda over every chain a row uses (B13)
    chains = seq_k * (2 + dv) + (seq_k * dh if _has_nearest(qk_chain) else 0)
    umax = max(r.u for r in (r_sc, r_sm, r_out, qk.out, pv.out))
    lam = _lam(chains, fp, umax)
    vmax = float(np.max(np.abs(x.v))) if x.v.size else 0.0
    qmax, kmax = float(np.max(np.abs(x.q))), float(np.max(np.abs(x.k)))
    f = _Baseline(
        r_sc, r_sm, r_out, u_om, eta_om, exp_c, r_sm.eta, qk, qk_chain, pv, ca, cb, vis, n_vis, seq_k, c_exact, c_hat,
        dc, qmax, kmax, vmax,
    )  # fmt: skip
    s_all, mag_all = _scores(x.q, x.k)
    out = _Rows(n_lead, seq_q, dv)
    for b in range(n_lead):
        _lead(f, out, b, s_all[b], mag_all[b], x.v[b], lam)
    return out.bound("baseline", pl.name, x.lead + (seq_q, dv), fp, lam)
