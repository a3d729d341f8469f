"""Python side of the vectorized engine: a plan and validated inputs into the njit records of
:mod:`simfloat.attention._engine` (lanes, dot records, operands with their alignment weights)."""

from __future__ import annotations

from typing import cast

import numpy as np

from simfloat._jit import record_of
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
from simfloat.attention import _engine as _baseline_engine
from simfloat.attention._engine import KEY_CHUNK
from simfloat.attention._flash_params import ARRAYS, FlashParams
from simfloat.attention._quant_kernels import DELTA_MMA
from simfloat.attention.plan import OpSpec, Plan, PlanParams
from simfloat.attention.vector.forward import Engine, Lanes, Operands
from simfloat.blockscale import BlockFormat
from simfloat.formats import FloatFormat
from simfloat.formats import format as _format
from simfloat.hardware import ex2_values
from simfloat.rounding import mode_code

__all__ = [
    "ENGINES",
    "baseline_engine",
    "check_engine",
    "clamp_blocks",
    "dot_output_format",
    "flash_engine",
    "within_float32",
]

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


def _baseline_lanes(pl: Plan) -> _baseline_engine.Lanes:
    def ln(op: str) -> Lane:
        if op == "opmath":  # a format, not an op: its multiply rounds to nearest-even
            return lane(_format("float32") if pl.opmath is None else pl.opmath, 0)
        s = getattr(pl, op)
        return lane(_format(s.fmt), int(mode_code(s.mode)))

    return _baseline_engine.Lanes(*(ln(op) for op in _baseline_engine.Lanes._fields))


def baseline_engine(
    pl: Plan, pp: PlanParams, *, q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool
) -> tuple[_baseline_engine.Engine, _baseline_engine.Operands]:
    """The njit records of a baseline call (:func:`simfloat.attention._engine.baseline_units`).

    Args:
        pl: the plan; pp: its params for the call's scale.
        q: (L, Sq, D), k: (L, Sk, D), v: (L, Sk, Dv) float64 operands (validated).
        causal: top-left causal mask.
    """
    mqk, mpv = mma(pl.qk), mma(pl.pv)
    qi, ki, vi = round_operands(q, mqk), round_operands(k, mqk), round_operands(v, mpv)
    # writable, as the P operand of the P.V dot is: numba compiles the row kernels once per read-only flag
    qi = np.require(qi, requirements="W")
    mqk = for_operands(mqk, qi, ki)
    inner = pl.pv.inner if isinstance(pl.pv, Chunked) else pl.pv
    p_fmt = pl.softmax.fmt  # P's values, as the P.V dot reads them
    if mpv.in_round:
        assert inner.input_fmt is not None  # in_round: the model has an input format
        p_fmt = _format(inner.input_fmt)
    mpv = for_operands(mpv, vi)
    if mpv.fast and mpv.exact_products and not _tame(p_fmt):
        mpv = mpv._replace(fast=False)
    if mpv.native == N_FMA32 and not within_float32(p_fmt):
        mpv = mpv._replace(native=N_NONE)
    seq_k = vi.shape[1]
    kt = _tiles(ki.transpose(0, 2, 1), KEY_CHUNK)  # (L * tiles, D, width): K^T tile by tile
    ekt, ev = _weights(kt, mqk), _weights(vi, mpv)
    mqk, kt32, ekt32 = operand32(mqk, kt, ekt, rows=False)  # the baseline's rows run row_mma
    mpv, v32, ev32 = operand32(mpv, vi, ev, rows=False)
    xs = _baseline_engine.Operands(qi, _weights(qi, mqk), kt, ekt, vi, ev, kt32, ekt32, v32, ev32)
    eng = _baseline_engine.Engine(
        record_of(pp, skip=("ex2_tab",)),
        record_of(_baseline_lanes(pl)),
        record_of(mqk),
        record_of(mpv),
        KEY_CHUNK,
        bool(causal),
        seq_k,
        pp.ex2_tab[:0],
    )
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


