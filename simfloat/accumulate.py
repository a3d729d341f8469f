"""Accumulation models for dot products and matrix products, and the tensor-core presets.

A model says how ``c + sum_k a[k] * b[k]`` is accumulated, rounding by rounding:

* :class:`Sequential` — ``c = round(c + a[k]*b[k])`` in order of k; products exact (one rounding per step, what an
  FMA loop does) or rounded into ``product_fmt`` first.
* :class:`Chunked` — k split into chunks of ``chunk``; each chunk accumulated from zero with an inner model; the
  chunk results added to ``c`` in order (split-k with ``chunk = ceil(K / splits)``, see :func:`split_k`).
* :class:`BlockFMA` — the tensor-core model: the exact products of each block of ``block`` consecutive k,
  together with the incoming accumulator, are aligned to the largest exponent among them (a product's own
  exponent, as Fasi et al. 2021 and Khattak & Mikaitis 2025 describe it, or the sum of its operands' exponents,
  as MMA-Sim, Xie et al. 2025, models it) and truncated (toward zero, sign-magnitude) to
  ``fraction_bits`` bits below that exponent; the aligned terms are summed exactly, normalized once and rounded
  into ``out_fmt`` with ``out_mode`` (toward zero for fp32 output). The result re-enters the next block as its
  accumulator.
* :class:`Interleaved` — k reordered before a :class:`BlockFMA`: each chunk's groups of consecutive k dealt in
  turn into the chunk's MMA steps (how Triton feeds fp8 operands, converted to fp16, to mma.sync on sm_90:
  :func:`fp8_mma_sync`).

Every model checks its formats and modes when it is made (a misspelt mode is a ValueError at once, naming the
field).

:func:`tensor_core` returns the presets (sm80, sm89, sm90, sm100, sm120; block-scaled kinds run through
:func:`matmul_scaled`); :func:`matmul` and :func:`dot` apply any other model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from simfloat._jit import f64_bits, fma64, jit
from simfloat._parallel import run_rows
from simfloat.formats import FloatFormat, FormatParams
from simfloat.formats import format as _format
from simfloat.rounding import RoundingMode, mode_code, round_exact, round_scalar, sticky

__all__ = [
    "AccParams",
    "BlockFMA",
    "Chunked",
    "Interleaved",
    "Model",
    "Sequential",
    "acc_params",
    "dot",
    "dot_acc",
    "dot_scaled_acc",
    "fp8_mma_sync",
    "matmul",
    "matmul_scaled",
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


# -- njit workers -------------------------------------------------------------------------------------------------


@jit
def _two_sum(a: float, b: float) -> tuple[float, float]:
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


@jit
def _fused_step(c: float, a: float, b: float, p: FormatParams, mode: int) -> float:
    """round(c + a*b) with one rounding of the exact value."""
    prod = a * b
    if prod - prod != 0.0 or c - c != 0.0:  # inf/nan: IEEE propagation
        return round_scalar(c + prod, p, mode, _ZERO)
    perr = fma64(a, b, -prod)  # exact: a*b = prod + perr
    s, e = _two_sum(c, prod)
    if perr == 0.0:  # always the case for operands of <= 26 significant bits (every low-precision format)
        return round_exact(s, sticky(s, e), p, mode, _ZERO)
    # Wide operands: exact value s + e + perr. Fold the two small terms into one float t rounded to odd, so t
    # keeps a sticky last bit, then split s + t again; the residual T - t only matters where e2 is 0 or a tie.
    t, tt = _two_sum(e, perr)
    if tt != 0.0 and (f64_bits(t) & np.uint64(1)) == _ZERO:
        t = np.nextafter(t, np.inf if tt > 0.0 else -np.inf)
        tt = 1.0 if tt > 0.0 else -1.0
    s2, e2 = _two_sum(s, t)
    d = sticky(s2, e2)
    if tt != 0.0:
        if d == 0:
            d = 1 if tt > 0.0 else -1
        elif abs(d) == 2 and (tt > 0.0) != (e2 > 0.0):
            d = 1 if e2 > 0.0 else -1  # just inside the half-ulp point
        elif abs(d) == 2:  # just beyond it: re-anchor on the neighbour, the tail now points back
            s2 = np.nextafter(s2, np.inf if e2 > 0.0 else -np.inf)
            d = -1 if e2 > 0.0 else 1
    return round_exact(s2, d, p, mode, _ZERO)


@jit
def _opnd(x: float, ap: AccParams) -> float:
    """An operand as the tensor core sees it (rounded into the input format if the model has one)."""
    if ap.round_inputs:
        return round_scalar(x, ap.in_p, ap.in_mode, _ZERO)
    return x


@jit
def _exponent(x: float) -> np.int64:
    """floor(log2 |x|) of a nonzero finite float64 (subnormals included)."""
    b = f64_bits(abs(x))
    expo = np.int64(b >> np.uint64(52))
    if expo == 0:  # subnormal: position of the leading one
        frac = b
        k = np.int64(0)
        while frac > np.uint64(1):
            frac >>= np.uint64(1)
            k += 1
        return k - 1074
    return expo - 1023


@jit
def product_exponent(a, b, p, ap):
    """The exponent a nonzero product is aligned by: its own, or the sum of its operands' exponents (each at
    least ``opnd_emin``), as the tensor core's multiplier delivers it before normalization."""
    if ap.align_sum:
        return max(_exponent(a), ap.opnd_emin) + max(_exponent(b), ap.opnd_emin_b)
    return _exponent(p)


