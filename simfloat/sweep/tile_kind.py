"""The built-in sweep kind ``tile-sweep``: one decode run (:func:`simfloat.attribution.residues.tile_sweep`) at
one key length ``base + residue`` per config, its error against float64 as metrics.

Config keys: ``residue`` (required, an int >= 0), ``base`` (default 128), ``block_n`` (64), ``block_m``,
``seq_q`` (1), ``heads`` (1), ``kv_heads``, ``head_dim`` (64), ``page_size``, ``num_splits`` (1), ``combine``
(``"flash-attn"``), ``plan`` (``"triton-bf16"``), ``format``, ``dist`` (``"normal"``), ``seed`` (0). The keys are
drawn ``base + block_n - 1`` long (or up to the residue, if larger), so every residue of a grid sees prefixes of
the same keys: a grid ``residue = [0, 1, ..., 63]`` is the tile-boundary sweep, stored and reported as any
sweep.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["TILE_KEYS", "tile_sweep_run", "validate"]

#: The config keys of the ``tile-sweep`` kind.
TILE_KEYS = (
    "residue",
    "base",
    "block_n",
    "block_m",
    "seq_q",
    "heads",
    "kv_heads",
    "head_dim",
    "page_size",
    "num_splits",
    "combine",
    "plan",
    "format",
    "dist",
    "seed",
)
_INTS = {"base": 128, "block_n": 64, "seq_q": 1, "heads": 1, "head_dim": 64, "num_splits": 1, "seed": 0}


def _settings(config: Mapping[str, Any]) -> dict[str, Any]:
    for k in config:
        if k not in TILE_KEYS:
            raise ValueError(f"unknown config key {k!r} for kind 'tile-sweep'; keys: {', '.join(TILE_KEYS)}")
    if "residue" not in config:
        raise ValueError("config key 'residue' is required for kind 'tile-sweep' (make it a grid axis)")
    s: dict[str, Any] = {}
    for key, default in {**_INTS, "residue": None, "block_m": None, "kv_heads": None, "page_size": None}.items():
        value = config.get(key, default)
        low = 0 if key in ("residue", "seed") else 1
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
            raise ValueError(f"config key {key!r} must be an int >= {low}, got {value!r}")
        s[key] = value
    for name, text in (("combine", "flash-attn"), ("plan", "triton-bf16"), ("format", None), ("dist", "normal")):
        given = config.get(name, text)
        if given is not None and not isinstance(given, str):
            raise ValueError(f"config key {name!r} must be a string, got {given!r}")
        s[name] = given
    if s["dist"] not in ("normal", "uniform", "outlier"):
        raise ValueError(f"config key 'dist' must be normal, uniform or outlier, got {s['dist']!r}")
    from simfloat.attention import COMBINES
    from simfloat.attention import plan as _plan

    if s["combine"] not in COMBINES:
        raise ValueError(f"config key 'combine' must be one of {', '.join(COMBINES)}, got {s['combine']!r}")
    try:
        _plan(s["plan"])
    except (ValueError, TypeError) as err:
        raise ValueError(f"config key 'plan': {err}") from None
    return s


def validate(config: dict[str, Any]) -> None:
    """Check one config of the ``tile-sweep`` kind without running it.

    Raises:
        ValueError: an unknown key, a missing residue, a bad value or plan; the message names the key.
    """
    _settings(config)


def tile_sweep_run(config: dict[str, Any]) -> dict[str, float | int | str]:
    """One key length of the tile-boundary sweep.

    Returns:
        ``kv_len``, ``residue``, the :func:`simfloat.metrics.error_metrics` keys against float64 attention and
        ``reports`` (the reported residue classes the length falls in).

    Raises:
        ValueError: as :func:`validate`.
    """
    from simfloat.attribution.residues import tile_sweep

    s = _settings(config)
    (row,) = tile_sweep(
        s["plan"],
        block_n=s["block_n"],
        base=s["base"],
        residues=[s["residue"]],
        seq_q=s["seq_q"],
        heads=s["heads"],
        kv_heads=s["kv_heads"],
        head_dim=s["head_dim"],
        page_size=s["page_size"],
        num_splits=s["num_splits"],
        combine=s["combine"],
        fmt=s["format"],
        dist=s["dist"],
        seed=s["seed"],
        block_m=s["block_m"],
        draw_len=s["base"] + max(s["block_n"] - 1, s["residue"]),
    )
    return {k: (v if isinstance(v, (int, str)) else float(v)) for k, v in row.items()}
