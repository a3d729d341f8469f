"""The whole GPU job in one command: environment, validation fixtures, hardware probes, speed.

    simfloat-gpu run --out DIR [--budget-s 230]                    # on the GPU machine
    simfloat-gpu run --out smoke-out --cpu-smoke                   # the same plumbing on a CPU

The exit status is 0 when every part ran, 1 when one failed (its error in ``summary.json`` and the log; the
other parts' files are kept), 2 for bad options or no GPU.

Parts, in this order (each in try/except: one failure loses nothing else; every line of the log is flushed):

1. **env**: GPU name, driver, CUDA, torch, triton, numpy versions (``summary.json``).
2. **isa**: a background subprocess (``python -m simfloat_gpu.campaign.probes isa``, fresh TRITON_CACHE_DIR) launches
the flash
   kernel (bf16, BLOCK 64 and 32; fp16 16 x 16) and the int8 kernel and reads their PTX/SASS back.
3. **pool** (worker processes, several kernels compiling at once): the validation grid in GPU mode with
   fixture recording (kernel outputs only: the emulator runs later, on a CPU, against the fixtures), the
   backward grid (``--bwd-grid``; forward then backward kernels, their outputs recorded the same way), the dot
   probes and the sum probes. Meanwhile the main process runs the **exp** probe.
4. **pack**: ``fixtures.tar`` (``<gpu>/env.json, configs.json, outputs.npz`` and the same three files in
   ``<gpu>/backward/``: copy to tests/fixtures/gpu/; ``simfloat-gpu validate --fixtures`` compares both),
   ``probes.npz`` (dot + sum), ``exp2.npz`` (+ ``exp2_binades.npz`` only if one file would exceed
   ``--max-file-mib``), ``isa.tar.xz``.
5. **speed**: the Triton flash kernel (bf16, head_dim 128, seq 1k..16k, causal and not) against torch SDPA's
   flash backend, and the INT8 / half-INT8 / FP16 kernels (:mod:`simfloat_gpu.campaign.speed`, the runners
   benchmarks/bench_gpu_attention.py times too; triton.testing.do_bench medians, TFLOP/s) -> ``speed.csv``.
   Last, alone on the GPU.

A global time budget (``--budget-s``, counted from process start) bounds every part; what does not fit is
skipped and logged. The outputs are bounded too, for machines that hand back only so much: no file above
``--max-file-mib`` (default 16; the exp2 samples are split into two files, then thinned, to stay below it)
and no more than ``--max-total-mib`` in all (default 64). Everything intermediate lives in a temporary
directory; ``--out`` receives only the files of ``OUT_FILES``, and a final check drops those that would break
a bound, least important first, and records it in ``summary.json``. Needs numpy, torch and triton only (no
pandas, no simfloat on the GPU path).
"""

from __future__ import annotations

import time

START = time.monotonic()

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tarfile  # noqa: E402
import tempfile  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

__all__ = ["main", "OUT_FILES", "DEFAULT_MAX_FILE_MIB", "DEFAULT_MAX_TOTAL_MIB", "PARTS", "check_out_dir"]

#: the folder holding the simfloat_gpu package (a checkout's, or site-packages): the isa subprocess imports it
#: from there
ROOT = Path(__file__).resolve().parents[2]
#: the files this job writes into --out, most important first
OUT_FILES = (
    "log.txt",
    "summary.json",
    "fixtures.tar",
    "probes.npz",
    "exp2.npz",
    "isa.tar.xz",
    "speed.csv",
    "exp2_binades.npz",
)
#: defaults of --max-file-mib and --max-total-mib
DEFAULT_MAX_FILE_MIB = 16.0
DEFAULT_MAX_TOTAL_MIB = 64.0
#: the parts --skip can name
PARTS = ("isa", "validate", "backward", "dot", "sum", "exp", "speed")


