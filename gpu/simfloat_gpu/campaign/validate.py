"""Cross-validation: the Triton attention kernels against simfloat's emulator, config by config, bit by bit.

    python -m simfloat_gpu.campaign.validate --out DIR [--grid full|ci|smoke] [--backend auto|gpu|faithful] [--jobs N]
    simfloat-gpu validate --out DIR ...                   (the same, through the console script)
    python -m simfloat_gpu.campaign.validate --out DIR --fixtures tests/fixtures/gpu/h200     (emulator vs recorded GPU
    outputs)
    python -m simfloat_gpu.campaign.validate --out DIR --fixtures tests/fixtures/gpu/h200 --plans triton,h200

For every config of a grid (:func:`simfloat_gpu.campaign.grid.grid`) it runs

* the Triton kernel of the config's kind (:data:`simfloat_gpu.campaign.kinds.KINDS`: flash
  ``simfloat_gpu.kernels.flash_attention.flash_attention``; int8 ``simfloat_gpu.kernels.int8_attention``; sage
  ``simfloat_gpu.kernels.sage_attention``, given the emulator's mean key ``simfloat.attention.mean_key``) on the GPU
  when ``torch.cuda.is_available()`` (backend ``gpu``), else on the CPU under :func:`simfloat_gpu.interpreter.faithful`
  (backend ``faithful``: Triton's interpreter with simfloat's numerics);
* the emulator with the matching plan: ``simfloat.attention.flash(q, k, v, plan=plan("triton-<fmt>"),
  block_m, block_n, causal)`` with ``out`` fp32 or the input format (int8: ``simfloat.attention.int8_flash``
  with the int8 preset; sage: ``simfloat.attention.quant_flash`` with the ``sage2-int8-fp8`` plan);
* a float64 reference (numpy), for the error of each against the exact softmax attention,

and writes ``DIR/validation.csv`` (one row per config) and ``DIR/validation.md`` (table, environment and,
under the interpreter, ``faithful_config()``). Under the faithful interpreter every config must agree 100%
bitwise (outputs, fp32 included, m_i and l_i); on a GPU the agreement measures the emulator's hardware model.

GPU mode can record fixtures (``--record-fixtures DIR``, :mod:`simfloat_gpu.campaign.fixtures`);
``tests/gpu/test_gpu_fixtures.py`` and ``--fixtures DIR`` compare the emulator against them; a ``backward/``
subfolder of the same layout is compared with ``flash_backward`` under the same plan families (backward.csv /
.md and a section of validation.md; :func:`simfloat_gpu.campaign.validate_bwd.compare_backward_fixtures`).

The campaign by concept: :mod:`~simfloat_gpu.campaign.kinds` (the kernel kinds, one record each, and the plan
families), :mod:`~simfloat_gpu.campaign.grid` (configs, grids, inputs), :mod:`~simfloat_gpu.campaign.running`
(backends, one config's run, the grid in worker processes), :mod:`~simfloat_gpu.campaign.compare` (the bit
metrics and the comparison with the emulator), :mod:`~simfloat_gpu.campaign.fixtures`,
:mod:`~simfloat_gpu.campaign.report`, :mod:`~simfloat_gpu.campaign.user_kernel` (:func:`compare_kernel`) and
this module, the command line. The names of the campaign's public API are importable from here too.

This module imports only numpy and the standard library at import time: torch, triton and simfloat are loaded
where used, and the GPU path (kernel runs and fixture recording) needs no simfloat at all.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from simfloat_gpu.campaign.arguments import names_of, plan_families, positive_int, positive_seconds, writable_dir
from simfloat_gpu.campaign.compare import agreement, compare_outputs, compare_to_emulator, emulator_plan, run_emulator
from simfloat_gpu.campaign.fixtures import (
    check_fixture_dir,
    compare_fixture,
    compare_fixtures,
    fixture_dirs,
    load_fixtures,
    write_fixtures,
)
from simfloat_gpu.campaign.grid import (
    BLOCKS,
    CAUSAL,
    FORMATS,
    HEAD_DIMS,
    OUTS,
    PRECISIONS,
    SEQS,
    Config,
    grid,
    input_crc,
    make_inputs,
    reference64,
    round_to_format,
)
from simfloat_gpu.campaign.kinds import KINDS, PLAN_FAMILIES, use_hardware
from simfloat_gpu.campaign.records import ValidationRecord
from simfloat_gpu.campaign.report import (
    FIELDS,
    agreement_summary,
    agreement_table,
    cpu_seconds,
    environment,
    pivot,
    summarize,
    write_report,
)
from simfloat_gpu.campaign.running import Interrupted, resolve_backend, run_grid, run_kernel, validate_config
from simfloat_gpu.campaign.user_kernel import KernelComparison, compare_kernel

__all__ = [
    "BLOCKS",
    "CAUSAL",
    "FIELDS",
    "FORMATS",
    "HEAD_DIMS",
    "KINDS",
    "OUTS",
    "PLAN_FAMILIES",
    "PRECISIONS",
    "SEQS",
    "Config",
    "Interrupted",
    "KernelComparison",
    "ValidationRecord",
    "add_arguments",
    "agreement",
    "agreement_summary",
    "agreement_table",
    "check_args",
    "compare_fixture",
    "compare_fixtures",
    "compare_kernel",
    "compare_outputs",
    "compare_to_emulator",
    "emulator_plan",
    "environment",
    "fixture_dirs",
    "grid",
    "input_crc",
    "load_fixtures",
    "main",
    "make_inputs",
    "names_of",
    "pivot",
    "plan_families",
    "positive_int",
    "positive_seconds",
    "reference64",
    "resolve_backend",
    "round_to_format",
    "run",
    "run_emulator",
    "run_grid",
    "run_kernel",
    "use_hardware",
    "validate_config",
    "write_fixtures",
    "write_report",
    "writable_dir",
]


def check_args(args: argparse.Namespace) -> None:
    """What :func:`run` checks before any work: options that would be ignored, the fixtures to read, and
    the folders to write (created here).

    Raises:
        ValueError: naming the option.
    """
    if args.fixtures is not None:
        if args.record_fixtures is not None:
            raise ValueError("--record-fixtures cannot be combined with --fixtures (no kernel runs then)")
        if args.no_emulator:
            raise ValueError("--no-emulator cannot be combined with --fixtures (it compares the emulator)")
        check_fixture_dir(Path(args.fixtures))
    else:
        if args.max_cost is not None:
            raise ValueError("--max-cost applies only with --fixtures")
        if getattr(args, "hardware", None) is not None:
            raise ValueError("--hardware applies only with --fixtures (it adds a plan family to compare)")
        if getattr(args, "plans", None) is not None:
            raise ValueError(
                "--plans applies only with --fixtures (against the interpreter only the "
                "triton-<fmt> plans are the kernel's model)"
            )
    writable_dir(Path(args.out), "--out")
    if args.record_fixtures is not None:
        writable_dir(Path(args.record_fixtures), "--record-fixtures")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, type=Path, help="output directory (validation.csv, validation.md)")
    p.add_argument(
        "--grid",
        default="full",
        choices=("full", "ci", "smoke", "tiles"),
        help="config grid (default full; tiles: whole tiles only, for kernels without masks)",
    )
    p.add_argument(
        "--backend",
        default="auto",
        choices=("auto", "gpu", "faithful"),
        help="auto: the GPU if torch sees CUDA (and TRITON_INTERPRET is unset), else the faithful CPU interpreter",
    )
    p.add_argument(
        "--jobs",
        type=positive_int,
        default=None,
        help="worker processes (default: CPU count, at most 8 on the interpreter, 12 on a GPU)",
    )
    p.add_argument("--no-int8", action="store_true", help="leave out the int8 configs")
    p.add_argument(
        "--pass",
        dest="passes",
        default="forward",
        choices=("forward", "backward", "both"),
        help="forward kernels (default), the backward kernels (validate_bwd: backward.csv/md) or both",
    )
    p.add_argument("--no-emulator", action="store_true", help="run the kernels only (GPU fixture recording)")
    p.add_argument(
        "--record-fixtures",
        type=Path,
        metavar="DIR",
        help="also write fixtures (configs, seeds, kernel outputs, m_i, l_i, env) into DIR",
    )
    p.add_argument(
        "--fixtures",
        type=Path,
        metavar="DIR",
        help="compare the emulator against recorded GPU fixtures in DIR (no kernel runs)",
    )
    p.add_argument(
        "--plans",
        type=plan_families,
        default=None,
        metavar="FAMILY[,FAMILY...]",
        help="with --fixtures: emulator plan families to compare, comma-separated: triton "
        "(triton-<fmt>: sm90 dot models, correctly rounded exp2, sequential row sums), h200 "
        "(h200-<fmt>: + the H200's measured ex2.approx and tl.sum order); default triton",
    )
    p.add_argument(
        "--hardware",
        type=Path,
        metavar="FILE",
        default=None,
        help="with --fixtures: also compare under plan('triton-<fmt>', hardware=FILE), a hardware profile "
        "(simfloat-gpu fit --profile; or a shipped name such as h200), as the family named by the profile",
    )
    p.add_argument(
        "--max-cost",
        type=positive_seconds,
        default=None,
        help="with --fixtures: skip configs whose emulator cost estimate exceeds this (seconds)",
    )
    p.add_argument(
        "--budget-s",
        type=positive_seconds,
        default=None,
        help="time budget in seconds; configs not started by then are reported as skipped",
    )


def _profile_arg(value: Path) -> str | Path:
    """A --hardware value: a file, else (no such file) a shipped profile's name."""
    return value if value.is_file() else str(value)


