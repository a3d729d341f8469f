"""Cross-validation of the backward pass: the Triton backward kernels (simfloat_gpu/kernels/flash_attention_bwd.py)
against the
emulator's ``triton-<fmt>`` backward plan (simfloat.attention.flash_backward), bit for bit on dQ, dK, dV and delta.

For every config (format, BLOCK_M, BLOCK_N, seq, head dim, causal, and ``out``: the forward's output stored in
the input format, "low", or in fp32, "fp32", the "delta from fp32 O" option; ``kv_heads``: grouped-query and
multi-query configs, k and v with fewer heads than q; fp32 inputs with a dot ``precision``, "tf32" against the
``triton-tf32`` plan or "ieee" against ``triton-fp32``), the forward kernel gives o, m, l;
the backward kernels give dq, dk, dv, delta and lse; the emulator gets the same q, k, v, o, dO and the lse of
:func:`simfloat.attention.lse_from_stats` (checked equal to the kernel's) and must reproduce every gradient bit.
A float64 torch autograd of the same inputs gives each side's max relative error. Grids reuse
:mod:`simfloat_gpu.campaign.grid`'s dimensions: "full" (a cost-weighted all-pairs covering array), "ci" (every
value of every dimension), "smoke" (three tiny configs, one multi-query); "full" and "ci" add grouped-query and
multi-query configs (:data:`GROUPS`) and fp32 configs of both precisions. Runs under the faithful interpreter
on a CPU, or on a GPU (then the emulator comparison measures how close the plan is to the hardware).

    python -m simfloat_gpu.campaign.validate --pass backward --out DIR [--grid ci]      # or
    simfloat_gpu.campaign.validate_bwd.run_backward(...)
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from simfloat_gpu.campaign import grid as G
from simfloat_gpu.campaign.compare import config_columns
from simfloat_gpu.campaign.fixtures import (
    add_fixture_arrays,
    fixture_entry,
    load_fixture_dir,
    optional_float,
    save_fixture_dir,
)
from simfloat_gpu.campaign.grid import (
    Config,
    all_pairs,
    all_values,
    dedupe,
    flash_config,
    input_crc,
    make_inputs,
    round_to_format,
)
from simfloat_gpu.campaign.kinds import PLAN_FAMILIES, run_flash
from simfloat_gpu.campaign.records import BackwardRecord
from simfloat_gpu.campaign.report import cell
from simfloat_gpu.campaign.running import kernel_session, resolve_backend

__all__ = [
    "BWD_FIELDS",
    "backward_record",
    "GROUPS",
    "BackwardRecord",
    "BACKWARD_DIR",
    "backward_grid",
    "backward_inputs",
    "backward_table",
    "compare_backward_fixtures",
    "compare_backward_to_emulator",
    "emulator_plan",
    "load_backward_fixtures",
    "record_backward_config",
    "run_backward",
    "run_backward_kernels",
    "validate_backward_config",
    "write_backward_fixtures",
    "write_backward_report",
]

#: the columns of backward.csv: the fields of :class:`BackwardRecord`
BWD_FIELDS = BackwardRecord.csv_fields()


#: the subfolder of a fixture folder (tests/fixtures/gpu/<gpu>/) that holds the backward fixtures
BACKWARD_DIR = "backward"
#: the kernel's arrays of a backward fixture; those in the input format (o too when ``out`` is "low") are
#: stored as their 16-bit patterns (``<name>_bits``), the rest as float32
FIXTURE_ARRAYS = ("o", "m", "l", "dq", "dk", "dv", "delta", "lse")

#: (heads, kv_heads) of the grouped-query (GQA) and multi-query (MQA) configs
GROUPS = ((4, 2), (4, 1))


def _gqa(fmt: str, bm: int, bn: int, seq: int, causal: bool, out: str, heads: int, kv_heads: int) -> Config:
    return Config("flash", fmt, seq, 32, bm, bn, causal, out, heads=heads, kv_heads=kv_heads)


def _fp32(precision: str, bm: int, bn: int, seq: int, d: int, causal: bool) -> Config:
    return Config("flash", "fp32", seq, d, bm, bn, causal, "fp32", heads=2, precision=precision)


def _extra(name: str) -> list[Config]:
    """The grouped-query and fp32 configs of a grid (head_dim 32 and short sequences: the interpreter's cost
    grows with heads, and fp32 "ieee" dots are FMA loops)."""
    if name == "ci":
        gqa = [_gqa("bf16", 32, 16, 97, False, "low", 4, 2), _gqa("fp16", 16, 32, 64, True, "fp32", 4, 1)]
        f32 = [_fp32("tf32", 32, 16, 97, 32, True), _fp32("ieee", 16, 32, 64, 16, False)]
        return gqa + f32
    tiles = ((16, 32, 97, "low"), (32, 16, 64, "fp32"), (64, 32, 97, "fp32"), (32, 64, 64, "low"))  # bm bn seq out
    gqa = [
        _gqa(fmt, *tiles[i % len(tiles)][:3], causal, tiles[i % len(tiles)][3], h, hk)
        for i, (fmt, (h, hk), causal) in enumerate(itertools.product(G.FORMATS, GROUPS, G.CAUSAL))
    ]
    f32 = [
        _fp32(prec, bm, bn, seq, d, causal)
        for prec in G.PRECISIONS
        for bm, bn, seq, d, causal in ((16, 32, 97, 16, True), (32, 16, 64, 32, False), (64, 64, 97, 16, False))
    ]
    return gqa + f32


def backward_grid(name: str = "ci") -> list[Config]:
    """The backward grid ("full", "ci" or "smoke"; see the module docstring)."""
    dims = (G.FORMATS, G.BLOCKS, G.BLOCKS, G.SEQS, G.HEAD_DIMS, G.CAUSAL, G.OUTS)
    if name == "full":
        return dedupe(all_pairs(dims, flash_config) + _extra(name))
    if name == "ci":
        return dedupe(all_values(dims, flash_config) + _extra(name))
    if name == "smoke":
        return [
            flash_config("bf16", 16, 32, 40, 16, True, "low"),
            flash_config("fp16", 32, 16, 33, 16, False, "fp32"),
            Config("flash", "bf16", 33, 16, 16, 16, True, "low", heads=2, kv_heads=1),
        ]
    raise ValueError(f"unknown grid {name!r}; known: full, ci, smoke")


def emulator_plan(cfg: Config, family: str = "triton") -> str:
    """The backward plan a config's kernels are compared with: ``<family>-<fmt>`` (family "triton" or "h200");
    fp32 inputs: ``<family>-tf32`` (tf32 tensor cores) or ``triton-fp32`` ("ieee" FMA loops; triton only) by
    the config's precision.

    Raises:
        ValueError: an unknown family, or "h200" with "ieee" dots (no such plan).
    """
    if family not in PLAN_FAMILIES:
        raise ValueError(f"unknown plan family {family!r}; backward families: {', '.join(PLAN_FAMILIES)}")
    if cfg.fmt == "fp32":
        if cfg.precision == "tf32":
            return f"{family}-tf32"
        if family != "triton":
            raise ValueError(f"no {family} plan for fp32 inputs with 'ieee' dots (only triton-fp32)")
        return "triton-fp32"
    return f"{family}-{cfg.fmt}"


def _grads64(q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray, causal: bool) -> list[np.ndarray]:
    """float64 autograd; k and v with fewer heads are repeated per query head (their gradients summed)."""
    import torch

    qq, kk, vv = (torch.tensor(np.asarray(x, dtype=np.float64), requires_grad=True) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    kr, vr = kk.repeat_interleave(group, dim=1), vv.repeat_interleave(group, dim=1)
    s = (qq @ kr.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
    (torch.softmax(s, -1) @ vr).backward(torch.tensor(np.asarray(do, dtype=np.float64)))
    return [t.grad.numpy() for t in (qq, kk, vv)]


def _rel(x: np.ndarray, ref: np.ndarray) -> float:
    scale = float(np.abs(ref).max()) or 1.0
    return float(np.abs(np.asarray(x, dtype=np.float64) - ref).max() / scale)


def backward_record(cfg: Config, backend: str, **fields: Any) -> BackwardRecord:
    """The record of ``cfg`` before any run (id ``bwd-<config id>``, ``kv_heads`` the heads of k and v), with
    ``fields``."""
    columns = config_columns(cfg, BackwardRecord)
    return BackwardRecord(
        **{**columns, "id": "bwd-" + cfg.id, "kv_heads": cfg.kv_heads or cfg.heads, "backend": backend, **fields}
    )


def backward_inputs(cfg: Config) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """q, k, v (:func:`simfloat_gpu.campaign.grid.make_inputs`) and dO (``cfg.shape``, standard normal from
    seed + 1): float32 arrays of values of ``cfg.fmt``, regenerable from the config alone."""
    q, k, v = make_inputs(cfg)
    do = round_to_format(np.random.default_rng(cfg.seed + 1).standard_normal(cfg.shape).astype(np.float32), cfg.fmt)
    return q, k, v, do


def run_backward_kernels(
    cfg: Config, backend: str, inputs: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
) -> dict[str, np.ndarray]:
    """The forward kernel (o, m, l), then the backward kernels (dq, dk, dv, delta, lse) on ``inputs`` (q, k, v,
    dO of :func:`backward_inputs`), on the GPU (backend ``gpu``) or under the faithful interpreter; the
    outputs as float64 host arrays (o and the gradients: values of their format)."""
    import torch

    from simfloat_gpu.kernels.flash_attention_bwd import flash_attention_backward

    with kernel_session(backend, cfg.fmt, *inputs) as (_, (tq, tk, tv, tdo)):
        o, m, l = run_flash(cfg, tq, tk, tv, torch.float32 if cfg.out == "fp32" else tq.dtype)  # noqa: E741
        dq, dk, dv, delta, lse = flash_attention_backward(
            tq,
            tk,
            tv,
            o,
            tdo,
            m,
            l,
            causal=cfg.causal,
            block_m=cfg.block_m,
            block_n=cfg.block_n,
            input_precision=cfg.precision or None,
            return_stats=True,
        )
    return {
        n: t.float().cpu().numpy().astype(np.float64)
        for n, t in zip(FIXTURE_ARRAYS, (o, m, l, dq, dk, dv, delta, lse), strict=True)
    }


def _kernel_errors(
    row: BackwardRecord, inputs: tuple[np.ndarray, ...], kernel: dict[str, np.ndarray], causal: bool
) -> tuple[BackwardRecord, list[np.ndarray]]:
    want = _grads64(*inputs, causal)
    errs = {f"{n}_err": _rel(kernel[n], w) for n, w in zip(("dq", "dk", "dv"), want, strict=True)}
    return dataclasses.replace(row, **errs), want


def compare_backward_to_emulator(
    row: BackwardRecord,
    cfg: Config,
    inputs: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    kernel: dict[str, np.ndarray],
    want: Sequence[np.ndarray],
    family: str = "triton",
) -> BackwardRecord:
    """The one backward comparison (a live run or a recorded fixture): the emulator's
    ``simfloat.attention.flash_backward`` under :func:`emulator_plan` of ``family`` on the same q, k, v, dO,
    the kernel's o and the lse of :func:`simfloat.attention.lse_from_stats` of the kernel's m, l; every bit of
    dq, dk, dv, delta and lse compared.

    Args:
        row: the config's record so far (the kernel's columns filled).
        cfg: the config.
        inputs: q (``cfg.shape``), k, v (``cfg.kv_shape``), dO (``cfg.shape``), values of ``cfg.fmt``.
        kernel: the kernel's o, m, l, dq, dk, dv, delta, lse (:func:`run_backward_kernels`).
        want: the float64 dq, dk, dv (:func:`_grads64`), for the emulator's errors.
        family: the plan family, "triton" or "h200".

    Returns:
        ``row`` with status ``bitwise`` or ``differs`` (``emulator error: ...`` when it raised).
    """
    from simfloat.attention import flash_backward, lse_from_stats

    q, k, v, do = inputs
    t0 = time.perf_counter()
    try:
        plan = emulator_plan(cfg, family)
        row = dataclasses.replace(row, plan=plan)
        lse_e = lse_from_stats(kernel["m"], kernel["l"], plan=plan)
        got = flash_backward(
            *(np.asarray(x, dtype=np.float64) for x in (q, k, v)),
            kernel["o"],
            np.asarray(do, dtype=np.float64),
            lse_e,
            plan=plan,
            block_m=cfg.block_m,
            block_n=cfg.block_n,
            causal=cfg.causal,
            return_delta=True,
        )
    except Exception as err:  # the row records it
        return dataclasses.replace(row, status=f"emulator error: {type(err).__name__}: {err}"[:300])
    emulator_s = round(time.perf_counter() - t0, 2)
    lse_equal = bool(np.array_equal(lse_e, kernel["lse"]))
    agree = {
        f"{name}_agreement": round(float(np.mean(g == kernel[name])), 6)
        for name, g in zip(("dq", "dk", "dv", "delta"), got, strict=True)
    }
    ok = lse_equal and all(a == 1.0 for a in agree.values())
    return dataclasses.replace(
        row,
        status="bitwise" if ok else "differs",
        emulator_s=emulator_s,
        lse_equal=lse_equal,
        emulator_dq_err=_rel(got[0], want[0]),
        emulator_dk_err=_rel(got[1], want[1]),
        emulator_dv_err=_rel(got[2], want[2]),
        **agree,
    )


def validate_backward_config(cfg: Config, backend: str, *, emulate: bool = True) -> BackwardRecord:
    """One config: kernels (forward, then backward), the emulator, the float64 gradients; one record."""
    rec, _ = _kernels_record(cfg, backend, emulate=emulate)
    return rec


def record_backward_config(cfg: Config, backend: str) -> tuple[BackwardRecord, dict[str, np.ndarray] | None]:
    """The kernels of one config (no emulator): the record (status ``kernel only``) and the kernel's arrays
    for a fixture (:func:`write_backward_fixtures`; None when the kernels failed)."""
    return _kernels_record(cfg, backend, emulate=False)


def _kernels_record(cfg: Config, backend: str, *, emulate: bool) -> tuple[BackwardRecord, dict[str, np.ndarray] | None]:
    row = backward_record(cfg, backend)
    inputs = backward_inputs(cfg)
    t0 = time.perf_counter()
    try:
        kernel = run_backward_kernels(cfg, backend, inputs)
    except Exception as err:  # one broken config must not stop the campaign; the row says why
        return dataclasses.replace(row, status=f"kernel error: {type(err).__name__}: {err}"[:300]), None
    row = dataclasses.replace(row, kernel_s=round(time.perf_counter() - t0, 2))
    row, want = _kernel_errors(row, inputs, kernel, cfg.causal)
    if not emulate:
        return dataclasses.replace(row, status="kernel only"), kernel
    return compare_backward_to_emulator(row, cfg, inputs, kernel, want), kernel


# ----------------------------------------------------------------------------------------------------
# fixtures: the same folder layout as the forward's (validate.write_fixtures), in <fixture folder>/backward
# ----------------------------------------------------------------------------------------------------


def _low_format(cfg: Config, name: str) -> bool:
    """Whether the kernel's array ``name`` holds values of a 16-bit input format (stored as bits)."""
    if cfg.fmt == "fp32":
        return False
    return name in ("dq", "dk", "dv") or (name == "o" and cfg.out == "low")