class Log:
    """Lines to stdout and to log.txt, flushed one by one, with the time since start."""

    def __init__(self, path: Path) -> None:
        self.f = open(path, "a", buffering=1)  # noqa: SIM115

    def __call__(self, msg: str) -> None:
        line = f"[{time.monotonic() - START:7.1f}s] {msg}"
        print(line, flush=True)
        self.f.write(line + "\n")
        self.f.flush()

    def close(self) -> None:
        self.f.close()


# ----------------------------------------------------------------------------------------------------
# pool tasks
# ----------------------------------------------------------------------------------------------------

_STATE: dict[str, Any] = {}


def _init_worker(smoke: bool) -> None:
    if smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    _STATE["smoke"] = smoke
    _STATE["device"] = "cpu" if smoke else "cuda"
    from simfloat_gpu.campaign.running import worker_init

    worker_init("faithful" if smoke else "gpu", 1 if smoke else 0)


def _task(kind: str, key: Any, payload: Any) -> tuple[str, Any, Any, float, str]:
    """(kind, key, result, seconds, error) for one pool task."""
    t0 = time.perf_counter()
    try:
        smoke, device = _STATE["smoke"], _STATE["device"]
        if kind == "validate":
            from simfloat_gpu.campaign.grid import Config
            from simfloat_gpu.campaign.running import validate_config

            res: Any = validate_config(
                Config.from_dict(payload), "faithful" if smoke else "gpu", emulate=False, record=True
            )
        elif kind == "backward":
            from simfloat_gpu.campaign import validate_bwd
            from simfloat_gpu.campaign.grid import Config

            res = validate_bwd.record_backward_config(Config.from_dict(payload), "faithful" if smoke else "gpu")
        elif kind == "dot":
            from simfloat_gpu.campaign import probes

            res = probes.dot_variant(*payload, device=device, max_rows=48 if smoke else None)
        elif kind == "sum":
            from simfloat_gpu.campaign import probes

            # under the interpreter, a pairwise tree makes simfloat_gpu.campaign.fit's tree inference non-trivial
            res = probes.sum_variant(
                *payload, device=device, faithful_kwargs={"reduce_order": "pairwise"} if smoke else None
            )
        else:
            raise ValueError(kind)
        return kind, key, res, time.perf_counter() - t0, ""
    except Exception as exc:
        return kind, key, None, time.perf_counter() - t0, f"{type(exc).__name__}: {exc}"[:1000]


def _run_pool(
    tasks: list[tuple[str, Any, Any]],
    jobs: int,
    smoke: bool,
    deadline: float,
    log: Log,
    while_waiting: Callable[[], None] | None = None,
) -> list[tuple[str, Any, Any, float, str]]:
    """Run tasks on ``jobs`` spawned workers until ``deadline``; ``while_waiting`` runs in this process
    meanwhile. Unfinished tasks come back with error 'skipped: time budget'."""
    import concurrent.futures as cf
    import multiprocessing as mp

    results: list[tuple[str, Any, Any, float, str]] = []
    ex = cf.ProcessPoolExecutor(
        max_workers=jobs, mp_context=mp.get_context("spawn"), initializer=_init_worker, initargs=(smoke,)
    )
    futs = {ex.submit(_task, *t): t for t in tasks}
    try:
        if while_waiting is not None:
            try:
                while_waiting()
            except Exception:
                log("main-process part failed:\n" + traceback.format_exc())
        pending = set(futs)
        while pending and time.monotonic() < deadline:
            done, pending = cf.wait(
                pending, timeout=max(0.0, deadline - time.monotonic()), return_when=cf.FIRST_COMPLETED
            )
            for f in done:
                try:
                    r = f.result()
                except Exception as exc:  # a worker process died
                    kind, key, _ = futs[f]
                    r = (kind, key, None, 0.0, f"worker died: {type(exc).__name__}: {exc}"[:500])
                results.append(r)
                if r[4]:
                    log(f"{r[0]} {r[1]}: FAILED {r[4]}")
                elif r[0] == "backward":
                    log(f"backward {r[1]}: {r[2][0].status} ({r[3]:.1f} s, dq err {r[2][0].table_cell('dq_err')})")
                elif r[0] != "validate":
                    log(f"{r[0]} {r[1]}: ok ({r[3]:.1f} s)")
                else:
                    row = r[2][0]
                    log(f"validate {r[1]}: {row.status} ({r[3]:.1f} s, err {row.table_cell('kernel_err_max')})")
        for f in pending:
            kind, key, _ = futs[f]
            results.append((kind, key, None, 0.0, "skipped: time budget"))
        if pending:
            log(f"pool: time budget reached, {len(pending)} task(s) not finished")
    finally:
        procs = list(getattr(ex, "_processes", {}).values())
        ex.shutdown(wait=False, cancel_futures=True)
        for p in procs:  # our own workers, possibly still compiling past the deadline
            with contextlib.suppress(Exception):
                if p.is_alive():
                    p.terminate()
        for p in procs:
            with contextlib.suppress(Exception):
                p.join(timeout=5)
    return results


