"""GPU speed of the attention kernels: INT8 / half-INT8 (simfloat_gpu.kernels.int8_attention) and FP8
(simfloat_gpu.kernels.fp8_attention)
against the FP16 / BF16 flash kernel (simfloat_gpu.kernels.flash_attention.flash_attention), through the runners of
simfloat_gpu.campaign.speed (which the speed part of ``simfloat-gpu run`` uses too).

Shapes: batch 4, 32 heads, head_dim 64 and 128, seq 1k..16k, non-causal. Each kernel is timed with
triton.testing.do_bench (median, L2 flushed between runs) on inputs already in its own format: the INT8
and FP8 timings are the attention kernel only, quantization excluded (add --include-quant to also time
quantize + kernel). TFLOP/s counts 4 * batch * heads * seq^2 * head_dim (two matmuls, non-causal).

Block sizes default to what fits NUM_WARPS=4 without register spills (sm_90, triton 3.9 ptxas):
BLOCK_M x BLOCK_N = 128 x 64 for head_dim 64 and 64 x 64 for head_dim 128; --block-m / --block-n
override both. The full sweep is sized to finish in well under 3 minutes on an H200 (--time-budget stops
early, --quick runs a small subset).

    python benchmarks/bench_gpu_attention.py [--quick] [--csv out.csv] [--kernels int8,fp16,...]

Without a CUDA GPU it prints that it needs one and exits 0 (1 with --require-gpu).
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time

# runnable as a script from the repository root or from benchmarks/ (the GPU side: gpu/simfloat_gpu)
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "gpu")]

from simfloat_gpu.campaign.speed import KERNELS as ALL_KERNELS  # noqa: E402

DEFAULT_KERNELS = ("int8", "half-int8", "fp16", "bf16")
FIELDS = ("kernel", "includes_quant", "batch", "heads", "seq", "head_dim", "block_m", "block_n", "ms", "tflops")


def _parse_args(argv):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="seq 1k and 4k only, shorter timing")
    p.add_argument("--csv", metavar="PATH", help="also write the results as CSV to PATH")
    p.add_argument(
        "--kernels",
        default=",".join(DEFAULT_KERNELS),
        help=f"comma-separated subset of {','.join(ALL_KERNELS)} (default: %(default)s)",
    )
    p.add_argument("--seqs", help="comma-separated sequence lengths (default 1024,2048,4096,8192,16384)")
    p.add_argument("--head-dims", default="64,128", help="comma-separated head dims (default: %(default)s)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--block-m", type=int, help="override BLOCK_M for every kernel")
    p.add_argument("--block-n", type=int, help="override BLOCK_N for every kernel")
    p.add_argument(
        "--include-quant",
        action="store_true",
        help="also time INT8/FP8 including the on-device quantization of q, k, v",
    )
    p.add_argument(
        "--time-budget",
        type=float,
        default=170.0,
        help="seconds; skip the remaining measurements once exceeded (default: %(default)s)",
    )
    p.add_argument("--require-gpu", action="store_true", help="exit 1 (instead of 0) without a CUDA GPU")
    args = p.parse_args(argv)
    kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    unknown = sorted(set(kernels) - set(ALL_KERNELS))
    if unknown:
        p.error(f"unknown kernel(s) {unknown}; choose from {list(ALL_KERNELS)}")
    args.kernels = kernels
    if args.seqs:
        args.seqs = [int(s) for s in args.seqs.split(",")]
    else:
        args.seqs = [1024, 4096] if args.quick else [1024, 2048, 4096, 8192, 16384]
    args.head_dims = [int(d) for d in args.head_dims.split(",")]
    return args


def main(argv=None) -> int:
    args = _parse_args(argv)
    try:
        import torch
    except ImportError:
        torch = None
    if torch is None or not torch.cuda.is_available():
        print("bench_gpu_attention: needs a CUDA GPU (torch.cuda.is_available() is False); nothing measured.")
        return 1 if args.require_gpu else 0
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("bench_gpu_attention: TRITON_INTERPRET is set; unset it to time compiled kernels.")
        return 1

    import triton
    from triton.testing import do_bench

    from simfloat_gpu.campaign.speed import default_blocks, make_runners

    kernels = list(args.kernels)

    warmup, rep = (10, 30) if args.quick else (25, 100)
    name = torch.cuda.get_device_name()
    print(
        f"# {name}, torch {torch.__version__}, triton {triton.__version__}; batch {args.batch}, "
        f"heads {args.heads}, non-causal; do_bench median (warmup {warmup} ms, rep {rep} ms)"
    )
    print(f"{'kernel':<10} {'quant':>5} {'d':>4} {'seq':>6} {'blocks':>8} {'ms':>9} {'TFLOP/s':>8}")
    rows = []
    start = time.perf_counter()
    skipped = 0
    b, h = args.batch, args.heads
    for head_dim in args.head_dims:
        block_m, block_n = default_blocks(head_dim, args.block_m, args.block_n)
        for seq in args.seqs:
            gen = torch.Generator(device="cuda").manual_seed(seq + head_dim)
            q16, k16, v16 = (
                torch.randn(b, h, seq, head_dim, device="cuda", dtype=torch.float16, generator=gen) for _ in range(3)
            )
            flops = 4.0 * b * h * seq * seq * head_dim
            for kernel in kernels:
                if time.perf_counter() - start > args.time_budget:
                    skipped += 1
                    continue
                for includes_quant, fn in make_runners(kernel, q16, k16, v16, block_m, block_n, args.include_quant):
                    ms = do_bench(fn, warmup=warmup, rep=rep, return_mode="median")
                    row = dict(
                        kernel=kernel,
                        includes_quant=includes_quant,
                        batch=b,
                        heads=h,
                        seq=seq,
                        head_dim=head_dim,
                        block_m=block_m,
                        block_n=block_n,
                        ms=round(ms, 4),
                        tflops=round(flops / (ms * 1e-3) / 1e12, 2),
                    )
                    rows.append(row)
                    print(
                        f"{kernel:<10} {'yes' if includes_quant else 'no':>5} {head_dim:>4} {seq:>6} "
                        f"{f'{block_m}x{block_n}':>8} {ms:>9.3f} {row['tflops']:>8.1f}",
                        flush=True,
                    )
            del q16, k16, v16
            torch.cuda.empty_cache()
    total = time.perf_counter() - start
    note = f"; {skipped} kernel x shape point(s) skipped (--time-budget {args.time_budget:g} s)" if skipped else ""
    print(f"# {len(rows)} measurements in {total:.1f} s{note}")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=FIELDS)
            writer.writeheader()
            writer.writerows(rows)
        print(f"# wrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
