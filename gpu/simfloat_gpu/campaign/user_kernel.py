"""A flash-attention kernel of one's own against the emulator under a plan, config by config, bit for bit
(:func:`compare_kernel`).

Made to hold up on a stranger's kernel: each config's kernel runs in a child process (a kernel that corrupts
memory or dies costs its row, ``crashed: signal ...``); a kernel whose error against float64 is far beyond the
emulator's (:data:`KERNEL_WRONG_FACTOR`) is ``kernel-wrong``, not ``ok``; a kernel that returns a log-sum-exp
instead of (m, l) is compared on it (:data:`STAT_FORMS`); an exception in the kernel (a failing
``tl.static_assert`` under the interpreter) names the kernel's source line.

Imports only numpy and the standard library at import time: torch, triton and simfloat are loaded where used.
"""

from __future__ import annotations

import dataclasses
import linecache
import math
import os
import sys
import sysconfig
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from simfloat_gpu.campaign.compare import agreement, compare_to_emulator, error_stats, error_status, new_record
from simfloat_gpu.campaign.grid import FORMATS, Config, dedupe, grid, make_inputs, reference64
from simfloat_gpu.campaign.kinds import PLAN_FAMILIES
from simfloat_gpu.campaign.records import KernelRecord
from simfloat_gpu.campaign.report import KERNEL_COLUMNS, cell
from simfloat_gpu.campaign.running import (
    ChildFailed,
    Crashed,
    TimedOut,
    kernel_session,
    resolve_backend,
    run_in_child,
)

__all__ = ["KERNEL_WRONG_FACTOR", "LSE_RTOL", "STAT_FORMS", "KernelComparison", "compare_kernel", "kernel_error"]

#: a config is ``kernel-wrong`` when the kernel's output is not bitwise the emulator's and its max error against
#: the float64 reference exceeds this many times the emulator's (at least one unit roundoff of the output
#: format): a kernel whose numerics differ from the plan's only in rounding (another exp, accumulation order, a
#: format one step coarser) stays within a few (up to ~16) times the emulator's error; 100x is an error of
#: another kind (a missing 1/l normalization, a wrong scale, a dropped or doubled tile)
KERNEL_WRONG_FACTOR = 100.0
#: the forms of the row statistics a kernel may return: "auto" (by what it returns: out; (out, m, l): "ml";
#: (out, lse): "lse2" or "lse", whichever the emulator's statistics are closer to), "ml", "lse2" (m + log2 l,
#: log2 units of the scaled scores, as Triton's fused-attention tutorial stores it) or "lse" (the natural
#: log-sum-exp of the scaled scores, m + ln l)
STAT_FORMS = ("auto", "ml", "lse2", "lse")
#: tolerance of a log-sum-exp the plan does not compute the same way (``lse`` of an exp2 plan, ``lse2`` of an exp
#: plan: the emulator's is rounded once from float64): |kernel - emulator| <= LSE_RTOL * max(1, |emulator|),
#: a few fp32 units (the kernel rounds the log, the add and the change of base)
LSE_RTOL = 2.0**-20