def flash_engine(
    pl: Plan,
    fp: FlashParams,
    *,
    qc: np.ndarray,
    kc: np.ndarray,
    vc: np.ndarray,
    bm: int,
    bn: int,
    causal: bool,
    wn: int,
    qs: np.ndarray | None = None,
    ks: np.ndarray | None = None,
    vs: np.ndarray | None = None,
    qb: np.ndarray | None = None,
    kb: np.ndarray | None = None,
    vb: np.ndarray | None = None,
    ds: np.ndarray | None = None,
) -> tuple[Engine, Operands] | None:
    """The njit records of a flash call under any plan (:mod:`simfloat.attention.vector.forward`).

    Args:
        pl: the :class:`~simfloat.attention.Plan` (with or without quantizers); fp: its
            :class:`~simfloat.attention._flash_params.FlashParams` for the call's scale.
        qc: (L, Sq, D) Q codes (a plan without quantizers: q); qs: (L, Sq) their per-row scales.
        kc: (L, Sk, D) K codes; ks: (L, n_tiles * bn) per-key scales (1 past Sk).
        vc: (L, Sk, Dv) V codes; vs: (L, n_tiles, Dv) V scales per key tile and channel. The scales are None
            for a plan without quantizers.
        bm, bn: tile sizes; causal; wn: warps along the keys of the tl.sum layout.
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

    exp_fmt = pl.exp.fmt
    li = _sum_inner(pl)
    none = OpSpec(f64)
    if pl.quantized:
        qo = pl.quant_ops()
        p = qo.p_quant
        pre = p.pre if p.pre is not None else pl.exp
        assert isinstance(pre, OpSpec) and isinstance(p.arith, OpSpec)  # made OpSpecs by Quant.__post_init__
        code = lane(cast(FloatFormat, p.fmt), int(p.rounding)) if p.kind == "float" else lane(f64, 0)
        lanes = Lanes(
            ln(qo.dequant),
            ln(pl.scale),
            ln(pl.exp),
            lane(_format(li.fmt), int(mode_code(li.mode))),
            ln(pl.l_i),
            ln(pl.acc),
            ln(qo.pv_dequant),
            ln(pl.normalize),
            ln(pl.out),
            ln(pre),
            ln(p.arith),
            code,
        )
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
        p_float = p.kind == "float"
    else:  # P's cast is the float code op p: no pre, no arithmetic of a scale
        lanes = Lanes(
            ln(none),
            ln(pl.scale),
            ln(pl.exp),
            lane(_format(li.fmt), int(mode_code(li.mode))),
            ln(pl.l_i),
            ln(pl.acc),
            ln(none),
            ln(pl.normalize),
            ln(pl.out),
            ln(pl.exp),
            ln(none),
            ln(pl.p),
        )
        t_fmt = exp_fmt
        p_tame, p_f32, p_float = _tame(pl.p.fmt), within_float32(pl.p.fmt), True
    lanes = record_of(lanes)
    mqk, mpv = mma(pl.qk), mma(pl.pv)
    qi, ki, vi = round_operands(qc, mqk), round_operands(kc, mqk), round_operands(vc, mpv)
    # writable, as the P operand of the P.V dot is: numba compiles the row kernels once per read-only flag
    qi = np.require(qi, requirements="W")
    eq, ek = _weights(qi, mqk), _weights(ki, mqk)
    if qb is not None and kb is not None:  # block-scaled qk (its quantizers are block ones: Plan checks)
        model = cast(BlockFMA, pl.qk)
        qi, ki = qc * qb, kc * kb
        qo = pl.quant_ops()
        spans = (_elem_span(qo.q_quant.fmt), _elem_span(qo.k_quant.fmt))
        if not scaled_ok(model, _bound(qi, ki) + float(np.abs(dsa).max(initial=0.0)), spans, qi, ki, dsa):
            return None
        mqk = scaled_mma(model)
        eq, ek = scaled_weights(qc, qb, model, b=False), scaled_weights(kc, kb, model, b=True)
    # delta_s as the MMA's initial accumulator: the fast forms must hold for it too
    mqk = for_operands(mqk, qi, ki, *((dsa,) if fp.delta_mode == DELTA_MMA else ()))
    inner = pl.pv.inner if isinstance(pl.pv, Chunked) else pl.pv
    if mpv.in_round:
        assert inner.input_fmt is not None  # in_round: the model has an input format
        p_fmt = _format(inner.input_fmt)
        p_tame, p_f32 = _tame(p_fmt), within_float32(p_fmt)
    pv_scaled, pv_lo, pv_elems = vb is not None, 0.0, False
    if vb is not None:  # block-scaled P.V: P's scaled codes and weights are made per key tile in the engine
        model = cast(BlockFMA, pl.pv)
        vi = vc * vb
        qo = pl.quant_ops()
        pbf = cast(BlockFormat, qo.p_quant.fmt)
        # |P| <= 1; two-level: |t| <= qmax up to the roundings of s1 and t (within 1.25 for >= 2 fraction bits);
        # a code times its block scale is within twice |t| (rounded to nearest, saturating)
        pq = qo.p_quant
        level = 1.25 * float(pq.qmax) if pq.granularity in ("per-token", "fixed") and pq.qmax is not None else 1.0
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
    xs = Operands(
        qi,
        eq,
        _ONES2 if qs is None else np.ascontiguousarray(qs, dtype=np.float64),
        kt,
        ekt,
        _ONES2 if ks is None else np.ascontiguousarray(ks, dtype=np.float64),
        vt,
        evt,
        _ONES3 if vs is None else np.ascontiguousarray(vs, dtype=np.float64),
        dsa,
        kt32,
        ekt32,
        vt32,
        evt32,
    )
    score_fmt = pl.dequant.fmt if fp.scores_dequant else dot_output_format(pl.qk)  # type: ignore[union-attr]
    fma_exact = _tame(score_fmt) and _tame(pl.scale.fmt)
    acc_exact = _tame(pl.acc.fmt) and _tame(pl.alpha.fmt)
    pvd_exact, p_exact = False, _tame(t_fmt)
    if pl.quantized:
        v = pl.quant_ops().v_quant
        v_scaled = v.kind != "none" and v.granularity != "unscaled"
        pvd_exact = _tame(dot_output_format(pl.pv)) and (not v_scaled or _tame(cast(OpSpec, v.arith).fmt))
    sum_fmt_f32 = (p_f32 if p_float else within_float32(exp_fmt)) if fp.consistent else within_float32(exp_fmt)
    l_native32 = _format(li.fmt).name == "float32" and int(mode_code(li.mode)) == 0 and sum_fmt_f32
    eng = Engine(
        record_of(fp, skip=ARRAYS),
        lanes,
        record_of(mqk),
        record_of(mpv),
        bool(fma_exact),
        bool(acc_exact),
        bool(pvd_exact),
        bool(p_exact),
        bool(l_native32),
        bm,
        bn,
        bool(causal),
        wn,
        seq_k,
        pv_scaled,
        pv_lo,
        pv_elems,
        ex2_values(fp.ex2_tab) if fp.exp2 else _NO_VALUES,
        fp.ex2_tab,
        fp.ex2_poly,
    )
    return eng, xs


_NO_VALUES = ex2_values(np.empty(0, dtype=np.int8))  # read-only, as a table's values
_ONES2 = np.ones((1, 1))
_ONES3 = np.ones((1, 1, 1))


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