def write_backward_fixtures(
    fix_dir: Path,
    results: Sequence[tuple[BackwardRecord, dict[str, np.ndarray] | None]],
    configs: Sequence[Config],
    env: dict[str, Any],
) -> int:
    """Write ``fix_dir/backward/`` (env.json, configs.json, outputs.npz, as the forward fixtures) from
    :func:`record_backward_config` results; returns the number of configs recorded. Inputs are not stored:
    :func:`backward_inputs` regenerates them from the config (CRC32 of q, k, v, dO checked)."""
    arrays: dict[str, np.ndarray] = {}
    entries = []
    for cfg, (rec, kern) in zip(configs, results, strict=True):
        if kern is None:
            continue
        low = [name for name in FIXTURE_ARRAYS if _low_format(cfg, name)]
        keys = add_fixture_arrays(arrays, cfg, kern, FIXTURE_ARRAYS, low)
        crc = input_crc(*backward_inputs(cfg))
        entries.append(fixture_entry(cfg, rec, crc, ("dq_err", "dk_err", "dv_err"), keys))
    save_fixture_dir(Path(fix_dir) / BACKWARD_DIR, env, entries, arrays)
    return len(entries)


def load_backward_fixtures(
    fix_dir: Path,
) -> tuple[dict[str, Any], list[tuple[Config, dict[str, Any], dict[str, np.ndarray]]]]:
    """(env, [(config, entry, arrays)]) from ``fix_dir/backward/`` (:func:`write_backward_fixtures`); the
    arrays as float64 (the values the kernels wrote), named as :data:`FIXTURE_ARRAYS`. No such subfolder:
    ({}, [])."""
    sub = Path(fix_dir) / BACKWARD_DIR
    if not (sub / "configs.json").is_file():
        return {}, []
    env, items = load_fixture_dir(sub)
    return env, [(cfg, entry, {k: a.astype(np.float64) for k, a in arrays.items()}) for cfg, entry, arrays in items]