# ----------------------------------------------------------------------------------------------------
# outputs
# ----------------------------------------------------------------------------------------------------


def _savez(path: Path, arrays: dict[str, np.ndarray]) -> int:
    np.savez_compressed(path, **arrays)
    return path.stat().st_size


def _write_exp(out: Path, arrays: dict[str, np.ndarray], max_bytes: int, log: Log) -> list[str]:
    """exp2.npz, split into exp2.npz + exp2_binades.npz only if one file would exceed ``max_bytes``, and
    thinned (every other sweep offset, recorded) if one of those still would."""
    size = _savez(out / "exp2.npz", arrays)
    if size <= max_bytes:
        log(f"exp2.npz: {size / 2**20:.1f} MiB")
        return ["exp2.npz"]
    binade = {k: v for k, v in arrays.items() if "_binade_" in k or k == "segments"}  # both self-described
    rest = {k: v for k, v in arrays.items() if "_binade_" not in k}
    s1, s2 = _savez(out / "exp2.npz", rest), _savez(out / "exp2_binades.npz", binade)
    log(f"exp2.npz {s1 / 2**20:.1f} MiB + exp2_binades.npz {s2 / 2**20:.1f} MiB")
    for name, s, arr in (("exp2.npz", s1, rest), ("exp2_binades.npz", s2, binade)):
        if s > max_bytes:  # last resort: keep every other sweep offset (recorded)
            for k in [k for k in arr if k.endswith("_off")]:
                arr[k] = arr[k][::2]
                arr[k.replace("_off", "_decimated")] = np.array([2])
            s = _savez(out / name, arr)
            log(f"{name} decimated to {s / 2**20:.1f} MiB")
    return ["exp2.npz", "exp2_binades.npz"]


def _tar(path: Path, src: Path, arc_root: str, mode: str) -> int:
    with tarfile.open(path, mode) as t:
        t.add(src, arcname=arc_root)
    return path.stat().st_size


def check_out_dir(
    out: Path, max_file_bytes: int, max_total_bytes: int, log: Callable[[str], None] = print
) -> list[str]:
    """Hold the job's files in ``out`` (those of :data:`OUT_FILES`; nothing else there is touched) to the
    bounds: a file above ``max_file_bytes`` is removed, then the least important ones until the rest fit in
    ``max_total_bytes``. Returns the problems (also logged)."""
    problems = []
    files = [out / n for n in OUT_FILES if (out / n).is_file()]
    kept = []
    for p in files:
        size = p.stat().st_size
        if size > max_file_bytes:
            problems.append(f"{p.name}: {size} bytes > --max-file-mib ({max_file_bytes} bytes): removed")
            p.unlink()
        else:
            kept.append((p, size))
    total = 0
    for p, size in kept:  # most important first
        if total + size > max_total_bytes:
            problems.append(
                f"{p.name}: {size} bytes would take the total past --max-total-mib ({max_total_bytes} bytes): removed"
            )
            p.unlink()
            continue
        total += size
    for msg in problems:
        log("out check: " + msg)
    return problems


