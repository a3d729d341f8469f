"""Python side of the vectorized engine: a plan and validated inputs into the njit records of
:mod:`simfloat.attention._engine` (lanes, dot records, operands with their alignment weights)."""

from __future__ import annotations

from typing import NamedTuple, cast

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
    # writable, as the P operand of the P.V dot is: numba compiles the row kernels (and the whole baseline loop)
    # once per read-only flag, and an operand the model does not round is the caller's read-only array
    qi, vi = np.require(qi, requirements="W"), np.require(vi, requirements="W")
    mqk = for_operands(mqk, qi, ki)
    read = _dot_reads(pl.pv)
    p_fmt = pl.softmax.fmt if read is None else read  # P's values, as the P.V dot reads them
    mpv = _pv_forms(for_operands(mpv, vi), _tame(p_fmt), within_float32(p_fmt))
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


def _dot_reads(model: Model) -> FloatFormat | None:
    """The input format a dot rounds its operands into (its MMA record's ``in_round``), or None where it takes
    them as they are."""
    if not mma(model).in_round:
        return None
    inner = model.inner if isinstance(model, Chunked) else model
    assert inner.input_fmt is not None  # in_round: the model has an input format
    return _format(inner.input_fmt)


def _pv_forms(mp: MMA, p_tame: bool, p_f32: bool) -> MMA:
    """The P.V dot's fast forms as far as P's values allow: exact products in float64 need them tame, a native
    float32 FMA needs float32 values."""
    if mp.fast and mp.exact_products and not p_tame:
        mp = mp._replace(fast=False)
    if mp.native == N_FMA32 and not p_f32:
        mp = mp._replace(native=N_NONE)
    return mp


class _PFacts(NamedTuple):
    """What the P.V dot's fast forms and the exactness flags may assume of P (its values as that dot reads
    them, or the codes of its quantizer).

    Attributes:
        t_fmt: the format of P before its codes (a quantizer's ``pre``, else exp's): ``t * qmax``'s operand.
        tame: P's values are :func:`_tame` (a fast exact-products dot may take them).
        f32: P's values are float32 values (a native float32 FMA dot may take them).
        float_codes: P's codes are a float cast (the float plans' ``p``, a float quantizer).
    """

    t_fmt: FloatFormat
    tame: bool
    f32: bool
    float_codes: bool


class _QK(NamedTuple):
    """The Q.K^T dot: its row-kernel model and its operands (rounded, or codes times block scales) with their
    alignment weights, each (L, S, D)."""

    mp: MMA
    q: np.ndarray
    eq: np.ndarray
    k: np.ndarray
    ek: np.ndarray


class _PV(NamedTuple):
    """The P.V dot: its row-kernel model and V's operand (L, Sk, Dv) with its weights; a block-scaled dot's
    ``scaled``, ``lo`` and ``elems`` (:class:`~simfloat.attention.vector.forward.Engine`'s ``pv_scaled``,
    ``pv_scale_lo`` and ``pv_elems``)."""

    mp: MMA
    v: np.ndarray
    ev: np.ndarray
    scaled: bool = False
    lo: float = 0.0
    elems: bool = False


class _Exact(NamedTuple):
    """The exactness flags of :class:`~simfloat.attention.vector.forward.Engine` (there documented; the same
    field names)."""

    fma_exact: bool
    acc_exact: bool
    pvd_exact: bool
    p_exact: bool
    l_native32: bool


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
    dsa = np.zeros((qc.shape[0], 0, 0)) if ds is None else np.ascontiguousarray(ds, dtype=np.float64)
    pf = _p_facts(pl)
    qk = _qk_dot(pl, fp, qc, kc, qb, kb, dsa)
    if qk is None:  # block-scaled operands beyond the row kernels
        return None
    pv = _pv_dot(pl, vc, vb, bn, pf)
    if pv is None:
        return None
    xs, mqk, mpv = _operand_tiles(qk, pv, bn, qs, ks, vs, dsa)
    eng = Engine(
        pp=record_of(fp, skip=ARRAYS),
        ln=_flash_lanes(pl),
        qk=record_of(mqk),
        pv=record_of(mpv),
        **_exact_flags(pl, fp, pf)._asdict(),
        bm=bm,
        bn=bn,
        causal=bool(causal),
        wn=wn,
        seq_k=pv.v.shape[1],
        pv_scaled=pv.scaled,
        pv_scale_lo=pv.lo,
        pv_elems=pv.elems,
        ex2_val=ex2_values(fp.ex2_tab) if fp.exp2 else _NO_VALUES,
        ex2_tab=fp.ex2_tab,
        ex2_poly=fp.ex2_poly,
    )
    return eng, xs