_CRC_DIFFERS = "regenerated inputs differ from the recorded ones (CRC32)"


def compare_backward_fixtures(
    fix_dir: Path,
    *,
    families: Sequence[str] = ("triton",),
    backend: str | None = None,
    log: Callable[[str], None] = print,
) -> list[BackwardRecord]:
    """Every backward fixture config of ``fix_dir`` (none: []) against ``flash_backward`` under each plan
    family's plan (:func:`emulator_plan`), bit for bit (:func:`compare_backward_to_emulator`): one row per
    config and family."""
    env, items = load_backward_fixtures(fix_dir)
    backend = backend or f"{env.get('gpu_slug') or Path(fix_dir).name} (fixtures)"
    rows = []
    for cfg, entry, kernel in items:
        base = backward_record(
            cfg,
            backend,
            kernel_s=optional_float(entry.get("kernel_s")),
            **{f"{n}_err": optional_float(entry.get(f"{n}_err")) for n in ("dq", "dk", "dv")},
        )
        inputs = backward_inputs(cfg)
        crc_ok = input_crc(*inputs) == int(entry["input_crc"])
        want = _grads64(*inputs, cfg.causal) if crc_ok else []
        for fam in families:
            if not crc_ok:
                row = dataclasses.replace(base, status=f"error: {_CRC_DIFFERS}")
            else:
                row = compare_backward_to_emulator(base, cfg, inputs, kernel, want, fam)
            rows.append(row)
            log(f"{row.id} {row.plan or fam}: {row.status}")
    return rows


