"""Typed result records of the validation campaign: one :class:`ValidationRecord` per forward config compared
(kernel against emulator, or recorded fixture against emulator), one :class:`BackwardRecord` per backward
config. Records are frozen dataclasses with typed fields; they are turned into text only at the edge:
``to_csv_row()`` / ``from_csv_row()`` (validation.csv, backward.csv) and ``to_json()`` / ``from_json()``
(the GPU job's summary.json).

A field that was not measured (a comparison that did not run, a kernel-only config) is ``None``; in CSV it is
the empty cell. Errors against the float64 reference are kept at full precision and written with four
significant digits (``%.3e``), as the reports always showed them; every other float is written as Python's
shortest round-trip repr, so ``from_csv_row`` gives back exactly what ``to_csv_row`` wrote.

This module imports only the standard library: the GPU job (:mod:`simfloat_gpu.campaign.gpu_run`) builds records
without simfloat's numerics being needed.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

__all__ = ["CONFIG_FIELDS", "BackwardRecord", "KernelRecord", "Record", "ValidationRecord"]

_R = TypeVar("_R", bound="Record")

#: field metadata key: the format of a float field in CSV / JSON text (default: repr)
_TEXT = "text"


def _e3(default: float | None = None) -> Any:
    """A float field written with four significant digits (``%.3e``)."""
    return dataclasses.field(default=default, metadata={_TEXT: ".3e"})


def _base_type(hint: Any) -> tuple[type, bool]:
    """(the scalar type, whether None is allowed) of a field's type hint: ``int``, ``float | None``, ..."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"record fields are one scalar type or that type | None, not {hint}")
        return args[0], True
    return hint, False


@dataclasses.dataclass(frozen=True)
class Record:
    """Base of the campaign's records: type checks at construction, CSV and JSON at the edge."""

    #: per subclass: field name -> (scalar type, None allowed), read from the annotations once
    _types: ClassVar[dict[str, tuple[type, bool]]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._types = {}  # filled lazily: the dataclass decorator runs after __init_subclass__

    @classmethod
    def _field_types(cls) -> dict[str, tuple[type, bool]]:
        if not cls._types:
            hints = typing.get_type_hints(cls)
            cls._types = {f.name: _base_type(hints[f.name]) for f in dataclasses.fields(cls)}
        return cls._types

    @classmethod
    def csv_fields(cls) -> tuple[str, ...]:
        """The CSV columns, in field order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    def __post_init__(self) -> None:
        for name, (typ, optional) in self._field_types().items():
            value = getattr(self, name)
            if value is None and optional:
                continue
            if typ is float and isinstance(value, int) and not isinstance(value, bool):
                object.__setattr__(self, name, float(value))  # 1 is a valid agreement; stored as 1.0
                continue
            ok = isinstance(value, typ) and not (typ is int and isinstance(value, bool))
            if not ok:
                raise TypeError(
                    f"{type(self).__name__}.{name} must be {typ.__name__}{' or None' if optional else ''}, "
                    f"got {value!r} ({type(value).__name__})"
                )

    # ------------------------------------------------------------------------------------------------
    # CSV
    # ------------------------------------------------------------------------------------------------

    def to_csv_row(self) -> dict[str, str]:
        """The record as one CSV row (``csv.DictWriter`` with :meth:`csv_fields`): ``None`` is the empty
        cell, booleans ``True`` / ``False``, error fields ``%.3e``."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None:
                out[f.name] = ""
            elif isinstance(value, float) and _TEXT in f.metadata:
                out[f.name] = format(value, f.metadata[_TEXT])
            else:
                out[f.name] = str(value)
        return out

    def table_cell(self, name: str) -> str:
        """Field ``name`` as a cell of a Markdown or text table: as in CSV, other floats with four
        significant digits (``%.4g``)."""
        value = getattr(self, name)
        if isinstance(value, float):
            f = next(f for f in dataclasses.fields(self) if f.name == name)
            return format(value, f.metadata.get(_TEXT, ".4g"))
        return "" if value is None else str(value)

    @classmethod
    def from_csv_row(cls: type[_R], row: Mapping[str, Any]) -> _R:
        """A record from a CSV row (``csv.DictReader``) or a mapping of such text cells (a typed value is taken
        as it is). Columns the record does not have are ignored; a missing or empty optional column is
        ``None``.

        Raises:
            ValueError: a missing required column, or a cell that is not a value of its field's type (the
                message names the column).
        """
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            typ, optional = cls._field_types()[f.name]
            has_default = f.default is not dataclasses.MISSING
            raw = row.get(f.name)
            if raw is None or raw == "":
                if optional:
                    kwargs[f.name] = None
                elif raw == "" and typ is str:
                    kwargs[f.name] = ""
                elif has_default:
                    kwargs[f.name] = f.default
                else:
                    raise ValueError(f"{cls.__name__}: column {f.name!r} is missing or empty")
                continue
            kwargs[f.name] = _parse(cls.__name__, f.name, typ, raw)
        return cls(**kwargs)

    # ------------------------------------------------------------------------------------------------
    # JSON
    # ------------------------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON-ready dict of typed values (``None`` -> null; NaN and infinities, which JSON
        lacks, as the strings ``nan``, ``inf``, ``-inf``)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = repr(value) if isinstance(value, float) and not math.isfinite(value) else value
        return out

    @classmethod
    def from_json(cls: type[_R], data: Mapping[str, Any]) -> _R:
        """A record from :meth:`to_json`'s dict; also reads the string-cell rows that earlier versions wrote
        into summary.json (empty strings for missing values, errors as ``%.3e`` text).

        Raises:
            ValueError: as :meth:`from_csv_row`.
        """
        return cls.from_csv_row(data)