@jit
def _block_step(c, a, b, lo, hi, ap):
    """One tensor-core step: c and the exact products a[k]*b[k], k in [lo, hi), aligned to the largest exponent,
    truncated to F fraction bits, summed exactly, normalized and rounded once into the accumulator format."""
    special = c - c != 0.0
    emax = np.int64(-100000)
    if c != 0.0 and not special:
        emax = max(_exponent(c), ap.acc_emin)
    elif c == 0.0:
        emax = np.int64(ap.zero_exp)
    for k in range(lo, hi):
        ak = _opnd(a[k], ap)
        bk = _opnd(b[k], ap)
        pk = ak * bk
        if pk - pk != 0.0:
            special = True
        elif pk != 0.0:
            emax = max(emax, product_exponent(ak, bk, pk, ap))
    if special:  # inf/nan anywhere: the hardware propagates like IEEE
        s = c
        for k in range(lo, hi):
            s += _opnd(a[k], ap) * _opnd(b[k], ap)
        return round_scalar(s, ap.acc_p, ap.acc_mode, _ZERO)
    if emax == -100000:
        return round_scalar(c + 0.0, ap.acc_p, ap.acc_mode, _ZERO)  # all zero: +0 unless c is -0 alone
    q = emax - ap.frac_bits  # weight of the last kept bit
    total = np.int64(0)
    # Each term becomes a signed integer multiple of 2**q, truncated toward zero (|term| / 2**q < 2**(F+2)).
    # Scaling by a power of two is exact; the products are exact (low-precision operands).
    if c != 0.0:
        total += np.int64(math.trunc(math.ldexp(c, -q)))
    for k in range(lo, hi):
        pk = _opnd(a[k], ap) * _opnd(b[k], ap)
        if pk != 0.0:
            total += np.int64(math.trunc(math.ldexp(pk, -q)))
    if total == 0:
        return 0.0
    # |total| < (block+1) * 2**(F+2) <= 2**53 for the presets: exact as float64, then one rounding.
    return round_scalar(math.ldexp(np.float64(total), q), ap.acc_p, ap.acc_mode, _ZERO)


@jit
def _scale_exp(x, emin):
    return max(_exponent(x), emin)


