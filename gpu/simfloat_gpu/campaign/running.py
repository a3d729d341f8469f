"""Running the Triton kernels: the backend (the GPU, or the faithful CPU interpreter), the setup every kernel
run shares, one config's run (kernel, emulator, float64 reference) and a grid of configs in worker processes.

Imports only numpy and the standard library at import time: torch, triton and simfloat are loaded where used.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from simfloat_gpu.campaign.compare import (
    compare_to_emulator,
    error_stats,
    error_status,
    new_record,
)
from simfloat_gpu.campaign.grid import Config, estimated_cost, input_crc, make_inputs, reference64
from simfloat_gpu.campaign.kinds import kind_of
from simfloat_gpu.campaign.records import ValidationRecord
from simfloat_gpu.campaign.report import cell

__all__ = [
    "ChildFailed",
    "Crashed",
    "Interrupted",
    "TimedOut",
    "kernel_session",
    "resolve_backend",
    "run_grid",
    "run_in_child",
    "run_kernel",
    "torch_dtype",
    "validate_config",
    "worker_init",
]

#: one config's result: its record and, when recording fixtures, the kernel's arrays
Result = tuple[ValidationRecord, dict[str, np.ndarray] | None]

# ----------------------------------------------------------------------------------------------------
# backends
# ----------------------------------------------------------------------------------------------------


def _env_interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def resolve_backend(backend: str = "auto") -> str:
    """ "gpu" or "faithful"; prepares TRITON_INTERPRET accordingly (before triton is imported)."""
    if backend == "auto":
        backend = "gpu" if (not _env_interpret() and _cuda_available()) else "faithful"
    if backend not in ("gpu", "faithful"):
        raise ValueError(f"backend must be auto, gpu or faithful, got {backend!r}")
    if backend == "faithful":
        if "triton" in sys.modules and not _env_interpret():
            import triton.language as tl

            if type(tl.standard.sum).__name__ != "InterpretedFunction":
                raise RuntimeError(
                    "the faithful backend needs TRITON_INTERPRET=1 before triton is first "
                    "imported; "
                    "triton is already imported without it in this process (run "
                    "`TRITON_INTERPRET=1 python -m simfloat_gpu.campaign.validate ...`)"
                )
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        if _env_interpret():
            raise RuntimeError("backend 'gpu' but TRITON_INTERPRET is set: unset it to run compiled kernels")
        if not _cuda_available():
            raise RuntimeError("backend 'gpu' needs torch with a CUDA device (torch.cuda.is_available() is False)")
    try:
        import torch  # noqa: F401
        import triton  # noqa: F401
    except ImportError as exc:
        from simfloat_gpu import INSTALL_HINT

        raise RuntimeError(
            f"running the Triton kernels needs torch and triton ({exc}); install the GPU side: {INSTALL_HINT}"
        ) from exc
    return backend


def torch_dtype(fmt: str) -> Any:
    """The torch dtype of a format name (bf16, fp16, fp32)."""
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[fmt]


@contextlib.contextmanager
def kernel_session(
    backend: str, fmt: str, *arrays: np.ndarray, faithful_options: dict[str, Any] | None = None
) -> Iterator[tuple[str, list[Any]]]:
    """The setup every kernel run shares: ``arrays`` as torch tensors of ``fmt`` on the backend's device
    ("cuda" for ``gpu``, else "cpu"), the body run under the faithful interpreter for backend ``faithful``
    (:func:`simfloat_gpu.interpreter.faithful` with ``faithful_options``), and the GPU synchronized at the end.

    Yields:
        (device, the tensors in the order of ``arrays``).
    """
    import torch

    device = "cuda" if backend == "gpu" else "cpu"
    dt = torch_dtype(fmt)
    tensors = [torch.from_numpy(np.ascontiguousarray(x)).to(dt).to(device) for x in arrays]
    ctx: Any = contextlib.nullcontext()
    if backend == "faithful":
        from simfloat_gpu.interpreter import faithful

        ctx = faithful(**(faithful_options or {}))
    with ctx:
        yield device, tensors
    if backend == "gpu":
        torch.cuda.synchronize()


def run_kernel(
    cfg: Config, q: np.ndarray, k: np.ndarray, v: np.ndarray, *, backend: str, fp32_too: bool = False
) -> dict[str, np.ndarray]:
    """The Triton kernel of the config's kind on the inputs. Returns float32 numpy arrays: ``out`` (in the
    config's output format), ``out32`` (the fp32 output, when ``cfg.out == "fp32"`` or ``fp32_too``), ``m``,
    ``l``."""
    with kernel_session(backend, cfg.fmt, q, k, v) as (device, (tq, tk, tv)):
        return kind_of(cfg).kernel(cfg, tq, tk, tv, device, fp32_too)


def validate_config(cfg: Config, backend: str, *, emulate: bool = True, record: bool = False) -> Result:
    """Run one config: kernel, emulator (unless ``emulate`` is False), float64 reference. Returns the record
    and, with ``record``, the kernel's arrays for a fixture (out, out32, m, l as float32)."""
    rec = new_record(cfg, backend)
    arrays = None
    try:
        if cfg.kv_heads or cfg.precision:
            raise ValueError(f"{cfg.id}: kv_heads and precision configs are for the backward pass (validate_bwd)")
        q, k, v = make_inputs(cfg)
        t0 = time.perf_counter()
        kern = run_kernel(cfg, q, k, v, backend=backend, fp32_too=record)
        kernel_s = round(time.perf_counter() - t0, 3)
        ref = reference64(q, k, v, cfg.causal)
        err_max, err_rms = error_stats(kern["out"], ref)
        rec = dataclasses.replace(rec, kernel_s=kernel_s, kernel_err_max=err_max, kernel_err_rms=err_rms)
        if record:
            arrays = {
                key: np.asarray(val, dtype=np.float32)
                for key, val in kern.items()
                if not (key == "out32" and cfg.out == "fp32")
            }  # the same launch: stored once
            arrays["crc"] = np.array([input_crc(q, k, v)], dtype=np.uint32)
        rec = dataclasses.replace(rec, status="ok")
        if emulate:
            rec = compare_to_emulator(rec, cfg, (q, k, v), ref, kern)
    except Exception as exc:  # one failing config must not lose the others
        rec = dataclasses.replace(rec, status=error_status(exc))
    return rec, arrays


