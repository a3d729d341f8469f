"""Every function and method of the public API is annotated: each parameter and the return.

The public API is what ``__all__`` names in ``simfloat`` and its public subpackages. Classes are walked for the
methods they define themselves (inherited ones from ``tuple``/``Enum``/``object`` are not the project's), and
NamedTuple/dataclass machinery generated at class creation is skipped. mypy checks that the annotations are
true (``make lint``); this test checks that none is missing, which mypy only does for the bodies it checks.
"""

from __future__ import annotations

import enum
import importlib
import importlib.util
import inspect
from collections.abc import Callable, Iterator

import pytest

MODULES = (
    "simfloat",
    "simfloat.attention",
    "simfloat.attribution",
    "simfloat.ops",
    "simfloat.formats",
    "simfloat.rounding",
    "simfloat.accumulate",
    "simfloat.accumulate.models",
    "simfloat.accumulate.scalar",
    "simfloat.accumulate.api",
    "simfloat.bounds",
    "simfloat.trace",
    "simfloat.hardware",
    "simfloat.blockscale",
    "simfloat.profiles",
    "simfloat.metrics",
    "simfloat.attention.tiling",
    "simfloat.sweep",
    "simfloat.sweep.spec",
    "simfloat.sweep.store",
    "simfloat.sweep.report",
    "simfloat.sweep.runner",
    "simfloat.sweep.kinds",
    "simfloat.cli",
    "simfloat.demo",
    "simfloat.torch",
)

# Modules that need an optional dependency: walked only where it is installed.
OPTIONAL = {"simfloat.torch": "torch"}

# Methods generated for NamedTuples, dataclasses and enums, not written in the project.
_GENERATED = {"_make", "_replace", "_asdict", "__new__", "__repr__", "__eq__", "__hash__", "__getnewargs__"}


def _target(obj: object) -> Callable[..., object] | None:
    """The plain Python function behind a public callable (numba dispatchers expose ``py_func``)."""
    py = getattr(obj, "py_func", None)
    if inspect.isfunction(py):
        return py
    if inspect.isfunction(obj):
        return obj
    return None


def _members(cls: type) -> Iterator[tuple[str, Callable[..., object]]]:
    """Functions a public class defines in its own body (methods, static/class methods, property getters)."""
    for name, raw in vars(cls).items():
        if name.startswith("_") and name not in ("__init__", "__call__"):
            continue
        if name in _GENERATED:
            continue
        if isinstance(raw, (staticmethod, classmethod)):
            raw = raw.__func__
        elif isinstance(raw, property):
            raw = raw.fget
        fn = _target(raw)
        if fn is not None and fn.__qualname__.startswith(cls.__qualname__ + "."):
            yield name, fn


def _public() -> Iterator[tuple[str, Callable[..., object]]]:
    """(qualified name, function) for every public function and method, each once."""
    seen: set[int] = set()
    for modname in MODULES:
        if modname in OPTIONAL and importlib.util.find_spec(OPTIONAL[modname]) is None:
            continue
        mod = importlib.import_module(modname)
        for name in mod.__all__:
            obj = getattr(mod, name)
            if inspect.ismodule(obj):
                continue
            if inspect.isclass(obj):
                if issubclass(obj, enum.Enum) and not any(inspect.isfunction(v) for v in vars(obj).values()):
                    continue
                items = [(f"{modname}.{name}.{m}", fn) for m, fn in _members(obj)]
            else:
                fn = _target(obj)
                items = [(f"{modname}.{name}", fn)] if fn is not None else []
            for qual, fn in items:
                if id(fn) not in seen:
                    seen.add(id(fn))
                    yield qual, fn


def _missing(fn: Callable[..., object]) -> list[str]:
    """Names of the parameters of ``fn`` without an annotation, and ``return`` when that has none."""
    sig = inspect.signature(fn)
    out = [
        p.name
        for i, p in enumerate(sig.parameters.values())
        if p.annotation is inspect.Parameter.empty and not (i == 0 and p.name in ("self", "cls"))
    ]
    if sig.return_annotation is inspect.Signature.empty:
        out.append("return")
    return out


def test_public_api_found() -> None:
    """The walk finds the API (a broken walk would make the annotation test pass vacuously)."""
    names = {q for q, _ in _public()}
    assert "simfloat.round" in names and "simfloat.rounding.round_exact" in names
    assert "simfloat.attention.flash" in names
    assert "simfloat.BlockFMA.__init__" in names and "simfloat.attention.Plan.replace" in names
    assert len(names) > 40
    # the modules beyond the package's own __all__ are walked too
    assert "simfloat.profiles.load_profile" in names and "simfloat.metrics.error_metrics" in names
    assert "simfloat.sweep.store.Store.__init__" in names and "simfloat.cli.main" in names


def test_missing_detects_unannotated() -> None:
    """The check itself flags a missing parameter or return annotation."""

    def bare(x, y: int):  # noqa: ANN001, ANN202
        return x

    def full(x: int) -> int:
        return x

    assert _missing(bare) == ["x", "return"]
    assert _missing(full) == []


@pytest.mark.parametrize("qual,fn", list(_public()), ids=lambda v: v if isinstance(v, str) else "")
def test_public_annotated(qual: str, fn: Callable[..., object]) -> None:
    """Every parameter and the return of a public function or method carry an annotation."""
    assert _missing(fn) == [], f"{qual} lacks annotations for {_missing(fn)}"
