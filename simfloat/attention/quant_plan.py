"""The quantized dataflow of a :class:`~simfloat.attention.Plan` with quantizers (its ``q_quant``, ``k_quant``,
``v_quant``, ``p_quant`` set): the checks of its quantizer ops and choices, its flattening for compiled code
(:func:`quant_params`), the plans derived from it (:func:`exact`, :func:`isolate`, :func:`ablate`,
:func:`arith_fp64`, behind the Plan methods of those names) and the quantized presets (:func:`quant_table`, part
of :func:`simfloat.attention.plan`'s one table). The kernels that run such a plan are
:mod:`simfloat.attention.quantized`'s; the algorithm is documented there. This module reads plans by their
fields and builds new ones through ``replace`` (it does not import :mod:`simfloat.attention.plan`, which imports
it)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

from simfloat.accumulate import BlockFMA, Chunked, Model, Sequential, acc_params, tensor_core
from simfloat.attention import _quant_kernels as _qk
from simfloat.attention._kernels import host_mul, host_rnd
from simfloat.attention._quant_kernels import QUANT_OPS
from simfloat.attention._specs import OpParams, OpSpec, _dot_spec, _scalar_spec
from simfloat.attention.quant import (
    EXACT,
    INT_RULES,
    PV_UPDATES,
    QUANTIZERS,
    ROW_SUMS,
    SCORE_SCALINGS,
    Quant,
    checked_choice,
    quant_spec,
)
from simfloat.blockscale import SCALE_RULES, BlockFormat, checked_scale_rounding
from simfloat.formats import format as _format
from simfloat.rounding import mode_code

__all__ = ["QUANT_FIELDS", "QUANT_FLAGS", "QUANT_OPS", "QuantOps", "quant_fields", "quant_params", "quant_table"]

_DOTS = ("qk", "pv")
#: Ops that a plan may leave out (None): smoothing is a transform of the dataflow, not a rounding of it.
_OPTIONAL = ("k_smooth", "q_smooth", "q_delta")
_SCALARS = tuple(op for op in QUANT_OPS if op not in QUANTIZERS and op not in _DOTS and op not in _OPTIONAL)
_QUANT_ONLY_FLAGS = ("row_sum", "score_scaling", "pv_update")
#: The flags of the quantized dataflow: exp2 and contract, its own three, and the float dataflow's options that
#: are optional steps of the one forward loop (the hardware models, tl.exp, lazy rescaling, the accumulator's
#: format).
QUANT_FLAGS = (
    "exp2",
    "contract",
    *_QUANT_ONLY_FLAGS,
    "exp2_impl",
    "sum_order",
    "exp_impl",
    "lazy_threshold",
    "pv_acc",
)
#: The Plan fields only a plan with quantizers has (None in a plan without).
QUANT_FIELDS = QUANTIZERS + ("rotate", "k_smooth", "q_smooth", "q_delta", "dequant", "pv_dequant") + _QUANT_ONLY_FLAGS
#: The Plan fields of the float dataflow a plan with quantizers does not model (yet): they must keep these values.
_FLOAT_ONLY = {
    "normalization": "deferred",
    "tie_shift": None,
    "tie_tol": 0.0,
    "state": "m_l",
    "kv_order": "forward",
    "contract_diagonal": True,
}
_LOG2E = math.log2(math.e)  # rn32 of it equals rn32(1.44269504), the kernels' constant (H1)
_F64 = OpSpec("float64")
_F32 = OpSpec("float32")
#: q_delta's default: a chain of fp32 fused multiply-adds
_Q_DELTA = Sequential("float32")


class QuantOps(NamedTuple):
    """The quantizer ops of a plan with quantizers, typed as they are there (a Plan's fields are optional)."""

    q_quant: Quant
    k_quant: Quant
    v_quant: Quant
    p_quant: Quant
    rotate: OpSpec
    dequant: OpSpec
    pv_dequant: OpSpec


def quant_fields(p: Any) -> dict[str, object]:
    """The quantizer ops and choices of plan ``p`` (one with at least one quantizer set) as field values: each
    quantizer a :class:`Quant` (None: ``Quant()``, nothing quantized), ``rotate``, ``dequant``, ``pv_dequant``
    OpSpecs (default float32), the smoothing ops (None: off) and the choices (defaults ``"reference"``,
    ``"scores"``, ``"separate"``).

    Raises:
        TypeError, ValueError: a value of the wrong type or an unknown choice.
    """
    out: dict[str, object] = {op: quant_spec(op, getattr(p, op)) for op in QUANTIZERS}
    for op in ("rotate", "dequant", "pv_dequant"):
        v = getattr(p, op)
        out[op] = _F32 if v is None else _scalar_spec(op, v)
    for op in ("k_smooth", "q_smooth"):
        v = getattr(p, op)
        out[op] = None if v is None else _scalar_spec(op, v)
    if out["q_smooth"] is None:
        if p.q_delta is not None:
            raise ValueError("q_delta is the correction of q_smooth: set q_smooth too, or neither")
        out["q_delta"] = None
    else:
        out["q_delta"] = _dot_spec("q_delta", _Q_DELTA if p.q_delta is None else p.q_delta)
    for op, choices, default in (
        ("row_sum", ROW_SUMS, "reference"),
        ("score_scaling", SCORE_SCALINGS, "scores"),
        ("pv_update", PV_UPDATES, "separate"),
    ):
        v = getattr(p, op)
        out[op] = default if v is None else checked_choice(f"Plan.{op}", v, choices)
    return out


def check_quantized(pl: Any) -> None:
    """The checks of a plan with quantizers (its fields as :func:`quant_fields` made them): the float dataflow's
    options it does not model, where each quantizer's granularity can go, and that the dots get the operands they
    take.

    Raises:
        ValueError: an invalid combination (the message names it).
    """
    for f, default in _FLOAT_ONLY.items():
        if getattr(pl, f) != default:
            raise ValueError(
                f"Plan.{f}={getattr(pl, f)!r}: plans with quantizers do not model it (yet); leave it {default!r}"
            )
    if pl.kernel == "baseline":
        raise ValueError("a plan with quantizers is a plan of the flash kernel, not kernel='baseline'")
    folded = pl.score_scaling == "folded"
    pvu = pl.pv_update
    _check_q_smooth(pl)
    q, k, v, p = pl.q_quant, pl.k_quant, pl.v_quant, pl.p_quant
    _check_block(pl, pvu)
    for name, qu in (("q_quant", q), ("k_quant", k)):
        if folded and qu.kind != "none" and qu.granularity == "per-warp":
            raise ValueError(
                f"{name}: score_scaling 'folded' needs one scale per tile (per-tensor or "
                "per-block); per-warp scales need score_scaling 'scores'"
            )
        if qu.granularity in ("per-channel", "fixed"):
            raise ValueError(
                f"{name}: granularity {qu.granularity!r} does not factor out of q . k; use "
                "per-token, per-tensor, per-block or unscaled"
            )
        if folded and qu.kind != "none" and qu.granularity == "per-token":
            raise ValueError(
                f"{name}: score_scaling 'folded' needs one scale per tile (per-tensor or "
                "per-block); per-token scales need score_scaling 'scores'"
            )
    if v.granularity in ("per-token", "per-warp", "fixed") and v.kind != "none":
        raise ValueError(
            f"v_quant: granularity {v.granularity!r} does not factor out of P . V; use "
            "per-tensor, per-block, per-channel or unscaled"
        )
    if pvu in ("into_acc", "two_level") and v.kind != "none" and v.granularity == "per-block":
        raise ValueError(
            f"v_quant per-block needs pv_update 'separate' or 'scaled', not {pvu!r} (the scale changes "
            "per key tile, so it cannot be applied once at the end)"
        )
    if p.kind not in ("none", "block") and p.granularity not in ("fixed", "unscaled"):
        raise ValueError(
            "p_quant: P takes a fixed scale (granularity 'fixed', int or float codes) or a plain cast "
            "(float, 'unscaled')"
        )
    if p.kind == "int" and pvu not in ("separate", "two_level"):
        raise ValueError("an int p_quant (fixed scale 1/qmax) needs pv_update 'separate' or 'two_level'")
    if p.kind == "float" and p.granularity == "fixed":
        if pvu == "scaled":
            raise ValueError("a fixed-scale float p_quant needs pv_update 'separate', 'into_acc' or 'two_level'")
        if pl.row_sum == "consistent":
            raise ValueError("row_sum 'consistent' takes an int or unscaled p_quant, not a fixed-scale float one")


def _check_q_smooth(pl: Any) -> None:
    """The correction of q_smooth needs a place in the scores."""
    if pl.q_smooth is None:
        return
    if isinstance(pl.q_delta, BlockFMA) and pl.q_delta.scale_block:
        raise ValueError("q_delta is a dot of unquantized values: it takes no block-scaled MMA model")
    if delta_mode(pl) == _qk.DELTA_NONE:
        raise ValueError(
            "q_smooth with score_scaling 'folded' needs Q and K without scales outside the qk MMA (unscaled "
            "or none): the correction mean_q . k is in score units; use score_scaling 'scores'"
        )


def delta_mode(pl: Any) -> int:
    """Where q_smooth's correction enters the scores (``_quant_kernels.DELTA_*``)."""
    if pl.q_smooth is None:
        return _qk.DELTA_NONE

    def whole(qu: Quant) -> bool:  # the codes carry their whole scale into the MMA
        return qu.kind == "none" or qu.granularity == "unscaled"

    if whole(pl.q_quant) and whole(pl.k_quant):
        return _qk.DELTA_MMA
    return _qk.DELTA_SCORES if pl.score_scaling == "scores" else _qk.DELTA_NONE


def _check_block(pl: Any, pvu: str) -> None:
    """Block-scaled quantizers and MMAs: where they may go, and that an MMA gets the operands it takes."""
    q, k, v, p = pl.q_quant, pl.k_quant, pl.v_quant, pl.p_quant
    for name, qu in (("q_quant", q), ("k_quant", k), ("v_quant", v)):
        if qu.kind == "block" and qu.granularity in ("per-token", "fixed"):
            raise ValueError(
                f"{name}: a block quantizer's {qu.granularity!r} level is P's (SageAttention3's two-level P)"
            )
    if p.kind == "block":
        if p.granularity == "per-tensor":
            raise ValueError("p_quant: a block quantizer of P takes granularity 'per-token', 'fixed' or 'unscaled'")
        if pvu != "two_level":
            raise ValueError("a block p_quant needs pv_update 'two_level' (each key tile's P.V from zero)")
        if pl.row_sum != "reference":
            raise ValueError("a block p_quant takes row_sum 'reference' (l from the unquantized P)")
    for dot, (na, a), (nb, b) in (("qk", ("q_quant", q), ("k_quant", k)), ("pv", ("p_quant", p), ("v_quant", v))):
        model = getattr(pl, dot)
        if not (isinstance(model, BlockFMA) and model.scale_block):
            continue
        for name, qu in ((na, a), (nb, b)):
            if qu.kind != "block" or qu.block_size != model.scale_block:
                raise ValueError(
                    f"{dot} is a block-scaled MMA (scale_block {model.scale_block}): it takes block-quantized "
                    f"operands with blocks of {model.scale_block}, but {name} is {qu}"
                )
        if dot == "pv" and pvu != "two_level":
            raise ValueError("a block-scaled pv MMA needs pv_update 'two_level'")


def feeds_block_mma(pl: Any, op: str) -> str | None:
    """The block-scaled dot a quantizer feeds, or None."""
    dot = {"q_quant": "qk", "k_quant": "qk", "p_quant": "pv", "v_quant": "pv"}.get(op)
    if dot is None:
        return None
    model = getattr(pl, dot)
    return dot if isinstance(model, BlockFMA) and model.scale_block else None


def exact(pl: Any) -> Any:
    """The same dataflow with nothing quantized and every op exact (float64; dots ``EXACT``)."""
    changes: dict[str, object] = {op: Quant() for op in QUANTIZERS}
    changes.update({op: EXACT for op in _DOTS})
    changes.update({op: _F64 for op in _SCALARS})
    changes.update({op: None if getattr(pl, op) is None else _F64 for op in ("k_smooth", "q_smooth")})
    changes["q_delta"] = None if pl.q_delta is None else EXACT
    changes["pv_acc"] = None  # the accumulator's format goes with the acc op
    return pl.replace(name=f"{pl.name}:exact", **changes)


def isolate(pl: Any, op: str) -> Any:
    """Only ``op`` as in this plan, everything else exact: the error ``op`` causes on its own."""
    if op not in QUANT_OPS:
        raise ValueError(f"unknown op {op!r}; ops: {', '.join(QUANT_OPS)}")
    model = getattr(pl, op)
    if op in _DOTS and isinstance(model, BlockFMA) and model.scale_block:
        raise ValueError(
            f"{op} is a block-scaled MMA: it takes block-quantized operands and cannot run without its "
            f"quantizers; compare the plan with plan.ablate({op!r}) instead"
        )
    keep: dict[str, object] = {op: model}
    if op == "acc":  # alpha's rounding into the accumulator's format is the acc op's
        keep["pv_acc"] = pl.pv_acc
    return exact(pl).replace(name=f"{pl.name}:only-{op}", **keep)


def ablate(pl: Any, op: str) -> Any:
    """This plan with ``op`` made exact (a quantizer removed): the error left without it. A quantizer that
    feeds a block-scaled MMA (FP4) takes the MMA with it (the MMA is made ``EXACT``): the MMA has no form
    for unquantized operands."""
    if op not in QUANT_OPS:
        raise ValueError(f"unknown op {op!r}; ops: {', '.join(QUANT_OPS)}")
    value: object = Quant() if op in QUANTIZERS else (EXACT if op in (*_DOTS, "q_delta") else _F64)
    if op in _OPTIONAL and getattr(pl, op) is None:
        value = None  # an op the plan does not have stays out
    changes: dict[str, object] = {op: value}
    if op == "acc":  # the accumulator's format (alpha's rounding into it) goes with the acc op
        changes["pv_acc"] = None
    dot = feeds_block_mma(pl, op)
    if dot is not None:
        changes[dot] = EXACT
    return pl.replace(name=f"{pl.name}:no-{op}", **changes)


def arith_fp64(pl: Any) -> Any:
    """The quantizers of this plan with all arithmetic exact: quantization error alone."""
    ex = exact(pl)
    return ex.replace(name=f"{pl.name}:fp64", **{op: getattr(pl, op) for op in QUANTIZERS})


def dot_kind(model: Model, a: Quant, b: Quant) -> int:
    if isinstance(model, Chunked):
        return _qk.DOT_GENERIC
    if isinstance(model, BlockFMA) and model.scale_block:
        return _qk.DOT_SCALED
    if model == EXACT:
        return _qk.DOT_INT if a.kind == "int" and b.kind == "int" else _qk.DOT_F64
    if isinstance(model, BlockFMA) and model.input_fmt is None:
        return _qk.DOT_BLOCK
    return _qk.DOT_GENERIC


def quant_params(pl: Any, scale: float) -> _qk.QParams:
    """The plan for the compiled kernels with the host's qk_scale (H1): ``scale(scale(sm_scale) *
    scale(log2 e))`` with exp2, else ``scale(sm_scale)``.

    Raises:
        ValueError: the rounded scale is not finite and > 0.
    """

    def op(name: str) -> OpParams:
        s: OpSpec = getattr(pl, name)
        return OpParams(s.fmt.params, int(s.mode))

    sc = op("scale")
    sm = host_rnd(float(scale), sc)
    qk_scale = host_mul(sm, host_rnd(_LOG2E, sc), sc) if pl.exp2 else sm
    if not (math.isfinite(qk_scale) and qk_scale > 0 and math.isfinite(sm) and sm > 0):
        raise ValueError(f"scale {scale} becomes {qk_scale} in {pl.scale.fmt.name}: it must stay finite and > 0")
    p = pl.p_quant
    pre = p.pre if p.pre is not None else _F64
    assert isinstance(pre, OpSpec) and isinstance(p.arith, OpSpec)  # made OpSpecs by Quant.__post_init__
    code = OpSpec(p.fmt, p.rounding) if p.kind == "float" else _F64  # fmt set for floats
    p_kind = {"none": _qk.K_NONE, "int": _qk.K_INT, "float": _qk.K_FLOAT, "block": _qk.K_BLOCK}[p.kind]
    blk = _block_params(p)
    if p.kind == "float" and p.granularity == "fixed":
        p_kind = _qk.K_FFLOAT
    rule = INT_RULES.index(p.rounding) if p.kind == "int" else 0
    return _qk.QParams(
        acc_params(pl.qk),
        acc_params(pl.pv),
        dot_kind(pl.qk, pl.q_quant, pl.k_quant),
        dot_kind(pl.pv, p, pl.v_quant),
        op("dequant"),
        sc,
        op("exp"),
        op("m_i"),
        op("alpha"),
        op("l_i"),
        op("acc"),
        op("pv_dequant"),
        op("normalize"),
        op("out"),
        p_kind,
        p.pre is not None,
        OpParams(pre.fmt.params, int(pre.mode)),
        OpParams(p.arith.fmt.params, int(p.arith.mode)),
        OpParams(code.fmt.params, int(code.mode)),
        float(p.qmax or 1.0),
        rule,
        pl.exp2,
        pl.contract,
        pl.row_sum == "consistent",
        pl.score_scaling == "folded",
        PV_UPDATES.index(pl.pv_update),
        qk_scale,
        float(scale) * (_LOG2E if pl.exp2 else 1.0),
        *blk,
        delta_mode(pl),
        _p_shift(pl, sc),
    )


def _p_shift(pl: Any, sc: OpParams) -> float:
    """``scale(log2(qmax))`` (``scale(ln(qmax))`` without exp2) of a block P quantizer with a fixed first level,
    else 0."""
    p = pl.p_quant
    if p.kind != "block" or p.granularity != "fixed":
        return 0.0
    assert p.qmax is not None
    return host_rnd(math.log2(p.qmax) if pl.exp2 else math.log(p.qmax), sc)


def _block_params(p: Quant) -> tuple[bool, int, OpParams, OpParams, float, float]:
    """QParams' fields of a block P quantizer (placeholders otherwise)."""
    f64 = OpParams(_F64.fmt.params, int(_F64.mode))
    if p.kind != "block":
        return False, 1, f64, f64, 1.0, 0.0
    bf = p.fmt
    assert isinstance(bf, BlockFormat)
    ef, sf = _format(bf.elem_fmt), _format(bf.scale_fmt)
    if bf.saturate:
        ef, sf = ef.replace(overflow="saturate", name=ef.name), sf.replace(overflow="saturate", name=sf.name)
    by_emax, smode = SCALE_RULES[checked_scale_rounding(bf.scale_rounding)]
    target = math.ldexp(1.0, _format(bf.elem_fmt).emax) if by_emax else _format(bf.elem_fmt).max
    return (
        p.granularity == "per-token",
        p.block_size,
        OpParams(sf.params, int(smode)),
        OpParams(ef.params, int(mode_code(bf.elem_mode))),
        float(target),
        0.0 if sf.zero else float(sf.tiny),
    )


FP8_NAMES = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}