@dataclasses.dataclass
class KernelComparison:
    """What :func:`compare_kernel` found: one record per config."""

    plan: str
    backend: str
    rows: list[KernelRecord]

    def summary(self) -> dict[str, Any]:
        """Configs, those compared (``ok`` or ``kernel-wrong``), ``kernel_wrong``, ``crashed``, ``timeouts`` and
        ``errors`` (every other status) counts, and the min and mean bitwise agreement of the output, m_i, l_i and lse
        over the ``ok`` configs."""
        done = [r for r in self.rows if r.status == "ok"]
        out: dict[str, Any] = {
            "configs": len(self.rows),
            "compared": sum(r.compared for r in self.rows),
            "kernel_wrong": sum(r.status.startswith("kernel-wrong") for r in self.rows),
            "crashed": sum(r.status.startswith("crashed") for r in self.rows),
            "timeouts": sum(r.status.startswith("timeout") for r in self.rows),
            "errors": sum(not r.compared and not r.status.startswith(("crashed", "timeout")) for r in self.rows),
        }
        fields = (("out", "bitwise_agreement"), ("m", "m_agreement"), ("l", "l_agreement"), ("lse", "lse_agreement"))
        for name, field in fields:
            vals = [v for r in done if (v := getattr(r, field)) is not None]
            out[f"{name}_min"] = min(vals) if vals else None
            out[f"{name}_mean"] = float(np.mean(vals)) if vals else None
        return out

    def table(self) -> str:
        """The agreement table: one line per config (with the lse columns where a kernel returned one), then the
        summary."""
        cols = list(KERNEL_COLUMNS)
        if any(r.lse_agreement is not None for r in self.rows):
            cols += ["stats", "lse_agreement", "lse_rel_diff"]
        lines = [" | ".join(cols)]
        lines += [" | ".join(r.table_cell(c) for c in cols) for r in self.rows]
        s = self.summary()
        parts = [
            f"{n} min {s[n + '_min']:.6g} mean {s[n + '_mean']:.6g}"
            for n in ("out", "m", "l", "lse")
            if s[n + "_min"] is not None
        ]
        parts += [f"{s[k]} {k.replace('_', '-')}" for k in ("kernel_wrong", "crashed", "timeouts", "errors") if s[k]]
        lines.append(
            f"{s['compared']} of {s['configs']} configs compared against plan {self.plan} "
            f"({self.backend}): " + "; ".join(parts)
        )
        return "\n".join(lines)


def _out_kind(fmt: str, out_fmt: str) -> str:
    if out_fmt == "float32":
        return "fp32"
    if out_fmt == {"bf16": "bfloat16", "fp16": "float16"}[fmt]:
        return "low"
    raise ValueError(
        f"compare_kernel compares outputs in float32 or the input format; the plan's output "
        f"format is {out_fmt} for {fmt} inputs"
    )


def _start_method(isolate: bool | str, backend: str) -> str | None:
    if isolate is False:
        return None
    if isolate is True:
        import multiprocessing as mp

        return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
    if isolate in ("forkserver", "spawn", "fork"):
        return str(isolate)
    raise ValueError(f"isolate must be True, False, 'forkserver', 'spawn' or 'fork', got {isolate!r}")


def _check_importable(kernel: Callable[..., Any]) -> None:
    """Raise a clear ValueError where a child process could not import the launcher by name."""
    import pickle

    advice = (
        "compare_kernel runs each config's kernel in a child process (isolate=True), which imports the launcher "
        "by name: define it at module level in a module file (or in the __main__ script, under the "
        "`if __name__ == '__main__':` guard), or pass isolate=False (in this process: a crash ends it)"
    )
    try:
        pickle.dumps(kernel)
    except Exception as exc:
        raise ValueError(f"the kernel's launcher does not pickle ({type(exc).__name__}: {exc}); {advice}") from None
    module = sys.modules.get(getattr(kernel, "__module__", None) or "")
    if module is not None and module.__name__ == "__main__" and not getattr(module, "__file__", None):
        raise ValueError(f"the kernel's launcher is defined in an interactive session (a notebook, a REPL); {advice}")