def run(args: argparse.Namespace, log: Callable[[str], None] = print) -> int:
    """Run the command parsed by :func:`add_arguments`: options and paths are checked (and the output folders
    created) before any work; returns the exit status (2: bad arguments)."""
    start = time.monotonic()
    try:
        check_args(args)
    except ValueError as err:
        print(f"validate: error: {err}", file=sys.stderr)
        return 2
    out_dir: Path = args.out
    if args.fixtures is not None:
        import simfloat

        families = list(args.plans or ["triton"])
        if getattr(args, "hardware", None) is not None:
            try:
                families = list(dict.fromkeys([*families, use_hardware(_profile_arg(args.hardware))]))
            except ValueError as err:
                print(f"validate: error: --hardware: {err}", file=sys.stderr)
                return 2
        stop = None
        try:
            env, rows = compare_fixtures(args.fixtures, max_cost=args.max_cost, families=families, log=log)
        except Interrupted as exc:
            stop = exc
            env, rows = exc.results
        env = dict(env, compared_on=environment("cpu"), simfloat=simfloat.__version__)
        table = agreement_table(rows)
        names = ", ".join(f"{f}-<fmt>" for f in families)
        write_report(
            out_dir,
            rows,
            env,
            None,
            elapsed=time.monotonic() - start,
            title=f"Emulator ({names} plans) vs recorded {Path(args.fixtures).name} kernel outputs",
            notes=[
                "triton-<fmt>: sm90 tensor-core model, correctly rounded exp2, sequential row "
                "sums: known inexact on a GPU in exp2 (ex2.approx.ftz.f32 is not correctly "
                "rounded) and the row sum l_ij (a layout-dependent tree); m_i depends on the QK^T "
                "model alone. h200-<fmt>: the same with the H200's measured ex2.approx and tl.sum "
                "order."
            ],
        )
        with open(out_dir / "validation.md", "a") as f:
            f.write(f"\n## Bitwise agreement per config and plan family\n\n```\n{table}\n```\n")
        log(table)
        if stop is None:  # backward fixtures (the fixture folder's backward/): the same families, flash_backward
            from simfloat_gpu.campaign import validate_bwd

            bwd_rows = validate_bwd.compare_backward_fixtures(
                args.fixtures, families=[f for f in families if f in PLAN_FAMILIES], log=log
            )
            if bwd_rows:
                bwd_table = validate_bwd.write_backward_report(
                    out_dir,
                    bwd_rows,
                    f"Emulator flash_backward vs recorded {Path(args.fixtures).name} backward kernel outputs",
                    elapsed=time.monotonic() - start,
                    unit="(config, plan) rows",
                )
                with open(out_dir / "validation.md", "a") as f:
                    f.write(f"\n## Backward: bitwise agreement per config and plan\n\n{bwd_table}")
                log(bwd_table)
        if stop is not None:
            print(
                f"validate: interrupted after {time.monotonic() - start:.1f} s: {len(rows)} comparisons "
                f"finished, kept in {out_dir / 'validation.csv'} and validation.md",
                file=sys.stderr,
            )
            return 130
        log(f"wrote {out_dir / 'validation.csv'} and validation.md")
        return 0
    backend = resolve_backend(args.backend)
    bwd_failed = False
    if getattr(args, "passes", "forward") in ("backward", "both"):
        from simfloat_gpu.campaign.validate_bwd import run_backward

        bwd_deadline = None if args.budget_s is None else start + float(args.budget_s)
        bwd_rows = run_backward(
            out_dir, args.grid, backend, emulate=not args.no_emulator, deadline=bwd_deadline, log=log
        )
        bwd_failed = backend == "faithful" and not args.no_emulator and any(r.status != "bitwise" for r in bwd_rows)
        log(
            f"backward: {sum(r.status == 'bitwise' for r in bwd_rows)}/{len(bwd_rows)} bitwise; wrote "
            f"{out_dir / 'backward.csv'}"
        )
        if args.passes == "backward":
            return 1 if bwd_failed else 0
    configs = grid(args.grid, int8=not args.no_int8)
    jobs = args.jobs
    if jobs is None:
        jobs = min(os.cpu_count() or 1, 8 if backend == "faithful" else 12)
    deadline = None if args.budget_s is None else start + float(args.budget_s)
    emulate = not args.no_emulator
    if emulate:
        import simfloat  # noqa: F401  (fail early and clearly if it is not importable)
    log(f"validate: {len(configs)} configs ({args.grid} grid), backend {backend}, {jobs} job(s)")
    stop = None
    try:
        results = run_grid(
            configs,
            backend,
            jobs=jobs,
            emulate=emulate,
            record=args.record_fixtures is not None,
            deadline=deadline,
            log=log,
        )
    except Interrupted as exc:
        stop = exc
        results = exc.results
    rows = [r for r, _ in results]
    env = environment(backend)
    config = None
    if backend == "faithful" and stop is None:  # an interrupted config may still be inside faithful()
        from simfloat_gpu.interpreter import faithful, faithful_config

        with faithful():
            config = faithful_config()
    elapsed = time.monotonic() - start
    env["elapsed_s"] = round(elapsed, 1)
    env["jobs"] = jobs
    env["cpu_s"] = cpu_seconds()
    with contextlib.suppress(Exception):
        env["load_average"] = [round(x, 2) for x in os.getloadavg()]
    if args.record_fixtures is not None:
        n = write_fixtures(args.record_fixtures, results, configs, env)
        log(f"recorded {n} fixture configs in {args.record_fixtures}")
    where = "GPU" if backend == "gpu" else "faithful CPU interpreter"
    write_report(
        out_dir,
        rows,
        env,
        config,
        elapsed=elapsed,
        title=f"Triton kernels ({where}) vs simfloat emulator, {args.grid} grid",
    )
    s = summarize(rows)
    if stop is not None:
        print(
            f"validate: interrupted after {elapsed:.1f} s: {stop.finished} of {len(configs)} configs finished "
            f"({s['bitwise_100']}/{s['compared']} compared bitwise identical), kept in "
            f"{out_dir / 'validation.csv'} and validation.md"
            + (f" and the fixtures in {args.record_fixtures}" if args.record_fixtures is not None else ""),
            file=sys.stderr,
        )
        return 130
    log(
        f"{s['configs']} configs in {elapsed:.1f} s ({env['cpu_s']} CPU s): "
        f"{s['bitwise_100']}/{s['compared']} "
        f"bitwise identical, "
        f"{s['kernel_only']} kernel only, {s['errors']} errors, {s['skipped']} skipped; wrote {out_dir}"
    )
    if backend == "faithful" and emulate and (s["bitwise_100"] != s["compared"] or s["errors"]):
        return 1
    return 1 if bwd_failed else 0


def main(argv: Sequence[str] | None = None, prog: str = "simfloat-gpu validate") -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        return run(args)
    except RuntimeError as exc:  # no triton / no CUDA / TRITON_INTERPRET set too late: say what to do
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
