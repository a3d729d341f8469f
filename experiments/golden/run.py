"""One run of the Golden et al. study: a flash plan and its two baselines against the float64 golden output.

The sweep contract: ``run(config) -> dict`` computes one grid point's metrics, ``validate(config)`` checks a
config before anything runs (``ValueError`` naming the bad key). A config holds:

* ``fmt``: ``bf16``, ``fp16`` or ``fp32`` (the working format of the flash plan and of the inputs);
* ``normalization``: ``per_step`` (FlashAttention-1: O normalized at every key block, O, l, m kept in the
  format) or ``deferred`` (FlashAttention-2: one division at the end);
* ``l_ij``: ``sequential`` (the in-tile row sum accumulated in the format, one rounding per addition) or
  ``fp32_once`` (float32 partial sums, rounded once into the format, as a torch reduction);
* ``rounding``: ``nearest_even`` or ``toward_zero``: the mode of every rounding of the flash plan and of the
  ``all-<fmt>`` baseline (the ``pytorch-<fmt>`` baseline rounds to nearest, as torch does);
* ``M`` (SRAM elements) and ``d`` (head dim): FlashAttention-1's tiles ``block_n = ceil(M / 4d)``,
  ``block_m = min(block_n, d)`` (:func:`simfloat.attention.fa1_tiles`);
* ``tiles``: ``fa1`` (those tiles), ``swapped`` (block_m and block_n exchanged) or ``square``
  (``block_n x block_n``);
* ``N``: sequence length (queries = keys); ``rows``: query rows evaluated, every ``N // rows``-th (0: all;
  rows are independent without a causal mask, so a subset is evaluated exactly); ``seed``.

The flash plan is ``all-<fmt>`` (every op, stored value and partial sum in the format, Golden et al.'s
simulator) with the config's normalization, l_ij model and rounding mode. Inputs: Q, K, V drawn N(0, 1) from
``seed`` and N, rounded to the format. Golden output: baseline attention under the ``fp64`` plan.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import numpy as np

KEYS = {
    "fmt": ("bf16", "fp16", "fp32"),
    "normalization": ("per_step", "deferred"),
    "l_ij": ("sequential", "fp32_once"),
    "rounding": ("nearest_even", "toward_zero"),
    "tiles": ("fa1", "swapped", "square"),
}
INTS = ("M", "d", "N", "rows", "seed")
_METRICS = ("max_abs", "mean_abs", "std_abs", "rmse", "rel_l1", "cos_sim", "snr_db")


def validate(config: dict[str, Any]) -> None:
    """Check one config (its keys and values) before anything runs.

    Raises:
        ValueError: a missing or unknown key, or a bad value (the message names the key).
    """
    known = set(KEYS) | set(INTS)
    unknown = sorted(set(config) - known)
    if unknown:
        raise ValueError(f"unknown config key(s) {unknown}; known: {sorted(known)}")
    for key, allowed in KEYS.items():
        if key not in config:
            raise ValueError(f"config key {key!r} is missing (one of {allowed})")
        if config[key] not in allowed:
            raise ValueError(f"config key {key!r} must be one of {allowed}, got {config[key]!r}")
    for key in INTS:
        if key not in config:
            raise ValueError(f"config key {key!r} is missing (an int)")
        val = config[key]
        if isinstance(val, bool) or not isinstance(val, (int, np.integer)):
            raise ValueError(f"config key {key!r} must be an int, got {val!r}")
        if val < (0 if key in ("rows", "seed") else 1):
            raise ValueError(f"config key {key!r} must be >= {0 if key in ('rows', 'seed') else 1}, got {val}")


def tiles_of(config: dict[str, Any]) -> tuple[int, int]:
    """(block_m, block_n) of a config."""
    from simfloat.attention import fa1_tiles

    bm, bn = fa1_tiles(int(config["M"]), int(config["d"]))
    if config["tiles"] == "swapped":
        return bn, bm
    if config["tiles"] == "square":
        return bn, bn
    return bm, bn


def flash_plan(fmt: str, normalization: str, l_ij: str, rounding: str) -> Any:
    """The study's flash plan: ``all-<fmt>`` with every rounding in ``rounding``, the normalization and the
    in-tile row sum model."""
    from simfloat.accumulate import Sequential
    from simfloat.attention import plan, sum_once

    base = plan(f"all-{fmt}")
    f = base.l_i.fmt
    ops = {op: (f, rounding) for op in ("scale", "exp", "m_i", "alpha", "l_i", "acc", "p", "normalize", "out")}
    dot = Sequential(f, rounding, product_fmt=f)
    lij = (f, rounding) if l_ij == "sequential" else sum_once(f, rounding)
    name = f"golden-{fmt}-{normalization}-{l_ij}-{rounding}"
    return base.replace(name=name, normalization=normalization, l_ij=lij, qk=dot, pv=dot, softmax=(f, rounding), **ops)


def baseline_all(fmt: str, rounding: str) -> Any:
    """The ``all-<fmt>`` baseline with every rounding in ``rounding``."""
    from simfloat.accumulate import Sequential
    from simfloat.attention import plan

    base = plan(f"all-{fmt}")
    if rounding == "nearest_even":
        return base
    f = base.l_i.fmt
    dot = Sequential(f, rounding, product_fmt=f)
    return base.replace(
        name=f"all-{fmt}/{rounding}", qk=dot, pv=dot, softmax=(f, rounding), scale=(f, rounding), out=(f, rounding)
    )


def _rows(n: int, rows: int) -> np.ndarray:
    if rows <= 0 or rows >= n:
        return np.arange(n)
    return np.arange(0, n, n // rows)[:rows]


@functools.lru_cache(maxsize=8)
def _inputs(fmt: str, n: int, d: int, seed: int, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    import simfloat as sf

    g = np.random.default_rng([seed, n, d])
    q, k, v = (sf.round(g.standard_normal((n, d)), fmt) for _ in range(3))
    return q[_rows(n, rows)], k, v


@functools.lru_cache(maxsize=64)
def _baseline_out(which: str, fmt: str, rounding: str, n: int, d: int, seed: int, rows: int) -> np.ndarray:
    from simfloat.attention import baseline, plan

    q, k, v = _inputs(fmt, n, d, seed, rows)
    if which == "golden":
        pl = plan("fp64")
    elif which == "pytorch":
        pl = plan(f"pytorch-{fmt}")
    else:
        pl = baseline_all(fmt, rounding)
    return baseline(q, k, v, plan=pl)


def run(config: dict[str, Any]) -> dict[str, float | int | str]:
    """One grid point: the flash deviation, both baselines' and the ratios (metrics against the golden output:
    :func:`simfloat.metrics.error_metrics`).

    Returns:
        ``block_m``, ``block_n``, ``rows_evaluated``, ``flash_<metric>``, ``pytorch_<metric>``,
        ``all_<metric>`` for max_abs, mean_abs, std_abs, rmse, rel_l1, cos_sim, snr_db; ``ratio_pytorch`` and
        ``ratio_all`` (flash max_abs / baseline max_abs), ``ratio_rmse_pytorch``, ``ratio_rmse_all``;
        ``seconds`` (this run's wall time, the cached baselines' included when they ran here).

    Raises:
        ValueError: a bad config (see :func:`validate`).
    """
    from simfloat.attention import flash
    from simfloat.metrics import error_metrics

    validate(config)
    t0 = time.perf_counter()
    fmt, rnd_mode = config["fmt"], config["rounding"]
    n, d, seed, rows = int(config["N"]), int(config["d"]), int(config["seed"]), int(config["rows"])
    q, k, v = _inputs(fmt, n, d, seed, rows)
    golden = _baseline_out("golden", fmt, rnd_mode, n, d, seed, rows)
    bm, bn = tiles_of(config)
    pl = flash_plan(fmt, config["normalization"], config["l_ij"], rnd_mode)
    out: dict[str, float | int | str] = {"block_m": bm, "block_n": bn, "rows_evaluated": int(q.shape[0])}
    res = {"flash": flash(q, k, v, plan=pl, block_m=bm, block_n=bn)}
    res["pytorch"] = _baseline_out("pytorch", fmt, rnd_mode, n, d, seed, rows)
    res["all"] = _baseline_out("all", fmt, rnd_mode, n, d, seed, rows)
    for name, o in res.items():
        m = error_metrics(o, golden, axis=-1)
        for key in _METRICS:
            out[f"{name}_{key}"] = m[key]
    for b in ("pytorch", "all"):
        out[f"ratio_{b}"] = float(out["flash_max_abs"]) / float(out[f"{b}_max_abs"])
        out[f"ratio_rmse_{b}"] = float(out["flash_rmse"]) / float(out[f"{b}_rmse"])
    out["seconds"] = time.perf_counter() - t0
    return out