def compare_kernel(
    kernel: Callable[..., Any],
    plan: Any,
    configs: str | Sequence[Config] = "ci",
    *,
    backend: str = "auto",
    stats: str = "auto",
    isolate: bool | str = True,
    timeout_s: float | None = None,
    faithful_options: dict[str, Any] | None = None,
    log: Callable[[str], None] = print,
) -> KernelComparison:
    """Run a flash-attention kernel of one's own and the emulator under ``plan`` on each config, bit for bit.

    The kernel is called as ``kernel(q, k, v, causal=..., block_m=..., block_n=...)`` with torch tensors of
    shape (batch, heads, seq, head_dim) in the config's format (bf16 / fp16), on the GPU (backend ``gpu``) or
    the CPU, under :func:`simfloat_gpu.interpreter.faithful` (backend ``faithful``); it must use the softmax scale
    1/sqrt(head_dim) and return the output, ``(out, m, l)`` with the row statistics ((batch, heads, seq),
    in the plan's units: log2 units with ``plan.exp2``) as the emulator's ``return_stats`` gives them, or
    ``(out, lse)`` with a log-sum-exp per row (``stats``; any shape of batch * heads * seq elements, read as
    (batch, heads, seq)). The emulator runs ``simfloat.attention.flash(q, k, v, plan=plan, block_m, block_n,
    causal)``; outputs are compared in the plan's output format (float32 or the input format), m and l in
    float32. A log-sum-exp is compared with the emulator's computed from its (m, l) as the kernel does, in
    fp32: ``fp32(m + fp32(log2 l))`` ("lse2" under an exp2 plan) or ``fp32(m + fp32(ln l))`` ("lse" under an
    exp plan) (:func:`simfloat.attention.lse_from_stats`), bit for bit where the kernel rounds a correctly rounded
    log so; the other pairings (a natural lse from an exp2 kernel) against float64's, within :data:`LSE_RTOL`
    (``lse_rel_diff``).

    The grids (:func:`simfloat_gpu.campaign.grid.grid`, and its module docstring): "ci" and "full" take seq 64,
    97, 256, 1000 (97 and 1000 leave a partial last tile: masking of ragged tiles), head dim 16, 64, 128 and
    blocks 16..128 on both axes (block 128 over head dim 64 too); a kernel that has no masks or needs BLOCK_M a
    multiple of BLOCK_N takes "tiles" (seq 128, 256, 512, head dim 64, 128, blocks (64, 32), (64, 64),
    (128, 64), (128, 128)).

    Each config's kernel runs in a child process (``isolate``): one that dies (a signal such as SIGSEGV from a
    store out of bounds, ``os._exit``) is the row ``crashed: signal SIGSEGV (11)`` (or ``exit code N``) and the
    other configs go on. A config whose output is not bitwise the emulator's and whose error against float64
    exceeds :data:`KERNEL_WRONG_FACTOR` times the emulator's is ``kernel-wrong: ...``: the kernel, not the
    numerics, disagrees. An exception in the kernel is ``error: <type> at <file>:<line> `<source line>`: <message>``
    (:func:`kernel_error`), so a failing ``tl.static_assert`` shows which one.

    Args:
        kernel: the kernel's launcher, as above (a module-level function: see ``isolate``).
        plan: a :class:`simfloat.attention.Plan` or preset name.
        configs: a grid name of :func:`grid` ("ci", "full", "smoke", "tiles") or :class:`Config` objects; int8
            configs are left out, and so are flash configs of another input format than the plan's (by its
            name, ``<family>-<fmt>``). Each config's ``out`` is set by the plan's output format.
        backend: ``"auto"`` (the GPU if torch sees one), ``"gpu"`` or ``"faithful"``.
        stats: the form of the statistics the kernel returns, one of :data:`STAT_FORMS`.
        isolate: run each config's kernel in a child process (:func:`~simfloat_gpu.campaign.running.run_in_child`):
            True ("forkserver" where the platform has it, else "spawn"), "forkserver", "spawn", "fork", or False
            (in this process: a crash ends it). With "forkserver" and "spawn" the kernel's launcher must pickle:
            a module-level function of an importable module or of the ``__main__`` script (under the ``if
            __name__ == "__main__":`` guard); in a notebook, import it from a file or pass isolate=False.
        timeout_s: with ``isolate``, seconds each config's kernel may run before its child process is killed (the
            row ``timeout: killed after N s``); None: no limit.
        faithful_options: keyword arguments of :func:`simfloat_gpu.interpreter.faithful` (backend ``faithful``).
        log: called with one line per config.

    Returns:
        A :class:`KernelComparison` (``rows``: :class:`~simfloat_gpu.campaign.records.KernelRecord`,
        ``summary()``, ``table()``).

    Raises:
        ValueError: no config left (configs whose input format is not the plan's, or whose output format would
            be neither float32 nor the input format, are left out), a bad backend, ``stats`` or ``isolate``, or
            a launcher a child process cannot import (``isolate``).
        RuntimeError: the backend cannot run (see :func:`resolve_backend`).
    """
    import simfloat.attention as A

    pl = A.plan(plan)
    if stats not in STAT_FORMS:
        raise ValueError(f"stats must be one of {', '.join(STAT_FORMS)}, got {stats!r}")
    backend = resolve_backend(backend)
    method = _start_method(isolate, backend)
    if method in ("forkserver", "spawn"):
        _check_importable(kernel)
    cfgs = grid(configs, int8=False) if isinstance(configs, str) else list(configs)
    family, _, pfmt = pl.name.rstrip("*").partition("@")[0].partition("-")
    chosen = []
    for c in cfgs:
        if c.kind != "flash" or (family in PLAN_FAMILIES and pfmt in FORMATS and c.fmt != pfmt):
            continue
        try:
            chosen.append(dataclasses.replace(c, out=_out_kind(c.fmt, pl.out.fmt.name)))
        except ValueError:  # an output format the kernel could not have for these inputs
            continue
    chosen = dedupe(chosen)
    if not chosen:
        raise ValueError(
            f"compare_kernel: no flash config of plan {pl.name}'s input format among the configs "
            f"(its output format, {pl.out.fmt.name}, must be float32 or the input format)"
        )
    rows = []
    for cfg in chosen:
        rec = KernelRecord(**dataclasses.asdict(new_record(cfg, backend, plan=pl.name)))
        try:
            rec = _compare_one(rec, kernel, cfg, pl, backend, stats, method, timeout_s, faithful_options or {})
        except Crashed as exc:
            rec = dataclasses.replace(rec, status=f"crashed: {exc}")
        except TimedOut as exc:
            rec = dataclasses.replace(rec, status=f"timeout: {exc}")
        except ChildFailed as exc:
            rec = dataclasses.replace(rec, status=f"error: {exc}".replace("\n", " ")[:400])
        except Exception as exc:  # one failing config must not lose the others
            rec = dataclasses.replace(rec, status=error_status(exc))
        rows.append(rec)
        log(
            f"{rec.id}: {rec.status} out {cell(rec.bitwise_agreement)} m {cell(rec.m_agreement)} "
            f"l {cell(rec.l_agreement)}" + (f" lse {cell(rec.lse_agreement)}" if rec.stats.startswith("lse") else "")
        )
    return KernelComparison(pl.name, backend, rows)


