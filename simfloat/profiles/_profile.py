"""One GPU's numerics, :class:`HardwareProfile`: its parts, its tables and its JSON form (the file format: the
package docstring of :mod:`simfloat.profiles`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simfloat.profiles._models import model_from_json, model_label, model_to_json
from simfloat.profiles._parts import DotPart, Exp2Part, ExpPart, IsaPart, SumPart
from simfloat.profiles._status import _is_exact

if TYPE_CHECKING:
    from simfloat.hardware import Ex2Table

PROFILE_VERSION = 1


_FORMAT = "simfloat-hardware-profile"
_DIR = Path(__file__).resolve().parent.parent / "data" / "profiles"


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
