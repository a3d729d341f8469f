"""Running a sweep on Dask: the client submits the runs the store lacks, and commits each result to the store
the moment its future completes (workers only compute and return), so that killing the client or a worker
loses only the runs in flight. With shards (a store on a network filesystem), each worker commits its own runs
to its shard before returning them, and the client merges the shards into the store when it starts and ends.

The cluster is a local one on this machine, a running scheduler, or Slurm jobs (:mod:`simfloat.sweep.cluster`).
``dask.distributed`` is imported only here, when a sweep runs (the ``sweep`` extra).
"""

from __future__ import annotations

import functools
import os
import platform
import socket
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simfloat.sweep.cluster import SlurmOptions
from simfloat.sweep.spec import RESERVED, Spec, load_spec, resolve_kind
from simfloat.sweep.store import Store, shard_dir, write_shard

__all__ = ["CLUSTERS", "SweepResult", "execute", "host_cpu", "run_sweep"]

#: The kinds of cluster :func:`run_sweep` starts.
CLUSTERS = ("local", "slurm")


@dataclass
class SweepResult:
    """What :func:`run_sweep` did.

    Attributes:
        name: the sweep's name.
        store: the store's path.
        total: configs in the SPEC.
        skipped: configs already in the store (finished, or failed without ``retry_failed``).
        skipped_failed: of those, the ones whose stored run failed.
        ok: runs finished and stored in this call.
        failed: runs that raised in this call (stored with their traceback).
        lost: runs whose worker died more often than the scheduler retries, or that the cluster could not run
            (not stored: a rerun retries them).
        lost_errors: the cluster's errors of the first few lost runs.
        interrupted: Ctrl-C stopped the sweep (the runs still in flight were cancelled).
        seconds: wall time of the call.
        axes: the config keys that vary across the grid.
    """

    name: str
    store: Path
    total: int
    skipped: int = 0
    skipped_failed: int = 0
    ok: int = 0
    failed: int = 0
    lost: int = 0
    interrupted: bool = False
    lost_errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    axes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def complete(self) -> bool:
        """Whether every config of the SPEC now has a row that did not fail (in this call or before)."""
        bad = self.failed + self.lost + self.skipped_failed
        return not self.interrupted and bad == 0 and self.skipped + self.ok == self.total

    def summary(self) -> str:
        """One line: how many runs were stored, skipped, failed or lost, and the wall time."""
        parts = [f"{self.ok} run{'s' if self.ok != 1 else ''} stored", f"{self.skipped} already in the store"]
        if self.skipped_failed:
            parts[-1] += f" ({self.skipped_failed} of them failed: --retry-failed runs them again)"
        if self.failed:
            parts.append(f"{self.failed} failed (stored with their traceback; rerun with --retry-failed)")
        if self.lost:
            parts.append(f"{self.lost} lost with their workers (a rerun retries them: {'; '.join(self.lost_errors)})")
        head = "interrupted" if self.interrupted else "done"
        return f"sweep {self.name}: {head} in {self.seconds:.1f} s: " + ", ".join(parts) + f" -> {self.store}"


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


