"""A sweep's SPEC: the TOML file (or dict) that names the study, its kind and its grid, checked and expanded
into the list of run configs before anything runs.

A SPEC has a ``[sweep]`` table (``name``, ``kind``, optional ``seeds``), a ``[grid]`` table (a list is an
axis, any other value is fixed; the cartesian product of the axes is the grid) and optional ``[[exclude]]``
and ``[[include]]`` tables of partial configs. Each run is identified by :func:`config_hash`, a stable hash of
its canonical config, its kind and the simfloat version.
"""

from __future__ import annotations

import hashlib
import importlib
import itertools
import json
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simfloat.sweep.store import COLUMNS

__all__ = ["BUILTIN_KINDS", "RESERVED", "Spec", "SpecError", "config_hash", "expand", "load_spec", "resolve_kind"]

#: The kinds a SPEC may name without a module: name -> ``"package.module:function"``.
BUILTIN_KINDS: Mapping[str, str] = {
    "attribute": "simfloat.sweep.kinds:attribute",
    "tile-sweep": "simfloat.sweep.tile_kind:tile_sweep_run",
}
#: Keys of the ``[sweep]`` table.
SWEEP_KEYS = ("name", "kind", "seeds")
#: Top-level tables of a SPEC.
TABLES = ("sweep", "grid", "include", "exclude")
#: Column names of the store's rows that a config key or a metric may not take (the store's own columns).
RESERVED = COLUMNS

Config = dict[str, Any]


class SpecError(ValueError):
    """A SPEC that cannot run: the message names the offending key."""


@dataclass(frozen=True)
class Spec:
    """A checked SPEC.

    Attributes:
        name: the study's name (``[sweep] name``), stored with every row.
        kind: the kind as written (a built-in name or ``"package.module:function"``).
        target: the importable ``"package.module:function"`` the kind resolves to.
        configs: the expanded run configs, in grid order, distinct, each a dict of JSON values.
        axes: the config keys whose value varies across ``configs`` (``seed`` included), in SPEC order.
    """

    name: str
    kind: str
    target: str
    configs: tuple[Config, ...]
    axes: tuple[str, ...]

    def hashes(self) -> list[str]:
        """:func:`config_hash` of every config, in order."""
        return [config_hash(self.kind, c) for c in self.configs]


def _version() -> str:
    import simfloat

    return simfloat.__version__


def canonical(kind: str, config: Mapping[str, Any]) -> str:
    """The canonical text of a run: sorted JSON of its config, its kind and the simfloat version."""
    return json.dumps(
        {"config": dict(config), "kind": kind, "simfloat": _version()},
        sort_keys=True,
        separators=(",", ":"),
        allow_nan=False,
    )


def config_hash(kind: str, config: Mapping[str, Any]) -> str:
    """The run's key in the store: SHA-256 (hex) of :func:`canonical`; the same for equal configs whatever
    their key order."""
    return hashlib.sha256(canonical(kind, config).encode()).hexdigest()


