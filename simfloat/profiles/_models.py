"""The accumulation models of a profile's tensor-core parts: their JSON form and their short label."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from simfloat.accumulate import BlockFMA, Chunked, Interleaved, Sequential
from simfloat.formats import FloatFormat
from simfloat.rounding import RoundingMode

_MODELS = {c.__name__: c for c in (Sequential, BlockFMA, Chunked, Interleaved)}


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
