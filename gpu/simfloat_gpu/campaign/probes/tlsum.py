"""Probe 4, **sum**: the reduction tree of ``tl.sum(p, 1)`` over a tile in the flash kernel's P layout and
a plain loaded tile, FPRev-style (see :mod:`simfloat_gpu.campaign.probes`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from simfloat_gpu.campaign.probes._shared import KERNELS, run_context

#: (BLOCK_M, BLOCK_N) of the sum probe
SUM_VARIANTS = ((64, 64), (32, 32), (16, 16), (128, 128), (128, 64), (64, 32), (32, 64), (64, 128))
SUM_SMOKE_VARIANTS = ((16, 16),)
#: the big value of the sum probe: 1 + 2^40 == 2^40 in fp32
SUM_M = float(2**40)


# ----------------------------------------------------------------------------------------------------
# 4. sum
# ----------------------------------------------------------------------------------------------------


def sum_design(n: int) -> tuple[np.ndarray, np.ndarray]:
    """FPRev rows for a length-n sum: (pairs (P, 2) int, rows (2P, n) float32); row r < P holds pair r, row
    P + r holds pair P - 1 - r (so every pair also sits at another row index)."""
    pairs = np.array([(i, j) for i in range(n) for j in range(i + 1, n)], dtype=np.int32).reshape(-1, 2)
    order = np.concatenate([np.arange(len(pairs)), np.arange(len(pairs))[::-1]])
    x = np.ones((order.size, n), dtype=np.float32)
    x[np.arange(order.size), pairs[order, 0]] = SUM_M
    x[np.arange(order.size), pairs[order, 1]] = -SUM_M
    return pairs, x


def _sum_kernel() -> Any:
    if "sum" not in KERNELS:
        import triton
        import triton.language as tl

        @triton.jit
        def _sum_probe(A, EYE, X, YM, YB, BM: tl.constexpr, BN: tl.constexpr):
            t = tl.program_id(0).to(tl.int64)
            om = tl.arange(0, BM)
            on = tl.arange(0, BN)
            a = tl.load(A + t * BM * BN + om[:, None] * BN + on[None, :])
            eye = tl.load(EYE + on[:, None] * BN + on[None, :])
            # p = A @ I: exactly the designed values (one nonzero product per element), in the accumulator
            # layout of tl.dot(q, k) -- the layout the flash kernel's P and its row sum l_ij have
            p = tl.dot(a, eye)
            tl.store(YM + t * BM + om, tl.sum(p, 1))
            x = tl.load(X + t * BM * BN + om[:, None] * BN + on[None, :])
            tl.store(YB + t * BM + om, tl.sum(x, 1))

        KERNELS["sum"] = _sum_probe
    return KERNELS["sum"]


def sum_variant(
    bm: int, bn: int, *, device: str = "cuda", faithful_kwargs: dict[str, Any] | None = None
) -> dict[str, np.ndarray]:
    """Run the sum probe for one (BLOCK_M, BLOCK_N): outputs ``y_mma`` (a tile produced by tl.dot, in its
    accumulator layout) and ``y_blocked`` (a loaded fp32 tile), one per design row (:func:`sum_design`)."""
    import torch

    _, x = sum_design(bn)
    r = x.shape[0]
    t = -(-r // bm)
    xp = np.ones((t * bm, bn), dtype=np.float32)
    xp[:r] = x
    kern = _sum_kernel()
    with run_context(device, faithful_kwargs):
        dx = torch.from_numpy(xp).to(device)
        da = dx.to(torch.bfloat16)  # 1 and +-2^40 are bf16 values
        eye = torch.eye(bn, dtype=torch.bfloat16, device=device)
        ym = torch.empty(t * bm, dtype=torch.float32, device=device)
        yb = torch.empty(t * bm, dtype=torch.float32, device=device)
        kern[(t,)](da, eye, dx, ym, yb, BM=bm, BN=bn, num_warps=4)
        y_mma, y_blk = ym.cpu().numpy()[:r], yb.cpu().numpy()[:r]
    return {"y_mma": y_mma.astype(np.float32), "y_blocked": y_blk.astype(np.float32), "shape": np.array([bm, bn])}
