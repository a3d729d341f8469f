"""``simfloat attribute``: the main job. Seeded inputs rounded to the format, :func:`attribute` over the
plans, the console table, and the PNG + CSVs in the output folder. Options are declared in
:mod:`simfloat.cli`."""

from __future__ import annotations

import argparse
import sys
import time
import warnings as _warnings
from pathlib import Path
from typing import Any

import numpy as np

from simfloat.attention._inputs import input_format, not_representable

__all__ = [
    "ANALYSIS",
    "DEFAULTS",
    "FORMATS",
    "QUICK",
    "captured_call",
    "head_count",
    "input_format",
    "inputs",
    "not_representable",
    "run",
    "steps_block_ns",
]

#: Input formats of ``--format`` (the seeded inputs are rounded into it).
FORMATS = ("bf16", "fp16", "fp32", "e4m3", "e5m2")
#: The fp16 baseline that stands in for an fp8 flash plan's (torch has no fp8 eager attention; fp8 values are
#: fp16 values, so it computes on the same inputs).
FP8_BASELINE = "pytorch-fp16"

#: The embedded default job (seq 2048, head dim 128, bf16, triton-bf16 and all-bf16 vs their baselines).
DEFAULTS = dict(
    seq=2048,
    head_dim=128,
    batch=1,
    heads=1,
    format="bf16",
    block_m=64,
    block_n=64,
    rows=None,
    tiles=[(32, 64), (128, 64), (64, 128), (128, 128)],
    block_ns=[16, 32, 64, 128, 256, 2048],
)
#: --quick: small sizes, for tests and a first look (a few seconds).
QUICK = dict(
    seq=80,
    head_dim=16,
    batch=1,
    heads=2,
    format="bf16",
    block_m=16,
    block_n=16,
    rows=None,
    tiles=[(8, 16), (16, 32)],
    block_ns=[8, 16, 32, 80],
)


