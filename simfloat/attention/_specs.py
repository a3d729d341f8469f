"""The entries of a precision plan: :class:`OpSpec` (a scalar op: format + rounding mode), the checks that turn
a plan's entry (a format name, ``(format, mode)``, an accumulation or sum model) into its field value, the
row-sum model :func:`sum_once`, and :class:`OpParams` (an OpSpec for compiled code). Shared by the forward and
backward plans and by the quantizers (:mod:`simfloat.attention.quant_plan`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from simfloat.accumulate import BlockFMA, Chunked, Model, Sequential, acc_params
from simfloat.formats import FloatFormat, FormatParams
from simfloat.formats import format as _format
from simfloat.rounding import RoundingMode, mode_code

__all__ = ["OpParams", "OpSpec", "sum_once"]

_BIG_CHUNK = 1 << 40  # one chunk: "accumulate, then round the result once into outer_fmt"


def _checked_format(fmt: object, what: str) -> FloatFormat:
    if not isinstance(fmt, (str, FloatFormat)):
        raise TypeError(f"{what}: expected a format (FloatFormat or name), got {type(fmt).__name__}")
    f = _format(fmt)
    if f.emin - f.mantissa_bits < -1074 or f.emax > 1023:
        raise ValueError(f"{what}: format {f.name} has values outside float64's range")
    return f


def _checked_mode(mode: object, what: str) -> RoundingMode:
    m = mode_code(mode)  # type: ignore[arg-type]  # mode_code raises TypeError for other types
    if m == RoundingMode.STOCHASTIC:
        raise ValueError(f"{what}: stochastic rounding is not supported in attention plans")
    return m


@dataclass(frozen=True)
class OpSpec:
    """One scalar operation: its exact result is rounded once into ``fmt`` with ``mode``.

    Attributes:
        fmt: target format (a :class:`FloatFormat`; names such as ``"bf16"`` are accepted).
        mode: rounding mode (any but stochastic).
    """

    fmt: FloatFormat
    mode: RoundingMode = RoundingMode.NEAREST_EVEN

    if TYPE_CHECKING:  # what the generated __init__ accepts: __post_init__ turns names into the field types

        def __init__(self, fmt: FloatFormat | str, mode: RoundingMode | str | int = RoundingMode.NEAREST_EVEN) -> None:
            pass

    def __post_init__(self) -> None:
        object.__setattr__(self, "fmt", _checked_format(self.fmt, "OpSpec.fmt"))
        object.__setattr__(self, "mode", _checked_mode(self.mode, "OpSpec.mode"))

    def __str__(self) -> str:
        rn = self.mode == RoundingMode.NEAREST_EVEN
        return self.fmt.name + ("" if rn else f"/{self.mode.name.lower()}")


def _scalar_spec(name: str, value: object) -> OpSpec:
    if isinstance(value, OpSpec):
        return value
    if isinstance(value, (str, FloatFormat)):
        return OpSpec(value)
    if isinstance(value, tuple) and len(value) == 2:
        return OpSpec(*value)
    is_model = isinstance(value, (Sequential, BlockFMA, Chunked))
    hint = " (accumulation models are for 'qk' and 'pv')" if is_model else ""
    raise TypeError(f"op {name!r} takes a format, (format, mode) or OpSpec, got {type(value).__name__}{hint}")


def _models(m: Model) -> tuple[Sequential | BlockFMA, ...]:
    return (m.inner,) if isinstance(m, Chunked) else (m,)


def _dot_spec(name: str, value: object) -> Model:
    if isinstance(value, (str, FloatFormat)):
        value = (value, RoundingMode.NEAREST_EVEN)
    if isinstance(value, tuple) and len(value) == 2:
        f = _checked_format(value[0], f"op {name!r}")
        return Sequential(f, _checked_mode(value[1], f"op {name!r}"), product_fmt=f)
    if not isinstance(value, (Sequential, BlockFMA, Chunked)):
        raise TypeError(
            f"op {name!r} takes an accumulation model (Sequential, BlockFMA, Chunked), a format or "
            f"(format, mode), got {type(value).__name__}"
        )
    acc_params(value)  # validates formats and modes
    for inner in _models(value):
        m = inner.mode if isinstance(inner, Sequential) else inner.out_mode
        _checked_mode(m, f"op {name!r}")
    return value


def sum_once(
    fmt: FloatFormat | str, mode: RoundingMode | str = "nearest_even", acc: FloatFormat | str = "float32"
) -> Chunked:
    """The row-sum model "accumulate in ``acc``, round the result once into ``fmt``" (as a torch reduction
    of a low-precision tensor does: float32 partial sums, one cast), for a plan's ``l_ij``.

    Args:
        fmt: the format of the sum's result; mode: its rounding.
        acc: the format of the partial sums (each addition rounded to nearest even into it).

    Returns:
        a :class:`~simfloat.accumulate.Chunked` model with one chunk.
    """
    return Chunked(_BIG_CHUNK, Sequential(acc), outer_fmt=fmt, outer_mode=mode)


def _sum_spec(name: str, value: object) -> Sequential | Chunked:
    """A row-sum model: a format / (format, mode) / OpSpec (sequential: each addition rounded into it), a
    :class:`Sequential` without product or input formats, or a one-level :class:`Chunked` of such a model."""
    if isinstance(value, OpSpec):
        value = (value.fmt, value.mode)
    if isinstance(value, (str, FloatFormat)):
        value = (value, RoundingMode.NEAREST_EVEN)
    if isinstance(value, tuple) and len(value) == 2:
        f = _checked_format(value[0], f"op {name!r}")
        return Sequential(f, _checked_mode(value[1], f"op {name!r}"))
    if isinstance(value, Chunked):
        if value.splits is not None:
            raise ValueError(f"op {name!r}: a row sum takes Chunked(chunk=...), not splits (the tile decides k)")
        inner = _sum_spec(name, value.inner)
        if not isinstance(inner, Sequential):
            raise ValueError(f"op {name!r}: a Chunked row sum takes a Sequential inner model")
        f = _checked_format(value.outer_fmt, f"op {name!r}: outer_fmt")
        m = _checked_mode(value.outer_mode, f"op {name!r}: outer_mode")
        return Chunked(value.chunk, inner, outer_fmt=f, outer_mode=m)
    if isinstance(value, Sequential):
        if value.product_fmt is not None or value.input_fmt is not None:
            raise ValueError(
                f"op {name!r} sums P: its Sequential model takes no product_fmt or input_fmt (each term is added "
                "exactly, then the sum rounded)"
            )
        f = _checked_format(value.fmt, f"op {name!r}")
        return Sequential(f, _checked_mode(value.mode, f"op {name!r}"))
    raise TypeError(
        f"op {name!r} takes a format, (format, mode), OpSpec, Sequential or Chunked (see sum_once), "
        f"got {type(value).__name__}"
    )


class OpParams(NamedTuple):
    """An :class:`OpSpec` for compiled code."""

    p: FormatParams
    mode: int