def _cpu_model() -> str:
    """The CPU's model as the OS names it (Linux: ``/proc/cpuinfo``'s model name)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "Processor", "cpu model")):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


@functools.cache
def host_cpu() -> dict[str, str]:
    """This process's CPU, as a run records it: ``cpu_model`` (the OS's name), and the LLVM target numba compiles
    simfloat's kernels for: ``cpu`` (``znver4``, ``skylake-avx512``; ``generic`` under ``NUMBA_CPU_NAME=generic``)
    and ``cpu_features``, its enabled instruction-set features (``avx2 fma ...``, sorted, space-separated)."""
    from numba.core.registry import cpu_target

    _, name, features = cpu_target.target_context.codegen().magic_tuple()
    enabled = sorted(f[1:] for f in features.split(",") if f.startswith("+"))
    return {"cpu_model": _cpu_model(), "cpu": str(name), "cpu_features": " ".join(enabled)}


def _worker_name() -> str:
    try:
        from distributed import get_worker

        return str(get_worker().name)
    except (ImportError, ValueError):
        return f"pid-{os.getpid()}"


def _metrics(out: object, config: Mapping[str, Any]) -> dict[str, Any]:
    """The kind's return value checked: a dict of str -> number, bool or str (numpy scalars converted)."""
    if not isinstance(out, Mapping):
        raise TypeError(f"a sweep kind must return a dict of metrics, got {type(out).__name__}")
    metrics: dict[str, Any] = {}
    for k, v in out.items():
        if not isinstance(k, str):
            raise TypeError(f"metric names must be strings, got {k!r}")
        if k in RESERVED or k in config:
            raise ValueError(f"metric {k!r} has the name of a store column or config key; rename it")
        if hasattr(v, "item") and not isinstance(v, bool | int | float | str):
            v = v.item()  # numpy scalar
        if not isinstance(v, bool | int | float | str):
            raise TypeError(f"metric {k!r} must be a number, bool or string, got {type(v).__name__}")
        metrics[k] = v
    return metrics


def execute(
    target: str, kind: str, sweep: str, config: dict[str, Any], config_hash: str, shards: str | None = None
) -> dict[str, Any]:
    """One run, on a worker: the kind's function on the config, with timings and the environment.

    An exception of the run is caught and returned as a failed row (its traceback in ``error``), so that the
    client stores it; only the worker's death escapes (the scheduler then retries the run elsewhere).

    Args:
        target, kind, sweep, config, config_hash: the run (:class:`~simfloat.sweep.spec.Spec`'s).
        shards: a shards folder: the row is committed to this process's shard before it is returned.

    Returns:
        The store row (:data:`simfloat.sweep.store.COLUMNS`, ``config``, ``metrics``).
    """
    import simfloat
    from simfloat._compiling import compile_seconds

    c0 = compile_seconds()
    row: dict[str, Any] = dict(
        config_hash=config_hash,
        sweep=sweep,
        kind=kind,
        config=config,
        worker=_worker_name(),
        hostname=socket.gethostname(),
        python=platform.python_version(),
        numpy=_version("numpy"),
        numba=_version("numba"),
        simfloat=simfloat.__version__,
        **host_cpu(),
        start=time.time(),
    )
    t0 = time.perf_counter()
    try:
        _, fn, _ = resolve_kind(target)
        row["metrics"] = _metrics(fn(dict(config)), config)
        row["status"], row["error"] = "ok", None
    except Exception:
        row["metrics"], row["status"], row["error"] = None, "failed", traceback.format_exc()
    row["wall_s"] = time.perf_counter() - t0
    row["end"] = time.time()
    if shards is not None:
        write_shard(shards, row)
    row["compile_s"] = compile_seconds() - c0  # not stored: the client's bar leaves it out of its rate
    return row


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _distributed() -> Any:
    try:
        import distributed
    except ImportError:
        raise ImportError("simfloat sweep needs dask.distributed: pip install 'simfloat-emu[sweep]'") from None
    return distributed