def _parse(record: str, name: str, typ: type, raw: Any) -> Any:
    if not isinstance(raw, str):
        return raw  # a typed value (JSON); __post_init__ checks it
    try:
        if typ is bool:
            if raw not in ("True", "False"):
                raise ValueError(raw)
            return raw == "True"
        if typ is int:
            return int(raw)
        if typ is float:
            return float(raw)
        return raw
    except ValueError:
        raise ValueError(f"{record}: column {name!r} must be {typ.__name__}, got {raw!r}") from None


#: the config fields every record declares (name -> type), in this order (a test checks both records): the
#: sequence length, head dimension and heads, the tile, the mask, the output ("fp32" or "low", the input format)
CONFIG_FIELDS: dict[str, str] = {
    "seq": "int",
    "head_dim": "int",
    "heads": "int",
    "block_m": "int",
    "block_n": "int",
    "causal": "bool",
    "out": "str",
}


@dataclasses.dataclass(frozen=True)
class ValidationRecord(Record):
    """One forward config compared: the config (:data:`CONFIG_FIELDS` after ``row_sum``), where it ran, the
    emulator plan, and per output the bitwise agreement (fraction of equal elements, 0..1) and the largest
    distance in units in the last place (-1: a non-finite value on one side only).

    Outputs: ``out`` the config's output (fp32 or the input format), ``out32`` the fp32 output, ``m`` and ``l``
    the row statistics m_i and l_i (fp32). ``out32_rel_diff`` is max |kernel - emulator| / max |kernel| of the
    fp32 output; ``*_err_max`` / ``*_err_rms`` the max and RMS error of each side's output against the
    float64 reference; ``*_s`` the seconds each side took. ``status``: ``ok``, ``kernel only: ...``,
    ``error: ...``, ``skipped: ...``.
    """

    id: str
    kind: str
    fmt: str
    variant: str
    row_sum: str
    seq: int
    head_dim: int
    heads: int
    block_m: int
    block_n: int
    causal: bool
    out: str
    seed: int
    backend: str
    plan: str = ""
    status: str = ""
    bitwise_agreement: float | None = None
    max_ulp: int | None = None
    out32_agreement: float | None = None
    out32_max_ulp: int | None = None
    out32_rel_diff: float | None = _e3()
    m_agreement: float | None = None
    m_max_ulp: int | None = None
    l_agreement: float | None = None
    l_max_ulp: int | None = None
    kernel_err_max: float | None = _e3()
    kernel_err_rms: float | None = _e3()
    emulator_err_max: float | None = _e3()
    emulator_err_rms: float | None = _e3()
    kernel_s: float | None = None
    emulator_s: float | None = None

    #: the agreement fields of each output, in the order of the reports
    AGREEMENTS: ClassVar[tuple[str, ...]] = ("bitwise_agreement", "out32_agreement", "m_agreement", "l_agreement")

    @property
    def compared(self) -> bool:
        """Whether the emulator's output was compared with the kernel's."""
        return self.bitwise_agreement is not None

    @property
    def bitwise(self) -> bool:
        """Compared, and every compared output bitwise identical."""
        vals = [getattr(self, k) for k in self.AGREEMENTS]
        return self.compared and all(v == 1.0 for v in vals if v is not None)


@dataclasses.dataclass(frozen=True)
class KernelRecord(ValidationRecord):
    """One config of :func:`simfloat_gpu.campaign.user_kernel.compare_kernel` (a kernel of one's own): a
    :class:`ValidationRecord` (validation.csv's columns unchanged) and the kernel's row statistic where it
    returns a log-sum-exp instead of (m, l): ``stats`` its form ("ml", "lse2": m + log2 l in log2 units, "lse":
    natural units; empty: none returned), ``lse_agreement`` / ``lse_max_ulp`` against the emulator's lse
    computed the same way (fp32), ``lse_rel_diff`` max |kernel - emulator| / max(1, |emulator|). ``status``
    adds ``kernel-wrong: ...`` and ``crashed: ...`` to the ValidationRecord's."""

    stats: str = ""
    lse_agreement: float | None = None
    lse_max_ulp: int | None = None
    lse_rel_diff: float | None = _e3()


@dataclasses.dataclass(frozen=True)
class BackwardRecord(Record):
    """One backward config compared: the config (:data:`CONFIG_FIELDS` after ``fmt``), where it ran, whether the
    emulator's lse equals the kernel's, the bitwise agreement (fraction of equal elements) of dQ, dK, dV and
    delta, the max error relative to the largest float64 gradient of each side (``d*_err`` the kernel's,
    ``emulator_d*_err`` the emulator's), and seconds. ``status``: ``bitwise``, ``differs``, ``kernel only``,
    ``kernel error: ...``, ``emulator error: ...``. ``kv_heads``: the key/value heads (fewer than ``heads``:
    grouped-query attention; empty in CSVs written before the column existed); ``precision``: the dot precision
    of fp32 inputs ("tf32" or "ieee", empty for bf16/fp16); ``plan``: the emulator's backward plan (empty in CSVs
    written before the column existed). The three are the last columns, so older CSVs still load."""

    id: str
    fmt: str
    seq: int
    head_dim: int
    heads: int
    block_m: int
    block_n: int
    causal: bool
    out: str
    backend: str
    status: str = ""
    lse_equal: bool | None = None
    dq_agreement: float | None = None
    dk_agreement: float | None = None
    dv_agreement: float | None = None
    delta_agreement: float | None = None
    dq_err: float | None = None
    dk_err: float | None = None
    dv_err: float | None = None
    emulator_dq_err: float | None = None
    emulator_dk_err: float | None = None
    emulator_dv_err: float | None = None
    kernel_s: float | None = None
    emulator_s: float | None = None
    kv_heads: int | None = None
    precision: str = ""
    plan: str = ""
