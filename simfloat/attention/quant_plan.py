"""Quantized attention plans: :class:`QuantPlan` (every op of the INT8 / FP8 / FP4 flash kernels, the four
quantizers each a :class:`Quant`), its presets (:func:`quant_presets`, :func:`quant_plan`) and its flattening for
njit code. The kernels that run a plan are :mod:`simfloat.attention.quantized`'s; the algorithm is documented
there."""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import numpy as np

from simfloat.accumulate import BlockFMA, Chunked, Model, Sequential, acc_params, tensor_core
from simfloat.attention import _quant_kernels as _qk
from simfloat.attention._kernels import mul, rnd
from simfloat.attention._quant_kernels import QUANT_OPS
from simfloat.attention.plan import OpParams, OpSpec, _checked_format, _dot_spec, _scalar_spec
from simfloat.blockscale import _SCALE_RULES, BlockFormat, _scale_rounding, block_format
from simfloat.formats import FloatFormat
from simfloat.formats import format as _format
from simfloat.rounding import RoundingMode, mode_code

__all__ = ["EXACT", "QUANTIZERS", "QUANT_OPS", "Quant", "QuantPlan", "quant_plan", "quant_presets"]

#: The quantizer ops.
QUANTIZERS = ("q_quant", "k_quant", "v_quant", "p_quant")
_DOTS = ("qk", "pv")
#: Ops that a plan may leave out (None): smoothing is a transform of the dataflow, not a rounding of it.
_OPTIONAL = ("k_smooth", "q_smooth", "q_delta")
_SCALARS = tuple(op for op in QUANT_OPS if op not in QUANTIZERS and op not in _DOTS and op not in _OPTIONAL)
_FLAGS = ("exp2", "contract", "row_sum", "score_scaling", "pv_update")
#: Exact accumulation: a float64 loop, exact for the integer codes (INT8 x INT8 -> INT32 tensor cores).
EXACT = Sequential("float64", product_fmt="float64")
_LOG2E = math.log2(math.e)  # rn32 of it equals rn32(1.44269504), the kernels' constant (H1)

_KINDS = ("none", "int", "float", "block")
#: granularities of a block-scaled quantizer: the level above its block scales
_BLOCK_GRANULARITIES = ("unscaled", "per-tensor", "per-token", "fixed")
_GRANULARITIES = ("per-token", "per-tensor", "per-block", "per-warp", "per-channel", "fixed", "unscaled")
_INT_RULES = ("nearest_even", "nearest_away", "toward_zero", "half_up", "half_up_unfused")
_ROW_SUMS = ("reference", "consistent")
_SCORE_SCALINGS = ("scores", "folded")
_PV_UPDATES = ("separate", "into_acc", "scaled", "two_level")


def _choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, one of {choices}, got {type(value).__name__}")
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