def _flash_lanes(pl: Plan) -> np.void:
    """The lanes (format, rounding) of the plan's scalar ops as a :class:`Lanes` record: a plan without
    quantizers has no dequantizations and no P arithmetic (float64 lanes the loop never reads), no ``pre`` (exp's
    lane) and its cast ``p`` as P's code."""
    f64 = _format("float64")

    def ln(spec: OpSpec) -> Lane:
        return lane(spec.fmt, int(spec.mode))

    none = ln(OpSpec(f64))
    dequant, pv_dequant, p_pre, p_arith = none, none, ln(pl.exp), none
    if pl.quantized:
        qo = pl.quant_ops()
        p = qo.p_quant
        assert isinstance(p.arith, OpSpec) and (p.pre is None or isinstance(p.pre, OpSpec))  # Quant made them so
        dequant, pv_dequant, p_arith = ln(qo.dequant), ln(qo.pv_dequant), ln(p.arith)
        p_pre = p_pre if p.pre is None else ln(p.pre)
        p_code = lane(cast(FloatFormat, p.fmt), int(p.rounding)) if p.kind == "float" else lane(f64, 0)
    else:
        p_code = ln(pl.p)
    li = _sum_inner(pl)
    return record_of(
        Lanes(
            dequant=dequant,
            scale=ln(pl.scale),
            exp=ln(pl.exp),
            l_ij=lane(_format(li.fmt), int(mode_code(li.mode))),
            l_i=ln(pl.l_i),
            acc=ln(pl.acc),
            pv_dequant=pv_dequant,
            normalize=ln(pl.normalize),
            out=ln(pl.out),
            p_pre=p_pre,
            p_arith=p_arith,
            p_code=p_code,
        )
    )


def _p_facts(pl: Plan) -> _PFacts:
    """P's format facts (:class:`_PFacts`): of its codes, or of the P.V dot's input format where that dot
    rounds its operands into one."""
    exp_fmt = pl.exp.fmt
    if not pl.quantized:  # P's cast is the float code op p
        pf = _PFacts(exp_fmt, _tame(pl.p.fmt), within_float32(pl.p.fmt), True)
    else:
        p = pl.quant_ops().p_quant
        t_fmt = cast(OpSpec, p.pre).fmt if p.pre is not None else exp_fmt
        if p.kind == "int":  # integer codes <= 2**20: narrow, float32 values
            tame, f32 = True, True
        elif p.kind == "block":  # codes times block scales (as the reference's values for a dot without scales)
            ef, sf = _format(cast(BlockFormat, p.fmt).elem_fmt), _format(cast(BlockFormat, p.fmt).scale_fmt)
            lo = ef.emin - ef.mantissa_bits + sf.emin - sf.mantissa_bits
            tame = ef.mantissa_bits + sf.mantissa_bits <= 24 and ef.emax + sf.emax <= 398 and lo >= -400
            f32 = False
        else:
            p_fmt = cast(FloatFormat, p.fmt) if p.kind == "float" else exp_fmt
            tame, f32 = _tame(p_fmt), within_float32(p_fmt)
        pf = _PFacts(t_fmt, tame, f32, p.kind == "float")
    read = _dot_reads(pl.pv)
    return pf if read is None else pf._replace(tame=_tame(read), f32=within_float32(read))


def _qk_dot(
    pl: Plan, fp: FlashParams, qc: np.ndarray, kc: np.ndarray, qb: np.ndarray | None, kb: np.ndarray | None,
    dsa: np.ndarray,
) -> _QK | None:  # fmt: skip
    """The Q.K^T dot (:class:`_QK`): the operands rounded into its input format, or a block-scaled MMA's codes
    times their block scales (None where they are beyond its row kernels). Q smoothing's delta_s enters as the
    MMA's initial accumulator under ``DELTA_MMA``, so the fast forms must hold for it too."""
    if qb is not None and kb is not None:  # block-scaled qk (its quantizers are block ones: Plan checks)
        model = cast(BlockFMA, pl.qk)
        qi, ki = qc * qb, kc * kb
        qo = pl.quant_ops()
        spans = (_elem_span(qo.q_quant.fmt), _elem_span(qo.k_quant.fmt))
        if not scaled_ok(model, _bound(qi, ki) + float(np.abs(dsa).max(initial=0.0)), spans, qi, ki, dsa):
            return None
        mqk = scaled_mma(model)
        eq, ek = scaled_weights(qc, qb, model, b=False), scaled_weights(kc, kb, model, b=True)
    else:
        mqk = mma(pl.qk)
        qi, ki = round_operands(qc, mqk), round_operands(kc, mqk)
        # writable, as the P operand of the P.V dot is: numba compiles the row kernels once per read-only flag
        qi = np.require(qi, requirements="W")
        eq, ek = _weights(qi, mqk), _weights(ki, mqk)
    mqk = for_operands(mqk, qi, ki, *((dsa,) if fp.delta_mode == DELTA_MMA else ()))
    return _QK(mqk, qi, eq, ki, ek)


