"""Python side of the vectorized engine: a plan and validated inputs into the njit records of
:mod:`simfloat.attention._engine` (lanes, dot records, operands with their alignment weights)."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import numpy as np

from simfloat._lanes import Lane, lane
from simfloat.accumulate import BlockFMA, Chunked, Model, Sequential, acc_params
from simfloat.accumulate._rows import (
    MMA,
    N_FMA32,
    N_NONE,
    for_operands,
    format_span,
    mma,
    operand32,
    operand_powers,
    round_operands,
    scaled_mma,
    scaled_ok,
    scaled_weights,
)
from simfloat.attention._engine import KEY_CHUNK, Engine, Lanes, Operands
from simfloat.attention._quant_engine import QEngine, QLanes, QOperands
from simfloat.attention._quant_kernels import DELTA_MMA
from simfloat.attention.plan import _NO_TABLE, OpSpec, Plan, PlanParams
from simfloat.blockscale import BlockFormat
from simfloat.formats import FloatFormat
from simfloat.formats import format as _format
from simfloat.rounding import mode_code

if TYPE_CHECKING:
    from simfloat.attention._quant_kernels import QParams

__all__ = ["ENGINES", "check_engine", "clamp_blocks", "dot_output_format", "engine", "quant_engine", "within_float32"]

ENGINES = ("vector", "reference")


def check_engine(engine: object, traced: bool) -> str:
    """The engine a call runs on: ``None`` picks ``"vector"``, or ``"reference"`` when tracing (the tracer
    records inside the reference kernels). An explicit ``"vector"`` with a tracer is an error, not a fallback."""
    if engine is None:
        return "reference" if traced else "vector"
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES} or None, got {engine!r}")
    if engine == "vector" and traced:
        raise ValueError("tracing runs on the reference engine: pass engine='reference' or engine=None")
    return str(engine)


def clamp_blocks(bm: int, bn: int, seq_q: int, seq_k: int, pv: Model) -> tuple[int, int]:
    """Tile sizes clamped to the sequences. The bits do not change: keys past the sequence are zero-padded
    (zero products leave every dot model's result as it is, zeros leave a row sum as it is) and the rows of one
    q tile never see keys past the last query. A split-k P.V dot, whose chunks depend on the tile's length,
    keeps block_n."""
    split = isinstance(pv, Chunked) and pv.splits is not None
    return max(1, min(bm, seq_q)), bn if split else max(1, min(bn, seq_k))


def within_float32(f: FloatFormat) -> bool:
    """Whether every value of ``f`` is a float32 value."""
    return f.mantissa_bits <= 23 and f.emin >= -126 and f.emax <= 127 and f.emin - f.mantissa_bits >= -149


def dot_output_format(model: Model) -> FloatFormat:
    """The format a dot's results are values of (the outer format of a chunked model)."""
    if isinstance(model, Chunked):
        return _format(model.outer_fmt)
    if isinstance(model, Sequential):
        return _format(model.fmt)
    return _format(model.out_fmt)


def _tame(f: FloatFormat) -> bool:
    """Narrow (<= 26 significant bits) and far from float64's range limits."""
    return f.mantissa_bits <= 25 and f.emin - f.mantissa_bits >= -400 and f.emax <= 400


def _lanes(pl: Plan) -> Lanes:
    def ln(op: str) -> Lane:
        s = getattr(pl, op)
        if op == "l_ij":
            s = _sum_inner(pl)
        return lane(_format(s.fmt), int(mode_code(s.mode)))

    return Lanes(*(ln(op) for op in Lanes._fields))


def engine(
    pl: Plan, pp: PlanParams, *, q: np.ndarray, k: np.ndarray, v: np.ndarray, bm: int, bn: int, causal: bool, wn: int
) -> tuple[Engine, Operands]:
    """The njit records of a flash call (``bn > 0``) or a baseline call (``bn == 0``).

    Args:
        pl: the plan; pp: its params for the call's scale.
        q: (L, Sq, D), k: (L, Sk, D), v: (L, Sk, Dv) float64 operands (validated).
        bm, bn: flash tile sizes (already clamped); causal; wn: warps along the keys of the tl.sum layout.
    """
    mqk, mpv = mma(pl.qk), mma(pl.pv)
    qi, ki, vi = round_operands(q, mqk), round_operands(k, mqk), round_operands(v, mpv)
    # writable, as the P operand of the P.V dot is: numba compiles the row kernels once per read-only flag
    qi = np.require(qi, requirements="W")
    mqk = for_operands(mqk, qi, ki)
    inner = pl.pv.inner if isinstance(pl.pv, Chunked) else pl.pv
    p_fmt = pl.p.fmt if bn else pl.softmax.fmt  # P's values, as the P.V dot reads them
    if mpv.in_round:
        assert inner.input_fmt is not None  # in_round: the model has an input format
        p_fmt = _format(inner.input_fmt)
    mpv = for_operands(mpv, vi)
    if mpv.fast and mpv.exact_products and not _tame(p_fmt):
        mpv = mpv._replace(fast=False)
    if mpv.native == N_FMA32 and not within_float32(p_fmt):
        mpv = mpv._replace(native=N_NONE)
    n_lead, seq_k, dv = vi.shape
    width = bn if bn else KEY_CHUNK
    kt = _tiles(ki.transpose(0, 2, 1), width)  # (L * tiles, D, width): K^T tile by tile
    vt = np.ascontiguousarray(_tiles(vi.transpose(0, 2, 1), bn).transpose(0, 2, 1)) if bn else vi
    ekt, ev = _weights(kt, mqk), _weights(vt, mpv)
    mqk, kt32, ekt32 = operand32(mqk, kt, ekt, rows=bool(bn))  # the baseline's rows run row_mma
    mpv, v32, ev32 = operand32(mpv, vt, ev, rows=bool(bn))
    xs = Operands(qi, _weights(qi, mqk), kt, ekt, vt, ev, kt32, ekt32, v32, ev32)
    fma_exact = _tame(dot_output_format(pl.qk)) and _tame(pl.scale.fmt)
    li = _sum_inner(pl)
    l_native32 = _format(li.fmt).name == "float32" and int(mode_code(li.mode)) == 0 and within_float32(pl.exp.fmt)
    eng = Engine(pp, _lanes(pl), mqk, mpv, bool(fma_exact), bool(l_native32), bm, width, bool(causal), wn, seq_k)
    return eng, xs


def _sum_inner(pl: Plan) -> Sequential:
    """The sequential model of the l_ij row sum's additions (a chunked model's inner one)."""
    m = pl.l_ij
    return m.inner if isinstance(m, Chunked) else m  # type: ignore[return-value]


def _tiles(x: np.ndarray, width: int) -> np.ndarray:
    """(L, C, S) -> (L * ceil(S / width), C, width): tile t of lead l at index l * n_tiles + t, zero-padded
    past S (the key axis S last)."""
    n_lead, rows, seq = x.shape
    n = -(-seq // width)
    out = np.zeros((n_lead, n, rows, width))
    for t in range(n):
        part = x[:, :, t * width : (t + 1) * width]
        out[:, t, :, : part.shape[2]] = part
    return out.reshape(n_lead * n, rows, width)


def _weights(x: np.ndarray, mp: MMA) -> np.ndarray:
    """Alignment weights of an operand array (used by exponent-sum block FMA only; always built, they are
    cheap and keep the records' types fixed)."""
    w = np.empty(x.shape)
    operand_powers(x.reshape(-1), w.reshape(-1), mp.opnd_emin)
    return w


def quant_engine(
    pl: Plan,
    qp: QParams,
    *,
    qc: np.ndarray,
    qs: np.ndarray,
    kc: np.ndarray,
    ks: np.ndarray,
    vc: np.ndarray,
    vs: np.ndarray,
    bm: int,
    bn: int,
    causal: bool,
    qb: np.ndarray | None = None,
    kb: np.ndarray | None = None,
    vb: np.ndarray | None = None,
    ds: np.ndarray | None = None,
) -> tuple[QEngine, QOperands] | None:
    """The njit records of a quantized flash call (:mod:`simfloat.attention._quant_engine`).

    Args:
        pl: the :class:`~simfloat.attention.Plan` with quantizers; qp: its
            :class:`~simfloat.attention._quant_kernels.QParams` for the call's scale.
        qc: (L, Sq, D) Q codes; qs: (L, Sq) their per-row scales.
        kc: (L, Sk, D) K codes; ks: (L, n_tiles * bn) per-key scales (1 past Sk).
        vc: (L, Sk, Dv) V codes; vs: (L, n_tiles, Dv) V scales per key tile and channel.
        bm, bn: tile sizes as requested (per-block scales follow them, so they are not clamped); causal.
        qb, kb: the per-element block scales of Q's and K's codes (shaped as them) when qk is a block-scaled
            MMA; vb: V's when pv is one; else None. Such a dot runs on the row kernels as
            :func:`simfloat.accumulate._rows.scaled_mma` describes: its operands are the codes times their block scales,
            with :func:`~simfloat.accumulate._rows.scaled_weights`.
        ds: (L, n_q_tiles, n_tiles * bn) Q smoothing's correction per q tile and key, or None (no smoothing).

    Returns:
        (engine, operands), or None where a block-scaled dot's operands are beyond what its row kernels take
        (:func:`~simfloat.accumulate._rows.scaled_ok`: the caller runs the reference engine instead).
    """
    f64 = _format("float64")
    dsa = np.zeros((qc.shape[0], 0, 0)) if ds is None else np.ascontiguousarray(ds, dtype=np.float64)

    def ln(spec: OpSpec) -> Lane:
        return lane(spec.fmt, int(spec.mode))

    qo = pl.quant_ops()
    p = qo.p_quant
    pre = p.pre if p.pre is not None else pl.exp
    assert isinstance(pre, OpSpec) and isinstance(p.arith, OpSpec)  # made OpSpecs by Quant.__post_init__
    code = lane(cast(FloatFormat, p.fmt), int(p.rounding)) if p.kind == "float" else lane(f64, 0)
    lanes = QLanes(
        ln(qo.dequant),
        ln(pl.scale),
        ln(pl.exp),
        ln(pl.acc),
        ln(pl.l_i),
        ln(qo.pv_dequant),
        ln(pl.normalize),
        ln(pl.out),
        ln(pre),
        ln(p.arith),
        code,
    )
    exp_fmt = pl.exp.fmt
    t_fmt = cast(OpSpec, p.pre).fmt if p.pre is not None else exp_fmt  # P before its codes
    if p.kind == "int":  # integer codes <= 2**20: narrow, float32 values
        p_tame, p_f32 = True, True
    elif p.kind == "block":  # codes times block scales (as the reference's values for a dot without scales)
        ef, sf = _format(cast(BlockFormat, p.fmt).elem_fmt), _format(cast(BlockFormat, p.fmt).scale_fmt)
        lo = ef.emin - ef.mantissa_bits + sf.emin - sf.mantissa_bits
        p_tame = ef.mantissa_bits + sf.mantissa_bits <= 24 and ef.emax + sf.emax <= 398 and lo >= -400
        p_f32 = False
    else:
        p_fmt = cast(FloatFormat, p.fmt) if p.kind == "float" else exp_fmt
        p_tame, p_f32 = _tame(p_fmt), within_float32(p_fmt)
    mqk, mpv = mma(pl.qk), mma(pl.pv)
    qi, ki, vi = round_operands(qc, mqk), round_operands(kc, mqk), round_operands(vc, mpv)
    eq, ek = _weights(qi, mqk), _weights(ki, mqk)
    if qb is not None and kb is not None:  # block-scaled qk (its quantizers are block ones: Plan checks)
        model = cast(BlockFMA, pl.qk)
        qi, ki = qc * qb, kc * kb
        spans = (_elem_span(qo.q_quant.fmt), _elem_span(qo.k_quant.fmt))
        if not scaled_ok(model, _bound(qi, ki) + float(np.abs(dsa).max(initial=0.0)), spans, qi, ki, dsa):
            return None
        mqk = scaled_mma(model)
        eq, ek = scaled_weights(qc, qb, model, b=False), scaled_weights(kc, kb, model, b=True)
    # delta_s as the MMA's initial accumulator: the fast forms must hold for it too
    mqk = for_operands(mqk, qi, ki, *((dsa,) if qp.delta_mode == DELTA_MMA else ()))
    inner = pl.pv.inner if isinstance(pl.pv, Chunked) else pl.pv
    if mpv.in_round:
        assert inner.input_fmt is not None  # in_round: the model has an input format
        p_fmt = _format(inner.input_fmt)
        p_tame, p_f32 = _tame(p_fmt), within_float32(p_fmt)
    pv_scaled, pv_lo, pv_elems = vb is not None, 0.0, False
    if vb is not None:  # block-scaled P.V: P's scaled codes and weights are made per key tile in the engine
        model = cast(BlockFMA, pl.pv)
        vi = vc * vb
        pbf = cast(BlockFormat, p.fmt)
        # |P| <= 1; two-level: |t| <= qmax up to the roundings of s1 and t (within 1.25 for >= 2 fraction bits);
        # a code times its block scale is within twice |t| (rounded to nearest, saturating)
        level = 1.25 * float(p.qmax) if p.granularity in ("per-token", "fixed") and p.qmax is not None else 1.0
        p_max = min(_format(pbf.elem_fmt).max * _format(pbf.scale_fmt).max, 2.0 * level)
        spans = (_elem_span(pbf), _elem_span(qo.v_quant.fmt))
        if not scaled_ok(model, p_max * float(np.abs(vi).max(initial=0.0)) * bn, spans, vi):
            return None
        ap = acc_params(model)
        mpv = scaled_mma(model)
        pv_scaled, pv_lo, pv_elems = True, float(2.0**ap.scale_emin), not ap.align_scale
        ev = scaled_weights(vc, vb, model, b=True)
    else:
        ev = _weights(vi, mpv)
    mpv = for_operands(mpv, vi)
    if mpv.fast and mpv.exact_products and not p_tame:
        mpv = mpv._replace(fast=False)
    if mpv.native == N_FMA32 and not p_f32:
        mpv = mpv._replace(native=N_NONE)
    n_lead, seq_k, dv = vi.shape
    kt, ekt = _tiles(ki.transpose(0, 2, 1), bn), _tiles(ek.transpose(0, 2, 1), bn)  # (L * tiles, D, bn)
    vt, evt = _key_tiles(vi, bn), _key_tiles(ev, bn)  # (L * tiles, bn, Dv)
    mqk, kt32, ekt32 = operand32(mqk, kt, ekt)
    mpv, vt32, evt32 = operand32(mpv, vt, evt)
    xs = QOperands(
        qi,
        eq,
        np.ascontiguousarray(qs, dtype=np.float64),
        kt,
        ekt,
        np.ascontiguousarray(ks, dtype=np.float64),
        vt,
        evt,
        np.ascontiguousarray(vs, dtype=np.float64),
        dsa,
        kt32,
        ekt32,
        vt32,
        evt32,
    )
    folded = pl.score_scaling == "folded"
    score_fmt = dot_output_format(pl.qk) if folded else qo.dequant.fmt
    fma_exact = _tame(score_fmt) and _tame(pl.scale.fmt)
    acc_exact = _tame(pl.acc.fmt) and _tame(pl.alpha.fmt)
    v = qo.v_quant
    v_scaled = v.kind != "none" and v.granularity != "unscaled"
    pvd_exact = _tame(dot_output_format(pl.pv)) and (not v_scaled or _tame(cast(OpSpec, v.arith).fmt))
    p_exact = _tame(t_fmt)
    consistent = pl.row_sum == "consistent"
    sum_fmt_f32 = (p_f32 if p.kind == "float" else within_float32(exp_fmt)) if consistent else within_float32(exp_fmt)
    l_native32 = pl.l_i.fmt.name == "float32" and int(pl.l_i.mode) == 0 and sum_fmt_f32
    eng = QEngine(
        qp,
        lanes,
        mqk,
        mpv,
        bool(fma_exact),
        bool(acc_exact),
        bool(pvd_exact),
        bool(p_exact),
        bool(l_native32),
        bm,
        bn,
        bool(causal),
        seq_k,
        _NO_TABLE,
        pv_scaled,
        pv_lo,
        pv_elems,
    )
    return eng, xs


def _key_tiles(x: np.ndarray, bn: int) -> np.ndarray:
    """(L, S, C) -> (L * ceil(S / bn), bn, C): :func:`_tiles` with the keys first in each tile."""
    return np.ascontiguousarray(_tiles(x.transpose(0, 2, 1), bn).transpose(0, 2, 1))


def _elem_span(bf: object) -> int:
    """The bit span of a block quantizer's element values (:func:`simfloat.accumulate._rows.format_span`)."""
    assert isinstance(bf, BlockFormat)
    return format_span(_format(bf.elem_fmt))


def _bound(a: np.ndarray, b: np.ndarray) -> float:
    """The largest |a_i . b_j| possible: K max|a| max|b| (a (..., K), b (..., K))."""
    return float(np.abs(a).max(initial=0.0) * np.abs(b).max(initial=0.0) * a.shape[-1])