def run_backward(
    out_dir: Path,
    grid_name: str = "ci",
    backend: str = "auto",
    *,
    emulate: bool = True,
    deadline: float | None = None,
    log: Callable[[str], None] = print,
) -> list[BackwardRecord]:
    """Run a backward grid; writes ``out_dir/backward.csv`` and ``backward.md``; returns the rows. Configs not
    started before ``deadline`` (a time.monotonic() value) are left out (the report says how many)."""
    backend = resolve_backend(backend)
    configs = backward_grid(grid_name)
    rows: list[BackwardRecord] = []
    start = time.monotonic()
    for i, cfg in enumerate(configs):
        if deadline is not None and time.monotonic() > deadline:
            break
        row = validate_backward_config(cfg, backend, emulate=emulate)
        rows.append(row)
        secs = f"{cell(row.kernel_s)} s + {cell(row.emulator_s)} s"
        log(f"[{i + 1}/{len(configs)}] {row.id}: {row.status} ({secs})")
    title = f"Backward kernels ({backend}) vs simfloat flash_backward, {grid_name} grid"
    write_backward_report(out_dir, rows, title, n_configs=len(configs), elapsed=time.monotonic() - start)
    return rows


def write_backward_report(
    out_dir: Path,
    rows: Sequence[BackwardRecord],
    title: str,
    *,
    n_configs: int | None = None,
    elapsed: float,
    unit: str = "configs",
) -> str:
    """``out_dir/backward.csv`` (one row per record) and ``backward.md`` (``title``, the count of bitwise rows,
    each one of ``unit``, the table); returns the table's Markdown."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "backward.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=BWD_FIELDS)
        w.writeheader()
        w.writerows(r.to_csv_row() for r in rows)
    n_configs = len(rows) if n_configs is None else n_configs
    table = backward_table(rows)
    n_bit = sum(r.status == "bitwise" for r in rows)
    lines = [
        f"# {title}",
        "",
        f"{n_bit}/{len(rows)} {unit} bitwise identical (dQ, dK, dV, delta, lse); {n_configs - len(rows)} "
        f"not run; {elapsed:.1f} s.",
        "",
        table,
    ]
    (out_dir / "backward.md").write_text("\n".join(lines))
    return table


def backward_table(rows: Sequence[BackwardRecord]) -> str:
    """The Markdown table of backward rows: id, plan, status, lse equality, the bitwise agreement of dQ, dK,
    dV and delta, the kernel's and the emulator's dQ error."""
    cols = (
        "id",
        "plan",
        "status",
        "lse_equal",
        "dq_agreement",
        "dk_agreement",
        "dv_agreement",
        "delta_agreement",
        "dq_err",
        "emulator_dq_err",
    )
    lines = [
        "| " + " | ".join(cols) + " |",
        "|" + "---|" * len(cols),
    ]
    for r in rows:
        lines.append("| " + " | ".join(_md_cell(getattr(r, c)) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def _md_cell(value: Any) -> str:
    if value is None:
        return ""
    return f"{value:.3g}" if isinstance(value, float) else str(value)
