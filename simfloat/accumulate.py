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

:func:`tensor_core` returns the published presets ("sm80", "sm90"); :func:`matmul` and :func:`dot` apply any model.
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
    "fp8_mma_sync",
    "matmul",
    "split_k",
    "tensor_core",
]

_ZERO = np.uint64(0)

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
            keeps one bit more. Measured on the H200 (tests/fixtures/gpu/h200/probes): every bf16, fp16, tf32,
            e4m3 and e5m2 tensor-core probe matches ``"exponent_sum"`` bit for bit, ``"product"`` 98.5-99.8%.
        operand_emin: with ``"exponent_sum"``, the exponent a subnormal operand counts with (the operand
            format's emin: the hardware reads the biased exponent field). ``None``: no clamp.
    """

    block: int
    fraction_bits: int
    out_fmt: FloatFormat | str = "float32"
    out_mode: RoundingMode | str = "toward_zero"
    input_fmt: FloatFormat | str | None = None
    input_mode: RoundingMode | str = "toward_zero"
    align: str = "product"
    operand_emin: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.block, int) or self.block < 1:
            raise ValueError(f"BlockFMA.block must be a positive int, got {self.block!r}")
        if not isinstance(self.fraction_bits, int) or not 1 <= self.fraction_bits <= 45:
            raise ValueError(f"BlockFMA.fraction_bits must be an int in 1..45, got {self.fraction_bits!r}")
        if self.align not in ("product", "exponent_sum"):
            raise ValueError(f"BlockFMA.align must be 'product' or 'exponent_sum', got {self.align!r}")
        if self.operand_emin is not None and (
            isinstance(self.operand_emin, bool) or not isinstance(self.operand_emin, int)
        ):
            raise TypeError(f"BlockFMA.operand_emin must be an int or None, got {self.operand_emin!r}")
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


def tensor_core(arch: str, input_format: str | FloatFormat) -> BlockFMA:
    """Published tensor-core accumulation models.

    Args:
        arch: ``"sm80"`` (A100) or ``"sm90"`` (H100/H200).
        input_format: operand format: bf16, fp16, tf32 (fp32 operands), e4m3/e5m2 (sm90 only).

    Returns:
        The :class:`BlockFMA` model. sm80: bf16/fp16/tf32 blocks of 8 (tf32: 4), F=24. sm90: bf16/fp16 blocks
        of 16, F=25; tf32 blocks of 8, F=25; fp8 blocks of 32 with 13 fraction bits and the result truncated to
        e8m13 (Xie et al. 2025; DeepSeek-V3 reports ~14 bits). fp32 outputs are rounded toward zero.
    """
    fmt = _format(input_format)
    arch_key = arch.lower()
    if arch_key not in ("sm80", "sm90"):
        raise ValueError(f"unknown tensor-core arch {arch!r}; known: 'sm80', 'sm90'")
    name = fmt.name
    # sm90: alignment by the operands' exponent sum, measured bit for bit on an H200; sm80: the published model
    # (alignment by the product's exponent), not measured here.
    kw: dict[str, Any] = {"align": "exponent_sum"} if arch_key == "sm90" else {}
    if name in ("float32", "tfloat32"):
        block = 4 if arch_key == "sm80" else 8
        f = 24 if arch_key == "sm80" else 25
        if kw:
            kw["operand_emin"] = -126
        return BlockFMA(block, f, input_fmt="tfloat32", input_mode="toward_zero", **kw)
    if kw:
        kw["operand_emin"] = fmt.emin
    if name in ("bfloat16", "float16"):
        return BlockFMA(8, 24) if arch_key == "sm80" else BlockFMA(16, 25, **kw)
    if name in ("float8_e4m3fn", "float8_e5m2"):
        if arch_key != "sm90":
            raise ValueError("fp8 tensor cores need sm89/sm90; no sm80 preset")
        return BlockFMA(32, 13, out_fmt=_E8M13, out_mode="toward_zero", **kw)
    raise ValueError(f"no tensor-core preset for input format {name!r} on {arch}")


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
        )
    if isinstance(model, BlockFMA):
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
            model.operand_emin if model.operand_emin is not None else -1074,
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
        return max(_exponent(a), ap.opnd_emin) + max(_exponent(b), ap.opnd_emin)
    return _exponent(p)


@jit
def _block_step(c, a, b, lo, hi, ap):
    """One tensor-core step: c and the exact products a[k]*b[k], k in [lo, hi), aligned to the largest exponent,
    truncated to F fraction bits, summed exactly, normalized and rounded once into the accumulator format."""
    special = c - c != 0.0
    emax = np.int64(-100000)
    if c != 0.0 and not special:
        emax = _exponent(c)
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


def dot(a: np.ndarray, b: np.ndarray, c: float = 0.0, *, acc: Model | Interleaved) -> float:
    """Emulated ``c + a . b`` of two 1-D arrays under an accumulation model (Interleaved: k reordered)."""
    a64 = _as_float_array(a, "a")
    b64 = _as_float_array(b, "b")
    if a64.ndim != 1 or b64.shape != a64.shape:
        raise ValueError(f"dot needs two 1-D arrays of equal length, got {a.shape} and {b.shape}")
    if isinstance(acc, Interleaved):
        order = acc.order(a64.shape[0])
        a64, b64, acc = a64[order], b64[order], acc.inner
    return float(dot_acc(a64, b64, float(c), acc_params(acc)))
