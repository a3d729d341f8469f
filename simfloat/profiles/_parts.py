"""A profile's parts, one per GPU unit it models: tensor cores (:class:`DotPart`), exp2, tl.exp, tl.sum and the
instruction facts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from simfloat.accumulate import BlockFMA, Chunked, Interleaved, Sequential
from simfloat.hardware import SumOrder
from simfloat.profiles._models import _MODELS
from simfloat.profiles._status import PUBLISHED, _check_status

#: the operand formats a profile's tensor-core parts are keyed by (``simfloat.formats`` names)
DOT_FORMATS = ("bf16", "fp16", "tf32", "e4m3", "e5m2")
#: the MMA instructions a part can describe
MMAS = ("wgmma", "mma.sync", "tcgen05", "any")


@dataclass(frozen=True)
class DotPart:
    """The tensor-core model of ``tl.dot`` for one operand format and MMA instruction.

    Attributes:
        input_format: operand format, one of :data:`DOT_FORMATS`.
        mma: ``"wgmma"`` (Triton's choice for block_m >= 64 on sm_90), ``"mma.sync"`` (smaller tiles, other
            archs), ``"tcgen05"`` (sm_100) or ``"any"`` (the model holds for every instruction of the arch).
        model: the accumulation model (block, fraction bits, alignment, output rounding, operand conversion;
            split-k as :class:`~simfloat.accumulate.Chunked`; fp8 through fp16 mma.sync as
            :class:`~simfloat.accumulate.Interleaved`).
        shapes: the probe tiles ``"MxNxK"`` it was measured on (empty when published).
        status: see the module docstring.
    """

    input_format: str
    mma: str
    model: Sequential | BlockFMA | Chunked | Interleaved
    shapes: tuple[str, ...] = ()
    status: str = PUBLISHED

    def __post_init__(self) -> None:
        if self.input_format not in DOT_FORMATS:
            raise ValueError(f"DotPart.input_format must be one of {DOT_FORMATS}, got {self.input_format!r}")
        if self.mma not in MMAS:
            raise ValueError(f"DotPart.mma must be one of {MMAS}, got {self.mma!r}")
        if not isinstance(self.model, tuple(_MODELS.values())):
            raise TypeError(f"DotPart.model must be an accumulation model, got {type(self.model).__name__}")
        object.__setattr__(self, "shapes", tuple(str(s) for s in self.shapes))
        _check_status(self.status, "DotPart")


@dataclass(frozen=True)
class Exp2Part:
    """``exp2`` (``ex2.approx``): a table of ulp offsets (see :mod:`simfloat.hardware`) or correctly rounded.

    Attributes:
        model: ``"table"`` or ``"correctly_rounded"``.
        table: with ``"table"``: the file name of the packed table (next to the profile's JSON).
        sha256: with ``"table"``: :func:`simfloat.hardware.ex2_table_sha256` of its entries.
        ftz: the instruction flushes subnormal inputs and outputs (``.ftz``).
        status: see the module docstring.
    """

    model: str
    table: str | None = None
    sha256: str | None = None
    ftz: bool = True
    status: str = PUBLISHED

    def __post_init__(self) -> None:
        if self.model not in ("table", "correctly_rounded"):
            raise ValueError(f"Exp2Part.model must be 'table' or 'correctly_rounded', got {self.model!r}")
        if (self.model == "table") != (self.table is not None and self.sha256 is not None):
            raise ValueError("Exp2Part: model 'table' needs table= and sha256=, and only it takes them")
        if not isinstance(self.ftz, bool):
            raise TypeError(f"Exp2Part.ftz must be a bool, got {type(self.ftz).__name__}")
        _check_status(self.status, "Exp2Part")


@dataclass(frozen=True)
class ExpPart:
    """``tl.exp``.

    Attributes:
        model: ``"exp2_of_scaled"``: ex2(rn32(x * rn32(log2 e))) with the profile's exp2, not flushed (Triton's
            lowering), or ``"correctly_rounded"``.
        status: see the module docstring.
    """

    model: str
    status: str = PUBLISHED

    def __post_init__(self) -> None:
        if self.model not in ("exp2_of_scaled", "correctly_rounded"):
            raise ValueError(f"ExpPart.model must be 'exp2_of_scaled' or 'correctly_rounded', got {self.model!r}")
        _check_status(self.status, "ExpPart")


@dataclass(frozen=True)
class SumPart:
    """The order of ``tl.sum(x, axis=1)`` over a tile in one layout.

    Attributes:
        layout: ``"mma"`` (the tensor-core accumulator layout: the flash kernel's P and its row sum l_ij) or
            ``"blocked"`` (a loaded tile).
        rule: the order as a ``Plan.sum_order`` value (``"h200-mma"``, ``"sequential"``), or ``None`` when no
            known rule reproduces the probes (``tree`` then holds the measured tree of one shape).
        shapes: the probe tiles ``"MxN"``.
        tree: the measured reduction tree (nested tuples of column indices) of the widest shape, as text.
        status: see the module docstring.
    """

    layout: str
    rule: str | None
    shapes: tuple[str, ...] = ()
    tree: str = ""
    status: str = PUBLISHED

    def __post_init__(self) -> None:
        if self.layout not in ("mma", "blocked"):
            raise ValueError(f"SumPart.layout must be 'mma' or 'blocked', got {self.layout!r}")
        object.__setattr__(self, "shapes", tuple(str(s) for s in self.shapes))
        _check_status(self.status, "SumPart")

    def order(self) -> SumOrder:
        """The part's rule as a plan's ``sum_order`` value (:class:`simfloat.hardware.SumOrder`: the order and
        its warp-layout rule).

        Raises:
            ValueError: the part has no rule (no known rule reproduces the probes).
        """
        if self.rule is None:
            raise ValueError(f"the tl.sum part of the {self.layout} layout has no rule ({self.status})")
        return SumOrder(self.rule)


@dataclass(frozen=True)
class IsaPart:
    """Facts read off the compiled flash kernels (PTX/SASS).

    Attributes:
        fma_contraction: ``qk*scale - m`` compiles to one fused multiply-add (``Plan.contract``).
        exp2_instruction: the instruction of ``tl.math.exp2`` (e.g. ``"ex2.approx.ftz.f32"``).
        division: the instruction of the final ``acc / l`` (e.g. ``"div.rn.f32"``: IEEE).
        kernels: per compiled kernel, the facts as recorded.
        status: see the module docstring (measured parts: ``N/N`` kernels agree on the facts).
    """

    fma_contraction: bool
    exp2_instruction: str
    division: str
    kernels: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    status: str = PUBLISHED

    def __post_init__(self) -> None:
        if not isinstance(self.fma_contraction, bool):
            raise TypeError(f"IsaPart.fma_contraction must be a bool, got {type(self.fma_contraction).__name__}")
        _check_status(self.status, "IsaPart")
