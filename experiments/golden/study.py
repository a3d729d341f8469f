"""The Golden et al. study by a plain loop (until ``simfloat sweep`` runs the same spec on Dask).

Expands ``spec.toml`` as the sweep contract does (the cartesian product of ``[grid]``, scalars fixed; each
``[[include]]`` table expanded likewise and added, keys it lacks taken from ``[grid]``; configs matching every
key of an ``[[exclude]]`` table dropped; ``seeds`` an int count or a list, the outermost loop), validates every
config first, then runs :func:`experiments.golden.run.run` on each and appends its row to the CSV as soon as
it finishes. A rerun skips the configs already in the CSV, so an interrupted study (Ctrl-C, a kill) resumes
where it stopped. One process per CSV (two at once would both run the configs neither has finished).

``--first KEY=V[|V...][,KEY=V...]`` (repeatable) runs the configs matching the first such partial config first,
then those matching the second, and so on, then the rest, each group in grid order (the order only; which
configs run is the spec's): a study too long for the time at hand finishes its most important configs first.

``python -m experiments.golden.study [--spec PATH] [--csv PATH] [--limit K] [--first FILTER]... [--smoke]``
(from the repository root); then ``python -m experiments.golden.figures``.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import importlib
import itertools
import json
import sys
import time
import tomllib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SPEC = HERE / "spec.toml"
CSV = HERE / "results" / "golden.csv"
SMOKE_GRID = {
    "fmt": ["bf16", "fp32"],
    "normalization": ["per_step", "deferred"],
    "l_ij": ["sequential", "fp32_once"],
    "rounding": "nearest_even",
    "M": 512,
    "d": 8,
    "N": [16, 40],
    "tiles": "fa1",
    "rows": 8,
}
SMOKE_INCLUDE = {"fmt": "bf16", "l_ij": "sequential", "tiles": ["swapped", "square"]}


def _product(table: dict[str, Any]) -> list[dict[str, Any]]:
    keys = list(table)
    values = [v if isinstance(v, list) else [v] for v in table.values()]
    for key, v in zip(keys, values, strict=True):
        if not v:
            raise ValueError(f"grid key {key!r} has an empty list")
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*values)]


def _matches(config: dict[str, Any], table: dict[str, Any]) -> bool:
    for key, want in table.items():
        allowed = want if isinstance(want, list) else [want]
        if config.get(key) not in allowed:
            return False
    return True


def expand(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Every config of a parsed spec (seeds included), in order, duplicates dropped.

    Raises:
        ValueError: a spec without ``[sweep]``/``[grid]``, an empty grid, bad seeds.
    """
    if "sweep" not in spec or "grid" not in spec:
        raise ValueError("spec: needs a [sweep] table and a [grid] table")
    grid = dict(spec["grid"])
    if not grid:
        raise ValueError("spec: [grid] is empty")
    seeds = spec["sweep"].get("seeds", 1)
    if isinstance(seeds, bool) or not isinstance(seeds, (int, list)):
        raise ValueError(f"spec: [sweep] seeds must be an int count or a list of ints, got {seeds!r}")
    seed_list = list(range(seeds)) if isinstance(seeds, int) else list(seeds)
    if not seed_list:
        raise ValueError("spec: [sweep] seeds gives no seed")
    configs = _product(grid)
    for inc in spec.get("include", []):
        configs += _product({**grid, **inc})
    excl = spec.get("exclude", [])
    out, seen = [], set()
    kept = [c for c in configs if not any(_matches(c, e) for e in excl)]
    for s in seed_list:  # seed outermost: a study stopped early holds the whole grid for its first seeds
        for c in kept:
            cfg = {**c, "seed": s}
            h = config_hash(cfg)
            if h not in seen:
                seen.add(h)
                out.append(cfg)
    if not out:
        raise ValueError("spec: the grid (after excludes) has no config")
    return out


def config_hash(config: dict[str, Any]) -> str:
    """A stable hash of a config (sorted JSON)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def load_kind(kind: str) -> tuple[Callable[..., dict], Callable[..., None] | None]:
    """The run function ``package.module:function`` of a spec and the module's ``validate``, if any."""
    mod_name, _, fn = kind.partition(":")
    if not fn:
        raise ValueError(f"spec: kind must be 'package.module:function', got {kind!r}")
    mod = importlib.import_module(mod_name)
    return getattr(mod, fn), getattr(mod, "validate", None)