def _pv_dot(pl: Plan, vc: np.ndarray, vb: np.ndarray | None, bn: int, pf: _PFacts) -> _PV | None:
    """The P.V dot (:class:`_PV`): V rounded into its input format, or a block-scaled MMA's codes times their
    block scales (None where they are beyond its row kernels; P's scaled codes and weights are made per key tile
    in the engine); its fast forms as far as P's values (``pf``) allow."""
    if vb is not None:
        model = cast(BlockFMA, pl.pv)
        vi = vc * vb
        qo = pl.quant_ops()
        pq = qo.p_quant
        pbf = cast(BlockFormat, pq.fmt)
        # |P| <= 1; two-level: |t| <= qmax up to the roundings of s1 and t (within 1.25 for >= 2 fraction bits);
        # a code times its block scale is within twice |t| (rounded to nearest, saturating)
        level = 1.25 * float(pq.qmax) if pq.granularity in ("per-token", "fixed") and pq.qmax is not None else 1.0
        p_max = min(_format(pbf.elem_fmt).max * _format(pbf.scale_fmt).max, 2.0 * level)
        spans = (_elem_span(pbf), _elem_span(qo.v_quant.fmt))
        if not scaled_ok(model, p_max * float(np.abs(vi).max(initial=0.0)) * bn, spans, vi):
            return None
        ap = acc_params(model)
        pv = _PV(scaled_mma(model), vi, scaled_weights(vc, vb, model, b=True), True, float(2.0**ap.scale_emin),
                 not ap.align_scale)  # fmt: skip
    else:
        mpv = mma(pl.pv)
        vi = round_operands(vc, mpv)
        pv = _PV(mpv, vi, _weights(vi, mpv))
    return pv._replace(mp=_pv_forms(for_operands(pv.mp, vi), pf.tame, pf.f32))


def _operand_tiles(
    qk: _QK, pv: _PV, bn: int, qs: np.ndarray | None, ks: np.ndarray | None, vs: np.ndarray | None, dsa: np.ndarray
) -> tuple[Operands, MMA, MMA]:
    """The :class:`Operands` record: K^T and V tile by tile with their weights and float32 forms, and the
    scales (ones where the plan has none); with the dots' models as their float32 forms leave them."""
    kt, ekt = _tiles(qk.k.transpose(0, 2, 1), bn), _tiles(qk.ek.transpose(0, 2, 1), bn)  # (L * tiles, D, bn)
    vt, evt = _key_tiles(pv.v, bn), _key_tiles(pv.ev, bn)  # (L * tiles, bn, Dv)
    mqk, kt32, ekt32 = operand32(qk.mp, kt, ekt)
    mpv, vt32, evt32 = operand32(pv.mp, vt, evt)

    def scales(x: np.ndarray | None, ones: np.ndarray) -> np.ndarray:
        return ones if x is None else np.ascontiguousarray(x, dtype=np.float64)

    xs = Operands(
        qk.q, qk.eq, scales(qs, _ONES2), kt, ekt, scales(ks, _ONES2), vt, evt, scales(vs, _ONES3), dsa,
        kt32, ekt32, vt32, evt32,
    )  # fmt: skip
    return xs, mqk, mpv


def _exact_flags(pl: Plan, fp: FlashParams, pf: _PFacts) -> _Exact:
    """Which of the loop's contracted or fused steps are exact in float64, so may run in lane form
    (:class:`_Exact`), and whether the row sum's additions are float32 additions of float32 values."""
    exp_fmt = pl.exp.fmt
    score_fmt = pl.dequant.fmt if fp.scores_dequant else dot_output_format(pl.qk)  # type: ignore[union-attr]
    pvd_exact = False
    if pl.quantized:
        v = pl.quant_ops().v_quant
        v_scaled = v.kind != "none" and v.granularity != "unscaled"
        pvd_exact = _tame(dot_output_format(pl.pv)) and (not v_scaled or _tame(cast(OpSpec, v.arith).fmt))
    sum_f32 = pf.f32 if fp.consistent and pf.float_codes else within_float32(exp_fmt)
    li = _sum_inner(pl)
    return _Exact(
        fma_exact=bool(_tame(score_fmt) and _tame(pl.scale.fmt)),
        acc_exact=bool(_tame(pl.acc.fmt) and _tame(pl.alpha.fmt)),
        pvd_exact=bool(pvd_exact),
        p_exact=bool(_tame(pf.t_fmt)),
        l_native32=bool(_format(li.fmt).name == "float32" and int(mode_code(li.mode)) == 0 and sum_f32),
    )


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