# ----------------------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------------------


def _in_grid_order(
    configs: Sequence[Any], results: Sequence[tuple[str, Any, Any, float, str]], missing: Callable[[Any, str], Any]
) -> list[Any]:
    """The pool's results of a grid's configs (forward or backward), one per config in grid order: a config's
    (record, arrays) where its task succeeded, else (``missing(config, status)``, None) with the task's error or
    "skipped" (never run) as the status."""
    got = {r[1]: r for r in results}
    out = []
    for c in configs:
        r = got.get(c.id)
        if r is not None and not r[4]:
            out.append(r[2])
        else:
            out.append((missing(c, r[4] if r is not None else "skipped"), None))
    return out


def _isa_subprocess(work: Path, smoke: bool, budget: float) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(work / "isa_cache")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    cmd = [
        sys.executable,
        "-m",
        "simfloat_gpu.campaign.probes",
        "isa",
        "--out",
        str(work / "isa"),
        "--budget-s",
        f"{budget:.0f}",
    ]
    if smoke:
        cmd.append("--compile-only")
    return subprocess.Popen(
        cmd,
        cwd=str(ROOT),
        env=env,
        stdout=open(work / "isa.log", "w"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
    )


def _parts(text: str) -> set[str]:
    """argparse type of --skip: comma-separated names of :data:`PARTS`."""
    from simfloat_gpu.campaign.arguments import names_of

    return names_of(text, PARTS, "part")


def _mib(text: str) -> float:
    """argparse type: a finite size in MiB > 0."""
    from simfloat_gpu.campaign.arguments import positive_number

    return positive_number(text, "a positive size in MiB")


def _parser(prog: str) -> argparse.ArgumentParser:
    """The command line of :func:`main`."""
    from simfloat_gpu.campaign.arguments import positive_int, positive_seconds

    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="output directory (created)")
    p.add_argument(
        "--budget-s",
        type=positive_seconds,
        default=230.0,
        help="total seconds, from process start (default 230; the last 8, 3 with --cpu-smoke, are "
        "kept for the final check)",
    )
    p.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="no GPU: tiny sizes under the faithful interpreter (TRITON_INTERPRET=1)",
    )
    p.add_argument(
        "--jobs",
        type=positive_int,
        default=None,
        help="worker processes (default: CPU count - 2, 2..14; 2 with --cpu-smoke)",
    )
    p.add_argument(
        "--grid",
        default=None,
        choices=("full", "ci", "smoke", "tiles"),
        help="validation grid (default: full; smoke with --cpu-smoke; tiles: whole tiles only)",
    )
    p.add_argument(
        "--bwd-grid",
        default=None,
        choices=("full", "ci", "smoke"),
        help="backward grid (simfloat_gpu.campaign.validate_bwd; default: ci; smoke with --cpu-smoke)",
    )
    p.add_argument(
        "--skip",
        type=_parts,
        default=set(),
        metavar="PART[,PART...]",
        help=f"comma-separated parts to skip: {','.join(PARTS)}",
    )
    p.add_argument(
        "--max-file-mib",
        type=_mib,
        default=DEFAULT_MAX_FILE_MIB,
        help=f"largest file the job leaves in --out, in MiB (default {DEFAULT_MAX_FILE_MIB:g})",
    )
    p.add_argument(
        "--max-total-mib",
        type=_mib,
        default=DEFAULT_MAX_TOTAL_MIB,
        help=f"most the job leaves in --out in all, in MiB (default {DEFAULT_MAX_TOTAL_MIB:g})",
    )
    return p