@dataclass(frozen=True)
class Quant:
    """A quantizer: how a tensor (Q, K, V) or P becomes codes and scales.

    Attributes:
        kind: ``"none"`` (the value itself, scale 1), ``"int"`` (symmetric integer codes in [-qmax, qmax]),
            ``"float"`` (codes of ``fmt``) or ``"block"`` (block-scaled codes: ``fmt`` is a
            :class:`~simfloat.BlockFormat` or its preset name, e.g. ``"nvfp4"``; the blocks run along the k
            dimension of the MMA the operand feeds: the head dimension for Q and K, the keys for V and P).
            A block quantizer's granularity is the level above its block scales: ``"unscaled"`` (block scales
            only), ``"per-tensor"`` (Q, K, V: NVFP4's fp32 tensor scale ``fp32(amax / (scale max * element
            max))`` per lead index, :func:`simfloat.quantize_block`'s ``global_scale="auto"``) or
            ``"per-token"`` (P only: SageAttention3's first level, ``s1 = arith(rowmax / qmax)`` per row of a
            key tile, ``t = arith(p / s1)``, then the blocks of ``t``; qmax defaults to scale max * element max,
            448 * 6 for NVFP4) or ``"fixed"`` (P only: the released SageAttention3 kernel's fixed first level,
            ``s1 = 1 / qmax`` folded into the softmax's shift: ``t = exp(exp2(fma(s, s_scale, -scale(m -
            scale(log2 qmax)))))`` (``ln`` without exp2), about ``qmax * p``, ``qmax`` where the row's running
            max is; the row sum and the accumulator carry the factor, which cancels in ``acc / l``; the
            standalone :func:`quantize` takes ``t = arith(p * qmax)``). Elements and scales follow the
            BlockFormat's rules (rounded once from the exact quotients, saturating); ``rounding`` is not used.
        granularity: one scale per ``"per-token"`` row, ``"per-tensor"`` (seq x head_dim of one lead index),
            ``"per-block"`` (the kernel's tile: block_m rows of Q, block_n keys of K/V), ``"per-warp"``
            (``group`` consecutive tokens from the start of the sequence: the rows one warp of a q tile
            holds), ``"per-channel"`` (one head_dim column over the sequence; V only), ``"fixed"`` (P only:
            scale 1/qmax, no amax; int codes, or float codes ``fmt(arith(t * qmax))``) or ``"unscaled"``
            (a plain cast into ``fmt``: scale 1).
        rounding: int: ``"nearest_even"`` (torch.round), ``"nearest_away"``, ``"toward_zero"`` or, for
            ``"fixed"`` only, ``"half_up"`` (``trunc(arith(x*qmax + 0.5))``, one rounding: the kernel's fp16
            fma), or ``"half_up_unfused"`` (``trunc(arith(arith(x*qmax) + 0.5))``, the reference code as
            written, if the compiler does not contract it); float: the rounding mode of the cast into ``fmt``.
        fmt: float kind: the code format (e.g. ``"float8_e4m3fn"``, ``"float16"``); block kind: the
            :class:`~simfloat.BlockFormat` (or its preset name).
        qmax: largest code (int: default 127; float: default ``fmt.max``; the clamp before the cast); block kind:
            the target of P's first level, per-token or fixed (default scale max * element max), None otherwise.
        arith: format and rounding of the quantizer's own arithmetic: ``amax/qmax``, ``x/scale``
            (fixed: ``x*qmax (+0.5)``).
        pre: a cast applied first (Q/K/V: fp32, the kernels' Q1; P: fp16, INT8 T12), or None.
        group: tokens per scale of granularity ``"per-warp"`` (required there, None otherwise).
    """

    kind: str = "none"
    granularity: str = "unscaled"
    rounding: str | RoundingMode = "nearest_even"
    fmt: FloatFormat | BlockFormat | str | None = None
    qmax: float | None = None
    arith: OpSpec | str = "float32"
    pre: OpSpec | str | None = None
    group: int | None = None

    def __post_init__(self) -> None:
        kind = _choice("Quant.kind", self.kind, _KINDS)
        gran = _choice("Quant.granularity", self.granularity, _GRANULARITIES)
        if kind == "block":
            self._init_block(gran)
            return
        if gran == "per-warp" and kind != "none":
            g = self.group
            if isinstance(g, bool) or not isinstance(g, (int, np.integer)) or g < 1:
                raise ValueError(f"Quant.group must be a positive int for granularity 'per-warp', got {g!r}")
            object.__setattr__(self, "group", int(g))
        elif self.group is not None:
            raise ValueError(f"Quant.group is for granularity 'per-warp' only, got granularity {gran!r}")
        object.__setattr__(self, "arith", _scalar_spec("Quant.arith", self.arith))
        if self.pre is not None:
            object.__setattr__(self, "pre", _scalar_spec("Quant.pre", self.pre))
        if kind == "none":
            object.__setattr__(self, "fmt", None)
            object.__setattr__(self, "qmax", None)
            return
        if kind == "int":
            rule = _choice("Quant.rounding (int)", self.rounding, _INT_RULES)
            if gran == "unscaled":
                raise ValueError("an int Quant needs a scale: granularity 'unscaled' is for float casts")
            if rule.startswith("half_up") != (gran == "fixed"):
                raise ValueError(
                    "int rounding 'half_up'/'half_up_unfused' goes with granularity 'fixed' (P) and only there"
                )
            if self.fmt is not None:
                raise ValueError("Quant.fmt is for float quantizers; an int quantizer has qmax")
            qmax = 127.0 if self.qmax is None else self.qmax
        else:
            if self.fmt is None:
                raise ValueError("a float Quant needs fmt (e.g. 'float8_e4m3fn')")
            f = _checked_format(self.fmt, "Quant.fmt")
            object.__setattr__(self, "fmt", f)
            m = mode_code(self.rounding)
            if m == RoundingMode.STOCHASTIC:
                raise ValueError("stochastic rounding is not supported in attention plans")
            object.__setattr__(self, "rounding", m)
            qmax = f.max if self.qmax is None else self.qmax
        if isinstance(qmax, bool) or not isinstance(qmax, (int, float)) or not (math.isfinite(qmax) and qmax > 0):
            raise ValueError(f"Quant.qmax must be a finite number > 0, got {qmax!r}")
        if kind == "int" and (qmax != int(qmax) or qmax > 2**20):
            raise ValueError(f"int Quant.qmax must be an integer <= 2**20, got {qmax!r}")
        object.__setattr__(self, "qmax", float(qmax))

    def _init_block(self, gran: str) -> None:
        if gran not in _BLOCK_GRANULARITIES:
            raise ValueError(f"a block Quant takes granularity {_BLOCK_GRANULARITIES}, got {gran!r}")
        if self.group is not None:
            raise ValueError("Quant.group is for granularity 'per-warp' only; a block Quant's block is its fmt's")
        f = self.fmt
        if isinstance(f, str):
            f = block_format(f)
        if not isinstance(f, BlockFormat):
            raise TypeError(f"a block Quant needs fmt, a BlockFormat or its preset name (e.g. 'nvfp4'), got {f!r}")
        if not isinstance(f.block, (int, np.integer)) and len(f.block) != 1:
            raise ValueError(f"a block Quant needs 1-D blocks (along the MMA's k), got block {f.block!r}")
        object.__setattr__(self, "fmt", f)
        object.__setattr__(self, "arith", _scalar_spec("Quant.arith", self.arith))
        if self.pre is not None:
            object.__setattr__(self, "pre", _scalar_spec("Quant.pre", self.pre))
        qmax = self.qmax
        if gran in ("per-token", "fixed"):
            qmax = _format(f.scale_fmt).max * _format(f.elem_fmt).max if qmax is None else qmax
            if isinstance(qmax, bool) or not isinstance(qmax, (int, float)) or not (math.isfinite(qmax) and qmax > 0):
                raise ValueError(f"Quant.qmax must be a finite number > 0, got {qmax!r}")
            qmax = float(qmax)
        elif qmax is not None:
            raise ValueError(
                "Quant.qmax of a block Quant is the target of P's first level (granularity 'per-token' or 'fixed')"
            )
        object.__setattr__(self, "qmax", qmax)

    @property
    def block_size(self) -> int:
        """Elements per block scale of a block Quant (0 otherwise)."""
        if self.kind != "block":
            return 0
        assert isinstance(self.fmt, BlockFormat)
        b = self.fmt.block
        return int(b if isinstance(b, (int, np.integer)) else b[0])

    @property
    def quantizes(self) -> bool:
        """Whether this quantizer changes anything (kind != 'none')."""
        return self.kind != "none"

    def __str__(self) -> str:
        if self.kind == "none":
            return "none"
        assert isinstance(self.arith, OpSpec)
        pre = f"{self.pre}->" if self.pre is not None else ""
        if self.kind == "block":
            assert isinstance(self.fmt, BlockFormat)
            name = self.fmt.name or f"{_format(self.fmt.elem_fmt).name}x{self.block_size}"
            if self.granularity in ("per-token", "fixed"):
                return f"{pre}{name}/{self.granularity}[{self.qmax:g}]/{self.arith}"
            return f"{pre}{name}/{self.granularity}"
        if self.kind == "int":
            gran = f"per-warp[{self.group}]" if self.granularity == "per-warp" else self.granularity
            return f"{pre}int[{self.qmax:g}]/{gran}/{self.rounding}/{self.arith}"
        assert isinstance(self.fmt, FloatFormat) and isinstance(self.rounding, RoundingMode)
        rn = "" if self.rounding == RoundingMode.NEAREST_EVEN else f"/{self.rounding.name.lower()}"
        if self.granularity == "unscaled":
            return f"{pre}{self.fmt.name}{rn}"
        gran = f"per-warp[{self.group}]" if self.granularity == "per-warp" else self.granularity
        if gran == "fixed":
            gran = f"fixed[{self.qmax:g}]"
        return f"{pre}{self.fmt.name}{rn}/{gran}/{self.arith}"


