"""A sweep's Slurm cluster (``simfloat sweep --cluster slurm``): dask-jobqueue's ``SLURMCluster``, whose jobs each
start ``processes`` Dask workers of one thread, so that a job runs that many configs at a time, numba getting
the job's cores divided among them (as the local cluster does on this machine).

``dask_jobqueue`` is imported only here, when such a cluster starts (the ``cluster`` extra).
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from dataclasses import dataclass
from typing import Any

__all__ = ["SlurmOptions", "job_script", "slurm_cluster", "start_jobs"]

_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_-]*\Z")
_WALLTIME = re.compile(r"(\d+-)?\d+(:\d+){0,2}\Z")  # Slurm's MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS


@dataclass(frozen=True)
class SlurmOptions:
    """What a sweep's Slurm jobs ask for, and how many run.

    Attributes:
        cores: CPUs per job (``#SBATCH --cpus-per-task``); None: dask-jobqueue's config
            (``jobqueue.slurm.cores``).
        memory: memory per job (``"16GB"``; ``#SBATCH --mem``); None: dask-jobqueue's config.
        processes: Dask workers per job, one run each at a time (default: ``cores``); numba gets
            ``cores // processes`` threads in each.
        walltime: the jobs' time limit (``#SBATCH -t``, Slurm's ``[D-]HH:MM:SS`` forms).
        account: ``#SBATCH -A``.
        partition: the partition (queue), ``#SBATCH -p``.
        jobs: a fixed number of jobs (default 1 unless ``min_jobs`` / ``max_jobs``).
        min_jobs: adaptive scaling: at least this many jobs (default 0).
        max_jobs: adaptive scaling: at most this many jobs (the cluster grows with the queued runs and shrinks
            when they are done).
        directives: more ``#SBATCH`` lines, each ``"KEY=VALUE"`` (``--KEY=VALUE``) or ``"KEY"`` (``--KEY``):
            ``("gres=gpu:1", "exclusive")``.
        prologue: shell lines run in the job before the workers start (``module load python``).
        interface: the network interface the scheduler and workers talk over (``ib0``); None: Dask's default.
        job_name: ``#SBATCH -J``.
        log_directory: where the jobs' stdout / stderr go (``#SBATCH -o`` / ``-e``); None: Slurm's default.
    """

    cores: int | None = None
    memory: str | None = None
    processes: int | None = None
    walltime: str | None = None
    account: str | None = None
    partition: str | None = None
    jobs: int | None = None
    min_jobs: int | None = None
    max_jobs: int | None = None
    directives: tuple[str, ...] = ()
    prologue: tuple[str, ...] = ()
    interface: str | None = None
    job_name: str = "simfloat-sweep"
    log_directory: str | None = None

    def check(self) -> None:
        """Refuse bad options before any job is asked for.

        Raises:
            ValueError: a count that is not a positive int (``min_jobs`` may be 0), more processes than cores,
                ``jobs`` with ``min_jobs`` / ``max_jobs``, ``min_jobs > max_jobs``, a malformed walltime or
                directive, or a line break in a value; naming the option.
        """
        for name in ("cores", "processes", "jobs", "max_jobs"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"slurm {name} must be a positive int, got {value!r}")
        if self.min_jobs is not None and (
            isinstance(self.min_jobs, bool) or not isinstance(self.min_jobs, int) or self.min_jobs < 0
        ):
            raise ValueError(f"slurm min_jobs must be an int >= 0, got {self.min_jobs!r}")
        if self.cores is not None and self.processes is not None and self.processes > self.cores:
            raise ValueError(f"slurm processes ({self.processes}) cannot exceed the job's cores ({self.cores})")
        if self.jobs is not None and (self.min_jobs is not None or self.max_jobs is not None):
            raise ValueError("slurm jobs is a fixed count; min_jobs / max_jobs scale adaptively: give one or the other")
        if self.min_jobs is not None and self.max_jobs is None:
            raise ValueError("slurm min_jobs needs max_jobs (adaptive scaling between the two)")
        if self.min_jobs is not None and self.max_jobs is not None and self.min_jobs > self.max_jobs:
            raise ValueError(f"slurm min_jobs ({self.min_jobs}) exceeds max_jobs ({self.max_jobs})")
        if self.walltime is not None and not _WALLTIME.match(self.walltime):
            raise ValueError(f"slurm walltime {self.walltime!r}: give Slurm's [D-]HH:MM:SS (or MM, MM:SS, D-HH)")
        for d in self.directives:
            key, _, _ = d.partition("=")
            if not _KEY.match(key):
                raise ValueError(f"slurm directive {d!r}: give KEY=VALUE or KEY (an sbatch option without '--')")
        for name in ("memory", "account", "partition", "interface", "job_name", "log_directory"):
            value = getattr(self, name)
            if value is not None and ("\n" in value or "\r" in value):
                raise ValueError(f"slurm {name} has a line break")
        for line in (*self.directives, *self.prologue):
            if "\n" in line or "\r" in line:
                raise ValueError(f"slurm directive or prologue line {line!r} has a line break")

    def workers_per_job(self) -> int:
        """Dask worker processes per job."""
        cores = self._cores()
        return self.processes if self.processes is not None else cores

    def _cores(self) -> int:
        if self.cores is not None:
            return self.cores
        import dask.config

        cores = dask.config.get("jobqueue.slurm.cores", None)
        if not isinstance(cores, int) or cores < 1:
            raise ValueError(
                "--cluster slurm needs the CPUs per job: --cores N (or jobqueue.slurm.cores in Dask's config)"
            )
        return cores

    def cluster_kwargs(self) -> dict[str, Any]:
        """The ``SLURMCluster`` arguments: ``cores`` / ``processes`` are the job's one-thread workers and
        ``job_cpu`` its CPUs; the prologue exports ``NUMBA_NUM_THREADS`` and the client's ``PYTHONPATH`` (the
        workers import the kind's module as the client does)."""
        self.check()
        cores = self._cores()
        procs = self.workers_per_job()
        if procs > cores:
            raise ValueError(f"slurm processes ({procs}) cannot exceed the job's cores ({cores})")
        path = os.pathsep.join(p for p in sys.path if p)
        prologue = [f"export NUMBA_NUM_THREADS={max(1, cores // procs)}", f"export PYTHONPATH={shlex.quote(path)}"]
        kwargs: dict[str, Any] = dict(
            cores=procs,  # Dask threads per job: one per worker process
            processes=procs,
            job_cpu=cores,
            job_name=self.job_name,
            python=sys.executable,
            job_extra_directives=[f"--{d}" for d in self.directives],
            job_script_prologue=[*prologue, *self.prologue],
            scheduler_options={"dashboard_address": ":0"},
        )
        optional = {
            "memory": self.memory,
            "walltime": self.walltime,
            "account": self.account,
            "queue": self.partition,
            "interface": self.interface,
            "log_directory": self.log_directory,
        }
        kwargs.update({k: v for k, v in optional.items() if v is not None})
        return kwargs


def _jobqueue() -> Any:
    try:
        import dask_jobqueue
    except ImportError:
        raise ImportError(
            "simfloat sweep --cluster slurm needs dask-jobqueue: pip install 'simfloat-emu[cluster]'"
        ) from None
    return dask_jobqueue


def slurm_cluster(options: SlurmOptions) -> Any:
    """A ``dask_jobqueue.SLURMCluster`` for ``options`` (its scheduler runs in this process; no job is
    submitted yet: :func:`start_jobs`).

    Raises:
        ImportError: dask-jobqueue is not installed (naming the ``cluster`` extra).
        ValueError: bad options (:meth:`SlurmOptions.check`), or cores / memory neither given nor in Dask's
            jobqueue config.
    """
    jq = _jobqueue()
    kwargs = options.cluster_kwargs()
    try:
        return jq.SLURMCluster(**kwargs)
    except ValueError as err:
        if "memory" in str(err).lower() and options.memory is None:
            raise ValueError(
                "--cluster slurm needs the memory per job: --memory 16GB (or jobqueue.slurm.memory in Dask's config)"
            ) from None
        raise ValueError(f"slurm cluster: {err}") from None


def start_jobs(cluster: Any, options: SlurmOptions) -> None:
    """Ask Slurm for the jobs: ``options.jobs`` of them (default 1), or adaptive scaling between
    ``min_jobs`` and ``max_jobs``."""
    if options.max_jobs is not None:
        cluster.adapt(minimum_jobs=options.min_jobs or 0, maximum_jobs=options.max_jobs)
    else:
        cluster.scale(jobs=options.jobs or 1)


def job_script(options: SlurmOptions) -> str:
    """The batch script each job of ``options`` would run (a scheduler starts and stops to fill in its address).

    Raises:
        ImportError, ValueError: as :func:`slurm_cluster`.
    """
    cluster = slurm_cluster(options)
    try:
        return str(cluster.job_script())
    finally:
        cluster.close()