@jit
def _scaled_block_step(c, a, b, sa, sb, lo, hi, ap):
    """One step of a block-scaled kind: the terms are the products a[k]*b[k]*sa[k]*sb[k] (or, with groups, the
    exact sum of each group of ``ap.group`` products times its scales), each aligned by its operands' and
    scales' exponent sum (or by its scales' alone), truncated to F bits below the largest, summed exactly with
    the accumulator and rounded once, as :func:`_block_step` does."""
    special = c - c != 0.0
    emax = np.int64(-100000)
    if c != 0.0 and not special:
        emax = max(_exponent(c), ap.acc_emin)
    elif c == 0.0:
        emax = np.int64(ap.zero_exp)
    g = ap.group
    for k0 in range(lo, hi, g):
        for k in range(k0, min(hi, k0 + g)):
            s = sa[k] * sb[k]
            pk = a[k] * b[k] * s
            if pk - pk != 0.0 or s != s:
                special = True
            elif pk != 0.0:
                w = _scale_exp(sa[k], ap.scale_emin) + _scale_exp(sb[k], ap.scale_emin)
                if not ap.align_scale:
                    w += max(_exponent(a[k]), ap.opnd_emin) + max(_exponent(b[k]), ap.opnd_emin_b)
                emax = max(emax, w)
    if special:  # inf/nan anywhere (a NaN scale included): IEEE propagation
        t = c
        for k in range(lo, hi):
            t += a[k] * b[k] * (sa[k] * sb[k])
        return round_scalar(t, ap.acc_p, ap.acc_mode, _ZERO)
    if emax == -100000:
        return round_scalar(c + 0.0, ap.acc_p, ap.acc_mode, _ZERO)
    q = emax - ap.frac_bits
    total = np.int64(0)
    if c != 0.0:
        total += np.int64(math.trunc(math.ldexp(c, -q)))
    for k0 in range(lo, hi, g):
        part = 0.0
        for k in range(k0, min(hi, k0 + g)):
            pk = a[k] * b[k] * (sa[k] * sb[k])  # exact: low-precision elements, scales of <= 4 bits
            t, err = _two_sum(part, pk)
            if err != 0.0:
                raise ValueError("block-scaled group sum is not exact in float64 (elements wider than fp8?)")
            part = t
        if part != 0.0:
            total += np.int64(math.trunc(math.ldexp(part, -q)))
    if total == 0:
        return 0.0
    return round_scalar(math.ldexp(np.float64(total), q), ap.acc_p, ap.acc_mode, _ZERO)


@jit
def dot_scaled_acc(a: np.ndarray, b: np.ndarray, sa: np.ndarray, sb: np.ndarray, c: float, ap: AccParams) -> float:
    """``c + sum_k a[k]*b[k]*sa[k]*sb[k]`` under a block-scaled model (``ap.scale_block > 0``).

    Args:
        a, b: 1-D float64 arrays of K element values (of the element formats).
        sa, sb: 1-D float64 arrays of K: the scale of each element (each scale repeated over its block).
        c: incoming accumulator. ap: :class:`AccParams` of the model.

    Returns:
        The accumulated value.
    """
    n = a.shape[0]
    k = 0
    while k < n:
        kend = min(n, k + ap.block)
        c = _scaled_block_step(c, a, b, sa, sb, k, kend, ap)
        k = kend
    return c


@jit
def _accumulate(a, b, c: float, lo: int, hi: int, ap: AccParams) -> float:
    if ap.kind == 0:
        for k in range(lo, hi):
            ak = _opnd(a[k], ap)
            bk = _opnd(b[k], ap)
            if ap.round_products:
                prod = round_scalar(ak * bk, ap.prod_p, ap.acc_mode, _ZERO)
                s, e = _two_sum(c, prod)
                c = round_exact(s, sticky(s, e), ap.acc_p, ap.acc_mode, _ZERO)
            else:
                c = _fused_step(c, ak, bk, ap.acc_p, ap.acc_mode)
        return c
    k = lo
    while k < hi:
        kend = min(hi, k + ap.block)
        c = _block_step(c, a, b, k, kend, ap)
        k = kend
    return c