def _pool_tasks(configs: list, bwd_configs: list, skip: set[str], smoke: bool) -> list[tuple[str, Any, Any]]:
    """The pool's (kind, key, argument) tasks: the all-pairs part of the forward grid first (the first 25 of a
    grid of more than 40), the backward grid, the dot and sum probes, then the rest of the forward grid."""
    from simfloat_gpu.campaign import probes

    tasks: list[tuple[str, Any, Any]] = []
    n_pairs = 25 if len(configs) > 40 else len(configs)
    if "validate" not in skip:
        tasks += [("validate", c.id, c.as_dict()) for c in configs[:n_pairs]]
    if "backward" not in skip:
        tasks += [("backward", c.id, c.as_dict()) for c in bwd_configs]
    if "dot" not in skip:
        tasks += [
            ("dot", "_".join(map(str, v)), v) for v in (probes.DOT_SMOKE_VARIANTS if smoke else probes.DOT_VARIANTS)
        ]
    if "sum" not in skip:
        tasks += [("sum", f"{v[0]}_{v[1]}", v) for v in (probes.SUM_SMOKE_VARIANTS if smoke else probes.SUM_VARIANTS)]
    if "validate" not in skip:
        tasks += [("validate", c.id, c.as_dict()) for c in configs[n_pairs:]]
    return tasks


def _pack_probes(
    out: Path, by_kind: dict[str, list], smoke: bool, env: dict[str, Any], log: Callable[[str], None]
) -> None:
    """probes.npz: the dot and sum probes' arrays (or their errors) and seconds, and the job's meta."""
    from simfloat_gpu.campaign import probes

    arrays: dict[str, np.ndarray] = {}
    for kind in ("dot", "sum"):
        for _, key, res, secs, err in by_kind[kind]:
            if err:
                arrays[f"{kind}_{key}__error"] = np.array(err)
                continue
            for k, a in res.items():
                arrays[f"{kind}_{key}__{k}"] = a
            arrays[f"{kind}_{key}__seconds"] = np.array([secs])
    arrays["meta"] = np.array(
        json.dumps({"smoke": smoke, "keep_cols": probes.KEEP_COLS, "sum_m": probes.SUM_M, "env": env}, default=str)
    )
    size = _savez(out / "probes.npz", arrays)
    log(f"probes.npz: {size / 2**20:.2f} MiB")


def _isa_wait(
    isa_proc: Any, work: Path, out: Path, until: float, summary: dict[str, Any], log: Callable[[str], None]
) -> None:
    """Wait for the isa subprocess (killed at ``until``, a time.monotonic() value), then pack isa.tar.xz and
    note the instruction facts in the summary."""
    if isa_proc is None:
        return
    try:
        isa_proc.wait(timeout=max(1.0, until - time.monotonic()))
    except subprocess.TimeoutExpired:
        isa_proc.kill()
        isa_proc.wait()
        log("isa: subprocess killed at its time limit")
    isa_dir = work / "isa"
    isa_dir.mkdir(exist_ok=True)
    shutil.copy(work / "isa.log", isa_dir / "isa.log")
    if (isa_dir / "isa.json").exists():
        facts = json.loads((isa_dir / "isa.json").read_text())
        summary["isa"] = {k: v.get("summary", v.get("error")) for k, v in facts.get("kernels", {}).items()}
        log(f"isa: {json.dumps(summary['isa'])}")
    size = _tar(out / "isa.tar.xz", isa_dir, "isa", "w:xz")
    log(f"isa.tar.xz: {size / 2**20:.2f} MiB")


