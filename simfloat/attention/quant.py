"""Quantizers, the optional ops of a precision plan (:class:`~simfloat.attention.Plan`) that turn Q, K, V or P into
codes and scales: :class:`Quant` (kind, granularity, code rounding rule, the format of its own scale arithmetic)
and the choices a plan's quantized dataflow offers. What a plan with quantizers computes is documented in
:mod:`simfloat.attention.quantized`."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simfloat.accumulate import Sequential
from simfloat.attention._specs import OpSpec, _checked_format, _scalar_spec
from simfloat.blockscale import BlockFormat, block_format
from simfloat.formats import FloatFormat
from simfloat.formats import format as _format
from simfloat.rounding import RoundingMode, mode_code

__all__ = ["EXACT", "QUANTIZERS", "Quant"]

#: The quantizer ops.
QUANTIZERS = ("q_quant", "k_quant", "v_quant", "p_quant")
#: Exact accumulation: a float64 loop, exact for the integer codes (INT8 x INT8 -> INT32 tensor cores).
EXACT = Sequential("float64", product_fmt="float64")

_KINDS = ("none", "int", "float", "block")
#: granularities of a block-scaled quantizer: the level above its block scales
_BLOCK_GRANULARITIES = ("unscaled", "per-tensor", "per-token", "fixed")
_GRANULARITIES = ("per-token", "per-tensor", "per-block", "per-warp", "per-channel", "fixed", "unscaled")
INT_RULES = ("nearest_even", "nearest_away", "toward_zero", "half_up", "half_up_unfused")
#: the quantized dataflow's choices (:class:`~simfloat.attention.Plan` fields ``row_sum``, ``score_scaling``,
#: ``pv_update``)
ROW_SUMS = ("reference", "consistent")
SCORE_SCALINGS = ("scores", "folded")
PV_UPDATES = ("separate", "into_acc", "scaled", "two_level")


def checked_choice(name: str, value: object, choices: tuple[str, ...]) -> str:
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
        kind = checked_choice("Quant.kind", self.kind, _KINDS)
        gran = checked_choice("Quant.granularity", self.granularity, _GRANULARITIES)
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
            rule = checked_choice("Quant.rounding (int)", self.rounding, INT_RULES)
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


def quant_spec(name: str, value: object) -> Quant:
    if isinstance(value, Quant):
        return value
    if value is None or value == "none":
        return Quant()
    raise TypeError(f"op {name!r} takes a Quant (or None / 'none'), got {type(value).__name__}")
