"""Hardware fingerprint probes: small Triton kernels whose outputs pin down what the GPU computes.

Each probe is a kernel plus a host driver returning a dict of compact numpy arrays (inputs where they cannot
be regenerated, outputs, design metadata); :mod:`simfloat_gpu.campaign.gpu_run` runs them on the device and
:mod:`simfloat_gpu.campaign.fit`
analyses them on a CPU.

1. **dot** (:func:`dot_variant`): ``C = tl.dot(A, B, C0)`` for bf16, fp16, tf32 (fp32 operands,
   ``input_precision="tf32"``), fp8 e4m3 and e5m2, at the tile shapes the flash kernels use (BLOCK_M 16..128 x
   N x K 16..128; BLOCK_M >= 64 compiles to wgmma on sm_90, smaller tiles to mma.sync). Each row of A is a
   designed test vector (one big product and tiny ones at chosen positions, cancelling pairs, sums that need
   more than 24 bits, random and wide-range rows, tf32 conversion patterns, subnormals; bf16 and tf32, whose
   products can leave fp32's range at both ends: sums beyond it (``overflow``) and one negative product below
   fp32's smallest step (``negtiny``), which ask ``BlockFMA.overflow`` and ``BlockFMA.zero_sign``); the columns
   of B multiply it by 1, -1, 1/8, 3, 1 + ulp, 2^-20 (bf16/tf32, column 6) and random values; C0 is zero
   (launch 0) or a designed accumulator (launch 1: re-entry). Stored: A and the first 16 columns of B, C0 and
   C, as raw bits.
2. **exp** (:func:`exp_probe`): tl.math.exp2 and tl.exp of float32 inputs: every 8th bit pattern of [-32,
   -2^-30] (36.7M inputs), every float32 of [1, 2) and of [-2, -1) (2^23 each), tl.exp every 64th of [-64,
   -2^-30], and edge inputs (zeros, subnormals, the flush range, infinities, NaN, large positives). The inputs
   are implicit (bit-pattern ranges); a result is stored as its int8 distance in ulps from the correctly
   rounded value (computed on the device in float64), except where the float64 value lies within 2^-20 ulp of
   a rounding boundary (``amb``) or the distance does not fit int8 (``clip``): there the raw result bits are
   stored.
3. **isa** (:func:`isa_probe`): PTX and SASS of the flash kernel (bf16, BLOCK 64 and 32), the fp16 16 x 16
   tile and the int8 kernel, and facts read from them (is ``qk*scale - m`` an FFMA feeding the exp2, which
   exp2 and division instructions, wgmma vs mma shapes, shuffle counts). Real launches on a GPU (the exact
   specialization, read back from a fresh TRITON_CACHE_DIR); a cross-compile for sm_90 without one.
4. **sum** (:func:`sum_variant`): the reduction tree of ``tl.sum(p, 1)`` over a BLOCK_M x BLOCK_N fp32 tile in
   the layout of the flash kernel's P (p = tl.dot(x_bf16, identity): the accumulator layout of
   ``tl.dot(q, k)``), and of a plain loaded tile, FPRev-style: row r holds +M at i, -M at j and ones elsewhere
   (M = 2^40), so the sum is the number of ones outside the smallest subtree holding i and j; every pair
   (i, j), twice, at different rows.

Without a GPU the drivers run under the faithful interpreter (``TRITON_INTERPRET=1`` set before triton is
imported), which is how ``gpu_run --cpu-smoke`` and the tests exercise them; ``simfloat_gpu.campaign.fit`` then
recovers the
interpreter's own models.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

from simfloat_gpu.campaign.probes._shared import to_format
from simfloat_gpu.campaign.probes.dot import (
    DOT_PARAMS,
    DOT_SMOKE_VARIANTS,
    DOT_VARIANTS,
    KEEP_COLS,
    RANGE_FORMATS,
    TINY_B,
    TINY_COL,
    dot_b_columns,
    dot_c0,
    dot_designs,
    dot_inputs,
    dot_record,
    dot_variant,
)
from simfloat_gpu.campaign.probes.exp import exp_probe, exp_segments, segment_inputs, segment_size
from simfloat_gpu.campaign.probes.isa import isa_facts, isa_probe
from simfloat_gpu.campaign.probes.tlsum import SUM_M, SUM_SMOKE_VARIANTS, SUM_VARIANTS, sum_design, sum_variant

#: the command line of one probe: ``python -m simfloat_gpu.campaign.probes`` (``__main__.py``); the probes by
#: concept: ``dot.py``, ``exp.py``, ``isa.py``, ``tlsum.py``, their shared helpers ``_shared.py``
__all__ = [
    "DOT_VARIANTS",
    "DOT_SMOKE_VARIANTS",
    "SUM_VARIANTS",
    "SUM_SMOKE_VARIANTS",
    "DOT_PARAMS",
    "dot_designs",
    "dot_b_columns",
    "dot_c0",
    "dot_inputs",
    "dot_record",
    "dot_variant",
    "sum_design",
    "sum_variant",
    "exp_segments",
    "exp_probe",
    "isa_probe",
    "isa_facts",
    "KEEP_COLS",
    "SUM_M",
    "RANGE_FORMATS",
    "TINY_COL",
    "TINY_B",
    "segment_inputs",
    "segment_size",
    "to_format",
    "main",
]


# ----------------------------------------------------------------------------------------------------
# command line (each probe on its own; simfloat_gpu.campaign.gpu_run runs them all)
# ----------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None, prog: str = "simfloat-gpu probe") -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("probe", choices=("isa", "dot", "exp", "sum"))
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--compile-only", action="store_true", help="isa: cross-compile for sm_90, launch nothing")
    p.add_argument("--smoke", action="store_true", help="tiny sizes (CPU interpreter)")
    p.add_argument("--budget-s", type=float, default=None)
    args = p.parse_args(argv)
    deadline = None if args.budget_s is None else time.monotonic() + args.budget_s
    args.out.mkdir(parents=True, exist_ok=True)
    if args.probe == "isa":
        isa_probe(args.out, compile_only=args.compile_only or None, deadline=deadline)
        return 0
    import torch

    device = "cuda" if torch.cuda.is_available() and not os.environ.get("TRITON_INTERPRET") else "cpu"
    if device == "cpu" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        print("no GPU: set TRITON_INTERPRET=1 to run the probe under the faithful interpreter", file=sys.stderr)
        return 2
    arrays: dict[str, np.ndarray] = {}
    if args.probe == "exp":
        arrays = exp_probe(device=device, smoke=args.smoke, deadline=deadline)
    elif args.probe == "dot":
        for v in DOT_SMOKE_VARIANTS if args.smoke else DOT_VARIANTS:
            res = dot_variant(*v, device=device, max_rows=64 if args.smoke else None)
            arrays.update({f"dot_{'_'.join(map(str, v))}__{k}": a for k, a in res.items()})
    else:
        for v in SUM_SMOKE_VARIANTS if args.smoke else SUM_VARIANTS:
            res = sum_variant(*v, device=device)
            arrays.update({f"sum_{v[0]}_{v[1]}__{k}": a for k, a in res.items()})
    np.savez_compressed(args.out / f"{args.probe}.npz", **arrays)
    return 0