def parse_filter(text: str) -> dict[str, list[Any]]:
    """A ``--first`` filter ``KEY=V[|V...][,KEY=V...]`` as ``{key: [values]}`` (ints where a value is one).

    Raises:
        ValueError: an item without ``=`` or an empty key or value.
    """
    out: dict[str, list[Any]] = {}
    for item in text.split(","):
        key, eq, vals = item.partition("=")
        values = [v.strip() for v in vals.split("|")]
        if not eq or not key.strip() or not all(values):
            raise ValueError(f"--first: expected KEY=V[|V...][,KEY=V...], got {text!r}")
        out[key.strip()] = [int(v) if v.lstrip("-").isdigit() else v for v in values]
    return out


def prioritize(configs: Sequence[dict[str, Any]], first: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``configs`` reordered: those matching ``first[0]`` (every key, a list matching any of its items), then
    those matching ``first[1]``, ..., then the rest; stable within each group.

    Raises:
        ValueError: a filter key that no config has (a misspelt key).
    """
    keys = set().union(*(c.keys() for c in configs)) if configs else set()
    for f in first:
        unknown = sorted(set(f) - keys)
        if unknown:
            raise ValueError(f"--first: unknown key(s) {unknown}; the configs have {sorted(keys)}")

    def rank(c: dict[str, Any]) -> int:
        return next((i for i, f in enumerate(first) if _matches(c, f)), len(first))

    return sorted(configs, key=rank)


def _done(path: Path) -> set[str]:
    if not path.exists():
        return set()
    with path.open(newline="") as fh:
        return {row["config_hash"] for row in csv.DictReader(fh)}


def run_grid(
    configs: Sequence[dict[str, Any]],
    fn: Callable[[dict[str, Any]], dict],
    path: Path,
    *,
    progress: Callable[[int, int, float], None] | None = None,
) -> int:
    """Run every config not yet in the CSV at ``path``, appending each row when it finishes; returns how many
    ran. The first row fixes the columns (config keys, ``config_hash``, then the metrics)."""
    done = _done(path)
    todo = [c for c in configs if config_hash(c) not in done]
    path.parent.mkdir(parents=True, exist_ok=True)
    fields: list[str] | None = None
    if path.exists() and path.stat().st_size:
        with path.open(newline="") as fh:
            fields = next(csv.reader(fh))
    t0 = time.perf_counter()
    if progress is not None:
        progress(0, len(todo), 0.0)
    for i, cfg in enumerate(todo):
        metrics = fn(dict(cfg))
        row = {**cfg, "config_hash": config_hash(cfg), **metrics}
        if fields is None:
            fields = list(row)
        with path.open("a", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
            if fh.tell() == 0:
                w.writeheader()
            w.writerow(row)
        if progress is not None:
            progress(i + 1, len(todo), time.perf_counter() - t0)
    return len(todo)


def _bar(done: int, total: int, elapsed: float) -> None:
    eta = f"{elapsed / done * (total - done):.0f} s" if done else "? (the first run compiles)"
    tty = sys.stderr.isatty()  # a terminal: one line redrawn; a log file: one line per run
    line = f"{done}/{total} runs, {elapsed:.0f} s, eta {eta}"
    print(f"\r{line}" if tty else line, end="" if tty else "\n", file=sys.stderr, flush=True)


def main(argv: Iterable[str] | None = None) -> int:
    """Run the study's grid (or ``--smoke``'s tiny one) into the CSV; returns 0 (130 on Ctrl-C, finished rows
    kept)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, default=SPEC)
    ap.add_argument("--csv", type=Path, default=CSV)
    ap.add_argument("--limit", type=int, default=None, help="run at most this many configs (in run order)")
    ap.add_argument(
        "--first",
        action="append",
        default=[],
        metavar="FILTER",
        help="KEY=V[|V...][,KEY=V...]: run the configs matching it first (repeatable: in the order given)",
    )
    ap.add_argument("--smoke", action="store_true", help="a tiny grid (seconds)")
    args = ap.parse_args(None if argv is None else list(argv))
    with args.spec.open("rb") as fh:
        spec = tomllib.load(fh)
    if args.smoke:
        spec = {"sweep": {**spec["sweep"], "seeds": 2}, "grid": SMOKE_GRID, "include": [SMOKE_INCLUDE]}
    configs = expand(spec)
    fn, validate = load_kind(spec["sweep"]["kind"])
    if validate is not None:
        for c in configs:
            validate(c)
    try:
        configs = prioritize(configs, [parse_filter(f) for f in args.first])
    except ValueError as err:
        ap.error(str(err))
    if args.limit is not None:
        configs = configs[: args.limit]
    t0 = time.perf_counter()
    try:
        n = run_grid(configs, fn, args.csv, progress=_bar)
    except KeyboardInterrupt:
        print(f"\ninterrupted: the finished runs are in {args.csv}", file=sys.stderr)
        return 130
    print(f"\n{n} runs of {len(configs)} configs ({len(configs) - n} already done), {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
