"""Hardware profiles: what one GPU run measured (or what is published), in one versioned file.

A :class:`HardwareProfile` holds, per part, a model the emulator can run and a ``status`` saying where it
comes from:

* ``"measured: N/N probes bit-exact"``: fitted from a GPU run, every probe output reproduced;
* ``"measured: inexact (x%)"``: fitted, but only x% of the probe outputs reproduced (plans still use the
  model; it is the best one found, and the status says it is not exact);
* ``"published, not measured"``: taken from the literature (simfloat's published presets).

Parts: tensor-core models per input format and MMA instruction (:class:`DotPart`), the exp2 unit
(:class:`Exp2Part`: ex2.approx as a table of ulp offsets, stored next to the JSON as an xz file named and
checked by sha256), ``tl.exp`` (:class:`ExpPart`), the ``tl.sum`` order per layout (:class:`SumPart`), the
instruction facts read off the compiled kernels (:class:`IsaPart`) and the environment of the run. A part
that was neither measured nor published is absent (``None`` / not listed); a plan built with the profile
keeps ``triton-<fmt>``'s default for it.

Shipped profiles (``simfloat/data/profiles/``): ``h200`` (fitted from tests/fixtures/gpu/h200/probes),
``a100``, ``ada`` and ``blackwell`` (published models only). :func:`load_profile` reads one by name or any
profile file; :func:`save_profile` writes one. ``simfloat.attention.plan("triton-bf16", hardware=profile)``
builds the flash plan of a profile; ``simfloat-gpu fit ... --profile OUT.json`` writes a fitted profile.

File format (``version`` 1): a JSON object ``{"format": "simfloat-hardware-profile", "version": 1, "name",
"arch", "environment", "tensor_cores": [...], "exp2", "exp", "sum": [...], "isa", "notes"}``; accumulation models are
objects ``{"model": "BlockFMA", <field>: <value>...}`` with formats as names (or ``{"float_format": {...}}``
for a format outside the alias table) and rounding modes as names.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simfloat.accumulate import BlockFMA, Chunked, Interleaved, Sequential
from simfloat.formats import FloatFormat
from simfloat.hardware import SUM_RULES as _SUM_RULES
from simfloat.hardware import SumOrder
from simfloat.rounding import RoundingMode

if TYPE_CHECKING:
    from simfloat.hardware import Ex2Table

__all__ = [
    "PROFILE_VERSION",
    "PUBLISHED",
    "DotPart",
    "Exp2Part",
    "ExpPart",
    "HardwareProfile",
    "IsaPart",
    "SumPart",
    "load_profile",
    "loaded_profile",
    "lab_status",
    "measured_status",
    "model_from_json",
    "model_label",
    "model_to_json",
    "register_profile",
    "save_profile",
    "shipped_profiles",
    "SUM_RULES",
    "tl_sum",
]

PROFILE_VERSION = 1
PUBLISHED = "published, not measured"
_FORMAT = "simfloat-hardware-profile"
_DIR = Path(__file__).resolve().parent / "data" / "profiles"
_MODELS = {c.__name__: c for c in (Sequential, BlockFMA, Chunked, Interleaved)}
#: the operand formats a profile's tensor-core parts are keyed by (``simfloat.formats`` names)
DOT_FORMATS = ("bf16", "fp16", "tf32", "e4m3", "e5m2")
#: the MMA instructions a part can describe
MMAS = ("wgmma", "mma.sync", "tcgen05", "any")
#: the status prefix of a part another lab measured (:func:`lab_status`)
LAB = "measured by an independent lab: "


def measured_status(exact: int, total: int) -> str:
    """The status of a fitted part: ``"measured: N/N probes bit-exact"`` only when every one of ``total``
    probe outputs was reproduced, else ``"measured: inexact (x%)"``.

    Raises:
        ValueError: counts that are negative, or ``exact > total``, or ``total == 0``.
    """
    if total <= 0 or exact < 0 or exact > total:
        raise ValueError(f"measured_status: need 0 <= exact <= total and total > 0, got {exact}/{total}")
    if exact == total:
        return f"measured: {exact}/{total} probes bit-exact"
    return f"measured: inexact ({100.0 * exact / total:.4f}%)"


def lab_status(exact: int, total: int, source: str) -> str:
    """The status of a published model that another lab's measurements check: ``"measured by an independent
    lab: N/N (source)"``, N the rows the model reproduces bit for bit of ``total``.

    Raises:
        ValueError: counts that are negative, or ``exact > total``, or ``total == 0``.
    """
    if total <= 0 or exact < 0 or exact > total:
        raise ValueError(f"lab_status: need 0 <= exact <= total and total > 0, got {exact}/{total}")
    return f"{LAB}{exact}/{total} ({source})"


def _check_status(status: object, what: str) -> str:
    if not isinstance(status, str):
        raise TypeError(f"{what}.status must be a string, got {type(status).__name__}")
    if status == PUBLISHED or status.startswith("measured: inexact (") or status.endswith(" probes bit-exact"):
        return status
    if status.startswith(LAB):
        return status
    raise ValueError(
        f"{what}.status must be {PUBLISHED!r}, 'measured: N/N probes bit-exact', 'measured: inexact (x%)' or "
        f"'{LAB}N/N (source)', got {status!r}"
    )


def _is_exact(status: str) -> bool:
    if status.startswith(LAB):
        n, _, total = status[len(LAB) :].partition(" ")[0].partition("/")
        return n == total
    return status.startswith("measured: ") and status.endswith(" probes bit-exact")


# -- accumulation models <-> JSON ------------------------------------------------------------------------------


def _value_to_json(v: object) -> object:
    if isinstance(v, RoundingMode):
        return {"mode": v.name.lower()}
    if isinstance(v, FloatFormat):
        return {"float_format": dataclasses.asdict(v)}
    if isinstance(v, (Sequential, BlockFMA, Chunked, Interleaved)):
        return model_to_json(v)
    if v is None or isinstance(v, (str, int, bool)):
        return v
    raise TypeError(f"cannot write a model field of type {type(v).__name__}")


def _value_from_json(v: object) -> object:
    if isinstance(v, dict):
        if "model" in v:
            return model_from_json(v)
        if set(v) == {"mode"}:
            return RoundingMode[str(v["mode"]).upper()]
        if set(v) == {"float_format"}:
            return FloatFormat(**v["float_format"])
        raise ValueError(f"unknown model field value {v!r}")
    return v


def model_to_json(model: Sequential | BlockFMA | Chunked | Interleaved) -> dict[str, Any]:
    """An accumulation model as a JSON object (every field, values as given: a round trip through
    :func:`model_from_json` gives an equal model)."""
    if not isinstance(model, tuple(_MODELS.values())):
        raise TypeError(f"not an accumulation model: {type(model).__name__}")
    out: dict[str, Any] = {"model": type(model).__name__}
    for f in dataclasses.fields(model):
        out[f.name] = _value_to_json(getattr(model, f.name))
    return out


def model_from_json(obj: Mapping[str, Any]) -> Sequential | BlockFMA | Chunked | Interleaved:
    """The model of :func:`model_to_json`.

    Raises:
        ValueError: unknown model kind or field (the message names it).
    """
    kind = obj.get("model")
    if kind not in _MODELS:
        raise ValueError(f"unknown accumulation model {kind!r}; known: {', '.join(_MODELS)}")
    cls = _MODELS[kind]
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(obj) - names - {"model"})
    if unknown:
        raise ValueError(f"{kind}: unknown fields {unknown}; fields: {', '.join(sorted(names))}")
    fields: dict[str, Any] = {k: _value_from_json(v) for k, v in obj.items() if k != "model"}
    return cls(**fields)


# -- parts -----------------------------------------------------------------------------------------------------


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


@dataclass(frozen=True)
class HardwareProfile:
    """One GPU's numerics (see the module docstring).

    Attributes:
        name: short name (``"h200"``); plans built with the profile are named ``triton-<fmt>@<name>``.
        arch: compute capability as ``"sm90"``.
        environment: GPU, driver, CUDA, torch, triton of the run (strings).
        tensor_cores: the tensor-core parts (at most one per input format and MMA).
        exp2: the exp2 part, or ``None`` (correctly rounded assumed, unmeasured).
        exp: the tl.exp part, or ``None``.
        sums: the tl.sum parts (at most one per layout).
        isa: the instruction facts, or ``None``.
        notes: free text: what the profile leaves out and why.
        directory: where the profile's tables are read from (the JSON's folder; not part of equality).
    """

    name: str
    arch: str
    environment: Mapping[str, str] = field(default_factory=dict)
    tensor_cores: tuple[DotPart, ...] = ()
    exp2: Exp2Part | None = None
    exp: ExpPart | None = None
    sums: tuple[SumPart, ...] = ()
    isa: IsaPart | None = None
    notes: tuple[str, ...] = ()
    directory: Path | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or "-" in self.name:
            raise ValueError(f"HardwareProfile.name must be a non-empty string without '-', got {self.name!r}")
        object.__setattr__(self, "tensor_cores", tuple(self.tensor_cores))
        object.__setattr__(self, "sums", tuple(self.sums))
        object.__setattr__(self, "notes", tuple(str(n) for n in self.notes))
        keys = [(d.input_format, d.mma) for d in self.tensor_cores]
        if len(set(keys)) != len(keys):
            raise ValueError(f"HardwareProfile.tensor_cores: more than one part for one (format, mma): {keys}")
        layouts = [s.layout for s in self.sums]
        if len(set(layouts)) != len(layouts):
            raise ValueError(f"HardwareProfile.sums: more than one part for one layout: {layouts}")

    def dot(self, input_format: str, mma: str | None = None) -> DotPart | None:
        """The tensor-core part for ``input_format`` (one of :data:`DOT_FORMATS`) and ``mma`` (None: the
        ``"wgmma"`` part, else ``"tcgen05"``, else ``"any"``, else ``"mma.sync"``), or ``None``."""
        order = (mma,) if mma is not None else ("wgmma", "tcgen05", "any", "mma.sync")
        for m in order:
            for d in self.tensor_cores:
                if d.input_format == input_format and (d.mma == m or (mma is not None and d.mma == "any")):
                    return d
        return None

    def sum(self, layout: str) -> SumPart | None:
        """The tl.sum part of ``layout`` (``"mma"`` or ``"blocked"``), or ``None``."""
        return next((s for s in self.sums if s.layout == layout), None)

    def exp2_impl(self) -> str | Ex2Table:
        """The ``Plan.exp2_impl`` value of the exp2 part: ``"correctly_rounded"`` (no part, or that model), else
        the table as a :class:`simfloat.hardware.Ex2Table` value (the shipped H200 table:
        :func:`simfloat.hardware.h200_ex2`; another: read and checked against its sha256), which a plan
        carries to any process.

        Raises:
            ValueError: the table file is missing or its sha256 differs from the profile's.
        """
        part = self.exp2
        if part is None or part.model == "correctly_rounded":
            return "correctly_rounded"
        from simfloat import hardware

        if part.sha256 == hardware.H200_EX2_SHA256:
            return hardware.h200_ex2()
        return hardware.ex2_table_value(self.ex2_table())

    def ex2_table(self) -> Any:
        """The exp2 part's table (int8[2^24], :func:`simfloat.hardware.ex2_table`'s layout).

        Raises:
            ValueError: no table part, the file is missing, or its sha256 differs from the profile's.
        """
        part = self.exp2
        if part is None or part.table is None:
            raise ValueError(f"profile {self.name!r} has no exp2 table")
        from simfloat import hardware

        base = self.directory if self.directory is not None else _DIR
        path = base / part.table
        if not path.is_file() and part.table == "ex2_h200.bin.xz":
            path = Path(hardware.__file__).resolve().parent / "data" / part.table
        if not path.is_file():
            raise ValueError(f"profile {self.name!r}: exp2 table {part.table!r} not found next to the profile")
        table = hardware.unpack_ex2_table(path.read_bytes(), str(part.table))
        sha = hardware.ex2_table_sha256(table)
        if sha != part.sha256:
            raise ValueError(
                f"profile {self.name!r}: exp2 table {part.table!r} has sha256 {sha}, expected {part.sha256}"
            )
        return table

    def to_json(self) -> dict[str, Any]:
        """The profile as the JSON object of the file format (see the module docstring)."""

        def part(p: Any) -> Any:
            if p is None:
                return None
            out: dict[str, Any] = {}
            for f in dataclasses.fields(p):
                v = getattr(p, f.name)
                if f.name == "model" and not isinstance(v, str):
                    v = model_to_json(v)
                elif isinstance(v, tuple):
                    v = list(v)
                elif isinstance(v, Mapping):
                    v = {k: dict(x) if isinstance(x, Mapping) else x for k, x in v.items()}
                out[f.name] = v
            return out

        return {
            "format": _FORMAT,
            "version": PROFILE_VERSION,
            "name": self.name,
            "arch": self.arch,
            "environment": dict(self.environment),
            "tensor_cores": [part(d) for d in self.tensor_cores],
            "exp2": part(self.exp2),
            "exp": part(self.exp),
            "sum": [part(s) for s in self.sums],
            "isa": part(self.isa),
            "notes": list(self.notes),
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], directory: Path | None = None) -> HardwareProfile:
        """The profile of a JSON object (see :meth:`to_json`).

        Raises:
            ValueError: not a profile, an unsupported version, or a bad part (the message names it).
        """
        if not isinstance(obj, Mapping) or obj.get("format") != _FORMAT:
            raise ValueError(f'not a hardware profile (expected "format": {_FORMAT!r})')
        if obj.get("version") != PROFILE_VERSION:
            raise ValueError(f"hardware profile version {obj.get('version')!r}; this simfloat reads {PROFILE_VERSION}")
        known = {
            "format",
            "version",
            "name",
            "arch",
            "environment",
            "tensor_cores",
            "exp2",
            "exp",
            "sum",
            "isa",
            "notes",
        }
        unknown = sorted(set(obj) - known)
        if unknown:
            raise ValueError(f"hardware profile: unknown keys {unknown}")

        def make(kind: type, v: Any, what: str) -> Any:
            if v is None:
                return None
            try:
                kw = dict(v)
                if kind is DotPart:
                    kw["model"] = model_from_json(kw["model"])
                return kind(**kw)
            except (TypeError, ValueError, KeyError) as exc:
                raise ValueError(f"hardware profile {obj.get('name')!r}, {what}: {exc}") from None

        return cls(
            name=str(obj.get("name", "")),
            arch=str(obj.get("arch", "")),
            environment={str(k): str(v) for k, v in (obj.get("environment") or {}).items()},
            tensor_cores=tuple(
                make(DotPart, d, f"tensor_cores[{i}]") for i, d in enumerate(obj.get("tensor_cores") or [])
            ),
            exp2=make(Exp2Part, obj.get("exp2"), "exp2"),
            exp=make(ExpPart, obj.get("exp"), "exp"),
            sums=tuple(make(SumPart, s, f"sum[{i}]") for i, s in enumerate(obj.get("sum") or [])),
            isa=make(IsaPart, obj.get("isa"), "isa"),
            notes=tuple(obj.get("notes") or ()),
            directory=directory,
        )

    def report(self) -> str:
        """One line per part: what it is and its status."""
        lines = [f"profile {self.name} ({self.arch}; {self.environment.get('gpu', 'no environment recorded')})"]
        for d in self.tensor_cores:
            lines.append(f"  tensor core {d.input_format:5s} {d.mma:9s} {model_label(d.model)}: {d.status}")
        if self.exp2 is not None:
            what = f"table {self.exp2.table}" if self.exp2.model == "table" else self.exp2.model
            lines.append(f"  exp2  {what}{' (ftz)' if self.exp2.ftz else ''}: {self.exp2.status}")
        if self.exp is not None:
            lines.append(f"  exp   {self.exp.model}: {self.exp.status}")
        for s in self.sums:
            lines.append(f"  tl.sum {s.layout:7s} rule {s.rule}: {s.status}")
        if self.isa is not None:
            i = self.isa
            lines.append(
                f"  isa   fma contraction {i.fma_contraction}, exp2 {i.exp2_instruction}, division {i.division}: "
                f"{i.status}"
            )
        return "\n".join(lines)

    def exact(self) -> dict[str, bool]:
        """Per part label (as in :meth:`report`), whether it was measured bit-exact."""
        out = {f"tensor core {d.input_format} {d.mma}": _is_exact(d.status) for d in self.tensor_cores}
        for label, p in (("exp2", self.exp2), ("exp", self.exp), ("isa", self.isa)):
            if p is not None:
                out[label] = _is_exact(p.status)
        out.update({f"tl.sum {s.layout}": _is_exact(s.status) for s in self.sums})
        return out


def model_label(m: object) -> str:
    """A short label of an accumulation model, as :meth:`HardwareProfile.report` prints it."""
    if isinstance(m, Chunked):
        n = f"{m.splits} splits" if m.splits is not None else f"chunks of {m.chunk}"
        return f"split-k({n}, {model_label(m.inner)})"
    if isinstance(m, Interleaved):
        return f"Interleaved(chunk {m.chunk}, groups of {m.group}, {model_label(m.inner)})"
    if isinstance(m, BlockFMA):
        extra = "" if m.align == "product" else f", align {m.align}"
        extra += "" if m.overflow == "round" else f", overflow {m.overflow}"
        extra += "" if m.zero_sign == "exact" else f", zero_sign {m.zero_sign}"
        out = m.out_fmt if isinstance(m.out_fmt, str) else m.out_fmt.name
        return f"BlockFMA({m.block}, F={m.fraction_bits}, out {out}{extra})"
    return type(m).__name__


# -- the tl.sum rules ------------------------------------------------------------------------------------------

#: the tl.sum order rules a :class:`SumPart` can name (``Plan.sum_order`` takes the same values)
SUM_RULES = _SUM_RULES


def tl_sum(x: Any, rule: str, warps_n: int = 1) -> Any:
    """Row sums of float32 rows in a tl.sum rule's order, each addition rounded to float32.

    ``"sequential"``: left to right. ``"h200-mma"``: the tensor-core accumulator layout with ``warps_n`` warps
    along the row, :func:`simfloat.hardware.mma_tree_sum` (the model the emulator's ``sum_order="h200-mma"``
    runs).

    Args:
        x: float32 values, shape (R, n) with n >= 1.
        rule: one of :data:`SUM_RULES`.
        warps_n: warps along the row for ``"h200-mma"``: 1, 2 or 4.

    Returns:
        float32 array of shape (R,).

    Raises:
        ValueError: an unknown rule, a warps_n other than 1/2/4, or x not 2-D with columns.
    """
    import numpy as np

    from simfloat.hardware import tl_sum_mma_array

    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] < 1:
        raise ValueError(f"tl_sum: x must have shape (rows, n) with n >= 1, got {x.shape}")
    if rule not in SUM_RULES:
        raise ValueError(f"tl_sum: rule must be one of {SUM_RULES}, got {rule!r}")
    if warps_n not in (1, 2, 4):
        raise ValueError(f"tl_sum: warps_n must be 1, 2 or 4, got {warps_n!r}")
    if rule == "sequential":
        s = x[:, 0].copy()
        for j in range(1, x.shape[1]):
            s = s + x[:, j]
        return s
    return tl_sum_mma_array(x, warps_n)


# -- files -----------------------------------------------------------------------------------------------------


def shipped_profiles() -> tuple[str, ...]:
    """Names of the profiles shipped with simfloat (``simfloat/data/profiles/<name>.json``)."""
    return tuple(sorted(p.stem for p in _DIR.glob("*.json")))


def load_profile(source: str | Path | HardwareProfile) -> HardwareProfile:
    """A profile by shipped name (``"h200"``, see :func:`shipped_profiles`) or from a JSON file; a
    :class:`HardwareProfile` is returned unchanged.

    Raises:
        ValueError: neither a shipped name nor a file, or not a valid profile (the message says why).
    """
    if isinstance(source, HardwareProfile):
        return source
    if not isinstance(source, (str, Path)):
        raise TypeError(f"hardware profile: expected a name, a path or a HardwareProfile, got {type(source).__name__}")
    path = Path(source)
    if isinstance(source, str) and source in shipped_profiles():
        path = _DIR / f"{source}.json"
    if not path.is_file():
        raise ValueError(
            f"hardware profile {str(source)!r}: no such file and not a shipped profile "
            f"(shipped: {', '.join(shipped_profiles())})"
        )
    try:
        obj = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"hardware profile {path.name}: not JSON ({exc})") from None
    return HardwareProfile.from_json(obj, directory=path.resolve().parent)


#: profiles plans were built with in this process, by name (:func:`register_profile`)
_REGISTERED: dict[str, HardwareProfile] = {}


def register_profile(profile: HardwareProfile) -> HardwareProfile:
    """Make ``profile`` reachable by its name in plan names (``triton-bf16@<name>``) in this process;
    ``plan(..., hardware=profile)`` does this. Registering the same profile again is a no-op.

    Raises:
        ValueError: another profile of that name is registered already, or the name is a shipped profile's
            and the profile differs from it (a plan name must mean one set of models).
    """
    if not isinstance(profile, HardwareProfile):
        raise TypeError(f"register_profile: expected a HardwareProfile, got {type(profile).__name__}")
    name = profile.name
    known = _REGISTERED.get(name)
    if known is None and name in shipped_profiles():
        known = load_profile(name)
    if known is not None and known != profile:
        raise ValueError(
            f"hardware profile {name!r} differs from the {'shipped' if name in shipped_profiles() else 'loaded'} "
            f"profile of that name, so plan names such as 'triton-bf16@{name}' would be ambiguous; give it "
            "another name (simfloat-gpu fit --name NAME, or dataclasses.replace(profile, name=...))"
        )
    _REGISTERED.setdefault(name, profile)
    return _REGISTERED[name]


def loaded_profile(ref: str) -> HardwareProfile:
    """The profile a plan name's ``@<ref>`` means: a profile registered in this process
    (:func:`register_profile`), else a shipped profile, else a profile file at the path ``ref``.

    Raises:
        ValueError: none of these (the message lists what is known).
    """
    if ref in _REGISTERED:
        return _REGISTERED[ref]
    if ref in shipped_profiles() or Path(ref).is_file():
        return load_profile(ref)
    known = sorted(set(_REGISTERED) | set(shipped_profiles()))
    raise ValueError(
        f"hardware profile {ref!r}: not a profile loaded in this process, a shipped profile or a file "
        f"(known: {', '.join(known)}); pass the profile file's path, or build the plan with hardware=PROFILE first"
    )


def save_profile(profile: HardwareProfile, path: str | Path, table: Any = None) -> Path:
    """Write ``profile`` as JSON to ``path``; with ``table`` (int8[2^24], the exp2 part's table) also the
    packed table next to it, under the part's ``table`` name (its sha256 must be the part's).

    Returns:
        The JSON path.

    Raises:
        ValueError: a table whose sha256 is not the profile's, or a table without a table part.
    """
    path = Path(path)
    if table is not None:
        from simfloat import hardware

        part = profile.exp2
        if part is None or part.table is None:
            raise ValueError("save_profile: a table was given but the profile has no exp2 table part")
        sha = hardware.ex2_table_sha256(table)
        if sha != part.sha256:
            raise ValueError(f"save_profile: the table's sha256 {sha} is not the profile's {part.sha256}")
        (path.parent / part.table).write_bytes(hardware.pack_ex2_table(table))
    path.write_text(json.dumps(profile.to_json(), indent=1) + "\n")
    return path


#: the shipped profiles of published models: name -> (arch, GPU description)
PUBLISHED_GPUS = {
    "a100": ("sm80", "NVIDIA A100 (published models)"),
    "ada": ("sm89", "NVIDIA Ada Lovelace, e.g. RTX 4090 / L40S (published models)"),
    "blackwell": ("sm100", "NVIDIA Blackwell, e.g. B200 (published models)"),
}


#: the measurements that check the published profiles: Khattak & Mikaitis' data (tests/fixtures/tensor_cores)
LAB_SOURCE = "Khattak & Mikaitis, arXiv 2512.07004, one mma.sync per row"


def published_profile(name: str, lab: Mapping[tuple[str, str], tuple[int, int]] | None = None) -> HardwareProfile:
    """A profile of published models only: the tensor-core presets :func:`simfloat.accumulate.tensor_core`
    has for the GPU's arch (MMA-Sim's models, checked bit for bit against ``mmasim``; one part per
    instruction where the arch's instructions differ, else one ``"any"`` part), every other part absent. The
    shipped ``a100``, ``ada`` and ``blackwell`` files are this, with ``lab`` the counts of Khattak &
    Mikaitis' measurements (tests/core/test_profiles.py recomputes them from tests/fixtures/tensor_cores).

    Args:
        name: a key of :data:`PUBLISHED_GPUS`.
        lab: per (input format, instruction) the rows another lab measured that the preset reproduces and
            their number; such parts have the status :func:`lab_status`, the others "published, not
            measured".

    Raises:
        ValueError: an unknown name.
    """
    from simfloat.accumulate import INSTRUCTIONS, tensor_core

    if name not in PUBLISHED_GPUS:
        raise ValueError(f"no published profile {name!r}; known: {', '.join(PUBLISHED_GPUS)}")
    arch, gpu = PUBLISHED_GPUS[name]
    lab = dict(lab or {})
    parts, missing = [], []
    for fmt in DOT_FORMATS:
        try:
            models = {ins: tensor_core(arch, fmt, instruction=ins) for ins in INSTRUCTIONS[arch]}
        except ValueError:
            missing.append(fmt)
            continue
        same = len(set(models.values())) == 1
        for ins, model in models.items() if not same else [("any", next(iter(models.values())))]:
            measured = [(i, lab[(fmt, i)]) for i in (INSTRUCTIONS[arch] if ins == "any" else (ins,)) if (fmt, i) in lab]
            status = PUBLISHED
            if measured:
                i, (exact, total) = measured[0]
                status = lab_status(exact, total, LAB_SOURCE if i == "mma.sync" else f"{LAB_SOURCE} ({i})")
            parts.append(DotPart(fmt, ins, model, status=status))
    notes = [
        f"tensor cores: simfloat.accumulate.tensor_core({arch!r}, fmt, instruction=...), MMA-Sim's model of the "
        "arch (checked bit for bit against mmasim) where MMA-Sim has one",
        "exp2, exp, tl.sum, isa: not published as bit-level models; absent (plans keep triton-<fmt>'s defaults)",
    ]
    if lab:
        notes.append(
            f"'{LAB}N/N': rows of {LAB_SOURCE} (their model_validation data, BSD-2-Clause) that the part's model "
            "reproduces bit for bit"
        )
    if missing:
        notes.append(f"no tensor-core kind on {arch} for {', '.join(missing)}")
    return HardwareProfile(name, arch, {"gpu": gpu}, tuple(parts), notes=tuple(notes))
