"""The speed of the Triton kernels: the speed part of ``simfloat-gpu run`` (:func:`run_speed`, speed.csv) and
the runners benchmarks/bench_gpu_attention.py times (:func:`make_runners`, :func:`default_blocks`).

Timings are ``triton.testing.do_bench`` medians (L2 flushed between runs) on the GPU, or the median of three
wall-clock runs on the CPU under the faithful interpreter (smoke mode). TFLOP/s counts
4 * batch * heads * seq^2 * head_dim (two matmuls; halved when causal).
"""

from __future__ import annotations

import contextlib
import csv
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["KERNELS", "SPEED_FIELDS", "default_blocks", "make_runners", "run_speed", "timer"]

#: the kernels :func:`make_runners` times
KERNELS = ("int8", "half-int8", "fp8-e4m3", "fp16", "bf16")
#: the columns of speed.csv
SPEED_FIELDS = (
    "part",
    "kernel",
    "batch",
    "heads",
    "seq",
    "head_dim",
    "causal",
    "block_m",
    "block_n",
    "ms",
    "tflops",
    "note",
)


def default_blocks(head_dim: int, block_m: int | None = None, block_n: int | None = None) -> tuple[int, int]:
    """The tiles that fit NUM_WARPS=4 without register spills (sm_90, triton 3.9 ptxas): BLOCK_M x BLOCK_N =
    128 x 64 for head_dim <= 64, 64 x 64 above; ``block_m`` / ``block_n`` override them."""
    return block_m or (128 if head_dim <= 64 else 64), block_n or 64


def make_runners(
    kernel: str, q16: Any, k16: Any, v16: Any, block_m: int, block_n: int, include_quant: bool = False
) -> list[tuple[bool, Callable[[], Any]]]:
    """[(includes_quant, fn)] for one kernel of :data:`KERNELS` on fp16 inputs, the inputs converted (fp16,
    bf16) or quantized (int8, half-int8) up front: ``fn()`` times the attention kernel alone; with
    ``include_quant`` also quantize + kernel. fp8-e4m3 quantizes inside its public launcher: its one runner
    includes the quantization.

    Raises:
        ValueError: an unknown kernel.
    """
    import torch

    from simfloat_gpu.kernels import fp8_attention as fp8_mod
    from simfloat_gpu.kernels import int8_attention as int8_mod
    from simfloat_gpu.kernels.flash_attention import flash_attention

    if kernel in ("fp16", "bf16"):
        dtype = torch.float16 if kernel == "fp16" else torch.bfloat16
        q, k, v = (t.to(dtype) for t in (q16, k16, v16))
        return [(False, lambda: flash_attention(q, k, v, block_m=block_m, block_n=block_n))]
    if kernel in ("int8", "half-int8"):
        q8, qs = int8_mod.quantize_per_token(q16)
        k8, ks = int8_mod.quantize_per_token(k16)
        if kernel == "int8":
            v8, vs = int8_mod.quantize_per_tensor(v16)
        else:
            v8, vs = v16, None
        runners = [
            (False, lambda: int8_mod.int8_attention_quantized(q8, qs, k8, ks, v8, vs, block_m=block_m, block_n=block_n))
        ]
        if include_quant:
            runners.append(
                (True, lambda: int8_mod.int8_attention(q16, k16, v16, variant=kernel, block_m=block_m, block_n=block_n))
            )
        return runners
    if kernel == "fp8-e4m3":
        return [(True, lambda: fp8_mod.fp8_attention(q16, k16, v16, fmt="e4m3", block_m=block_m, block_n=block_n))]
    raise ValueError(f"unknown kernel {kernel!r}; kernels: {', '.join(KERNELS)}")


def timer(smoke: bool) -> Callable[[Callable[[], Any]], float]:
    if not smoke:
        from triton.testing import do_bench

        return lambda fn: float(do_bench(fn, warmup=10, rep=40, return_mode="median"))

    def cpu_median(fn: Callable[[], Any]) -> float:
        ts = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        return float(np.median(ts))

    return cpu_median


