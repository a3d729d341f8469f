"""The bound of :func:`simfloat.attention.flash` (B5-B12): the tiled online softmax's chains per (row, key)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simfloat.accumulate import Chunked, Sequential
from simfloat.attention._build import clamp_blocks
from simfloat.attention._inputs import block, prepare
from simfloat.attention.plan import OpSpec, Plan
from simfloat.bounds._chains import (
    _LIBM,
    _LOG2E,
    Rounding,
    _Chain,
    _has_nearest,
    _holds_float32,
    _op,
    _scale_chain,
    ex2_h200_error,
    rounding,
)
from simfloat.bounds._dots import _Dot, _dot, _dot_abs, _exact_inputs, _with_inputs
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


@dataclass(frozen=True)
class _Ops:
    """The roundings of a flash plan's ops (B1) and its two exp evaluations (B6, B7), as the bound uses them."""

    sc: Rounding  # scale (qk * scale, or the FMA with -m)
    mi: Rounding  # m_i, the running max
    al: Rounding  # alpha's argument m_old - m_new
    l: Rounding  # noqa: E741 - the kernel's l_i
    lij: Rounding  # the tile's row sum l_ij (its inner rounding when chunked)
    acc: Rounding
    p: Rounding  # P's cast before the P.V dot
    norm: Rounding  # the division by l
    out: Rounding
    exp: _Chain  # exp(s c - m)
    exp_eta: float
    alpha: _Chain  # exp(m_old - m_new)
    alpha_eta: float


def _ops(pl: Plan) -> _Ops:
    r_sc, r_mi, r_al, r_l, r_acc, r_p, r_norm, r_out = (
        _op(getattr(pl, n)) for n in ("scale", "m_i", "alpha", "l_i", "acc", "p", "normalize", "out")
    )
    exp_c, exp_eta = _exp_rounding(pl, pl.exp)
    al_c, al_eta = _exp_rounding(pl, pl.alpha)
    lij = pl.l_ij
    if isinstance(lij, Chunked):
        assert isinstance(lij.inner, Sequential) and lij.chunk is not None  # checked by Plan.__post_init__
        r_lij = rounding(lij.inner.fmt, lij.inner.mode)
    else:
        assert lij is not None  # Plan.__post_init__ fills the default
        r_lij = rounding(lij.fmt, lij.mode)
    return _Ops(r_sc, r_mi, r_al, r_l, r_lij, r_acc, r_p, r_norm, r_out, exp_c, exp_eta, al_c, al_eta)


@dataclass(frozen=True)
class _Tiles:
    """Which key tiles each query row walks (the causal mask ends a q tile's walk at its last row's tile)."""

    n_kv_all: int  # key tiles of a full row
    n_kv: np.ndarray  # (seq_q,) key tiles row i walks
    later: np.ndarray  # (seq_q, seq_k) tiles after key j's tile, per row (B8)
    vis: np.ndarray | None  # (seq_q, seq_k) visible keys (causal), None: all
    n_vis: np.ndarray  # (seq_q, 1) visible keys per row