# ----------------------------------------------------------------------------------------------------
# one call in a child process
# ----------------------------------------------------------------------------------------------------


class Crashed(RuntimeError):
    """The child process of :func:`run_in_child` died without an answer (a signal, ``os._exit``, a fault).

    Attributes:
        exitcode: the child's exit code; negative: killed by signal ``-exitcode``.
    """

    def __init__(self, exitcode: int | None) -> None:
        self.exitcode = exitcode
        super().__init__(self.describe(exitcode))

    @staticmethod
    def describe(exitcode: int | None) -> str:
        """``signal SIGSEGV (11)``, ``exit code 3`` or ``no exit code``."""
        import signal

        if exitcode is None:
            return "no exit code"
        if exitcode < 0:
            try:
                name = signal.Signals(-exitcode).name
            except ValueError:
                name = "signal"
            return f"signal {name} ({-exitcode})"
        return f"exit code {exitcode}"


class TimedOut(RuntimeError):
    """The child process of :func:`run_in_child` ran past its time limit and was killed."""


class ChildFailed(RuntimeError):
    """The call in the child process of :func:`run_in_child` raised; the message is the child's description of
    the exception (its ``describe`` argument's result)."""


def _child_main(
    conn: Any, fn: Callable[..., Any], args: tuple[Any, ...], describe: Callable[[BaseException], str]
) -> None:
    try:
        msg = ("ok", fn(*args))
    except BaseException as exc:  # the parent gets a line, never the child's traceback objects
        try:
            msg = ("error", describe(exc))
        except Exception:  # a describe that fails must not lose the error
            msg = ("error", f"{type(exc).__name__}: {exc}")
    conn.send(msg)
    conn.close()


