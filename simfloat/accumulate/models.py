"""Accumulation models (what each rounding of a dot product does) and the tensor-core presets.

The model classes are data: :class:`Sequential`, :class:`BlockFMA`, :class:`Chunked`, :class:`Interleaved`;
:func:`tensor_core` builds the presets from the architecture table; :func:`acc_params` flattens a model into the
:class:`AccParams` record the njit kernels read (:mod:`simfloat.accumulate.scalar`,
:mod:`simfloat.accumulate._rows`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from simfloat.formats import FloatFormat, FormatParams
from simfloat.formats import format as _format
from simfloat.rounding import RoundingMode, mode_code

__all__ = [
    "AccParams",
    "BlockFMA",
    "Chunked",
    "Interleaved",
    "Model",
    "Sequential",
    "VARIANTS",
    "acc_params",
    "fp8_mma_sync",
    "split_k",
    "tensor_core",
]

_ZERO = np.uint64(0)
_NONE = -100000  # "no clamp" for the alignment exponents of AccParams

# -- model descriptions ---------------------------------------------------------------------------------------


def _check_fields(model: object, formats: tuple[str, ...], modes: tuple[str, ...]) -> None:
    """Resolve every format and rounding-mode field of a model now, so a bad one fails where it is written."""
    cls = type(model).__name__
    for name in formats:
        value = getattr(model, name)
        if value is None:
            continue
        try:
            _format(value)
        except (TypeError, ValueError) as err:
            raise type(err)(f"{cls}.{name}: {err}") from None
    for name in modes:
        try:
            mode_code(getattr(model, name))
        except (TypeError, ValueError) as err:
            raise type(err)(f"{cls}.{name}: {err}") from None


@dataclass(frozen=True)
class Sequential:
    """``c = round_fmt(c + a[k]*b[k])`` for k in order.

    Attributes:
        fmt: accumulator format (every partial sum is rounded into it).
        mode: rounding mode of the partial sums.
        product_fmt: if given, each product is first rounded into this format (with ``mode``); otherwise the
            product is exact and each step rounds once, as a fused multiply-add does.
        input_fmt: if given, the operands are first rounded into this format with ``input_mode``.
        input_mode: rounding of the operands into ``input_fmt``.
    """

    fmt: FloatFormat | str = "float32"
    mode: RoundingMode | str = "nearest_even"
    product_fmt: FloatFormat | str | None = None
    input_fmt: FloatFormat | str | None = None
    input_mode: RoundingMode | str = "nearest_even"

    def __post_init__(self) -> None:
        _check_fields(self, ("fmt", "product_fmt", "input_fmt"), ("mode", "input_mode"))


@dataclass(frozen=True)
class BlockFMA:
    """Tensor-core block fused multiply-add (see module docstring).

    Attributes:
        block: number of products summed per step (4 V100, 8 A100, 16 H100 bf16/fp16, 32 H100 fp8).
        fraction_bits: F, bits kept below the largest exponent when aligning (24 A100, 25 H100, 13 H100 fp8).
        out_fmt: format of the result of each block (the accumulator).
        out_mode: rounding of the normalized block sum into ``out_fmt`` (toward zero for fp32 output).
        input_fmt: if given, operands are first rounded into it (fp32 operands of a tf32 dot).
        input_mode: rounding of operands into ``input_fmt`` (Triton's tf32 keeps the top bits: toward zero).
        align: the exponent each product is aligned by. ``"product"``: the exponent of the exact product.
            ``"exponent_sum"``: the sum of the operands' exponents, as the multiplier sees them before
            normalizing the product (whose significand lies in [1, 4)): a product with significand >= 2 then
            keeps one bit more. The H200's tensor cores align by ``"exponent_sum"`` (the recorded probes of
            tests/fixtures/gpu/h200/probes; README "GPU validation (H200)" gives how closely each model
            matches them and the command that measures it).
        operand_emin: with ``"exponent_sum"``, the exponent a subnormal operand counts with (the operand
            format's emin: the hardware reads the biased exponent field). ``None``: no clamp.
        operand_emin_b: the same for the B operand where its format differs (``kind::f8f6f4`` mixes element
            formats); ``None``: ``operand_emin``.
        acc_emin: the exponent a subnormal incoming accumulator counts with when aligning (MMA-Sim: -126, the
            fp32 accumulator's emin). ``None``: its own exponent.
        zero_exp: the alignment exponent of a zero accumulator (MMA-Sim's ``e_zero``: the least exponent the
            block aligns to, -132 on sm80/sm89, -133 on sm90 and later, -139 for the fp4 kinds). ``None``: a
            zero accumulator does not take part.
        scale_block: block-scaled kinds (``mxf8f6f4``, ``mxf4``, ``nvf4``): consecutive k sharing one scale of
            each operand (32 or 16); 0: no scales. Such a model runs through :func:`matmul_scaled`.
        scale_emin: the exponent a subnormal scale counts with (-127 for ue8m0, -6 for ue4m3).
        group: products summed exactly in groups of this many consecutive k before alignment (the fp4 kinds:
            16); 1: each product is a term.
        align ``"scale"``: (block-scaled kinds with groups) a term is aligned by its scales' exponent sum only.
    """

    block: int
    fraction_bits: int
    out_fmt: FloatFormat | str = "float32"
    out_mode: RoundingMode | str = "toward_zero"
    input_fmt: FloatFormat | str | None = None
    input_mode: RoundingMode | str = "toward_zero"
    align: str = "product"
    operand_emin: int | None = None
    operand_emin_b: int | None = None
    acc_emin: int | None = None
    zero_exp: int | None = None
    scale_block: int = 0
    scale_emin: int = -127
    group: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.block, int) or self.block < 1:
            raise ValueError(f"BlockFMA.block must be a positive int, got {self.block!r}")
        if not isinstance(self.fraction_bits, int) or not 1 <= self.fraction_bits <= 45:
            raise ValueError(f"BlockFMA.fraction_bits must be an int in 1..45, got {self.fraction_bits!r}")
        if self.align not in ("product", "exponent_sum", "scale"):
            raise ValueError(f"BlockFMA.align must be 'product', 'exponent_sum' or 'scale', got {self.align!r}")
        for name in ("operand_emin", "operand_emin_b", "acc_emin", "zero_exp"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                raise TypeError(f"BlockFMA.{name} must be an int or None, got {v!r}")
        for name in ("scale_block", "group", "scale_emin"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"BlockFMA.{name} must be an int, got {v!r}")
        if self.scale_block < 0 or self.group < 1:
            raise ValueError(f"BlockFMA.scale_block must be >= 0 and group >= 1, got {self.scale_block}, {self.group}")
        if self.scale_block and (self.block % self.scale_block and self.scale_block % self.block):
            raise ValueError(f"BlockFMA.scale_block ({self.scale_block}) and block ({self.block}) must nest")
        if self.block % self.group or (self.scale_block and self.scale_block % self.group):
            raise ValueError(f"BlockFMA.group ({self.group}) must divide block and scale_block")
        if (self.align == "scale" or self.group > 1) and not self.scale_block:
            raise ValueError("BlockFMA: align='scale' and group > 1 describe block-scaled kinds (scale_block > 0)")
        _check_fields(self, ("out_fmt", "input_fmt"), ("out_mode", "input_mode"))


@dataclass(frozen=True)
class Chunked:
    """k split into consecutive chunks of ``chunk``; each accumulated from zero with ``inner``; the chunk results
    then added to the accumulator in order, each addition rounded into ``outer_fmt`` with ``outer_mode``.

    Attributes:
        chunk: chunk length (> 0), or ``None`` with ``splits`` given.
        inner: model of the accumulation inside a chunk (Sequential or BlockFMA).
        outer_fmt: format of the running sum of chunk results.
        outer_mode: rounding of that running sum.
        splits: number of equal splits of k (split-k); the chunk is then ``ceil(K / splits)``.
    """

    chunk: int | None = None
    inner: Sequential | BlockFMA = Sequential()
    outer_fmt: FloatFormat | str = "float32"
    outer_mode: RoundingMode | str = "nearest_even"
    splits: int | None = None

    def __post_init__(self) -> None:
        if (self.chunk is None) == (self.splits is None):
            raise ValueError("Chunked needs exactly one of chunk= or splits=")
        n = self.chunk if self.chunk is not None else self.splits
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"Chunked chunk/splits must be a positive int, got {n!r}")
        if not isinstance(self.inner, (Sequential, BlockFMA)):
            raise TypeError(f"Chunked.inner must be Sequential or BlockFMA, got {type(self.inner).__name__}")
        _check_fields(self, ("outer_fmt",), ("outer_mode",))


@dataclass(frozen=True)
class Interleaved:
    """k reordered, then accumulated by a :class:`BlockFMA`: Triton's operand layout for mma.sync steps.

    k is cut into chunks of ``chunk``; each chunk holds ``chunk // inner.block`` MMA steps (blocks) and
    ``chunk // group`` groups of ``group`` consecutive k. Group ``i`` of a chunk goes to step
    ``i % steps``, the groups of a step in increasing order; the steps then run in order, each a block of
    ``inner``. With chunk 32, group 2 and blocks of 16, step 0 sums k = 0, 1, 4, 5, ..., 28, 29 and step 1
    k = 2, 3, 6, 7, ..., 30, 31.

    Only :func:`matmul` and :func:`dot` apply it (they reorder the operands and run ``inner``, on either
    engine); the njit kernels (:func:`acc_params`, attention plans, ``faithful(dot=...)``) take BlockFMA,
    Sequential and Chunked only.

    Attributes:
        inner: the model of each step (``block`` must divide ``chunk``; ``group`` must divide ``block``).
        chunk: k per chunk; K must be a multiple of it.
        group: consecutive k kept together.
    """

    inner: BlockFMA
    chunk: int = 32
    group: int = 2

    def __post_init__(self) -> None:
        if not isinstance(self.inner, BlockFMA):
            raise TypeError(f"Interleaved.inner must be a BlockFMA, got {type(self.inner).__name__}")
        for name in ("chunk", "group"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Interleaved.{name} must be a positive int, got {value!r}")
        if self.chunk % self.inner.block or self.inner.block % self.group:
            raise ValueError(
                f"Interleaved needs inner.block ({self.inner.block}) to divide chunk ({self.chunk}) "
                f"and group ({self.group}) to divide inner.block"
            )

    def order(self, k: int) -> np.ndarray:
        """The permutation of range(k) in the order the steps read it.

        Raises:
            ValueError: k is not a multiple of ``chunk``.
        """
        if k % self.chunk:
            raise ValueError(f"Interleaved: K = {k} is not a multiple of chunk = {self.chunk}")
        steps = self.chunk // self.inner.block
        groups = np.arange(self.chunk).reshape(self.chunk // self.group, self.group)
        one = np.concatenate([groups[s::steps].reshape(-1) for s in range(steps)])
        return (np.arange(0, k, self.chunk)[:, None] + one[None, :]).reshape(-1)


Model = Sequential | BlockFMA | Chunked


def split_k(splits: int, inner: Sequential | BlockFMA = Sequential(), outer_fmt: str = "float32") -> Chunked:
    """Split-k: k cut into ``splits`` equal parts accumulated separately, then combined in order."""
    return Chunked(splits=splits, inner=inner, outer_fmt=outer_fmt)


_E8M13 = FloatFormat("e8m13", 8, 13)


def fp8_mma_sync(arch: str = "sm90") -> Interleaved:
    """``tl.dot`` of fp8 (e4m3/e5m2) operands where Triton issues mma.sync instead of an fp8 MMA (sm_90 with
    M < 64): the operands are converted to fp16 (exactly) and each 32-wide chunk of k is split into two k16
    mma.sync.m16n8k16.f16 steps, in alternating pairs of k (:class:`Interleaved` over the sm90 fp16 preset).

    Measured on the H200 probe ``e4m3_16_32_32`` (tests/fixtures/gpu/h200/probes): this model reproduces every
    output, where the fp16 preset in plain k order misses some; e5m2 and K > 32 follow the same conversion but
    were not probed.

    Args:
        arch: ``"sm90"`` (the only architecture measured).

    Returns:
        ``Interleaved(tensor_core("sm90", "fp16"), chunk=32, group=2)``; K must be a multiple of 32.
    """
    if not isinstance(arch, str) or arch.lower() != "sm90":
        raise ValueError(f"fp8_mma_sync: only arch 'sm90' is modelled, got {arch!r}")
    return Interleaved(tensor_core("sm90", "fp16"), chunk=32, group=2)


_ARCHS = {
    "sm80": "sm80",
    "a100": "sm80",
    "ampere": "sm80",
    "sm86": "sm80",
    "sm89": "sm89",
    "ada": "sm89",
    "l40": "sm89",
    "sm90": "sm90",
    "h100": "sm90",
    "h200": "sm90",
    "hopper": "sm90",
    "sm100": "sm100",
    "b200": "sm100",
    "blackwell": "sm100",
    "sm120": "sm120",
    "rtx_blackwell": "sm120",
}
# per architecture, as MMA-Sim (Xie et al. 2025) models it: fraction bits F, the bytes of k one step sums
# (block = bytes / operand size), the least alignment exponent (e_zero) and F for fp8 where it differs
_ARCH_DATA: dict[str, dict[str, Any]] = {
    "sm80": {"f": 24, "bytes": 16, "zero": -132, "fp8_f": None},
    "sm89": {"f": 24, "bytes": 16, "zero": -132, "fp8_f": 13},
    "sm90": {"f": 25, "bytes": 32, "zero": -133, "fp8_f": 13},
    "sm100": {"f": 25, "bytes": 32, "zero": -133, "fp8_f": 25},
    "sm120": {"f": 25, "bytes": 32, "zero": -133, "fp8_f": 25},
}
_F8F6F4 = ("float8_e4m3fn", "float8_e5m2", "float6_e3m2fn", "float6_e2m3fn", "float4_e2m1fn")
_BLOCK_KINDS = ("mxf8f6f4", "mxf4", "nvf4")
VARIANTS = ("mmasim", "fasi2021", "h200")


def tensor_core(
    arch: str,
    input_format: str | FloatFormat,
    b_format: str | FloatFormat | None = None,
    *,
    kind: str | None = None,
    variant: str | None = None,
) -> BlockFMA:
    """Tensor-core accumulation models, fp32 output (every difference between architectures is a field value).

    Args:
        arch: ``"sm80"`` (A100), ``"sm89"`` (Ada), ``"sm90"`` (H100/H200), ``"sm100"`` (B200, tcgen05) or
            ``"sm120"`` (RTX Blackwell); names such as ``"a100"``, ``"hopper"``, ``"blackwell"`` too.
        input_format: operand format (the A operand's): bf16, fp16, tf32 (fp32 operands), e4m3/e5m2 (sm89 and
            later), e3m2/e2m3/e2m1 (``kind::f8f6f4``, sm100/sm120).
        b_format: the B operand's format where it differs (mixed f8f6f4 kinds); default ``input_format``.
        kind: ``None`` (plain MMA), or a block-scaled kind of sm100/sm120: ``"mxf8f6f4"`` (fp8/fp6/fp4
            elements, ue8m0 scales per 32 k), ``"mxf4"`` (e2m1, ue8m0 per 32 k), ``"nvf4"`` (e2m1, ue4m3 per
            16 k). Block-scaled models run through :func:`matmul_scaled`.
        variant: ``None`` for the default. sm90: ``"h200"`` (the default: measured bit for bit on an H200,
            tests/fixtures/gpu/h200) or ``"mmasim"`` (adds MMA-Sim's accumulator clamps, ``acc_emin=-126``
            and ``zero_exp=-133``: they differ from the default only where the accumulator and every product
            of a step lie below 2**-126). sm80: ``"mmasim"`` (the default, MMA-Sim's Ampere model: alignment
            by the operands' exponent sum) or ``"fasi2021"`` (the published model of Fasi et al. 2021:
            alignment by each product's exponent, no clamps). Other archs: ``"mmasim"`` only.

    Returns:
        The :class:`BlockFMA` model. Per MMA-Sim: sm80/sm89 sum 16 bytes of k per step (8 fp16/bf16, 4 tf32,
        16 fp8) with F=24 (fp8 on sm89: F=13, result truncated to e8m13); sm90 32 bytes (16, 8, 32) with F=25
        (fp8: F=13, e8m13); sm100/sm120 32 bytes with F=25 for every kind, fp8/fp6/fp4 included; mxf8f6f4
        blocks of 32 with the scales' exponents added to the products'; mxf4/nvf4 steps of 64 k, each group
        of 16 products summed exactly, scaled and aligned by the scales' exponents with F=35. fp32 results
        are rounded toward zero.

    Raises:
        ValueError: an unknown arch, format, kind or variant, or a combination the architecture lacks.
    """
    if not isinstance(arch, str) or arch.lower() not in _ARCHS:
        raise ValueError(f"unknown tensor-core arch {arch!r}; known: {', '.join(sorted(set(_ARCHS.values())))}")
    a_key = _ARCHS[arch.lower()]
    d = _ARCH_DATA[a_key]
    fa = _format(input_format)
    fb = _format(b_format) if b_format is not None else fa
    default = "h200" if a_key == "sm90" else "mmasim"
    var = default if variant is None else variant
    allowed = {"sm90": ("h200", "mmasim"), "sm80": ("mmasim", "fasi2021")}.get(a_key, ("mmasim",))
    if var not in allowed:
        raise ValueError(f"tensor_core: variant {variant!r} is not one of {allowed} for {a_key}")
    if kind is not None and kind not in _BLOCK_KINDS:
        raise ValueError(f"tensor_core: kind must be None or one of {_BLOCK_KINDS}, got {kind!r}")
    if kind is not None and a_key not in ("sm100", "sm120"):
        raise ValueError(f"tensor_core: block-scaled kind {kind!r} needs sm100 or sm120, got {a_key}")
    names = (fa.name, fb.name)
    clamps: dict[str, Any] = {"acc_emin": -126, "zero_exp": d["zero"]} if var == "mmasim" else {}
    if kind in ("mxf4", "nvf4"):
        if names != ("float4_e2m1fn", "float4_e2m1fn"):
            raise ValueError(f"tensor_core: kind {kind!r} takes e2m1 operands, got {fa.name} and {fb.name}")
        return BlockFMA(
            64,
            35,
            align="scale",
            acc_emin=-126,
            zero_exp=-139,
            scale_block=32 if kind == "mxf4" else 16,
            scale_emin=-127 if kind == "mxf4" else -6,
            group=16,
        )
    if kind == "mxf8f6f4":
        if not set(names) <= set(_F8F6F4):
            raise ValueError(f"tensor_core: kind 'mxf8f6f4' takes fp8/fp6/fp4 operands, got {fa.name}, {fb.name}")
        return BlockFMA(
            32,
            25,
            align="exponent_sum",
            operand_emin=fa.emin,
            operand_emin_b=fb.emin if fb != fa else None,
            scale_block=32,
            scale_emin=-127,
            **clamps,
        )
    if var == "fasi2021":
        if fa.name in ("float32", "tfloat32"):
            return BlockFMA(4, 24, input_fmt="tfloat32", input_mode="toward_zero")
        if fa.name in ("bfloat16", "float16"):
            return BlockFMA(8, 24)
        raise ValueError(f"tensor_core: no {a_key} preset for {fa.name!r} (variant fasi2021)")
    if fa != fb and not set(names) <= set(_F8F6F4):
        raise ValueError(f"tensor_core: mixed operand formats exist only among fp8/fp6/fp4, got {names}")
    if fa.name in ("float32", "tfloat32"):
        return BlockFMA(
            d["bytes"] // 4, d["f"], input_fmt="tfloat32", input_mode="toward_zero", align="exponent_sum",
            operand_emin=-126, **clamps,
        )  # fmt: skip
    if fa.name in ("bfloat16", "float16"):
        return BlockFMA(d["bytes"] // 2, d["f"], align="exponent_sum", operand_emin=fa.emin, **clamps)
    if set(names) <= set(_F8F6F4):
        small = not set(names) <= {"float8_e4m3fn", "float8_e5m2"}
        if d["fp8_f"] is None or (small and a_key not in ("sm100", "sm120")):
            raise ValueError(f"tensor_core: {a_key} has no tensor-core kind for {fa.name} x {fb.name}")
        f8 = d["fp8_f"]
        kw: dict[str, Any] = {"out_fmt": _E8M13, "out_mode": "toward_zero"} if f8 == 13 else {}
        return BlockFMA(
            d["bytes"],
            f8,
            align="exponent_sum",
            operand_emin=fa.emin,
            operand_emin_b=fb.emin if fb != fa else None,
            **kw,
            **clamps,
        )
    raise ValueError(f"no tensor-core preset for input format {fa.name!r} on {a_key}")


# -- njit parameters --------------------------------------------------------------------------------------------


class AccParams(NamedTuple):
    """A model flattened for njit code (see :func:`acc_params`)."""

    kind: int  # 0 sequential, 1 block FMA
    acc_p: FormatParams  # accumulator format (Sequential.fmt / BlockFMA.out_fmt)
    acc_mode: int
    round_products: bool
    prod_p: FormatParams
    round_inputs: bool
    in_p: FormatParams
    in_mode: int
    block: int
    frac_bits: int
    chunk: int  # 0: not chunked; > 0 chunk length; < 0: -(number of splits)
    outer_p: FormatParams
    outer_mode: int
    align_sum: bool  # BlockFMA aligns products by the operands' exponent sum
    opnd_emin: int  # exponent a subnormal operand counts with (align_sum only)
    opnd_emin_b: int  # the same for the B operand
    acc_emin: int  # exponent a subnormal accumulator counts with (-100000: its own)
    zero_exp: int  # alignment exponent of a zero accumulator (-100000: none)
    scale_block: int  # k per scale of block-scaled kinds (0: none)
    scale_emin: int  # exponent a subnormal scale counts with
    group: int  # products summed exactly in groups before alignment
    align_scale: bool  # terms aligned by their scales' exponents only


def acc_params(model: Model) -> AccParams:
    """Flatten a model into :class:`AccParams` for njit kernels (validates it)."""
    chunk = 0
    outer = _format("float32")
    outer_mode = RoundingMode.NEAREST_EVEN
    if isinstance(model, Chunked):
        chunk = model.chunk if model.chunk is not None else -int(model.splits or 1)
        outer = _format(model.outer_fmt)
        outer_mode = mode_code(model.outer_mode)
        model = model.inner
    if isinstance(model, Sequential):
        acc = _format(model.fmt)
        prod = _format(model.product_fmt) if model.product_fmt is not None else acc
        inp = _format(model.input_fmt) if model.input_fmt is not None else acc
        return AccParams(
            0,
            acc.params,
            int(mode_code(model.mode)),
            model.product_fmt is not None,
            prod.params,
            model.input_fmt is not None,
            inp.params,
            int(mode_code(model.input_mode)),
            1,
            0,
            chunk,
            outer.params,
            int(outer_mode),
            False,
            -1074,
            -1074,
            _NONE,
            _NONE,
            0,
            -127,
            1,
            False,
        )
    if isinstance(model, BlockFMA):
        emin_a = model.operand_emin if model.operand_emin is not None else -1074
        acc = _format(model.out_fmt)
        inp = _format(model.input_fmt) if model.input_fmt is not None else acc
        return AccParams(
            1,
            acc.params,
            int(mode_code(model.out_mode)),
            False,
            acc.params,
            model.input_fmt is not None,
            inp.params,
            int(mode_code(model.input_mode)),
            model.block,
            model.fraction_bits,
            chunk,
            outer.params,
            int(outer_mode),
            model.align == "exponent_sum",
            emin_a,
            model.operand_emin_b if model.operand_emin_b is not None else emin_a,
            model.acc_emin if model.acc_emin is not None else _NONE,
            model.zero_exp if model.zero_exp is not None else _NONE,
            model.scale_block,
            model.scale_emin,
            model.group,
            model.align == "scale",
        )
    if isinstance(model, Interleaved):
        raise TypeError(
            "an Interleaved model reorders k; matmul and dot apply it, the njit kernels take "
            "Sequential, BlockFMA or Chunked (use its inner model on operands in Interleaved.order)"
        )
    raise TypeError(f"accumulation model must be Sequential, BlockFMA or Chunked, got {type(model).__name__}")
