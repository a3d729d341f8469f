"""The built-in sweep kind ``attribute``: one :func:`simfloat.attribution.attribute` run per config, its
tables flattened into metrics.

Config keys are ``simfloat attribute``'s options with underscores (``seq``, ``seq_k``, ``head_dim``,
``batch``, ``heads``, ``kv_heads``, ``format``, ``plan``, ``baseline``, ``block_m``, ``block_n``, ``tiles``,
``block_ns``, ``rows``, ``trace_rows``, ``dist``, ``seed``, ``causal``, ``quick``) plus ``ops``. One ``plan``
per config (a grid axis, not a list), defaults as the command's, except that the tile and rescaling-steps
studies and the traced run are off unless asked for (in a sweep, tiles are grid axes). A list-valued key
(``ops``, ``tiles``, ``block_ns``) is written as a list of lists in ``[grid]`` (a plain list is an axis); one op
or one block_n may be given bare.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["ATTRIBUTE_KEYS", "attribute", "validate"]

#: The config keys of the ``attribute`` kind.
ATTRIBUTE_KEYS = (
    "seq",
    "seq_k",
    "head_dim",
    "batch",
    "heads",
    "kv_heads",
    "format",
    "plan",
    "baseline",
    "block_m",
    "block_n",
    "tiles",
    "block_ns",
    "rows",
    "trace_rows",
    "dist",
    "seed",
    "causal",
    "quick",
    "ops",
)
_DISTS = ("normal", "uniform", "outlier")


def _int(config: Mapping[str, Any], key: str, default: int | None, low: int = 1) -> int | None:
    value = config.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"config key {key!r} must be an int >= {low}, got {value!r}")
    return value


def _settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """The checked arguments of one attribution run (no kernel runs here)."""
    from simfloat.attention import plan as _plan
    from simfloat.attention._inputs import kv_group
    from simfloat.attention.plan import FLASH_OPS
    from simfloat.attribution import baseline_plan_for
    from simfloat.attribution.cli import DEFAULTS, FORMATS, QUICK, input_format

    for k in config:
        if k not in ATTRIBUTE_KEYS:
            raise ValueError(f"unknown config key {k!r} for kind 'attribute'; keys: {', '.join(ATTRIBUTE_KEYS)}")
    quick = config.get("quick", False)
    if not isinstance(quick, bool):
        raise ValueError(f"config key 'quick' must be true or false, got {quick!r}")
    base: Mapping[str, Any] = QUICK if quick else DEFAULTS
    plan_name = config.get("plan", "triton-bf16")
    if not isinstance(plan_name, str):
        raise ValueError(
            f"config key 'plan' must be one preset name (make it a grid axis for several), got {plan_name!r}"
        )
    try:
        fp = _plan(plan_name)
    except (ValueError, TypeError) as err:
        raise ValueError(f"config key 'plan': {err}") from None
    if "flash" not in fp.kernels():
        raise ValueError(f"config key 'plan': {plan_name!r} is a baseline plan; give it as 'baseline'")
    if fp.quantized:
        raise ValueError(
            f"config key 'plan': {plan_name!r} has quantizers; the attribute kind studies the float flash plans"
        )
    baseline = config.get("baseline")
    if baseline is not None and not isinstance(baseline, str):
        raise ValueError(f"config key 'baseline' must be a plan name, got {baseline!r}")
    try:
        bp = baseline_plan_for(fp, baseline)
    except (ValueError, TypeError) as err:
        raise ValueError(f"config key 'baseline': {err}") from None
    fmt = config.get("format", input_format(plan_name) or base["format"])
    if fmt not in FORMATS:
        raise ValueError(f"config key 'format' must be one of {', '.join(FORMATS)}, got {fmt!r}")
    dist = config.get("dist", "normal")
    if dist not in _DISTS:
        raise ValueError(f"config key 'dist' must be one of {', '.join(_DISTS)}, got {dist!r}")
    seq = _int(config, "seq", base["seq"])
    heads = _int(config, "heads", base["heads"])
    kv_heads = _int(config, "kv_heads", heads)
    assert heads is not None and kv_heads is not None  # both have int defaults
    try:
        kv_group(heads, kv_heads)
    except ValueError as err:
        raise ValueError(f"config key 'kv_heads': {err}") from None
    causal = config.get("causal", False)
    if not isinstance(causal, bool):
        raise ValueError(f"config key 'causal' must be true or false, got {causal!r}")
    rows = config.get("rows")
    if rows == "all":
        rows = None
    if rows is not None:
        rows = _int(config, "rows", None)
        if causal:
            raise ValueError("config key 'rows' cannot be combined with causal = true")
    tiles = config.get("tiles", [])
    if not isinstance(tiles, list) or not all(
        isinstance(t, list) and len(t) == 2 and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in t)
        for t in tiles
    ):
        raise ValueError(
            f"config key 'tiles' must be a list of [block_m, block_n] pairs, got {tiles!r} (in [grid], a list is "
            "an axis: write tiles = [[[64, 64], [128, 64]]] for one value)"
        )
    block_ns = config.get("block_ns", [])
    if isinstance(block_ns, int) and not isinstance(block_ns, bool):
        block_ns = [block_ns]
    if not isinstance(block_ns, list) or not all(
        isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block_ns
    ):
        raise ValueError(f"config key 'block_ns' must be a list of positive ints, got {block_ns!r}")
    ops = config.get("ops", list(FLASH_OPS))
    if isinstance(ops, str):  # one op (a grid axis over single ops)
        ops = [ops]
    if not isinstance(ops, list) or not ops or not all(op in FLASH_OPS for op in ops):
        raise ValueError(
            f"config key 'ops' must be a non-empty list of flash ops ({', '.join(FLASH_OPS)}), got {ops!r}"
        )
    return dict(
        plan=fp,
        baseline=bp,
        format=fmt,
        dist=dist,
        seed=_int(config, "seed", 0, low=0),
        seq=seq,
        seq_k=_int(config, "seq_k", seq),
        head_dim=_int(config, "head_dim", base["head_dim"]),
        batch=_int(config, "batch", base["batch"]),
        heads=heads,
        kv_heads=kv_heads,
        block_m=_int(config, "block_m", base["block_m"]),
        block_n=_int(config, "block_n", base["block_n"]),
        tiles=[tuple(t) for t in tiles],
        block_ns=list(block_ns),
        rows=rows,
        trace_rows=_int(config, "trace_rows", 0, low=0),
        causal=causal,
        ops=list(ops),
    )


def validate(config: dict[str, Any]) -> None:
    """Check one config of the ``attribute`` kind without running it.

    Raises:
        ValueError: an unknown key, an unknown plan or baseline, or a bad value; the message names the key.
    """
    _settings(config)


def _prefixed(prefix: str, d: Mapping[str, Any], metrics: tuple[str, ...]) -> dict[str, float]:
    return {f"{prefix}_{m}": float(d[m]) for m in metrics}


def attribute(config: dict[str, Any]) -> dict[str, float | int | str]:
    """One attribution (:func:`simfloat.attribution.attribute`) of ``config['plan']`` on seeded inputs.

    Returns:
        Metrics against the float64 golden output: ``flash_<m>`` and ``baseline_<m>`` for ``m`` in max_abs,
        mean_abs, rms, rel_rms; ``ratio_max``, ``ratio_rms`` (flash over baseline); per attributed op
        ``iso_<op>_max_abs``/``_rms`` (only that op low-precision) and ``abl_<op>_max_abs``/``_rms`` (only
        that op float64); ``ref_max_abs``/``ref_rms`` (every op float64 under the plan's flags); with
        ``tiles``: ``tile_<m>x<n>_max_abs``/``_rms``; with ``block_ns``: ``steps_<b>_max_abs``/``_rms``; and
        ``baseline_plan``, ``runs`` (distinct kernel runs), ``kernel_seconds``.

    Raises:
        ValueError: as :func:`validate`.
    """
    from simfloat.attribution import METRICS
    from simfloat.attribution import attribute as _attribute
    from simfloat.attribution.cli import inputs

    s = _settings(config)
    shape_q = (s["batch"], s["heads"], s["seq"], s["head_dim"])
    shape_kv = (s["batch"], s["kv_heads"], s["seq_k"], s["head_dim"])
    q, k, v = inputs(shape_q, shape_kv, s["dist"], s["format"], s["seed"])
    res = _attribute(
        q,
        k,
        v,
        s["plan"],
        baseline=s["baseline"],
        block_m=s["block_m"],
        block_n=s["block_n"],
        causal=s["causal"],
        ops=s["ops"],
        tiles=s["tiles"],
        block_ns=s["block_ns"],
        rows=s["rows"],
        trace=s["trace_rows"] > 0,
        trace_rows=s["trace_rows"] or None,
        workers=1,
    )
    m = tuple(METRICS)
    fvb = res.flash_vs_baseline.set_index("kernel")
    out: dict[str, float | int | str] = {}
    out.update(_prefixed("flash", fvb.loc["flash"], m))
    out.update(_prefixed("baseline", fvb.loc["baseline"], m))
    out["ratio_max"] = float(fvb.loc["flash", "ratio_max"])
    out["ratio_rms"] = float(fvb.loc["flash", "ratio_rms"])
    for name, table in (("iso", res.isolation), ("abl", res.ablation)):
        for r in table.itertuples(index=False):
            if r.op != "all":
                out.update(_prefixed(f"{name}_{r.op}", r._asdict(), ("max_abs", "rms")))
    ref = res.ablation[res.ablation["op"] == "all"].iloc[0]
    out.update(_prefixed("ref", ref, ("max_abs", "rms")))
    for r in res.tiles.itertuples(index=False):
        out.update(_prefixed(f"tile_{r.block_m}x{r.block_n}", r._asdict(), ("max_abs", "rms")))
    for r in res.steps.itertuples(index=False):
        out.update(_prefixed(f"steps_{r.block_n}", r._asdict(), ("max_abs", "rms")))
    out["baseline_plan"] = s["baseline"].name
    out["runs"] = int(res.meta["runs"])
    out["kernel_seconds"] = float(res.meta["kernel_seconds"])
    return out