def run_in_child(
    fn: Callable[..., Any],
    *args: Any,
    method: str = "forkserver",
    describe: Callable[[BaseException], str] = lambda e: f"{type(e).__name__}: {e}",
    preload: Sequence[str] = (),
    timeout: float | None = None,
) -> Any:
    """``fn(*args)`` in a child process of start method ``method``, its result (which must pickle) sent back
    through a pipe: a child that dies (a signal, a segfault, memory corruption, ``os._exit``) costs this call
    only.

    ``method``: "forkserver" (children forked from a clean server process that imported ``preload`` once: cheap
    children, safe after this process used OpenMP or CUDA), "spawn" (a fresh interpreter each) or "fork" (a copy
    of this process: unsafe once it ran OpenMP threads, as numba's omp layer; the child aborts). With
    "forkserver" and "spawn", ``fn`` and ``args`` must pickle (module-level functions). ``timeout``: seconds
    after which the child is killed (None: no limit).

    Returns:
        What ``fn`` returned.

    Raises:
        Crashed: the child died without an answer (``exitcode``: its exit code, negative for a signal).
        ChildFailed: ``fn`` raised in the child (the message: ``describe(exception)``, made in the child).
        TimedOut: the child ran past ``timeout`` seconds (it is killed).
        KeyboardInterrupt: Ctrl-C (the child is terminated).
    """
    import multiprocessing as mp

    ctx: Any = mp.get_context(method)
    if method == "forkserver" and preload:
        ctx.set_forkserver_preload(list(preload))  # used when the server starts (the first call)
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child_main, args=(send, fn, args, describe), daemon=True)
    proc.start()
    send.close()  # the child holds the only write end: its death is EOF here
    msg = None
    end = None if timeout is None else time.monotonic() + timeout
    try:
        while True:
            if recv.poll(0.1):
                with contextlib.suppress(EOFError, OSError):
                    msg = recv.recv()
                break
            if not proc.is_alive() and not recv.poll(0):
                break
            if end is not None and time.monotonic() > end:
                proc.kill()
                proc.join(timeout=2)
                raise TimedOut(f"killed after {timeout:g} s")
        proc.join()
    except BaseException:
        proc.terminate()
        proc.join(timeout=2)
        raise
    finally:
        recv.close()
    if msg is None:
        raise Crashed(proc.exitcode)
    kind, payload = msg
    if kind == "error":
        raise ChildFailed(payload)
    return payload


# ----------------------------------------------------------------------------------------------------
# the grid, in parallel
# ----------------------------------------------------------------------------------------------------

_WORKER: dict[str, Any] = {}


def worker_init(backend: str, numba_threads: int) -> None:
    """The initializer of a worker process of :func:`run_grid` (and of ``simfloat-gpu run``'s pool): Ctrl-C
    left to the parent, the faithful backend's TRITON_INTERPRET set, numba's thread count (0: numba's default)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it terminates the workers
    if backend == "faithful":
        os.environ["TRITON_INTERPRET"] = "1"
    _WORKER["backend"] = backend
    if numba_threads > 0:
        with contextlib.suppress(Exception):
            import numba

            numba.set_num_threads(numba_threads)


def _worker_run(cfg_dict: dict[str, Any], emulate: bool, record: bool) -> Result:
    return validate_config(Config.from_dict(cfg_dict), _WORKER["backend"], emulate=emulate, record=record)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`run_grid` or :func:`compare_fixtures` (raised within a fraction of a second).

    Attributes:
        results: what the interrupted function would have returned, the configs not finished marked
            ``skipped: interrupted``: run_grid's ``[(row, arrays)]``, compare_fixtures' ``(env, rows)``.
        finished: the number of configs (compare_fixtures: rows) finished.
    """

    def __init__(self, results: Any, finished: int) -> None:
        super().__init__(f"interrupted after {finished} finished")
        self.results, self.finished = results, finished


