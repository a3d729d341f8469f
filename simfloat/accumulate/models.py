"""Accumulation models (what each rounding of a dot product does).

The model classes are data: :class:`Sequential`, :class:`BlockFMA`, :class:`Chunked`, :class:`Interleaved`
(the tensor-core presets built from them: :mod:`simfloat.accumulate.presets`); :func:`acc_params` flattens a
model into the :class:`AccParams` record the njit kernels read (:mod:`simfloat.accumulate.scalar`,
:mod:`simfloat.accumulate._rows`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

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
    "acc_params",
    "split_k",
]

ZERO_U64 = np.uint64(0)
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
            tests/fixtures/gpu/h200/probes; docs/results/h200-validation.md gives how closely each model
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
        acc_add: how the incoming accumulator enters a block. ``"fused"``: as one of its aligned terms (every
            tensor-core kind MMA-Sim models). A rounding mode (``"nearest_even"``): the block's products are
            summed from zero (aligned, truncated, rounded into ``out_fmt`` with ``out_mode``) and the
            accumulator is added to that sum in one addition rounded with this mode (B200's ``mma.sync`` on fp8
            operands: tests/fixtures/tensor_cores). The vector engine runs it as a :class:`Chunked` model of
            one block per chunk; a Chunked model cannot take such a BlockFMA as its inner model.
        overflow: a block sum beyond the output format's range. ``"round"`` (default): what the output
            rounding gives under IEEE 754 (toward zero: +-the largest finite value; to nearest: +-inf).
            ``"inf"``: +-inf whatever the rounding (MMA-Sim's result). No measurement settles which the hardware
            does (the GPU job's ``overflow`` probe asks it); the default keeps the IEEE rule of the modelled
            rounding.
        zero_sign: the sign of a nonzero block sum that rounds to zero (below the output format's smallest
            step). ``"exact"`` (default): the exact sum's sign, as IEEE 754 gives it (a negative sum gives
            -0.0). ``"positive"``: +0.0 (MMA-Sim adds +0.0 to every result, on purpose). Unsettled by
            measurement as ``overflow`` (the probe ``negative_tiny``).
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
    acc_add: RoundingMode | str = "fused"
    overflow: str = "round"
    zero_sign: str = "exact"

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
        if self.overflow not in ("round", "inf"):
            raise ValueError(f"BlockFMA.overflow must be 'round' or 'inf', got {self.overflow!r}")
        if self.zero_sign not in ("exact", "positive"):
            raise ValueError(f"BlockFMA.zero_sign must be 'exact' or 'positive', got {self.zero_sign!r}")
        if self.acc_add != "fused":
            _check_fields(self, (), ("acc_add",))
            if self.scale_block:
                raise ValueError("BlockFMA: acc_add other than 'fused' is not modelled for block-scaled kinds")
        _check_fields(self, ("out_fmt", "input_fmt"), ("out_mode", "input_mode"))

    @property
    def fused(self) -> bool:
        """Whether the accumulator is a term of each block (``acc_add == "fused"``)."""
        return self.acc_add == "fused"


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
        if isinstance(self.inner, BlockFMA) and not self.inner.fused:
            raise ValueError(
                "Chunked.inner: a BlockFMA whose acc_add is not 'fused' is itself one chunk per block; "
                "use its fused form (dataclasses.replace(model, acc_add='fused')) inside Chunked"
            )
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
        inner: the model of each step (``block`` must divide ``chunk``; ``group`` must divide ``block``), or a
            :class:`Chunked` of such a BlockFMA whose chunk is a multiple of ``chunk`` (each chunk's steps from
            zero, the result added to the accumulator: the fp16 results of sm90/sm100 ``mma.sync`` on fp8).
        chunk: k per chunk; K must be a multiple of it.
        group: consecutive k kept together.
    """

    inner: BlockFMA | Chunked
    chunk: int = 32
    group: int = 2

    def __post_init__(self) -> None:
        step = self.inner.inner if isinstance(self.inner, Chunked) else self.inner
        if not isinstance(step, BlockFMA):
            raise TypeError(
                f"Interleaved.inner must be a BlockFMA or a Chunked of one, got {type(self.inner).__name__}"
            )
        for name in ("chunk", "group"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Interleaved.{name} must be a positive int, got {value!r}")
        if self.chunk % step.block or step.block % self.group:
            raise ValueError(
                f"Interleaved needs inner.block ({step.block}) to divide chunk ({self.chunk}) "
                f"and group ({self.group}) to divide inner.block"
            )
        if isinstance(self.inner, Chunked) and (self.inner.chunk is None or self.inner.chunk % self.chunk):
            raise ValueError(
                f"Interleaved: an inner Chunked needs a chunk that is a multiple of {self.chunk}, got "
                f"{'splits' if self.inner.chunk is None else self.inner.chunk}"
            )

    @property
    def step(self) -> BlockFMA:
        """The BlockFMA each step runs (``inner``, or the inner model of a Chunked ``inner``)."""
        return self.inner.inner if isinstance(self.inner, Chunked) else self.inner  # type: ignore[return-value]

    def order(self, k: int) -> np.ndarray:
        """The permutation of range(k) in the order the steps read it.

        Raises:
            ValueError: k is not a multiple of ``chunk``.
        """
        if k % self.chunk:
            raise ValueError(f"Interleaved: K = {k} is not a multiple of chunk = {self.chunk}")
        steps = self.chunk // self.step.block
        groups = np.arange(self.chunk).reshape(self.chunk // self.group, self.group)
        one = np.concatenate([groups[s::steps].reshape(-1) for s in range(steps)])
        return (np.arange(0, k, self.chunk)[:, None] + one[None, :]).reshape(-1)


Model = Sequential | BlockFMA | Chunked


def split_k(splits: int, inner: Sequential | BlockFMA = Sequential(), outer_fmt: str = "float32") -> Chunked:
    """Split-k: k cut into ``splits`` equal parts accumulated separately, then combined in order."""
    return Chunked(splits=splits, inner=inner, outer_fmt=outer_fmt)


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
    ovf_lim: float  # a block sum of at least this magnitude gives +-inf (BlockFMA.overflow "inf"; else inf)
    pos_zero: bool  # a block sum that rounds to zero gives +0.0 (BlockFMA.zero_sign "positive")


def _overflow_limit(fmt: FloatFormat) -> float:
    """2**(emax + 1) of a format: the least magnitude beyond its range whatever the rounding."""
    return float(2.0 ** (int(np.floor(np.log2(fmt.params.max_value))) + 1))


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
            np.inf,
            False,
        )
    if isinstance(model, BlockFMA):
        emin_a = model.operand_emin if model.operand_emin is not None else -1074
        acc = _format(model.out_fmt)
        if not model.fused:  # the accumulator added after each block: one chunk per block, from zero
            chunk, outer, outer_mode = model.block, acc, mode_code(model.acc_add)
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
            _overflow_limit(acc) if model.overflow == "inf" else np.inf,
            model.zero_sign == "positive",
        )
    if isinstance(model, Interleaved):
        raise TypeError(
            "an Interleaved model reorders k; matmul and dot apply it, the njit kernels take "
            "Sequential, BlockFMA or Chunked (use its inner model on operands in Interleaved.order)"
        )
    raise TypeError(f"accumulation model must be Sequential, BlockFMA or Chunked, got {type(model).__name__}")