def _compare_one(
    rec: KernelRecord,
    kernel: Callable[..., Any],
    cfg: Config,
    pl: Any,
    backend: str,
    stats: str,
    method: str | None,
    timeout_s: float | None,
    options: dict[str, Any],
) -> KernelRecord:
    q, k, v = make_inputs(cfg)
    ref = reference64(q, k, v, cfg.causal)
    t0 = time.perf_counter()
    args = (kernel, cfg, q, k, v, backend, options)
    if method is None:
        try:
            kern = _run_user_kernel(*args)
        except Exception as exc:
            raise ChildFailed(kernel_error(exc)) from exc
    else:
        module = getattr(kernel, "__module__", None)
        preload = ("torch", "triton", __name__) + ((module,) if module and module != "__main__" else ())
        kern = run_in_child(
            _run_user_kernel, *args, method=method, describe=kernel_error, preload=preload, timeout=timeout_s
        )
    kernel_s = round(time.perf_counter() - t0, 3)
    form = _stat_form(kern, stats)
    err_max, err_rms = error_stats(kern["out"], ref)
    rec = dataclasses.replace(rec, kernel_s=kernel_s, kernel_err_max=err_max, kernel_err_rms=err_rms, stats=form)
    emu: dict[str, np.ndarray] = {}
    given: dict[str, np.ndarray] = {key: kern[key] for key in ("out", "m", "l") if key in kern}
    rec = cast(KernelRecord, compare_to_emulator(rec, cfg, (q, k, v), ref, given, plan=pl, emulated=emu))
    if "lse" in kern:
        if form == "auto":
            form = _closer_form(kern["lse"], emu, pl.exp2)
        rec = dataclasses.replace(rec, stats=form, **_compare_lse(kern["lse"], emu, form, pl.exp2))
    wrong = _kernel_wrong(rec, cfg)
    return dataclasses.replace(rec, status=wrong) if wrong else rec


