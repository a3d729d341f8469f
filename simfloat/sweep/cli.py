"""``simfloat sweep`` and ``simfloat report``: their options and what they print."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from simfloat._args import positive_int
from simfloat.sweep.cluster import SlurmOptions

__all__ = ["add_report", "add_sweep", "run_report", "run_sweep_cli", "slurm_options"]

#: The Slurm options of ``simfloat sweep``: argparse dest -> :class:`~simfloat.sweep.cluster.SlurmOptions` field.
_SLURM = {
    "cores": "cores",
    "memory": "memory",
    "processes": "processes",
    "walltime": "walltime",
    "account": "account",
    "partition": "partition",
    "jobs": "jobs",
    "min_jobs": "min_jobs",
    "max_jobs": "max_jobs",
    "cluster_option": "directives",
    "job_prologue": "prologue",
    "interface": "interface",
    "job_log_dir": "log_directory",
}


def add_sweep(sub: argparse._SubParsersAction) -> None:
    """The ``sweep`` subcommand's options."""
    p = sub.add_parser(
        "sweep",
        help="run a grid of attribution or error runs (a TOML SPEC) on Dask into a resumable SQLite store",
        description="Expand the SPEC's grid, skip the configs the store already has, run the others on a "
        "local Dask cluster (or --scheduler) and commit each run to the store as it finishes. Rerun the same "
        "command after a kill to resume.",
    )
    p.add_argument(
        "spec", metavar="SPEC", help="the TOML file ([sweep] name, kind, seeds; [grid]; [[include]]/[[exclude]])"
    )
    p.add_argument("--store", required=True, metavar="PATH", help="the SQLite results store (created if missing)")
    p.add_argument("--scheduler", metavar="ADDRESS", help="a running Dask scheduler (default: a local cluster)")
    p.add_argument("--workers", type=positive_int, metavar="N", help="local cluster processes (default: the cores)")
    p.add_argument("--retry-failed", action="store_true", help="run the configs whose stored run failed again")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--shards",
        action="store_true",
        help="each worker commits its runs to a file of its own in <store>.shards/, merged into the store when "
        "the sweep starts and ends: for a store on NFS, Lustre, GPFS, ... (where the store's WAL mode is refused)",
    )
    p.add_argument(
        "--cluster",
        choices=("local", "slurm"),
        default="local",
        help="local: this machine (or --scheduler); slurm: Slurm jobs of Dask workers (dask-jobqueue, the "
        "'cluster' extra), sized by the options below",
    )
    g = p.add_argument_group("Slurm jobs (--cluster slurm)")
    g.add_argument("--cores", type=positive_int, metavar="N", help="CPUs per job (--cpus-per-task)")
    g.add_argument("--memory", metavar="SIZE", help="memory per job (16GB)")
    g.add_argument(
        "--processes", type=positive_int, metavar="N", help="Dask workers per job, one run each (default: --cores)"
    )
    g.add_argument("--walltime", metavar="TIME", help="the jobs' time limit ([D-]HH:MM:SS)")
    g.add_argument("--account", metavar="NAME", help="the account charged (-A)")
    g.add_argument("--partition", "--queue", metavar="NAME", help="the partition (-p)")
    g.add_argument("--jobs", type=positive_int, metavar="N", help="a fixed number of jobs (default 1)")
    g.add_argument("--min-jobs", type=int, metavar="N", help="adaptive scaling: at least N jobs (default 0)")
    g.add_argument("--max-jobs", type=positive_int, metavar="N", help="adaptive scaling: at most N jobs")
    g.add_argument(
        "--cluster-option",
        action="append",
        default=[],
        metavar="KEY[=VALUE]",
        help="one more #SBATCH --KEY=VALUE line (repeatable): --cluster-option gres=gpu:1",
    )
    g.add_argument(
        "--job-prologue",
        action="append",
        default=[],
        metavar="LINE",
        help="a shell line the job runs before its workers start (repeatable): 'module load python'",
    )
    g.add_argument("--interface", metavar="NAME", help="network interface of the scheduler and workers (ib0)")
    g.add_argument("--job-log-dir", metavar="DIR", help="the jobs' stdout and stderr files")
    g.add_argument("--print-job-script", action="store_true", help="print the jobs' batch script and exit")
    p.set_defaults(func=run_sweep_cli)