def main(argv: list[str] | None = None, prog: str = "simfloat-gpu run") -> int:
    from simfloat_gpu.campaign.arguments import writable_dir

    p = _parser(prog)
    args = p.parse_args(argv)
    smoke = bool(args.cpu_smoke)
    reserve = 3.0 if smoke else 8.0  # time left for packing and the final check
    if args.budget_s <= reserve:
        p.error(
            f"argument --budget-s: {args.budget_s:g} s leaves no time: the last {reserve:g} s are kept for "
            "the final check"
        )
    skip: set[str] = args.skip
    out: Path = args.out
    try:
        writable_dir(out, "--out")
    except ValueError as err:
        p.error(str(err))
    max_file = int(args.max_file_mib * 2**20)
    max_total = int(args.max_total_mib * 2**20)
    log = Log(out / "log.txt")
    budget = float(args.budget_s)
    end = START + budget - reserve
    work = Path(tempfile.mkdtemp(prefix="gpu_run_"))
    summary: dict[str, Any] = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "parts": {},
        "limits": dict(file_bytes=max_file, total_bytes=max_total),
    }

    def save_summary() -> None:
        summary["elapsed_s"] = round(time.monotonic() - START, 1)
        (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")

    def part(name: str, fn: Callable[[], Any]) -> Any:
        if name in skip:
            summary["parts"][name] = {"status": "skipped (--skip)"}
            save_summary()
            return None
        t0 = time.monotonic()
        try:
            res = fn()
            summary["parts"].setdefault(name, {}).update(status="ok", seconds=round(time.monotonic() - t0, 1))
            return res
        except Exception as exc:
            summary["parts"].setdefault(name, {}).update(
                status=f"error: {type(exc).__name__}: {exc}"[:500], seconds=round(time.monotonic() - t0, 1)
            )
            log(f"part {name} failed:\n{traceback.format_exc()}")
            return None
        finally:
            save_summary()

    log(f"gpu_run: out {out}, budget {budget:.0f} s, {'CPU smoke' if smoke else 'GPU'}; work dir {work}")
    if smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    elif os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        log("TRITON_INTERPRET is set: unset it for the GPU run (or pass --cpu-smoke)")
        return 2
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from simfloat_gpu.campaign import probes, validate_bwd
    from simfloat_gpu.campaign.compare import new_record
    from simfloat_gpu.campaign.fixtures import write_fixtures
    from simfloat_gpu.campaign.grid import grid
    from simfloat_gpu.campaign.report import environment

    # 1. env
    def env_part() -> dict[str, Any]:
        import torch

        if not smoke and not torch.cuda.is_available():
            raise RuntimeError("no CUDA device visible to torch; use --cpu-smoke on a CPU")
        env = environment("faithful" if smoke else "gpu")
        summary["env"] = env
        log(
            f"env: {env.get('gpu', 'CPU')} driver {env.get('driver')} CUDA {env.get('cuda')} "
            f"torch {env['torch']} "
            f"triton {env['triton']} numpy {env['numpy']}"
        )
        return env

    env = part("env", env_part)
    if env is None:
        check_out_dir(out, max_file, max_total, log)
        log.close()
        return 2
    slug = "cpu-smoke" if smoke else (env.get("gpu_slug") or "gpu")
    cpus = os.cpu_count() or 2
    jobs = args.jobs or (2 if smoke else max(2, min(14, cpus - 2)))

    # 2. isa, in the background
    isa_proc = None
    if "isa" not in skip:
        try:
            isa_proc = _isa_subprocess(work, smoke, budget=max(10.0, 0.45 * budget))
            log(f"isa: subprocess {isa_proc.pid} started")
        except Exception as exc:
            summary["parts"]["isa"] = {"status": f"error: {type(exc).__name__}: {exc}"}

    # 3. pool: validation grid (fixtures), dot and sum probes; the exp probe in this process meanwhile
    configs = grid(args.grid or ("smoke" if smoke else "full"))
    bwd_configs = validate_bwd.backward_grid(args.bwd_grid or ("smoke" if smoke else "ci"))
    tasks = _pool_tasks(configs, bwd_configs, skip, smoke)
    exp_arrays: dict[str, np.ndarray] = {}
    pool_deadline = min(end, START + (0.5 if smoke else 0.47) * budget)

    def exp_part() -> None:
        if "exp" in skip:
            return
        t0 = time.monotonic()
        try:
            exp_arrays.update(
                probes.exp_probe(device="cpu" if smoke else "cuda", smoke=smoke, deadline=pool_deadline, log=log)
            )
            summary["parts"]["exp"] = {"status": "ok", "seconds": round(time.monotonic() - t0, 1)}
        except Exception as exc:
            summary["parts"]["exp"] = {"status": f"error: {type(exc).__name__}: {exc}"[:500]}
            log("exp probe failed:\n" + traceback.format_exc())

    log(f"pool: {len(tasks)} tasks on {jobs} workers until t={pool_deadline - START:.0f} s")
    results = part("pool", lambda: _run_pool(tasks, jobs, smoke, pool_deadline, log, while_waiting=exp_part)) or []
    by_kind: dict[str, list] = {"validate": [], "backward": [], "dot": [], "sum": []}
    for r in results:
        by_kind[r[0]].append(r)
    summary["parts"]["pool"] = dict(
        summary["parts"].get("pool", {}),
        **{
            k: {"ok": sum(1 for r in v if not r[4]), "failed": [f"{r[1]}: {r[4]}" for r in v if r[4]]}
            for k, v in by_kind.items()
        },
    )
    save_summary()

    # 4. pack
    def pack_fixtures() -> None:
        fix = work / "fixtures" / slug
        env_f = dict(env, recorded_by="simfloat_gpu.campaign.gpu_run", smoke=smoke)
        info: dict[str, Any] = summary["parts"].setdefault("fixtures", {})
        if "validate" not in skip:
            res = _in_grid_order(configs, by_kind["validate"], lambda c, st: new_record(c, "gpu", status=st))
            n = write_fixtures(fix, res, configs, env_f)
            info.update(configs=n, of=len(configs), rows=[r[0].to_json() for r in res])
            log(f"fixtures: {n}/{len(configs)} forward configs")
        else:  # no forward configs, but a fixture folder all the same (validate --fixtures reads it)
            write_fixtures(fix, [], [], env_f)
        if "backward" not in skip:
            bres = _in_grid_order(
                bwd_configs,
                by_kind["backward"],
                lambda c, st: validate_bwd.backward_record(c, "gpu", status=st),
            )
            nb = validate_bwd.write_backward_fixtures(fix, bres, bwd_configs, env_f)
            info.update(backward_configs=nb, backward_of=len(bwd_configs), backward_rows=[r[0].to_json() for r in bres])
            log(f"fixtures: {nb}/{len(bwd_configs)} backward configs (in {validate_bwd.BACKWARD_DIR}/)")
        info["bytes"] = size = _tar(out / "fixtures.tar", fix, slug, "w")
        log(f"fixtures.tar: {size / 2**20:.2f} MiB (extract into tests/fixtures/gpu/)")

    if "validate" not in skip or "backward" not in skip:
        part("fixtures", pack_fixtures)

    part("probes_pack", lambda: _pack_probes(out, by_kind, smoke, env, log))
    if exp_arrays:
        part("exp_pack", lambda: _write_exp(out, exp_arrays, max_file, log))

    part("isa", lambda: _isa_wait(isa_proc, work, out, min(end, START + 0.6 * budget), summary, log))

    # 5. speed, alone on the GPU
    def speed_part() -> None:
        from simfloat_gpu.campaign.speed import run_speed

        n = run_speed(out / "speed.csv", end, smoke, log)
        summary["parts"]["speed"] = {"measurements": n}

    if "speed" not in skip:
        part("speed", speed_part)
    summary["out_check"] = check_out_dir(out, max_file, max_total, log)
    summary["files"] = {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.is_file()}
    failed = [name for name, p in summary["parts"].items() if str(p.get("status", "")).startswith("error")]
    log(f"done in {time.monotonic() - START:.1f} s; files: {summary['files']}")
    if failed:
        log(f"failed part(s): {', '.join(failed)} (see summary.json and above)")
    save_summary()
    log.close()
    shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