def _quant_spec(name: str, value: object) -> Quant:
    if isinstance(value, Quant):
        return value
    if value is None or value == "none":
        return Quant()
    raise TypeError(f"op {name!r} takes a Quant (or None / 'none'), got {type(value).__name__}")


_F64 = OpSpec("float64")
#: q_delta's default: a chain of fp32 fused multiply-adds
_Q_DELTA = Sequential("float32")


@dataclass(frozen=True)
class QuantPlan:
    """Format, rounding or quantizer of every operation of the quantized flash kernels (see module docs).

    Construct presets with :func:`quant_plan`, variants with :meth:`replace`.

    Attributes:
        name: label (shown in traces).
        q_quant, k_quant, v_quant, p_quant: the quantizers (:class:`Quant`).
        qk, pv: accumulation models of the two dot products (on the codes).
        rotate: incoherent processing: the rotated Q and K (computed in float64) rounded into this op.
        k_smooth: SageAttention's smoothing of K by its mean key, or None (no smoothing): per lead index and
            channel, ``mu = k_smooth(mean(k))`` (the float64 mean over the sequence: numpy's sum / seq_k),
            then ``k = k_smooth(k - mu)`` (the exact difference rounded once; after ``rotate``, before
            ``k_quant``). Every score
            of a query row shifts by the same ``q . mu``, which softmax removes.
        q_smooth: SageAttention2/3's smoothing of Q by the mean query of each q tile, or None (no smoothing;
            then q_delta is None too): per lead index, q tile (block_m rows) and channel,
            ``mu_q = q_smooth(mean(q))`` (float64 mean over the tile's rows), ``q = q_smooth(q - mu_q)``
            (after ``rotate`` and ``k_smooth``, before ``q_quant``). Unlike K's, Q's shift is not removed by
            softmax: ``q_delta`` adds it back.
        q_delta: the accumulation model of the correction ``delta_s = mu_q . k`` (per q tile and key, on the
            unquantized keys after ``k_smooth``), or None; a plan with ``q_smooth`` and no ``q_delta`` gets
            ``Sequential("float32")`` (a chain of fp32 fused multiply-adds). Where Q's and K's codes carry their whole
            scale into the qk MMA (unscaled casts, block quantizers without a level above, or no quantizer),
            ``delta_s`` is the MMA's initial accumulator, as SageAttention3 loads it: ``s = qk(delta_s +
            q_code . k_code)``; otherwise (``score_scaling="scores"``) it is added to the dequantized score,
            ``s = dequant(s + delta_s)``.
        dequant: ``score_scaling="scores"``: the two multiplications of the integer score by the scales.
        scale: the softmax scale (H1), ``max * s_scale``, ``fma(s, s_scale, -m)``; folded: the scale products.
        exp, m_i, alpha, l_i, acc, normalize, out: as in :class:`~simfloat.attention.Plan`.
        pv_dequant: ``pv * v_scale`` and ``/ qmax`` of P (separate), the epilogue ``acc * v_scale``
            (into_acc), the fused ``fma(pv, v_scale, acc)`` (scaled).
        exp2, contract: as in :class:`~simfloat.attention.Plan`.
        row_sum: ``"reference"`` (l from the fp32 P, INT-FlashAttention's code) or ``"consistent"`` (from the
            quantized P that multiplies V).
        score_scaling: ``"scores"`` (INT8 kernel) or ``"folded"`` (FP8 kernel).
        pv_update: ``"separate"`` (INT8), ``"into_acc"`` (FP8 per-tensor, half-INT8, FP16 flash),
            ``"scaled"`` (FP8 per-block) or ``"two_level"`` (SageAttention2: each key tile's P.V from zero,
            ``acc = acc(fma(acc, alpha, pv(c . v)))``, V's scale and P's fixed scale once in the epilogue; a
            block P's per-row first level multiplies each tile's P.V first: ``pv_dequant(pv * s1)``).
    """

    name: str
    q_quant: Quant
    k_quant: Quant
    v_quant: Quant
    p_quant: Quant
    qk: Model
    pv: Model
    rotate: OpSpec = OpSpec("float32")
    k_smooth: OpSpec | None = None
    q_smooth: OpSpec | None = None
    q_delta: Model | None = None
    dequant: OpSpec = OpSpec("float32")
    scale: OpSpec = OpSpec("float32")
    exp: OpSpec = OpSpec("float32")
    m_i: OpSpec = OpSpec("float32")
    alpha: OpSpec = OpSpec("float32")
    l_i: OpSpec = OpSpec("float32")
    acc: OpSpec = OpSpec("float32")
    pv_dequant: OpSpec = OpSpec("float32")
    normalize: OpSpec = OpSpec("float32")
    out: OpSpec = OpSpec("float16")
    exp2: bool = True
    contract: bool = True
    row_sum: str = "reference"
    score_scaling: str = "scores"
    pv_update: str = "separate"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(f"QuantPlan.name must be a string, got {type(self.name).__name__}")
        for op in QUANTIZERS:
            object.__setattr__(self, op, _quant_spec(op, getattr(self, op)))
        for op in _DOTS:
            object.__setattr__(self, op, _dot_spec(op, getattr(self, op)))
        for op in _SCALARS:
            object.__setattr__(self, op, _scalar_spec(op, getattr(self, op)))
        for op in ("k_smooth", "q_smooth"):
            if getattr(self, op) is not None:
                object.__setattr__(self, op, _scalar_spec(op, getattr(self, op)))
        for flag in ("exp2", "contract"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"QuantPlan.{flag} must be a bool, got {type(getattr(self, flag)).__name__}")
        _choice("QuantPlan.row_sum", self.row_sum, _ROW_SUMS)
        folded = _choice("QuantPlan.score_scaling", self.score_scaling, _SCORE_SCALINGS) == "folded"
        pvu = _choice("QuantPlan.pv_update", self.pv_update, _PV_UPDATES)
        self._check_q_smooth()
        q, k, v, p = self.q_quant, self.k_quant, self.v_quant, self.p_quant
        self._check_block(pvu)
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
            if self.row_sum == "consistent":
                raise ValueError("row_sum 'consistent' takes an int or unscaled p_quant, not a fixed-scale float one")

    def _check_q_smooth(self) -> None:
        """q_smooth and its correction q_delta go together; the correction needs a place in the scores."""
        if self.q_smooth is None:
            if self.q_delta is not None:
                raise ValueError("q_delta is the correction of q_smooth: set q_smooth too, or neither")
            return
        if self.q_delta is None:
            object.__setattr__(self, "q_delta", _Q_DELTA)
        object.__setattr__(self, "q_delta", _dot_spec("q_delta", self.q_delta))
        if isinstance(self.q_delta, BlockFMA) and self.q_delta.scale_block:
            raise ValueError("q_delta is a dot of unquantized values: it takes no block-scaled MMA model")
        if self._delta_mode() == _qk.DELTA_NONE:
            raise ValueError(
                "q_smooth with score_scaling 'folded' needs Q and K without scales outside the qk MMA (unscaled "
                "or none): the correction mean_q . k is in score units; use score_scaling 'scores'"
            )

    def _delta_mode(self) -> int:
        """Where q_smooth's correction enters the scores (``_quant_kernels.DELTA_*``)."""
        if self.q_smooth is None:
            return _qk.DELTA_NONE

        def whole(qu: Quant) -> bool:  # the codes carry their whole scale into the MMA
            return qu.kind == "none" or qu.granularity == "unscaled"

        if whole(self.q_quant) and whole(self.k_quant):
            return _qk.DELTA_MMA
        return _qk.DELTA_SCORES if self.score_scaling == "scores" else _qk.DELTA_NONE

    def _check_block(self, pvu: str) -> None:
        """Block-scaled quantizers and MMAs: where they may go, and that an MMA gets the operands it takes."""
        q, k, v, p = self.q_quant, self.k_quant, self.v_quant, self.p_quant
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
            if self.row_sum != "reference":
                raise ValueError("a block p_quant takes row_sum 'reference' (l from the unquantized P)")
        for dot, (na, a), (nb, b) in (("qk", ("q_quant", q), ("k_quant", k)), ("pv", ("p_quant", p), ("v_quant", v))):
            model = getattr(self, dot)
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

    def _feeds_block_mma(self, op: str) -> str | None:
        """The block-scaled dot a quantizer feeds, or None."""
        dot = {"q_quant": "qk", "k_quant": "qk", "p_quant": "pv", "v_quant": "pv"}.get(op)
        if dot is None:
            return None
        model = getattr(self, dot)
        return dot if isinstance(model, BlockFMA) and model.scale_block else None

    def replace(self, **changes: object) -> QuantPlan:
        """A copy with some ops or flags changed (the name gets a ``*`` unless given).

        Raises:
            ValueError: unknown op or flag (the message lists the valid ones), or an invalid combination.
            TypeError: a value of the wrong type.
        """
        unknown = sorted(set(changes) - set(QUANT_OPS) - set(_FLAGS) - {"name"})
        if unknown:
            raise ValueError(f"unknown plan entries {unknown}; ops: {', '.join(QUANT_OPS)}; flags: {', '.join(_FLAGS)}")
        if "name" not in changes:
            changes["name"] = self.name if self.name.endswith("*") else self.name + "*"
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]  # checked in __post_init__

    def exact(self) -> QuantPlan:
        """The same dataflow with nothing quantized and every op exact (float64; dots ``EXACT``)."""
        changes: dict[str, object] = {op: Quant() for op in QUANTIZERS}
        changes.update({op: EXACT for op in _DOTS})
        changes.update({op: _F64 for op in _SCALARS})
        changes.update({op: None if getattr(self, op) is None else _F64 for op in ("k_smooth", "q_smooth")})
        changes["q_delta"] = None if self.q_delta is None else EXACT
        return self.replace(name=f"{self.name}:exact", **changes)

    def isolate(self, op: str) -> QuantPlan:
        """Only ``op`` as in this plan, everything else exact: the error ``op`` causes on its own."""
        if op not in QUANT_OPS:
            raise ValueError(f"unknown op {op!r}; ops: {', '.join(QUANT_OPS)}")
        model = getattr(self, op)
        if op in _DOTS and isinstance(model, BlockFMA) and model.scale_block:
            raise ValueError(
                f"{op} is a block-scaled MMA: it takes block-quantized operands and cannot run without its "
                f"quantizers; compare the plan with plan.ablate({op!r}) instead"
            )
        return self.exact().replace(name=f"{self.name}:only-{op}", **{op: model})

    def ablate(self, op: str) -> QuantPlan:
        """This plan with ``op`` made exact (a quantizer removed): the error left without it. A quantizer that
        feeds a block-scaled MMA (FP4) takes the MMA with it (the MMA is made ``EXACT``): the MMA has no form
        for unquantized operands."""
        if op not in QUANT_OPS:
            raise ValueError(f"unknown op {op!r}; ops: {', '.join(QUANT_OPS)}")
        value: object = Quant() if op in QUANTIZERS else (EXACT if op in (*_DOTS, "q_delta") else _F64)
        if op in _OPTIONAL and getattr(self, op) is None:
            value = None  # an op the plan does not have stays out
        changes: dict[str, object] = {op: value}
        dot = self._feeds_block_mma(op)
        if dot is not None:
            changes[dot] = EXACT
        return self.replace(name=f"{self.name}:no-{op}", **changes)

    def arith_fp64(self) -> QuantPlan:
        """The quantizers of this plan with all arithmetic exact: quantization error alone."""
        exact = self.exact()
        return exact.replace(name=f"{self.name}:fp64", **{op: getattr(self, op) for op in QUANTIZERS})

    def __str__(self) -> str:
        ops = ", ".join(f"{op}={getattr(self, op)}" for op in QUANT_OPS)
        return (
            f"QuantPlan({self.name}: {ops}; exp2={self.exp2}, contract={self.contract}, "
            f"row_sum={self.row_sum}, score_scaling={self.score_scaling}, pv_update={self.pv_update})"
        )

    def _dot_kind(self, model: Model, a: Quant, b: Quant) -> int:
        if isinstance(model, Chunked):
            return _qk.DOT_GENERIC
        if isinstance(model, BlockFMA) and model.scale_block:
            return _qk.DOT_SCALED
        if model == EXACT:
            return _qk.DOT_INT if a.kind == "int" and b.kind == "int" else _qk.DOT_F64
        if isinstance(model, BlockFMA) and model.input_fmt is None:
            return _qk.DOT_BLOCK
        return _qk.DOT_GENERIC

    def params(self, scale: float) -> _qk.QParams:
        """The plan for njit kernels with the host's qk_scale (H1): ``scale(scale(sm_scale) *
        scale(log2 e))`` with exp2, else ``scale(sm_scale)``.

        Raises:
            ValueError: the rounded scale is not finite and > 0.
        """

        def op(name: str) -> OpParams:
            s: OpSpec = getattr(self, name)
            return OpParams(s.fmt.params, int(s.mode))

        sc = op("scale")
        sm = rnd(float(scale), sc)
        qk_scale = mul(sm, rnd(_LOG2E, sc), sc) if self.exp2 else sm
        if not (math.isfinite(qk_scale) and qk_scale > 0 and math.isfinite(sm) and sm > 0):
            raise ValueError(f"scale {scale} becomes {qk_scale} in {self.scale.fmt.name}: it must stay finite and > 0")
        p = self.p_quant
        pre = p.pre if p.pre is not None else _F64
        assert isinstance(pre, OpSpec) and isinstance(p.arith, OpSpec)  # made OpSpecs by Quant.__post_init__
        code = OpSpec(p.fmt, p.rounding) if p.kind == "float" else _F64  # type: ignore[arg-type]  # fmt set for floats
        p_kind = {"none": _qk.K_NONE, "int": _qk.K_INT, "float": _qk.K_FLOAT, "block": _qk.K_BLOCK}[p.kind]
        blk = _block_params(p)
        if p.kind == "float" and p.granularity == "fixed":
            p_kind = _qk.K_FFLOAT
        rule = _INT_RULES.index(p.rounding) if p.kind == "int" else 0
        return _qk.QParams(
            acc_params(self.qk),
            acc_params(self.pv),
            self._dot_kind(self.qk, self.q_quant, self.k_quant),
            self._dot_kind(self.pv, p, self.v_quant),
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
            self.exp2,
            self.contract,
            self.row_sum == "consistent",
            self.score_scaling == "folded",
            _PV_UPDATES.index(self.pv_update),
            qk_scale,
            float(scale) * (_LOG2E if self.exp2 else 1.0),
            *blk,
            self._delta_mode(),
            self._p_shift(sc),
        )

    def _p_shift(self, sc: OpParams) -> float:
        """``scale(log2(qmax))`` (``scale(ln(qmax))`` without exp2) of a block P quantizer with a fixed first level,
        else 0."""
        p = self.p_quant
        if p.kind != "block" or p.granularity != "fixed":
            return 0.0
        assert p.qmax is not None
        return rnd(math.log2(p.qmax) if self.exp2 else math.log(p.qmax), sc)


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
    by_emax, smode = _SCALE_RULES[_scale_rounding(bf.scale_rounding)]
    target = math.ldexp(1.0, _format(bf.elem_fmt).emax) if by_emax else _format(bf.elem_fmt).max
    return (
        p.granularity == "per-token",
        p.block_size,
        OpParams(sf.params, int(smode)),
        OpParams(ef.params, int(mode_code(bf.elem_mode))),
        float(target),
        0.0 if sf.zero else float(sf.tiny),
    )