def slurm_options(args: argparse.Namespace) -> SlurmOptions | None:
    """The :class:`~simfloat.sweep.cluster.SlurmOptions` of the command line; None when no Slurm option is given
    and the cluster is not Slurm.

    Raises:
        ValueError: Slurm options without ``--cluster slurm``.
    """
    given: dict[str, Any] = {
        field: tuple(v) if isinstance(v, list) else v
        for dest, field in _SLURM.items()
        if (v := getattr(args, dest, None)) not in (None, [])
    }
    if args.cluster != "slurm":
        if given or args.print_job_script:
            names = ", ".join("--" + d.replace("_", "-") for d, f in _SLURM.items() if f in given)
            raise ValueError(f"{names or '--print-job-script'}: Slurm options need --cluster slurm")
        return None
    return SlurmOptions(**given)


def run_sweep_cli(args: argparse.Namespace) -> int:
    """Exit status: 0 every config has a finished row, 1 some failed or were lost, 2 a bad SPEC or store,
    130 Ctrl-C (the finished runs are in the store)."""
    import os

    from simfloat.sweep import SpecError, run_sweep
    from simfloat.sweep.cluster import job_script

    if os.getcwd() not in sys.path:  # a kind "package.module:function" imports from here, as with python -m
        sys.path.insert(0, os.getcwd())
    try:
        slurm = slurm_options(args)
        if args.print_job_script:
            print(job_script(slurm or SlurmOptions()), flush=True)
            return 0
        res = run_sweep(
            args.spec,
            args.store,
            scheduler=args.scheduler,
            workers=args.workers,
            progress=not args.no_progress,
            retry_failed=args.retry_failed,
            echo=lambda line: print(line, flush=True),
            cluster=args.cluster,
            slurm=slurm,
            shards=args.shards,
        )
    except (SpecError, ValueError, ImportError) as err:
        print(f"simfloat sweep: error: {err}", file=sys.stderr)
        return 2
    print(res.summary(), flush=True)
    if res.interrupted:
        return 130
    return 0 if res.complete else 1


def add_report(sub: argparse._SubParsersAction) -> None:
    """The ``report`` subcommand's options."""
    p = sub.add_parser(
        "report",
        help="a sweep's results store as tables (CSV + markdown) and plots",
        description="Per metric: the finished runs grouped by the --by axes (mean, std, min, max, count over "
        "the others, e.g. the seeds), as a CSV and a section of report.md, and a plot of the metric against "
        "--x, one line per value of the other --by axes.",
    )
    p.add_argument("--store", required=True, metavar="PATH", help="the SQLite results store")
    p.add_argument("--out", metavar="DIR", help="output folder (default: <store stem>-report next to the store)")
    p.add_argument(
        "--by", nargs="+", metavar="AXIS", help="config keys to group by (default: every varying key but seed)"
    )
    p.add_argument("--metric", action="append", metavar="M", help="metric to tabulate (repeatable; default: all)")
    p.add_argument("--x", metavar="AXIS", help="the plots' horizontal axis, one of --by (default: the first numeric)")
    p.add_argument("--no-plots", action="store_true", help="tables only")
    p.set_defaults(func=run_report)


def run_report(args: argparse.Namespace) -> int:
    """Exit status 0, or 2 for a missing store or a bad --by/--metric/--x."""
    from simfloat.sweep import report

    try:
        rep = report(args.store, args.out, by=args.by, metrics=args.metric, x=args.x, plots=not args.no_plots)
    except (ValueError, ImportError) as err:
        print(f"simfloat report: error: {err}", file=sys.stderr)
        return 2
    print(
        f"simfloat report: {rep.runs} finished runs ({rep.failed} failed, left out), {len(rep.metrics)} "
        f"metric{'s' if len(rep.metrics) != 1 else ''} "
        f"grouped by {', '.join(rep.by) or '(one group)'}" + (f", plotted against {rep.x}" if rep.x else "")
    )
    print(f"wrote {len(rep.files)} files to {rep.out}: report.md, <metric>.csv" + (", <metric>.png" if rep.x else ""))
    return 0