def run_speed(csv_path: Path, deadline: float, smoke: bool, log: Callable[[str], None]) -> int:
    """The speed part of the job: ``csv_path`` (speed.csv, :data:`SPEED_FIELDS`), one row per measurement
    (configurations not reached before ``deadline``, a time.monotonic() value, are rows with a note); returns
    the number of rows. ``smoke``: tiny sizes on the CPU under the faithful interpreter."""
    import torch

    from simfloat_gpu.kernels.flash_attention import flash_attention

    device = "cpu" if smoke else "cuda"
    time_of = timer(smoke)
    ctx: Any = contextlib.nullcontext()
    if smoke:
        from simfloat_gpu.interpreter import faithful

        ctx = faithful()
    rows: list[dict[str, Any]] = []
    f = open(csv_path, "w", newline="")  # noqa: SIM115
    w = csv.DictWriter(f, fieldnames=SPEED_FIELDS)
    w.writeheader()
    f.flush()

    def emit(
        part: str,
        kernel: str,
        b: int,
        h: int,
        s: int,
        d: int,
        causal: bool,
        bm: Any,
        bn: Any,
        *,
        ms: Any = "",
        tflops: Any = "",
        note: str = "",
    ) -> None:
        """One row of speed.csv (:data:`SPEED_FIELDS`): what was measured, the timing (empty: none)."""
        row = dict(part=part, kernel=kernel, batch=b, heads=h, seq=s, head_dim=d, causal=causal, block_m=bm, block_n=bn)
        row.update(ms=ms, tflops=tflops, note=note)
        rows.append(row)
        w.writerow(row)
        f.flush()
        log(
            f"speed {row['part']} {row['kernel']} seq {row['seq']} d {row['head_dim']} "
            f"causal {row['causal']}: "
            f"{row['ms']} ms, {row['tflops']} TFLOP/s {row['note']}"
        )

    def measure(
        part: str, kernel: str, fn: Callable[[], Any], b: int, h: int, s: int, d: int, causal: bool, bm: Any, bn: Any
    ) -> None:
        where = (part, kernel, b, h, s, d, causal, bm, bn)
        if time.monotonic() > deadline:
            emit(*where, note="skipped: time budget")
            return
        try:
            ms = time_of(fn)
            flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
            emit(*where, ms=round(ms, 4), tflops=round(flops / (ms * 1e-3) / 1e12, 2))
        except Exception as exc:
            emit(*where, note=f"error: {type(exc).__name__}: {exc}"[:200])

    try:
        with ctx:
            # 1. flash bf16, head_dim 128, vs SDPA's flash backend; batch * seq = 16k tokens, 16 heads
            d, heads = (32, 1) if smoke else (128, 16)
            seqs = (64,) if smoke else (1024, 2048, 4096, 8192, 16384)
            bm, bn = default_blocks(d)
            for s in seqs:
                b = 1 if smoke else max(1, 16384 // s)
                g = torch.Generator(device=device).manual_seed(s)
                q, k, v = (
                    torch.randn(b, heads, s, d, device=device, dtype=torch.bfloat16, generator=g) for _ in range(3)
                )
                for causal in (False, True):
                    measure(
                        "flash-vs-sdpa",
                        "triton-bf16",
                        lambda q=q, k=k, v=v, c=causal: flash_attention(q, k, v, causal=c, block_m=bm, block_n=bn),
                        b,
                        heads,
                        s,
                        d,
                        causal,
                        bm,
                        bn,
                    )
                    if not smoke:
                        from torch.nn.attention import SDPBackend, sdpa_kernel
                        from torch.nn.functional import scaled_dot_product_attention as sdpa

                        def run_sdpa(q=q, k=k, v=v, c=causal) -> Any:
                            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                                return sdpa(q, k, v, is_causal=c)

                        measure("flash-vs-sdpa", "sdpa-flash-bf16", run_sdpa, b, heads, s, d, causal, "", "")
                del q, k, v
            # 2. INT8 / half-INT8 vs FP16 (kernel only, inputs pre-quantized)
            for d in (32,) if smoke else (128, 64):
                bm, bn = default_blocks(d)
                for s in (64,) if smoke else (1024, 4096, 16384):
                    b, heads = (1, 1) if smoke else (max(1, 16384 // s), 16)
                    g = torch.Generator(device=device).manual_seed(s + d)
                    q16, k16, v16 = (
                        torch.randn(b, heads, s, d, device=device, dtype=torch.float16, generator=g) for _ in range(3)
                    )
                    for kernel in ("fp16", "int8", "half-int8"):
                        try:
                            runners = make_runners(kernel, q16, k16, v16, bm, bn)
                        except Exception as exc:
                            note = f"error: {type(exc).__name__}: {exc}"[:200]
                            emit("int8-vs-fp16", kernel, b, heads, s, d, False, bm, bn, note=note)
                            continue
                        for _, fn in runners:
                            measure("int8-vs-fp16", kernel, fn, b, heads, s, d, False, bm, bn)
                    del q16, k16, v16
                    if not smoke:
                        torch.cuda.empty_cache()
    finally:
        f.close()
    return len(rows)