# ---------------------------------------------------------------------------------------------------------
# presets
# ---------------------------------------------------------------------------------------------------------

_FP8 = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}


@functools.cache
def _build() -> dict[str, QuantPlan]:
    fp32 = OpSpec("float32")
    tok = Quant("int", "per-token", pre=fp32)
    p_int8 = Quant("int", "fixed", "half_up", arith="float16", pre="float16")
    int8 = QuantPlan("int8-reference", tok, tok, Quant("int", "per-tensor", pre=fp32), p_int8, EXACT, EXACT)
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
    for short, f in _FP8.items():
        cast = Quant("float", "unscaled", fmt=f)
        tens = Quant("float", "per-tensor", fmt=f, pre=fp32)
        base = QuantPlan(
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
        out[f"{short}-flash"] = QuantPlan(
            f"{short}-flash",
            cast,
            cast,
            cast,
            cast,
            tensor_core("sm90", f),
            tensor_core("sm90", f),
            out=f,  # type: ignore[arg-type]  # a name: an OpSpec after __post_init__
            score_scaling="folded",
            pv_update="into_acc",
        )
    # SageAttention2 (INT8 QK^T, FP8 P.V): K smoothed by its mean key (fp32), Q INT8 per warp of 32 rows, K INT8
    # per key tile, exact integer QK^T; V e4m3 per channel; P in [0, 1] scaled by 448 (e4m3's max) and cast to
    # e4m3; P.V on the sm90 fp8 tensor-core model, fresh per key tile, added to the fp32 accumulator
    e4m3 = "float8_e4m3fn"
    sage = QuantPlan(
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
    # SageAttention3 (FP4 QK^T and P.V): K smoothed as above; Q, K NVFP4 along the head dimension and V NVFP4
    # along the keys (e2m1 elements, ue4m3 scales per 16, no tensor scale: the released kernels hand the MMA
    # e4m3 block scales only); P two-level: per row of a key tile scaled onto [0, 448 * 6] (fp32), then NVFP4
    # per 16 keys; both products on the Blackwell nvf4 MMA model (sm120, RTX 5090; sm100's is the same model),
    # each key tile's P.V from zero, times P's row scale, added to the fp32 accumulator
    nv_blk = Quant("block", "unscaled", fmt="nvfp4", pre=fp32)
    fp4_dot = tensor_core("sm120", "e2m1", kind="nvf4")
    sage3 = QuantPlan(
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
    out["fp64"] = out["int8-reference"].exact().replace(name="fp64")
    return out


def quant_presets() -> dict[str, QuantPlan]:
    """All preset quantized plans by name (see :func:`quant_plan`)."""
    return dict(_build())


def quant_plan(name: str | QuantPlan) -> QuantPlan:
    """A preset :class:`QuantPlan` (a QuantPlan is returned unchanged).

    Presets (all with fp32 arithmetic, exp2 with log2(e) folded into an fp32 scale, FMAs as the kernels,
    fp16 output):
        ``int8-reference``: simfloat_gpu/kernels/int8_attention.py "int8": Q, K per-token INT8, V per-tensor INT8 (scale
            max/127, round half to even), exact integer dots, P = trunc(fp16(fp16(p)*127 + 0.5)), row sum
            from the fp32 P. ``int8-consistent``: row sum from the quantized P.
            ``int8-reference-unfused``: P's ``p16*127 + 0.5`` rounded twice (the reference code as
            written). ``int8-reference-vblock`` / ``-vchannel``: V scales per key tile / per head_dim
            channel (the CUDA port's options).
        ``half-int8`` (``-consistent``): Q, K INT8; V and P fp16, P.V on the sm90 fp16 tensor-core model into
            the accumulator.
        ``fp8-e4m3``, ``fp8-e5m2``: simfloat_gpu/kernels/fp8_attention.py per-tensor (one scale per tensor,
        amax/FP8_MAX,
            scales folded into the softmax scale, P cast to fp8, V's scale in the epilogue);
            ``fp8-<fmt>-block``: FA3-style per-block scales (Q per block_m tile, K and V per block_n tile);
            ``fp8-<fmt>-unscaled``: Q, K, V cast straight to fp8 (the INT-FlashAttention code's FP8
            baseline). fp8 dots use the sm90 fp8 tensor-core model (blocks of 32, 13 fraction bits, e8m13
            results), as simfloat_gpu.interpreter.
        ``fp16-flash``, ``bf16-flash``: no scaling, Q/K/V/P cast to fp16/bf16, sm90 tensor-core dots: the
            ``triton-fp16``/``triton-bf16`` flash plans, bit for bit.
        ``sage2-int8-fp8``: SageAttention2's INT8 QK^T / FP8 P.V: K smoothed by its mean key (``k_smooth``
            fp32), Q INT8 per warp (32 consecutive rows), K INT8 per key tile (block_n), exact integer dots,
            V e4m3 per channel, P cast to e4m3 with the fixed scale 1/448, P.V on the sm90 fp8 tensor-core
            model fresh per key tile and added in fp32 (``pv_update="two_level"``; V's and P's scales in the
            epilogue). ``sage2-int8-fp8-single``: P.V into the running accumulator (single-level, e8m13
            across the whole sequence). ``sage2-int8-fp8-qblock``: Q per block_m tile (SageAttention1's
            granularity). ``sage2-int8-fp8-qsmooth``: with SageAttention2's Q smoothing (``q_smooth`` fp32
            per q tile, ``delta_s`` an fp32 FMA chain added to the dequantized scores in fp32).
        ``sage3-fp4``: SageAttention3's FP4 attention: K smoothed as sage2, Q and K NVFP4 along the head
            dimension and V NVFP4 along the keys (e2m1 elements, ue4m3 scales per 16, rounded once from the
            exact quotients as :func:`simfloat.quantize_block`; no fp32 tensor scale, as the released kernels),
            P two-level: per row of each key tile ``s1 = fp32(rowmax(P) / (448 * 6))``, ``t = fp32(P / s1)``,
            then NVFP4 of t per 16 keys; QK^T and P.V on the Blackwell ``nvf4`` MMA model
            (``tensor_core("sm120", "e2m1", kind="nvf4")``, fp32 output), each key tile's P.V from zero, times
            ``s1`` in fp32 (``pv_dequant``), added with ``fma(acc, alpha, .)`` (``pv_update="two_level"``).
            ``sage3-fp4-tensorscale``: Q, K, V with NVFP4's per-tensor fp32 scale (applied after the MMA:
            ``dequant`` for Q/K, the epilogue for V). ``sage3-fp4-onelevel``: P in NVFP4 without the per-row
            first level. ``sage3-fp4-qsmooth``: with Q smoothing (``q_smooth`` fp32 per q tile, ``delta_s`` an
            fp32 FMA chain, the qk MMA's initial accumulator). ``sage3-fp4-fixedp``: P's first level fixed
            (``Quant("block", "fixed", fmt="nvfp4")``: 448 * 6 folded into the softmax's shift relative to the
            running max, as the released kernel). ``sage3-fp4-released``: both (the released kernel's
            dataflow).
        ``<any>-fp64``: the same quantizers with every other op exact (float64); ``fp64``: nothing quantized,
            everything float64.

    Raises:
        ValueError: unknown name (the message lists the presets). TypeError: neither str nor QuantPlan.
    """
    if isinstance(name, QuantPlan):
        return name
    if not isinstance(name, str):
        raise TypeError(f"plan must be a QuantPlan or a preset name, got {type(name).__name__}")
    table = quant_presets()
    if name not in table:
        raise ValueError(f"unknown quantized plan {name!r}; presets: {', '.join(table)}")
    return table[name]


# ---------------------------------------------------------------------------------------------------------
# quantization
# ---------------------------------------------------------------------------------------------------------