def resolve_kind(kind: str) -> tuple[str, Callable[[Config], Mapping[str, Any]], Callable[[Config], None] | None]:
    """``(target, fn, validate)`` of a kind: the function a run calls, and the ``validate`` function next to
    it in its module, if there is one.

    Raises:
        SpecError: not a built-in kind nor ``"package.module:function"``, or it does not import, naming
            ``kind``.
    """
    if not isinstance(kind, str) or not kind:
        raise SpecError(
            f"[sweep] kind must be a built-in kind ({', '.join(BUILTIN_KINDS)}) or 'package.module:function'"
        )
    target = BUILTIN_KINDS.get(kind, kind)
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise SpecError(
            f"[sweep] kind {kind!r}: not a built-in kind ({', '.join(BUILTIN_KINDS)}) nor 'package.module:function'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise SpecError(f"[sweep] kind {kind!r}: cannot import {module_name!r}: {err}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise SpecError(f"[sweep] kind {kind!r}: module {module_name!r} has no function {attr!r}")
    validate = getattr(module, "validate", None)
    return target, fn, validate if callable(validate) and validate is not fn else None


def _json_value(value: Any, where: str) -> Any:
    """A TOML value as a JSON value (TOML dates and times are refused)."""
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise SpecError(f"{where}: NaN and infinity are not config values")
        return value
    if isinstance(value, list | tuple):
        return [_json_value(v, where) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _json_value(v, f"{where}.{k}") for k, v in value.items()}
    raise SpecError(f"{where}: {type(value).__name__} values are not supported (use strings, numbers, booleans)")


def _table(raw: Mapping[str, Any], name: str) -> dict[str, Any]:
    t = raw.get(name, {})
    if not isinstance(t, Mapping):
        raise SpecError(f"[{name}] must be a table")
    return dict(t)


def _tables(raw: Mapping[str, Any], name: str) -> list[dict[str, Any]]:
    ts = raw.get(name, [])
    if isinstance(ts, Mapping):
        ts = [ts]
    if not isinstance(ts, list) or not all(isinstance(t, Mapping) for t in ts):
        raise SpecError(f"[[{name}]] must be an array of tables")
    for i, t in enumerate(ts):
        if not t:
            raise SpecError(f"[[{name}]] #{i + 1} is empty")
    return [dict(t) for t in ts]


def _seeds(value: Any) -> list[int] | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | list):
        raise SpecError(f"[sweep] seeds must be a count (int >= 1) or a list of ints, got {value!r}")
    if isinstance(value, int):
        if value < 1:
            raise SpecError(f"[sweep] seeds must be a count >= 1 or a list of ints, got {value}")
        return list(range(value))
    if not value or not all(isinstance(s, int) and not isinstance(s, bool) for s in value):
        raise SpecError(f"[sweep] seeds must be a non-empty list of ints, got {value!r}")
    return list(dict.fromkeys(value))


def _matches(config: Config, partial: Config) -> bool:
    """Whether ``config`` has every value of ``partial`` (a list value in ``partial`` matches any of its
    items, unless the config's value is that list itself)."""
    for k, want in partial.items():
        if k not in config:
            return False
        have = config[k]
        if have == want:
            continue
        if isinstance(want, list) and have in want:
            continue
        return False
    return True


def _product(fixed: Config, axes: Mapping[str, list[Any]]) -> list[Config]:
    names = list(axes)
    return [{**fixed, **dict(zip(names, combo, strict=True))} for combo in itertools.product(*axes.values())]