def _tiles(seq_q: int, seq_k: int, bm: int, bn: int, causal: bool) -> _Tiles:
    n_kv_all = -(-seq_k // bn)
    rows = np.arange(seq_q)
    n_kv = np.full(seq_q, n_kv_all)
    if causal:
        kv_hi = np.minimum((rows // bm + 1) * bm, seq_k)
        n_kv = -(-kv_hi // bn)
    jt = np.arange(seq_k) // bn  # tile of each key
    later = np.maximum(n_kv[:, None] - 1 - jt[None, :], 0)  # tiles after key j's, per row (B8)
    vis = (np.arange(seq_k)[None, :] <= rows[:, None]) if causal else None
    n_vis = vis.sum(axis=-1, keepdims=True).astype(np.float64) if vis is not None else np.full((seq_q, 1), float(seq_k))
    return _Tiles(n_kv_all, n_kv, later, vis, n_vis)


def _chains(pl: Plan, r: _Ops, pv: _Dot, bn: int, later: np.ndarray) -> tuple[_Chain, _Chain, _Chain]:
    """The chains per (row, key) (B8, B9): common to numerator and denominator (exp, alpha), the numerator's
    (P cast, P.V, rescaling, division) and the denominator's (l_ij, l_i)."""
    ce = _Chain().extend(r.exp)
    _scale_chain(ce, r.alpha, later)
    pv_term = _with_inputs(pv)  # P is rounded by the plan's p op; the dot's input conversion comes on top
    ca = _Chain().add(1, r.p).extend(pv_term).add(1, r.norm)  # own tile: cast, P.V; FA2 final / FA1 own division
    step = _Chain().add(1, r.acc).extend(pv.acc)  # each later tile: acc rescale, the tile's P.V steps
    if pl.normalization == "per_step":
        step.add(1, r.acc).add(1, r.norm)  # w = l_old * alpha, and the division by l_new
    _scale_chain(ca, step, later)
    cb = _Chain()  # l_ij (bn roundings at most on any path) + the own tile's update
    lij = pl.l_ij
    if isinstance(lij, Chunked):
        assert lij.chunk is not None  # checked by Plan.__post_init__
        n_chunks = -(-bn // lij.chunk)
        cb.add(min(bn, lij.chunk), r.lij).add(n_chunks, rounding(lij.outer_fmt, lij.outer_mode)).add(1, r.l)
    elif r.lij == r.l:
        cb.add(bn + 1, r.l)
    else:
        cb.add(bn, r.lij).add(1, r.l)
    _scale_chain(cb, _Chain().add(1 if pl.contract else 2, r.l), later)
    return ce, ca, cb


@dataclass(frozen=True)
class _Flash:
    """Everything of one :func:`flash_bound` call that is the same for every lead index."""

    pl: Plan
    r: _Ops
    t: _Tiles
    qk: _Dot
    qk_chain: _Chain  # the score dot's chain, with the input conversion unless q and k are values of it
    pv: _Dot
    ce: _Chain
    ca: _Chain
    cb: _Chain
    bn: int
    seq_k: int
    beta: float  # 2 (exp2) or e
    lnb: float
    c_exact: float  # the exact scale of the exponent (times log2 e for exp2)
    c_hat: float  # the plan's computed scale
    dc: float  # |c_hat - c_exact| (B5)
    tau: float  # lazy rescaling's threshold, rounded
    qmax: float
    kmax: float
    vmax: float


def _mask(f: _Flash, a: np.ndarray) -> np.ndarray:
    return np.where(f.t.vis, a, 0.0) if f.t.vis is not None else a


def _exponent_errors(
    f: _Flash, ds: np.ndarray, s: np.ndarray, s_run: np.ndarray, s_max: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(B8, B9): per (row, key) the error ``xi`` of the exponent the kernel evaluates (the subtractions of the
    running max and alpha's arguments) and ``zeta`` of the scaled scores, and per row the running max's error."""
    r, c_hat = f.r, f.c_hat
    rmax = np.max(ds, axis=-1, keepdims=True)
    em = _mask(
        f,
        c_hat * rmax
        + ((1 + r.sc.u) * (1 + r.mi.u) - 1) * c_hat * (np.abs(s_run) + rmax)
        + r.sc.eta * (1 + r.mi.u)
        + r.mi.eta,
    )  # (B8): |m_t - c S_t|
    em_max = np.max(em, axis=-1, keepdims=True)
    xj = _mask(f, c_hat * (s_run - s) + c_hat * ds + em + f.tau)  # (B8): |s_j c - m_{t_j}|
    yj = _mask(f, c_hat * (s_max - s_run) + 2 * em_max + f.tau)  # (B8): m_T - m_{t_j}
    if f.pl.contract:
        xi = r.sc.u * xj + r.sc.eta
    else:
        e1 = r.sc.u * c_hat * (np.abs(s) + ds) + r.sc.eta
        xi = e1 + r.sc.u * (xj + e1) + r.sc.eta
    xi = _mask(f, xi + r.al.u * yj + f.t.later * r.al.eta)  # (B8): the alpha subtractions telescope
    zeta = _mask(f, f.c_hat * ds + f.dc * (s_max - s))  # (B9)
    return xi, zeta, em_max


def _absolute_terms(f: _Flash, p_up: float, l_up: float, a_max: float, b_max: float) -> tuple[np.ndarray, np.ndarray]:
    """(B11): the numerator's and the denominator's absolute terms per row, in computed units: exp and alpha
    underflow, P's cast, the P.V dots, the per-tile rescaling and (per-step normalization) divisions."""
    r, t, vmax = f.r, f.t, f.vmax
    aw = _mask(f, r.exp_eta + t.later * r.alpha_eta * p_up)  # per key: exp and alpha underflow
    aw_sum = np.sum(aw, axis=-1, keepdims=True)
    per_tile = r.acc.eta
    if f.pl.normalization == "per_step":
        per_tile += r.acc.eta * (1 + vmax * a_max) + r.norm.eta * l_up
    abs_num = (
        a_max
        * (
            t.n_vis * r.p.eta * vmax
            + t.n_kv_all * _dot_abs(f.pv, p_up * (1 + r.p.u) + r.p.eta, vmax)
            + t.n_kv[:, None] * per_tile
        )
        + aw_sum * a_max * vmax
    )
    abs_den = (t.n_kv[:, None] * (f.bn + 2) * r.l.eta + aw_sum) * b_max
    return abs_num, abs_den


def _lead(f: _Flash, out: _Rows, b: int, s: np.ndarray, mag: np.ndarray, vb: np.ndarray, lam: float) -> None:
    """The worst-case and the probabilistic bound of lead index ``b``'s rows: scores ``s``, magnitudes ``mag``,
    values ``vb``."""
    r, vis = f.r, f.t.vis
    sv = np.where(vis, s, -np.inf) if vis is not None else s
    s_max = np.max(sv, axis=-1, keepdims=True)
    s_run = _running_tile_max(sv, f.bn)  # (B8): S_{t_j}, the exact running max up to key j's tile
    if vis is not None:
        s_run = np.where(vis, s_run, s_max)
    w = np.exp((sv - s_max) * f.c_exact * f.lnb)  # exact weights, max 1
    pi, o = _softmax_parts(w, vb, vis)
    wsum = np.sum(w, axis=-1, keepdims=True)
    for which, l_ in ((None, None), ("prob", lam)):
        g_qk = f.qk_chain.bounds(l_)[0] - 1.0
        ds = _mask(f, g_qk * mag + _dot_abs(f.qk, f.qmax, f.kmax))  # (B5) score errors
        if which is None:
            _overflow("the scores |q||k|", float(np.max(mag + ds)), f.qk.out)
        xi, zeta, em_max = _exponent_errors(f, ds, s, s_run, s_max)
        rho = (xi + zeta) * f.lnb  # natural-log units
        _exponent_check(rho)
        _exponent_check((em_max + f.tau) * f.lnb)
        kappa_lo = np.exp(-(em_max + f.tau) * f.lnb)  # (B9): |K| <= eps_m + tau
        fu_c, fl_c = f.ce.bounds(l_)
        fu, fl = fu_c * np.exp(rho), fl_c * np.exp(-rho)
        au, _ = f.ca.bounds(l_)
        bu, bl = f.cb.bounds(l_)
        a_max, b_max = float(np.max(au)), float(np.max(bu))
        # (B11): every computed p is below p_up; the row sum below l_up (computed units)
        _exponent_check(np.max(f.tau + 2 * em_max + xi) * f.lnb)
        p_up = f.beta ** float(np.max(f.tau + 2 * em_max + xi)) * float(np.max(r.exp.bounds(None)[0])) + r.exp_eta
        l_up = p_up * f.seq_k * b_max
        if which is None:
            _overflow("exp", p_up, _op(f.pl.exp))
            _overflow("l_i", l_up, r.l)
            _overflow("l_ij", l_up, r.lij)
            _overflow("acc", l_up * a_max * max(f.vmax, 1.0), r.acc)
        abs_num, abs_den = _absolute_terms(f, p_up, l_up, a_max, b_max)  # then / kappa, / sum w
        lowsum = np.sum(pi * fl * bl, axis=-1, keepdims=True) - abs_den / (kappa_lo * wsum)
        lemma = _lemma(
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
        )  # (B10)
        # (B12) the final division's underflow (FA2) and the output cast
        div_abs = r.norm.eta if f.pl.normalization == "deferred" else 0.0
        out.output(which, b, lemma, div_abs, o, f.vmax, r.out)


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
    # the exponent's scale as computed against the exact one (B5)
    c_exact = x.scale * _LOG2E if pl.exp2 else x.scale
    c_hat = pp.qk_scale
    dc = abs(c_hat - c_exact) + 2.0**-52 * c_exact
    r = _ops(pl)
    tau = 0.0 if pl.lazy_threshold is None else pp.threshold * (1 + r.mi.u) + r.mi.eta
    # the two dots (B3); the chains per (row, key) over the key tiles each row walks (B8, B9)
    qk = _dot(pl.qk, dh)
    qk_exact = _exact_inputs(x.q, qk, pl.qk) and _exact_inputs(x.k, qk, pl.qk)
    qk_chain = qk.term if qk_exact else _with_inputs(qk)
    pv = _dot(pl.pv, bn)
    t = _tiles(seq_q, seq_k, bm, bn, x.causal)
    ce, ca, cb = _chains(pl, r, pv, bn, t.later)
    # the probabilistic bound's lambda over every chain a row uses (B13)
    chains = seq_k * (2 + dv) + (seq_k * dh if _has_nearest(qk_chain) else 0)
    umax = max(u.u for u in (r.sc, r.mi, r.al, r.l, r.lij, r.acc, r.p, r.norm, r.out, qk.out, pv.out))
    lam = _lam(chains, fp, umax)
    vmax = float(np.max(np.abs(x.v))) if x.v.size else 0.0
    qmax, kmax = float(np.max(np.abs(x.q))), float(np.max(np.abs(x.k)))
    beta = 2.0 if pl.exp2 else math.e
    f = _Flash(
        pl,
        r,
        t,
        qk,
        qk_chain,
        pv,
        ce,
        ca,
        cb,
        bn,
        seq_k,
        beta,
        math.log(beta),
        c_exact,
        c_hat,
        dc,
        tau,
        qmax,
        kmax,
        vmax,
    )
    s_all, mag_all = _scores(x.q, x.k)
    out = _Rows(n_lead, seq_q, dv)
    for b in range(n_lead):
        _lead(f, out, b, s_all[b], mag_all[b], x.v[b], lam)
    return out.bound("flash", pl.name, x.lead + (seq_q, dv), fp, lam)


def _running_tile_max(s: np.ndarray, bn: int) -> np.ndarray:
    """Per row and key j: the max of s over the keys of the tiles up to key j's tile."""
    rows, n = s.shape
    nt = -(-n // bn)
    pad = np.full((rows, nt * bn), -np.inf)
    pad[:, :n] = s
    tm = np.maximum.accumulate(pad.reshape(rows, nt, bn).max(axis=2), axis=1)
    return np.repeat(tm, bn, axis=1)[:, :n]