def quant_table(make: Callable[..., Any]) -> dict[str, Any]:
    """The quantized presets by name (documented at :func:`simfloat.attention.plan`), each built by ``make(name,
    q_quant, k_quant, v_quant, p_quant, qk, pv, **other fields)`` (the plan constructor with the quantized
    kernels' defaults: every other op fp32, output fp16, exp2 and FMA contraction) and its ``replace``. The
    quantized golden is ``quant-fp64`` (``int8-reference`` with nothing quantized and every op float64; ``fp64``
    is the float plans' golden).
    """
    fp32 = OpSpec("float32")
    tok = Quant("int", "per-token", pre=fp32)
    p_int8 = Quant("int", "fixed", "half_up", arith="float16", pre="float16")
    int8 = make("int8-reference", tok, tok, Quant("int", "per-tensor", pre=fp32), p_int8, EXACT, EXACT)
    fp16 = Quant("float", "unscaled", fmt="float16")
    half = int8.replace(
        name="half-int8", v_quant=fp16, p_quant=fp16, pv=tensor_core("sm90", "fp16"), pv_update="into_acc"
    )
    out = {
        "int8-reference": int8,
        "int8-consistent": int8.replace(name="int8-consistent", row_sum="consistent"),
        "int8-reference-unfused": int8.replace(
            name="int8-reference-unfused",
            p_quant=Quant("int", "fixed", "half_up_unfused", arith="float16", pre="float16"),
        ),
        "int8-reference-vblock": int8.replace(
            name="int8-reference-vblock", v_quant=Quant("int", "per-block", pre=fp32)
        ),
        "int8-reference-vchannel": int8.replace(
            name="int8-reference-vchannel", v_quant=Quant("int", "per-channel", pre=fp32)
        ),
        "half-int8": half,
        "half-int8-consistent": half.replace(name="half-int8-consistent", row_sum="consistent"),
    }
    fp8_dot = tensor_core("sm90", "e4m3")  # faithful()'s "fp8" model, for e4m3 and e5m2 operands alike
    for short, f in FP8_NAMES.items():
        cast = Quant("float", "unscaled", fmt=f)
        tens = Quant("float", "per-tensor", fmt=f, pre=fp32)
        base = make(
            f"fp8-{short}", tens, tens, tens, cast, fp8_dot, fp8_dot, score_scaling="folded", pv_update="into_acc"
        )
        blk = Quant("float", "per-block", fmt=f, pre=fp32)
        out[f"fp8-{short}"] = base
        out[f"fp8-{short}-block"] = base.replace(
            name=f"fp8-{short}-block", q_quant=blk, k_quant=blk, v_quant=blk, pv_update="scaled"
        )
        out[f"fp8-{short}-unscaled"] = base.replace(
            name=f"fp8-{short}-unscaled", q_quant=cast, k_quant=cast, v_quant=cast
        )
    for short, f in (("fp16", "float16"), ("bf16", "bfloat16")):
        cast = Quant("float", "unscaled", fmt=f)
        out[f"{short}-flash"] = make(
            f"{short}-flash",
            cast,
            cast,
            cast,
            cast,
            tensor_core("sm90", f),
            tensor_core("sm90", f),
            out=f,  # a name: an OpSpec after __post_init__
            score_scaling="folded",
            pv_update="into_acc",
        )
    # SageAttention2 (INT8 QK^T, FP8 P.V): K smoothed by its mean key (fp32), Q INT8 per warp of 32 rows, K INT8
    # per key tile, exact integer QK^T; V e4m3 per channel; P in [0, 1] scaled by 448 (e4m3's max) and cast to
    # e4m3; P.V on the sm90 fp8 tensor-core model, fresh per key tile, added to the fp32 accumulator
    e4m3 = "float8_e4m3fn"
    sage = make(
        "sage2-int8-fp8",
        Quant("int", "per-warp", pre=fp32, group=32),
        Quant("int", "per-block", pre=fp32),
        Quant("float", "per-channel", fmt=e4m3, pre=fp32),
        Quant("float", "fixed", fmt=e4m3),
        EXACT,
        fp8_dot,
        k_smooth=fp32,
        pv_update="two_level",
    )
    out["sage2-int8-fp8"] = sage
    out["sage2-int8-fp8-single"] = sage.replace(name="sage2-int8-fp8-single", pv_update="into_acc")
    out["sage2-int8-fp8-qblock"] = sage.replace(
        name="sage2-int8-fp8-qblock", q_quant=Quant("int", "per-block", pre=fp32)
    )
    # SageAttention2's Q smoothing (the paper's option): Q less its mean per q tile (fp32), the correction
    # mean_q . k (fp32 FMA chain) added to the dequantized scores in fp32
    out["sage2-int8-fp8-qsmooth"] = sage.replace(name="sage2-int8-fp8-qsmooth", q_smooth=fp32, q_delta=_Q_DELTA)
    # SageAttention1's CUDA kernel (sageattn_qk_int8_pv_fp16_cuda; INT8 QK^T, FP16 P.V) on a consumer GPU (the
    # mma.sync model of sm89, RTX 4090): Q, K and the scores as sage2; V and P cast to fp16, the row sum from the
    # fp16 P (the kernel sums it on the tensor cores, here in fp32 left to right). Its three P.V accumulators
    # (pv_accum_dtype): "fp32" (f16f16f32 MMA into the fp32 accumulator); "fp16" (f16f16f16 MMA: the accumulator
    # held in fp16 over the whole sequence, rescaled by the fp16 alpha, divided by l into fp16); "fp16+fp32"
    # (each key tile's P.V from zero in fp16, added to the fp32 accumulator)
    f16 = Quant("float", "unscaled", fmt="float16")
    mma16 = tensor_core("sm89", "fp16", out_format="fp16")
    sage1 = sage.replace(
        name="sage1-int8-fp16",
        v_quant=f16,
        p_quant=f16,
        pv=tensor_core("sm89", "fp16"),
        pv_update="into_acc",
        row_sum="consistent",
    )
    out["sage1-int8-fp16"] = sage1
    out["sage1-int8-fp16-acc16"] = sage1.replace(
        name="sage1-int8-fp16-acc16", pv=mma16, acc="float16", pv_acc="float16", normalize="float16"
    )
    out["sage1-int8-fp16-acc16-flush32"] = sage1.replace(
        name="sage1-int8-fp16-acc16-flush32", pv=mma16, pv_update="two_level"
    )
    # SageAttention3 (FP4 QK^T and P.V): K smoothed as above; Q, K NVFP4 along the head dimension and V NVFP4
    # along the keys (e2m1 elements, ue4m3 scales per 16, no tensor scale: the released kernels hand the MMA
    # e4m3 block scales only); P two-level: per row of a key tile scaled onto [0, 448 * 6] (fp32), then NVFP4
    # per 16 keys; both products on the Blackwell nvf4 MMA model (sm120, RTX 5090; sm100's is the same model),
    # each key tile's P.V from zero, times P's row scale, added to the fp32 accumulator
    nv_blk = Quant("block", "unscaled", fmt="nvfp4", pre=fp32)
    fp4_dot = tensor_core("sm120", "e2m1", kind="nvf4")
    sage3 = make(
        "sage3-fp4",
        nv_blk,
        nv_blk,
        nv_blk,
        Quant("block", "per-token", fmt="nvfp4"),
        fp4_dot,
        fp4_dot,
        k_smooth=fp32,
        pv_update="two_level",
    )
    nv_tensor = Quant("block", "per-tensor", fmt="nvfp4", pre=fp32)
    out["sage3-fp4"] = sage3
    out["sage3-fp4-tensorscale"] = sage3.replace(
        name="sage3-fp4-tensorscale", q_quant=nv_tensor, k_quant=nv_tensor, v_quant=nv_tensor
    )
    out["sage3-fp4-onelevel"] = sage3.replace(
        name="sage3-fp4-onelevel", p_quant=Quant("block", "unscaled", fmt="nvfp4")
    )
    # the released SageAttention3 kernel's Q smoothing: Q less its mean per q tile, the correction as the qk
    # MMA's initial accumulator
    out["sage3-fp4-qsmooth"] = sage3.replace(name="sage3-fp4-qsmooth", q_smooth=fp32, q_delta=_Q_DELTA)
    # the released kernel's P: scaled onto [0, 448 * 6] by a fixed shift in the softmax's exponent (no per-tile
    # row max), NVFP4 per 16 keys; with its Q smoothing: the closest preset to the released kernel
    fixed_p = Quant("block", "fixed", fmt="nvfp4")
    out["sage3-fp4-fixedp"] = sage3.replace(name="sage3-fp4-fixedp", p_quant=fixed_p)
    out["sage3-fp4-released"] = out["sage3-fp4-qsmooth"].replace(name="sage3-fp4-released", p_quant=fixed_p)
    for name in list(out):
        out[f"{name}-fp64"] = out[name].arith_fp64().replace(name=f"{name}-fp64")
    out["quant-fp64"] = out["int8-reference"].exact().replace(name="quant-fp64")
    return out