def inputs(
    shape_q: tuple[int, ...], shape_kv: tuple[int, ...], dist: str, fmt: str, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Seeded q, k, v rounded (nearest-even) into ``fmt``.

    ``normal``: N(0, 1); ``uniform``: U[0, 1) (torch.rand, as INT-FlashAttention's accuracy test);
    ``outlier``: N(0, 1) + N(0, 100) * Bernoulli(0.001) (FlashAttention-3's FP8 test; N(0, 100) has variance
    100, i.e. standard deviation 10).
    """
    from simfloat.rounding import round as _round

    g = np.random.default_rng(seed)

    def draw(shape: tuple[int, ...]) -> np.ndarray:
        if dist == "normal":
            x = g.standard_normal(shape)
        elif dist == "uniform":
            x = g.random(shape)
        elif dist == "outlier":
            x = g.standard_normal(shape) + 10.0 * g.standard_normal(shape) * (g.random(shape) < 0.001)
        else:
            raise ValueError(f"unknown distribution {dist!r}; choose normal, uniform or outlier")
        return _round(x, fmt)

    return draw(shape_q), draw(shape_kv), draw(shape_kv)


def pick_arg(args: argparse.Namespace, name: str) -> Any:
    value = getattr(args, name, None)
    if value is not None:
        return value
    return (QUICK if args.quick else DEFAULTS)[name]


def head_count(args: argparse.Namespace) -> int:
    """``--heads`` of a seeded job: one count (default 1, --quick 2).

    Raises:
        ValueError: several values or 0 (head indices are for ``--inputs``).
    """
    heads = getattr(args, "heads", None)
    if heads is None:
        return int((QUICK if args.quick else DEFAULTS)["heads"])  # type: ignore[call-overload]
    if len(heads) != 1 or heads[0] < 1:
        raise ValueError(
            f"--heads {' '.join(map(str, heads))}: seeded inputs take one head count >= 1 (head indices pick the "
            "heads of a recorded call, with --inputs)"
        )
    return int(heads[0])


#: Options that describe seeded inputs, which a recorded call (``--inputs``) replaces.
_SEEDED = ("seq", "seq_k", "head_dim", "batch", "kv_heads")


def captured_call(args: argparse.Namespace) -> Any:
    """``--inputs FILE --call N [--heads H ...]``: the recorded call (its chosen heads), checked; None without
    ``--inputs``.

    Raises:
        ValueError: ``--call`` without ``--inputs``, an option of seeded inputs with it, no such call or head,
            ``--causal`` for a call without a causal mask.
        NotImplementedError: a call with options the emulator does not model (named).
    """
    path = getattr(args, "inputs", None)
    call = getattr(args, "call", None)
    if path is None:
        if call is not None:
            raise ValueError("--call picks a call of a recorded file: give the file with --inputs")
        return None
    given = [f"--{name.replace('_', '-')}" for name in _SEEDED if getattr(args, name, None) is not None]
    if given:
        raise ValueError(f"--inputs: the recorded call fixes the shapes; leave out {', '.join(given)}")
    from simfloat.attribution.captured import load_capture

    with load_capture(path) as cap:
        try:
            rec = cap[0 if call is None else call]
        except IndexError as err:
            raise ValueError(f"--call: {err}; the calls:\n{cap.describe()}") from None
    rec.check()
    if args.causal and not rec.causal:
        raise ValueError(f"--causal: {rec.describe()} had no causal mask")
    return rec.select_heads(getattr(args, "heads", None))


def steps_block_ns(args: argparse.Namespace, seq_k: int) -> list[int]:
    """block_n values of the rescaling-steps study (forward and backward): ``--block-ns``, else the job's
    defaults up to seq_k and always the single-step point block_n = seq_k."""
    if args.block_ns is not None:
        return list(args.block_ns)
    block_ns = [b for b in pick_arg(args, "block_ns") if b <= seq_k] or [seq_k]
    if max(block_ns) < seq_k:
        block_ns.append(seq_k)  # always include the single-step (one kv block) point
    return block_ns


def _baseline_arg(items: list[str] | None) -> object:
    if not items:
        return None
    pairs: dict[str, str] = {}
    single = None
    for it in items:
        if "=" in it:
            a, b = it.split("=", 1)
            if not a or not b:
                raise ValueError(f"--baseline takes FLASH_PLAN=BASELINE_PLAN or BASELINE_PLAN, got {it!r}")
            pairs[a] = b
        else:
            single = it
    if single is not None and pairs:
        raise ValueError("--baseline: give either one plan for all or FLASH_PLAN=BASELINE_PLAN pairs, not both")
    return single if single is not None else pairs


def run(args: argparse.Namespace) -> int:
    """Run the job described by the parsed options: check the analysis extra and ``--out`` first, print the
    header (inputs, plans, then the number of runs) at once, show progress from the first run, print the table
    and write PNG, CSVs and summary.txt."""
    try:
        return _run(args)
    except (ValueError, TypeError, ImportError, NotImplementedError) as err:
        print(f"simfloat attribute: error: {err}", file=sys.stderr)
        return 2


#: What the job needs beyond numpy and numba (the ``analysis`` extra): tables, the plot, the progress bar.
ANALYSIS = ("pandas", "matplotlib", "tqdm")


def _check_analysis() -> None:
    import importlib

    missing = []
    for name in ANALYSIS:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise ImportError(
            f"needs {', '.join(ANALYSIS)} (missing: {', '.join(missing)}): pip install 'simfloat-emu[analysis]'"
        )


def out_dir(path: str) -> Path:
    """The output folder, created and checked writable before any work (:func:`simfloat._args.writable_dir`)."""
    from simfloat._args import writable_dir

    writable_dir(Path(path), "--out", "output folder")
    return Path(path)


class _Progress:
    """attribute's progress callback: the number of runs on stdout once known, then a tqdm bar on stderr."""

    def __init__(self) -> None:
        self.bar: Any = None

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            from tqdm import tqdm

            from simfloat._compiling import BarClock

            print(f"{total} distinct kernel runs", flush=True)
            self.bar = BarClock(tqdm(total=total, desc="kernel runs", unit="run", file=sys.stderr, leave=False))
        self.bar.update(done - self.bar.bar.n)  # the rate, hence the ETA, leaves out compile time

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _input_warnings(plans: list[str], fmt: str, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> list[str]:
    """One line per plan whose input format (:func:`input_format`) does not hold the inputs (rounded to
    ``fmt``): :func:`~simfloat.attribution.attribute` rounds them into it for that plan (as the kernel's caller
    does) and reports the rounding (its own InputFormatWarning is silenced in the job: these lines say it)."""
    out = []
    total = q.size + k.size + v.size
    for p in plans:
        want = input_format(p)
        if want is None or want == fmt:
            continue
        bad = sum(not_representable(x, want) for x in (q, k, v))
        if bad:
            out.append(
                f"plan {p} takes {want} inputs, but {bad} of the {total} values of q, k, v ({fmt}) are "
                f"not {want} values: they are rounded into {want} for it first (as the kernel's caller does) and "
                f"that rounding's own error is reported (input rounding); --format {want} draws {want} inputs"
            )
    return out


#: What an interrupted job keeps: its finished kernel runs and their deviations (written on Ctrl-C).
PARTIAL = "partial_runs.csv"


def _interrupted(stop: Any, out: Path, head: str, elapsed: float) -> int:
    """Ctrl-C during the runs: keep the finished ones (``out/partial_runs.csv``), say so, exit status 130."""
    import csv

    path = out / PARTIAL
    cols = ["kernel", "plan", "block_m", "block_n", "traced", "seconds", "max_abs", "mean_abs", "rms", "rel_rms"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(stop.runs)
    what = (
        f"interrupted after {elapsed:.1f} s: {len(stop.runs)} of {stop.total} kernel runs finished, kept in "
        f"{path} (each with its deviation from the golden output once that run is done); the tables need "
        "all of them"
    )
    (out / "summary.txt").write_text(head + "\n" + what + "\n")
    print(f"simfloat attribute: {what}", file=sys.stderr, flush=True)
    return 130


def _triton_plan(name: str, unprofiled: bool = False) -> bool:
    """Whether the plan ``name`` models the Triton flash kernel (its ``gpu_kernel`` field), with ``unprofiled``
    without a hardware profile yet (its ``profile`` field): the plans ``--hardware`` applies to. An unknown name
    is none (it stops later, with its own message)."""
    from simfloat.attention import plan

    try:
        pl = plan(name)
    except ValueError:
        return False
    return pl.gpu_kernel == "triton" and not (unprofiled and pl.profile is not None)


def _with_hardware(
    plans: list[str], pairs: dict[str, str], baseline: Any, hardware: str
) -> tuple[list[Any], Any, dict]:
    """--hardware: each triton-<f> plan replaced by plan("triton-<f>", hardware=...), paired with the baseline
    triton-<f> had; returns (plans to run, baseline mapping, pairs by shown name)."""
    from simfloat.attention import plan
    from simfloat.profiles import load_profile

    source = Path(hardware) if Path(hardware).is_file() else hardware
    prof = load_profile(source)  # a bad profile stops here, naming it
    if not any(_triton_plan(p, unprofiled=True) for p in plans):
        raise ValueError(f"--hardware {hardware}: no triton-<format> plan among {', '.join(plans)} to apply it to")
    run_plans: list[Any] = []
    new_pairs: dict[str, str] = {}
    for p in plans:
        if _triton_plan(p, unprofiled=True):
            hp = plan(p, hardware=prof)
            run_plans.append(hp)
            new_pairs[hp.name] = pairs[p]
        else:
            run_plans.append(p)
            new_pairs[p] = pairs[p]
    return run_plans, dict(new_pairs), new_pairs


class _EstimateOnly(Exception):
    """--estimate: the estimate is printed, nothing runs."""


def _estimate_printer(args: argparse.Namespace) -> Any:
    def show(est: Any) -> None:
        from tqdm import tqdm

        advice = est.advice()
        tqdm.write(f"{est}" + (f"; {advice}" if advice else ""), file=sys.stdout)  # above the progress bar
        if getattr(args, "estimate", False):
            raise _EstimateOnly

    return show


def _run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    _check_analysis()
    rec = captured_call(args)
    seq_k = None
    if rec is None:
        seq = int(pick_arg(args, "seq"))
        seq_k = int(args.seq_k) if args.seq_k is not None else seq
    else:
        seq, seq_k = rec.q.shape[-2], rec.k.shape[-2]
    fmt = args.format
    if fmt is None and args.plan:  # the plans' own input format, when they agree on one
        wanted = {f for f in map(input_format, args.plan) if f is not None}
        fmt = wanted.pop() if len(wanted) == 1 else None
    if fmt is None and rec is not None and rec.input_format in FORMATS:
        fmt = rec.input_format  # the recorded tensors' dtype
    fmt = str(fmt if fmt is not None else pick_arg(args, "format"))
    plans = args.plan or [f"triton-{fmt}", f"all-{fmt}"]
    causal = bool(args.causal) if rec is None else rec.causal
    rows = args.rows if args.rows is not None else (None if causal else pick_arg(args, "rows"))
    if rows == "all":
        rows = None
    if rows is not None and causal:
        raise ValueError(
            "--rows cannot be combined with --causal"
            + (" (the recorded call is causal)" if rec is not None else "")
            + " (a causal row's keys depend on its position)"
        )
    bm, bn = int(pick_arg(args, "block_m")), int(pick_arg(args, "block_n"))
    tiles = pick_arg(args, "tiles")
    block_ns = steps_block_ns(args, seq_k)
    baseline = _baseline_arg(args.baseline)
    fp8 = {p: FP8_BASELINE for p in plans if input_format(p) in ("e4m3", "e5m2") and _triton_plan(p)}
    if fp8 and baseline is None:
        baseline = fp8
    elif fp8 and isinstance(baseline, dict):
        baseline = {**fp8, **baseline}
    from simfloat.attribution import baseline_plan_for

    pairs = {p: baseline_plan_for(p, baseline).name for p in plans}  # unknown plans and pairings stop here
    run_plans: list[Any] = list(plans)
    if getattr(args, "hardware", None) is not None:
        run_plans, baseline, pairs = _with_hardware(plans, pairs, baseline, args.hardware)
    shown = [getattr(p, "name", p) for p in run_plans]
    if rec is None:
        d = int(pick_arg(args, "head_dim"))
        batch, heads = int(pick_arg(args, "batch")), head_count(args)
        kv_heads = heads if getattr(args, "kv_heads", None) is None else int(args.kv_heads)
        from simfloat.attention._inputs import kv_group

        try:  # grouped-query attention: --kv-heads must divide --heads
            kv_group(heads, kv_heads)
        except ValueError as err:
            raise ValueError(f"--kv-heads {kv_heads} with --heads {heads}: {err}") from None
    out = out_dir(args.out)
    baselines = ", ".join(f"{a}->{b}" for a, b in pairs.items())
    if rec is None:
        shape_q, shape_kv = (batch, heads, seq, d), (batch, kv_heads, seq_k, d)
        evaluated = "all query rows" if rows is None or rows >= seq else f"{rows} of {seq} query rows"
        head = (
            f"simfloat attribute: {args.dist} inputs rounded to {fmt}, seed {args.seed}; q {shape_q}, k and v "
            f"{shape_kv}, {evaluated}{', causal' if causal else ''}; plans {', '.join(shown)} (baselines: "
            f"{baselines})"
        )
    else:
        evaluated = "all query rows" if rows is None or rows >= seq else f"{rows} of {seq} query rows"
        from simfloat.attribution.captured import load_capture

        with load_capture(args.inputs) as cap:
            n_calls = len(cap)
        head = (
            f"simfloat attribute: {rec.describe()} (call {rec.index} of {n_calls} in {args.inputs}"
            + (f", heads {' '.join(map(str, args.heads))}" if args.heads else "")
            + f"), {evaluated}; plans {', '.join(shown)} (baselines: {baselines})"
        )
    print(head, flush=True)
    if rec is None:
        q, k, v = inputs(shape_q, shape_kv, args.dist, fmt, args.seed)
    else:
        q, k, v = rec.q, rec.k, rec.v
    warnings = _input_warnings(plans, fmt if rec is None else rec.dtype, q, k, v)
    for w in warnings:
        print(f"simfloat attribute: warning: {w}", file=sys.stderr, flush=True)
    if warnings:
        head += "\n" + "\n".join(f"warning: {w}" for w in warnings)
    import simfloat.attribution  # looked up at call time (tests replace it)
    from simfloat.attention import InputFormatWarning

    progress = _Progress()
    try:
        with _warnings.catch_warnings():
            _warnings.simplefilter("ignore", InputFormatWarning)  # said above, in the job's own words
            res = simfloat.attribution.attribute(
                q,
                k,
                v,
                run_plans,
                baseline=baseline,
                block_m=bm,
                block_n=bn,
                causal=causal,
                scale=None if rec is None else rec.scale,
                tiles=tiles,
                block_ns=block_ns,
                rows=rows,
                trace_rows=args.trace_rows,
                progress=progress,
                bounds=getattr(args, "bounds", False),
                estimate=_estimate_printer(args),
            )
    except _EstimateOnly:
        return 0
    except simfloat.attribution.AttributionInterrupted as stop:
        progress.close()
        return _interrupted(stop, out, head, time.perf_counter() - t0)
    finally:
        progress.close()
    if rec is not None:
        res.meta["call"] = rec.meta()
    table = res.table()
    res.to_csv(out)
    png = res.plot(out / "attribution.png")
    elapsed = time.perf_counter() - t0
    tail = f"\n\nwall time {elapsed:.1f} s"
    (out / "summary.txt").write_text(head + "\n" + table + tail + "\n")
    print(table + tail)
    print(f"wrote {png}, {out}/*.csv, {out / 'summary.txt'}")
    return 0