def expand(raw: Mapping[str, Any]) -> tuple[list[Config], tuple[str, ...]]:
    """The run configs of a SPEC's ``[grid]``, ``[[exclude]]``, ``[[include]]`` and ``seeds``.

    The grid's lists are its axes and the other values fixed; the product of the axes, minus every config an
    exclude table matches (all its keys equal; a list in an exclude matches any of its items), plus the
    include tables (each: the fixed values and one-value axes, and its own keys, its lists expanded as a small
    grid of their own),
    distinct in that order; then each config once per seed (a ``seed`` key).

    Returns:
        (configs, axes): the configs, and the keys whose value varies across them.

    Raises:
        SpecError: empty lists, an empty grid, an exclude key that is not a grid key, an exclude that matches
            nothing, a ``seed`` key next to ``seeds``, or a reserved column name; each naming the key.
    """
    grid = {str(k): _json_value(v, f"[grid] {k}") for k, v in _table(raw, "grid").items()}
    includes = [{str(k): _json_value(v, f"[[include]] {k}") for k, v in t.items()} for t in _tables(raw, "include")]
    excludes = [{str(k): _json_value(v, f"[[exclude]] {k}") for k, v in t.items()} for t in _tables(raw, "exclude")]
    if not grid and not includes:
        raise SpecError("[grid] is empty: give at least one key (a list is an axis, any other value is fixed)")
    for k, v in grid.items():
        if isinstance(v, list) and not v:
            raise SpecError(f"[grid] {k} is an empty list: an axis needs at least one value")
    for i, t in enumerate(includes):
        for k, v in t.items():
            if isinstance(v, list) and not v:
                raise SpecError(f"[[include]] #{i + 1} {k} is an empty list")
    axes = {k: v for k, v in grid.items() if isinstance(v, list)}
    fixed = {k: v for k, v in grid.items() if not isinstance(v, list)}
    configs = _product(fixed, axes) if grid else []
    for i, ex in enumerate(excludes):
        for k in ex:
            if k not in grid:
                raise SpecError(f"[[exclude]] #{i + 1} key {k!r} is not a [grid] key ({', '.join(grid) or 'none'})")
        kept = [c for c in configs if not _matches(c, ex)]
        if len(kept) == len(configs):
            raise SpecError(f"[[exclude]] #{i + 1} {ex} matches no config of the grid (a misspelt value?)")
        configs = kept
    single = {k: v[0] for k, v in axes.items() if len(v) == 1}  # a one-value axis is a fixed value
    for t in includes:
        t_axes = {k: v for k, v in t.items() if isinstance(v, list)}
        t_fixed = {**fixed, **single, **{k: v for k, v in t.items() if not isinstance(v, list)}}
        configs += _product(t_fixed, t_axes)
    seen: dict[str, Config] = {}
    for c in configs:
        seen.setdefault(json.dumps(c, sort_keys=True), c)
    configs = list(seen.values())
    if not configs:
        raise SpecError("[grid]: the excludes remove every config")
    seeds = _seeds(_table(raw, "sweep").get("seeds"))
    if seeds is not None:
        if any("seed" in c for c in configs):
            raise SpecError("[sweep] seeds: the configs already have a 'seed' key; give one or the other")
        configs = [{**c, "seed": s} for c in configs for s in seeds]
    keys = list(dict.fromkeys(k for c in configs for k in c))
    for k in keys:
        if k in RESERVED:
            raise SpecError(f"config key {k!r} is a column of the store; rename it")
    varying = tuple(k for k in keys if len({json.dumps(c.get(k), sort_keys=True) for c in configs}) > 1)
    return configs, varying


def load_spec(spec: str | Path | Mapping[str, Any], *, check: bool = True) -> Spec:
    """Read and check a SPEC: a TOML file's path, or the same structure as a dict.

    Args:
        spec: the TOML file, or a dict ``{"sweep": {...}, "grid": {...}, "include": [...], "exclude": [...]}``.
        check: call the kind's ``validate(config)`` on every config (see :func:`resolve_kind`).

    Returns:
        The :class:`Spec`.

    Raises:
        SpecError: an unreadable file, unknown tables or ``[sweep]`` keys, a missing name or kind, an
            unimportable kind, a bad grid (:func:`expand`), or a config the kind's ``validate`` refuses; the
            message names the key.
    """
    if isinstance(spec, Mapping):
        raw = dict(spec)
        where = "SPEC"
    else:
        path = Path(spec)
        where = str(path)
        try:
            raw = tomllib.loads(path.read_text())
        except OSError as err:
            raise SpecError(f"SPEC {path}: cannot read it: {err.strerror or err}") from None
        except tomllib.TOMLDecodeError as err:
            raise SpecError(f"SPEC {path}: not valid TOML: {err}") from None
    for k in raw:
        if k not in TABLES:
            raise SpecError(f"{where}: unknown table {k!r}; a SPEC has {', '.join(TABLES)}")
    sweep = _table(raw, "sweep")
    for k in sweep:
        if k not in SWEEP_KEYS:
            raise SpecError(f"[sweep] unknown key {k!r}; [sweep] has {', '.join(SWEEP_KEYS)}")
    name = sweep.get("name")
    if not isinstance(name, str) or not name.strip():
        raise SpecError("[sweep] name: a non-empty string is required")
    if "kind" not in sweep:
        raise SpecError("[sweep] kind is required: a built-in kind (attribute) or 'package.module:function'")
    kind = sweep["kind"]
    target, _, validate = resolve_kind(kind)
    configs, axes = expand(raw)
    if check and validate is not None:
        for c in configs:
            try:
                validate(dict(c))
            except (ValueError, TypeError, KeyError) as err:
                raise SpecError(f"config {c}: {err}") from None
    return Spec(name=name, kind=kind, target=target, configs=tuple(configs), axes=axes)