def _client(
    scheduler: str | None, workers: int | None, cluster_kind: str = "local", slurm: SlurmOptions | None = None
) -> tuple[Any, Any]:
    """(client, cluster): a connection to ``scheduler``, a Slurm cluster with its jobs asked for, or a local
    cluster of ``workers`` processes with one Dask thread each (numba gets the cores divided among them);
    cluster is None for an existing scheduler."""
    import logging

    dd = _distributed()
    if cluster_kind == "slurm":
        from simfloat.sweep.cluster import slurm_cluster, start_jobs

        opts = slurm if slurm is not None else SlurmOptions()
        sc = slurm_cluster(opts)
        try:
            client = dd.Client(sc)
            start_jobs(sc, opts)
            return client, sc
        except BaseException:
            sc.close()
            raise
    if scheduler is not None:
        try:
            return dd.Client(scheduler, timeout="20s"), None
        except (OSError, TimeoutError) as err:
            raise ValueError(f"scheduler {scheduler!r}: cannot connect: {err}") from None
    n = workers if workers is not None else _cores()
    threads = max(1, _cores() // n)
    cluster = dd.LocalCluster(
        n_workers=n,
        threads_per_worker=1,
        processes=True,
        dashboard_address=":0",  # a free port: never a clash with another cluster on this machine
        silence_logs=logging.ERROR,
        # the workers import the kind's module as the client does
        env={"NUMBA_NUM_THREADS": str(threads), "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
    )
    try:
        return dd.Client(cluster), cluster
    except BaseException:
        cluster.close()
        raise


def _bar(progress: bool, total: int, initial: int, name: str) -> Any:
    if not progress:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        raise ImportError("the sweep's progress bar needs tqdm: pip install 'simfloat-emu[sweep]'") from None
    from simfloat._compiling import BarClock

    return BarClock(  # its rate, hence its ETA, leaves out the workers' compile time
        tqdm(total=total, initial=initial, desc=f"sweep {name}", unit="run", file=sys.stderr, dynamic_ncols=True)
    )


def _positive(value: int | None, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a positive int, got {value!r}")
    return value


def run_sweep(
    spec: str | Path | Mapping[str, Any] | Spec,
    store: str | Path,
    *,
    scheduler: str | None = None,
    workers: int | None = None,
    progress: bool = True,
    retry_failed: bool = False,
    echo: Callable[[str], None] | None = None,
    cluster: str = "local",
    slurm: SlurmOptions | None = None,
    shards: bool = False,
) -> SweepResult:
    """Run every config of a SPEC that the store lacks, on Dask, committing each run as it finishes.

    The SPEC is checked (:func:`simfloat.sweep.spec.load_spec`) and the store opened before any cluster
    starts. A config whose hash has a row is skipped (a failed row too, unless ``retry_failed``); so a
    rerun after a kill resumes, and ends with one row per config.

    Args:
        spec: a TOML path, a SPEC dict or a checked :class:`~simfloat.sweep.spec.Spec`.
        store: the SQLite file (created if missing; its folder must exist).
        scheduler: the address of a running Dask scheduler (``tcp://host:8786``); None: a local cluster of
            ``workers`` processes on this machine (or Slurm jobs: ``cluster``).
        workers: processes of the local cluster (default: this machine's cores); not with ``scheduler``.
        progress: a tqdm bar on stderr, up before the cluster starts.
        retry_failed: run the configs whose stored row failed again (their rows are replaced).
        echo: called with status lines (the counts before the runs start); None: silent.
        cluster: ``"local"`` (this machine, or ``scheduler``) or ``"slurm"``: Slurm jobs of Dask workers
            through dask-jobqueue (the ``cluster`` extra), sized and counted by ``slurm``.
        slurm: the Slurm jobs' options (:class:`~simfloat.sweep.cluster.SlurmOptions`; default: its defaults).
        shards: each worker commits its runs to a shard of its own (``<store>.shards/``), merged into the store
            when the sweep starts and ends; for a store on a network filesystem (NFS, Lustre, GPFS, ...), where
            the store's WAL mode does not work and is refused. A killed sweep keeps every run a worker finished.

    Returns:
        A :class:`SweepResult`.

    Raises:
        SpecError: a bad SPEC (nothing runs).
        SharedFilesystemError: the store is on a network filesystem and ``shards`` is False (a ValueError).
        ValueError: a bad store path, ``workers`` with ``scheduler``, an unreachable scheduler, or bad
            ``cluster`` / ``slurm`` options.
        ImportError: dask.distributed (or, for Slurm, dask-jobqueue) is not installed.
    """
    t0 = time.perf_counter()
    workers = _positive(workers, "workers")
    if scheduler is not None and workers is not None:
        raise ValueError("workers sets the size of the local cluster; an existing scheduler has its own workers")
    if cluster not in CLUSTERS:
        raise ValueError(f"cluster must be one of {', '.join(CLUSTERS)}, got {cluster!r}")
    if cluster == "slurm" and (scheduler is not None or workers is not None):
        raise ValueError("a Slurm cluster has its own scheduler, and its workers are set by the Slurm options")
    if cluster != "slurm" and slurm is not None:
        raise ValueError("Slurm options need cluster='slurm'")
    if slurm is not None:
        slurm.check()
    sp = spec if isinstance(spec, Spec) else load_spec(spec)
    result = SweepResult(name=sp.name, store=Path(store), total=len(sp.configs), axes=sp.axes)
    shard_path = str(shard_dir(Path(store).resolve())) if shards else None
    with Store(store, wal=not shards) as st:
        if shard_path is not None:  # the runs of an earlier sweep that its client did not see end
            for p in sorted(Path(shard_path).glob("*.db")):
                st.merge(p)
        done = st.statuses()
        todo = [
            (h, c)
            for h, c in zip(sp.hashes(), sp.configs, strict=True)
            if h not in done or (retry_failed and done[h] == "failed")
        ]
        result.skipped = result.total - len(todo)
        result.skipped_failed = 0 if retry_failed else sum(done.get(h) == "failed" for h in sp.hashes())
        if echo is not None:
            echo(
                f"sweep {sp.name}: {result.total} configs (axes: {', '.join(sp.axes) or 'none'}), "
                f"{result.skipped} already in {store}, {len(todo)} to run"
            )
        if not todo:
            result.seconds = time.perf_counter() - t0
            return result
        _distributed()  # before the bar: a missing extra is said at once
        bar = _bar(progress, result.total, result.skipped, sp.name)
        client = dask_cluster = None
        futures: list[Any] = []
        try:
            client, dask_cluster = _client(scheduler, workers, cluster, slurm)
            n_workers = max(1, len(client.nthreads()))  # runs compile in parallel, one per worker
            dd = _distributed()
            by_key = {f"simfloat-sweep-{h}": (h, c) for h, c in todo}
            futures = [
                client.submit(
                    execute,
                    sp.target,
                    sp.kind,
                    sp.name,
                    dict(c),
                    h,
                    shard_path,
                    key=f"simfloat-sweep-{h}",
                    pure=False,
                    retries=0,
                )
                for h, c in todo
            ]
            for fut in dd.as_completed(futures):
                compiled = 0.0
                if fut.status == "finished":
                    row = fut.result()
                    compiled = float(row.pop("compile_s", 0.0)) / n_workers
                    if shard_path is None:
                        st.put(row)  # committed before the next result is looked at (with shards: by the worker)
                    if row["status"] == "ok":
                        result.ok += 1
                    else:
                        result.failed += 1
                elif fut.status == "cancelled":
                    continue
                else:  # execute() returns a run's own exception as a row: this is the cluster's (a dead worker)
                    result.lost += 1
                    if len(result.lost_errors) < 5:
                        h, _ = by_key[fut.key]
                        result.lost_errors.append(f"{h[:12]}: {fut.exception()!r}")
                if bar is not None:
                    bar.update(1, compiled=compiled)
                    if result.failed or result.lost:
                        bar.bar.set_postfix(failed=result.failed, lost=result.lost, refresh=False)
        except KeyboardInterrupt:
            result.interrupted = True
        finally:
            if client is not None:
                if futures:
                    client.cancel(futures)
                client.close()
            if dask_cluster is not None:
                dask_cluster.close()
            if bar is not None:
                bar.close()
            if shard_path is not None:
                for p in sorted(Path(shard_path).glob("*.db")):
                    st.merge(p)
    result.seconds = time.perf_counter() - t0
    return result