def run_grid(
    configs: Sequence[Config],
    backend: str,
    *,
    jobs: int = 1,
    emulate: bool = True,
    record: bool = False,
    deadline: float | None = None,
    log: Callable[[str], None] = print,
) -> list[Result]:
    """Run every config (``jobs`` worker processes; 1: in this process, on a thread of its own so that Ctrl-C
    is seen at once). Configs not started before ``deadline`` (a time.monotonic() value) are reported as
    skipped. Results come back in config order.

    Raises:
        Interrupted: Ctrl-C (the worker processes are terminated; the finished configs are in its results).
    """
    results: dict[int, Result] = {}
    try:
        _run_grid(configs, backend, results, jobs=jobs, emulate=emulate, record=record, deadline=deadline, log=log)
    except KeyboardInterrupt:
        raise Interrupted(_in_order(configs, backend, results, "skipped: interrupted"), len(results)) from None
    return _in_order(configs, backend, results, "skipped: time budget")


def _in_order(
    configs: Sequence[Config],
    backend: str,
    results: dict[int, Result],
    missing: str,
) -> list[Result]:
    out = []
    for i, cfg in enumerate(configs):
        if i in results:
            out.append(results[i])
        else:
            out.append((new_record(cfg, backend, status=missing), None))
    return out


def _run_grid(
    configs: Sequence[Config],
    backend: str,
    results: dict[int, Result],
    *,
    jobs: int,
    emulate: bool,
    record: bool,
    deadline: float | None,
    log: Callable[[str], None],
) -> None:
    from simfloat._interrupt import call_interruptibly

    n = len(configs)

    def done(i: int, res: Result) -> None:
        results[i] = res
        rec = res[0]
        log(
            f"[{len(results)}/{n}] {rec.id}: {rec.status}"
            + (
                f", out {rec.bitwise_agreement}, m {cell(rec.m_agreement)}, l {cell(rec.l_agreement)}"
                if rec.compared
                else ""
            )
            + f" ({cell(rec.kernel_s)} s + {rec.emulator_s or 0} s)"
        )

    def over() -> bool:
        return deadline is not None and time.monotonic() > deadline

    if jobs <= 1 or n <= 1:
        for i, cfg in enumerate(configs):
            if over():
                break
            done(i, call_interruptibly(validate_config, cfg, backend, emulate=emulate, record=record))
    else:
        import concurrent.futures as cf
        import multiprocessing as mp

        order = sorted(range(n), key=lambda i: -estimated_cost(configs[i]))  # longest first
        threads = 1 if backend == "faithful" else 0
        ex = cf.ProcessPoolExecutor(
            max_workers=jobs, mp_context=mp.get_context("spawn"), initializer=worker_init, initargs=(backend, threads)
        )
        stopped = False
        try:
            futs = {ex.submit(_worker_run, configs[i].as_dict(), emulate, record): i for i in order}
            pending = set(futs)
            while pending:
                timeout = 0.5 if deadline is None else min(0.5, max(0.0, deadline - time.monotonic()))
                finished, pending = cf.wait(pending, timeout=timeout, return_when=cf.FIRST_COMPLETED)
                for f in finished:
                    i = futs[f]
                    try:
                        done(i, f.result())
                    except Exception as exc:  # a worker died
                        status = f"error: worker: {type(exc).__name__}: {str(exc)[:200]}"
                        done(i, (new_record(configs[i], backend, status=status), None))
                if over() and pending:
                    log(f"time budget reached: {len(pending)} config(s) not finished")
                    break
        except KeyboardInterrupt:
            _stop_pool(ex)
            stopped = True
            raise
        finally:
            if stopped:
                pass
            elif over():
                _stop_pool(ex)
            else:
                ex.shutdown(wait=True)  # reaped: their CPU time shows in RUSAGE_CHILDREN


def _stop_pool(ex: Any) -> None:
    """Cancel what has not started and terminate the workers this module started (still busy)."""
    procs = list((getattr(ex, "_processes", None) or {}).values())
    ex.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        with contextlib.suppress(Exception):
            p.terminate()
    for p in procs:
        with contextlib.suppress(Exception):
            p.join(timeout=2)


# ----------------------------------------------------------------------------------------------------