@jit
def dot_acc(a: np.ndarray, b: np.ndarray, c: float, ap: AccParams) -> float:
    """``c + sum_k a[k]*b[k]`` under the model ``ap``.

    Args:
        a, b: 1-D float64 arrays (any stride) of equal length K; if the model has an input format each operand
            is rounded into it as it is read.
        c: incoming accumulator (already a value of the accumulator format).
        ap: :class:`AccParams` from :func:`acc_params`.

    Returns:
        The accumulated value (representable in the accumulator format, or the chunk-sum format if chunked).
    """
    n = a.shape[0]
    if ap.scale_block > 0:
        raise ValueError("a block-scaled model needs the scales: use matmul_scaled / dot_scaled_acc")
    if ap.chunk == 0:
        return _accumulate(a, b, c, 0, n, ap)
    size = ap.chunk if ap.chunk > 0 else max(1, -((-n) // (-ap.chunk)))
    lo = 0
    while lo < n:
        hi = min(n, lo + size)
        part = _accumulate(a, b, 0.0, lo, hi, ap)
        s, e = _two_sum(c, part)
        c = round_exact(s, sticky(s, e), ap.outer_p, ap.outer_mode, _ZERO)
        lo = hi
    return c


@jit
def _matmul_rows(lo, hi, a, b, c, out, ap):
    m = a.shape[1]
    n = b.shape[2]
    for r in range(lo, hi):
        bi = r // m
        i = r - bi * m
        for j in range(n):
            out[bi, i, j] = dot_acc(a[bi, i, :], b[bi, :, j], c[bi, i, j], ap)


def _no_scales(acc: object) -> None:
    inner = acc.inner if isinstance(acc, (Chunked, Interleaved)) else acc
    if isinstance(inner, BlockFMA) and inner.scale_block:
        raise TypeError("a block-scaled model (scale_block > 0) needs the scales: use matmul_scaled")


def _as_float_array(x: object, name: str) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(x).__name__}")
    if x.dtype not in (np.float32, np.float64):
        raise TypeError(f"{name} must have dtype float32 or float64, got {x.dtype}")
    return x.astype(np.float64, copy=False)


def matmul(
    a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None, *, acc: Model | Interleaved, engine: str = "vector"
) -> np.ndarray:
    """Emulated ``c + a @ b`` under an accumulation model.

    Args:
        a: (..., M, K) float32/float64 array (values are taken as they are: round them into the operand format
            first, e.g. with :func:`simfloat.round`, or give the model an ``input_fmt``).
        b: (..., K, N) array; leading dims broadcast with ``a``'s.
        c: optional (..., M, N) incoming accumulator (defaults to zeros).
        acc: accumulation model (an :class:`Interleaved` one reorders k of ``a`` and ``b`` and runs its inner
            model).
        engine: ``"vector"`` (the row kernels of :mod:`simfloat._mma`, vectorized across outputs) or
            ``"reference"`` (:func:`dot_acc` per output); the same bits.

    Returns:
        float64 array (..., M, N) of values of the accumulator format.
    """
    if engine not in ("vector", "reference"):
        raise ValueError(f"engine must be 'vector' or 'reference', got {engine!r}")
    a64 = _as_float_array(a, "a")
    b64 = _as_float_array(b, "b")
    if a64.ndim < 2 or b64.ndim < 2:
        raise ValueError(f"matmul needs arrays of at least 2 dims, got a.ndim={a64.ndim}, b.ndim={b64.ndim}")
    if a64.shape[-1] != b64.shape[-2]:
        raise ValueError(f"inner dimensions differ: a is {a.shape}, b is {b.shape}")
    _no_scales(acc)
    if isinstance(acc, Interleaved):
        order = acc.order(a64.shape[-1])
        a64, b64, acc = a64[..., order], b64[..., order, :], acc.inner
    ap = acc_params(acc)
    lead = np.broadcast_shapes(a64.shape[:-2], b64.shape[:-2])
    m, n = a64.shape[-2], b64.shape[-1]
    nl = math.prod(lead)
    a3 = np.ascontiguousarray(np.broadcast_to(a64, lead + a64.shape[-2:])).reshape(nl, m, a64.shape[-1])
    b3 = np.ascontiguousarray(np.broadcast_to(b64, lead + b64.shape[-2:])).reshape(nl, b64.shape[-2], n)
    if c is None:
        c3 = np.zeros((a3.shape[0], m, n))
    else:
        c64 = _as_float_array(c, "c")
        try:
            c3 = np.ascontiguousarray(np.broadcast_to(c64, lead + (m, n))).reshape(nl, m, n)
        except ValueError as err:
            raise ValueError(f"c of shape {c.shape} does not broadcast to {lead + (m, n)}") from err
    if engine == "vector":
        from simfloat._mma import matmul_rows

        return matmul_rows(a3, b3, c3, acc).reshape(lead + (m, n))
    out = np.empty((a3.shape[0], m, n))
    run_rows(_matmul_rows, a3.shape[0] * m, a3, b3, c3, out, ap)
    return out.reshape(lead + (m, n))


@jit
def _scaled_rows(lo, hi, a, b, sa, sb, c, out, ap):
    m = a.shape[1]
    n = b.shape[2]
    for r in range(lo, hi):
        bi = r // m
        i = r - bi * m
        for j in range(n):
            out[bi, i, j] = dot_scaled_acc(a[bi, i, :], b[bi, :, j], sa[bi, i, :], sb[bi, :, j], c[bi, i, j], ap)


def matmul_scaled(
    a: np.ndarray,
    b: np.ndarray,
    a_scales: np.ndarray,
    b_scales: np.ndarray,
    c: np.ndarray | None = None,
    *,
    acc: BlockFMA,
    engine: str = "vector",
) -> np.ndarray:
    """Emulated block-scaled MMA ``c + (a * a_scales) @ (b * b_scales)`` as the tensor core sums it.

    Args:
        a: (M, K) element values (of the model's element formats, e.g. ``quantize_block(...).codes``).
        b: (K, N) element values.
        a_scales: (M, K // scale_block) scales of a's blocks along k (``quantize_block(x, ..., axis=-1)``).
        b_scales: (K // scale_block, N) scales of b's blocks along k (``quantize_block(x, ..., axis=0)``).
        c: optional (M, N) incoming accumulator (zeros by default).
        acc: a block-scaled :class:`BlockFMA` (``tensor_core(arch, fmt, kind=...)``).
        engine: ``"vector"`` or ``"reference"`` (:func:`dot_scaled_acc` per output); the same bits. The vector
            engine scales the operands exactly and gives them alignment weights from the scales' exponents
            (times the elements', for ``mxf8f6f4``), so that the block-FMA row kernels of :mod:`simfloat._mma`
            apply (the grouped fp4 kinds ``mxf4``, ``nvf4`` sum each group of 16 exactly first:
            :func:`simfloat._mma.scaled_mma`); operands it cannot take (a NaN scale, extreme magnitudes) run
            the reference.

    Returns:
        float64 (M, N) array.

    Raises:
        TypeError: a non-float array or a model without scales. ValueError: shapes that do not match, or K not
            a multiple of ``scale_block``.
    """
    if not isinstance(acc, BlockFMA) or acc.scale_block == 0:
        raise TypeError("matmul_scaled needs a block-scaled BlockFMA (tensor_core(arch, fmt, kind=...))")
    a64, b64 = _as_float_array(a, "a"), _as_float_array(b, "b")
    sa64, sb64 = _as_float_array(a_scales, "a_scales"), _as_float_array(b_scales, "b_scales")
    if a64.ndim != 2 or b64.ndim != 2 or a64.shape[1] != b64.shape[0]:
        raise ValueError(f"matmul_scaled needs a (M, K) and b (K, N), got {a64.shape} and {b64.shape}")
    m, k = a64.shape
    n = b64.shape[1]
    sb_k = acc.scale_block
    if k % sb_k:
        raise ValueError(f"K = {k} is not a multiple of the model's scale_block = {sb_k}")
    if sa64.shape != (m, k // sb_k) or sb64.shape != (k // sb_k, n):
        raise ValueError(
            f"a_scales must be {(m, k // sb_k)} and b_scales {(k // sb_k, n)}, got {sa64.shape} and {sb64.shape}"
        )
    c3 = np.zeros((1, m, n)) if c is None else np.array(_as_float_array(c, "c"), dtype=np.float64).reshape(1, m, n)
    sa_e = np.ascontiguousarray(np.repeat(sa64, sb_k, axis=1))[None]
    sb_e = np.ascontiguousarray(np.repeat(sb64, sb_k, axis=0))[None]
    if engine not in ("vector", "reference"):
        raise ValueError(f"engine must be 'vector' or 'reference', got {engine!r}")
    if engine == "vector":
        from simfloat._mma import scaled_rows

        res = scaled_rows(a64, b64, sa_e[0], sb_e[0], c3[0], acc)
        if res is not None:
            return res
    out = np.empty((1, m, n))
    run_rows(
        _scaled_rows, m, np.ascontiguousarray(a64)[None], np.ascontiguousarray(b64)[None], sa_e, sb_e, c3, out,
        acc_params(acc),
    )  # fmt: skip
    return out[0]


def dot(a: np.ndarray, b: np.ndarray, c: float = 0.0, *, acc: Model | Interleaved) -> float:
    """Emulated ``c + a . b`` of two 1-D arrays under an accumulation model (Interleaved: k reordered)."""
    a64 = _as_float_array(a, "a")
    b64 = _as_float_array(b, "b")
    if a64.ndim != 1 or b64.shape != a64.shape:
        raise ValueError(f"dot needs two 1-D arrays of equal length, got {a.shape} and {b.shape}")
    _no_scales(acc)
    if isinstance(acc, Interleaved):
        order = acc.order(a64.shape[0])
        a64, b64, acc = a64[order], b64[order], acc.inner
    return float(dot_acc(a64, b64, float(c), acc_params(acc)))