def _stat_form(kern: dict[str, np.ndarray], stats: str) -> str:
    """The statistic form of what the kernel returned ("" for the output alone; "auto" left for the lse)."""
    if "lse" in kern:
        if stats == "ml":
            raise ValueError("stats='ml' but the kernel returned (out, lse): two values, not (out, m, l)")
        return stats
    if "m" in kern:
        if stats in ("lse2", "lse"):
            raise ValueError(f"stats={stats!r} but the kernel returned (out, m, l): three values, not (out, lse)")
        return "ml"
    return ""


def _lse64(emu: dict[str, np.ndarray], form: str, exp2: bool) -> np.ndarray:
    """The emulator's log-sum-exp in ``form`` from its (m, l), in float64 (no rounding)."""
    m, l_ = np.asarray(emu["m"], dtype=np.float64), np.asarray(emu["l"], dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        lse2 = m + np.log2(l_) if exp2 else (m + np.log(l_)) / math.log(2.0)
    return lse2 if form == "lse2" else lse2 * math.log(2.0)


def _closer_form(lse: np.ndarray, emu: dict[str, np.ndarray], exp2: bool) -> str:
    """ "lse2" or "lse": the form whose emulator values lie closer to the kernel's (median |difference|)."""
    d = {
        form: float(np.nanmedian(np.abs(np.asarray(lse, dtype=np.float64) - _lse64(emu, form, exp2))))
        for form in ("lse2", "lse")
    }
    return min(d, key=lambda f: (d[f], f != ("lse2" if exp2 else "lse")))


def _compare_lse(lse: np.ndarray, emu: dict[str, np.ndarray], form: str, exp2: bool) -> dict[str, Any]:
    """lse_agreement, lse_max_ulp (fp32) and lse_rel_diff of a kernel's log-sum-exp in ``form`` against the
    emulator's: ``fp32(m + fp32(log l))`` where the form is the plan's own (log2 with exp2, ln without), else
    float64's rounded to fp32."""
    if form == ("lse2" if exp2 else "lse"):
        from simfloat.attention import backward_plan, lse_from_stats

        bwd = backward_plan("triton-bf16").replace(exp2=exp2)  # its lse op: the log and the add in fp32, RN
        m, l_ = (np.asarray(emu[key], dtype=np.float32) for key in ("m", "l"))
        mine = lse_from_stats(m, l_, plan=bwd)
    else:
        mine = _lse64(emu, form, exp2).astype(np.float32).astype(np.float64)
    agree, ulp = agreement(lse, mine, "fp32")
    k = np.asarray(lse, dtype=np.float64)
    rel = np.abs(k - mine) / np.maximum(1.0, np.abs(mine)) if k.size else np.zeros(0)
    return {
        "lse_agreement": round(agree, 6),
        "lse_max_ulp": ulp,
        "lse_rel_diff": float(np.max(rel)) if rel.size else 0.0,
    }


#: unit roundoff of each output format: the floor of the emulator's error in the kernel-wrong test
_UNIT = {"fp32": 2.0**-24, "bf16": 2.0**-8, "fp16": 2.0**-11}


def _kernel_wrong(rec: KernelRecord, cfg: Config) -> str:
    """``kernel-wrong: ...`` where the kernel's error against float64 exceeds :data:`KERNEL_WRONG_FACTOR` times
    the emulator's (not bitwise equal), else ""."""
    if rec.bitwise_agreement == 1.0 or rec.kernel_err_max is None or rec.emulator_err_max is None:
        return ""
    kerr, eerr = rec.kernel_err_max, rec.emulator_err_max
    if not math.isfinite(eerr):
        return ""
    floor = max(eerr, _UNIT["fp32" if cfg.out == "fp32" else cfg.fmt])
    if math.isfinite(kerr) and kerr <= KERNEL_WRONG_FACTOR * floor:
        return ""
    if math.isfinite(kerr):
        how = f"{kerr:.3g} is {kerr / floor:.0f}x the emulator's {eerr:.3g} (limit {KERNEL_WRONG_FACTOR:g}x)"
    else:
        how = f"is {kerr} (a non-finite output) where the emulator's is {eerr:.3g}"
    return f"kernel-wrong: the kernel's max error vs float64 {how}: the kernel, not the numerics, disagrees"


def _library_dirs() -> tuple[str, ...]:
    """Directories whose frames are not the kernel's: the standard library, numpy, torch, triton, simfloat and
    simfloat_gpu (but its kernels)."""
    dirs = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib")}
    for name in ("numpy", "torch", "triton", "simfloat", "simfloat_gpu"):
        path = getattr(sys.modules.get(name), "__file__", None)
        if isinstance(path, str):
            dirs.add(os.path.dirname(os.path.abspath(path)))
    return tuple(d.rstrip(os.sep) + os.sep for d in dirs)


def _kernel_frame(exc: BaseException, libs: tuple[str, ...]) -> tuple[str, int] | None:
    """(file, line) of the innermost frame of the kernel's own code in ``exc``'s traceback, or None."""
    kernels = os.sep + os.path.join("simfloat_gpu", "kernels") + os.sep
    where = None
    tb = exc.__traceback__
    while tb is not None:
        fname = os.path.abspath(tb.tb_frame.f_code.co_filename)
        if (kernels in fname or not fname.startswith(libs)) and os.path.exists(fname):
            where = (fname, tb.tb_lineno)
        tb = tb.tb_next
    return where


def kernel_error(exc: BaseException) -> str:
    """An exception of a kernel run on one line: ``<type> at <file>:<line> `<source>`: <message>``.

    The exception described is the innermost of the ``raise ... from`` chain (the interpreter wraps what the
    kernel raised in an ``InterpreterError`` whose message is its repr: the original is what the user needs);
    the place is the innermost frame of the kernel's own code (not the standard library, numpy, torch, triton
    or simfloat; the project's kernels count as the kernel's) in its traceback, else in the outer ones'. Under
    the interpreter a failing ``tl.static_assert`` (an ``AssertionError`` with an empty message) names the
    kernel's line. Without such a frame: ``<type>: <message>``.
    """
    chain = [exc]
    while chain[-1].__cause__ is not None and len(chain) < 16:
        chain.append(chain[-1].__cause__)
    libs = _library_dirs()
    inner = chain[-1]
    where = next((w for e in reversed(chain) if (w := _kernel_frame(e, libs)) is not None), None)
    msg = str(inner).replace("\n", " ").strip()
    text = type(inner).__name__
    if where is not None:
        fname, line = where
        try:
            shown = os.path.relpath(fname)
        except ValueError:  # another drive
            shown = fname
        if shown.startswith(".."):
            shown = fname
        source = linecache.getline(fname, line).strip()
        text += f" at {shown}:{line}" + (f" `{source}`" if source else "")
    return f"{text}: {msg}" if msg else text


def _run_user_kernel(
    kernel: Callable[..., Any],
    cfg: Config,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    backend: str,
    options: dict[str, Any],
) -> dict[str, np.ndarray]:
    """The kernel on one config: float32 numpy arrays ``out`` and ``m``, ``l`` or ``lse`` where it returns them
    (the statistics as (batch, heads, seq))."""
    with kernel_session(backend, cfg.fmt, q, k, v, faithful_options=options) as (_, (tq, tk, tv)):
        res = kernel(tq, tk, tv, causal=cfg.causal, block_m=cfg.block_m, block_n=cfg.block_n)
    parts = res if isinstance(res, tuple) else (res,)
    if len(parts) not in (1, 2, 3):
        raise ValueError(f"the kernel returned {len(parts)} values; expected out, (out, lse) or (out, m, l)")
    keys = {1: ("out",), 2: ("out", "lse"), 3: ("out", "m", "l")}[len(parts)]
    out = {key: t.float().cpu().numpy() for key, t in zip(keys, parts, strict=True)}
    if out["out"].shape != q.shape[:-1] + (v.shape[-1],):
        raise ValueError(f"the kernel's output has shape {out['out'].shape}, expected {q.shape}")
    for key in keys[1:]:
        if out[key].size != math.prod(q.shape[:-1]):
            raise ValueError(f"the kernel's {key} has shape {out[key].shape}, expected {q.shape[:-1]}")
        out[key] = out[key].reshape(q.shape[:-1])
    return out
