"""Probe 2, **exp**: tl.math.exp2 and tl.exp of float32 inputs, stored as ulp offsets from the correctly
rounded value (see :mod:`simfloat_gpu.campaign.probes`)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from simfloat_gpu.campaign.probes._shared import KERNELS, run_context

# ----------------------------------------------------------------------------------------------------
# 2. exp2 / exp
# ----------------------------------------------------------------------------------------------------


def f32_bits(v: float) -> int:
    return int(np.array(v, dtype=np.float32).view(np.uint32))


def exp_segments(smoke: bool = False) -> list[dict[str, Any]]:
    """The input ranges: name, function (exp2 | exp), sign bit, magnitude bit range [lo, hi] and stride."""
    s = 2**15 if smoke else 1
    return [
        dict(name="exp2_sweep", fn="exp2", sign=1, lo=f32_bits(2.0**-30), hi=f32_bits(32.0), stride=8 * s),
        dict(name="exp2_neg_binade", fn="exp2", sign=1, lo=f32_bits(1.0), hi=f32_bits(2.0) - 1, stride=s),
        dict(name="exp2_pos_binade", fn="exp2", sign=0, lo=f32_bits(1.0), hi=f32_bits(2.0) - 1, stride=s),
        dict(name="exp_sweep", fn="exp", sign=1, lo=f32_bits(2.0**-30), hi=f32_bits(64.0), stride=64 * s),
    ]


def segment_inputs(seg: dict[str, Any], start: int = 0, stop: int | None = None) -> np.ndarray:
    """float32 inputs of a segment (elements [start, stop))."""
    mags = np.arange(seg["lo"], seg["hi"] + 1, seg["stride"], dtype=np.int64)[start:stop]
    bits = (mags | (int(seg["sign"]) << 31)).astype(np.uint32)
    return bits.view(np.float32)


def segment_size(seg: dict[str, Any]) -> int:
    return (seg["hi"] - seg["lo"]) // seg["stride"] + 1


def exp_edges() -> np.ndarray:
    """Edge inputs stored with raw outputs."""
    v = [
        0.0,
        -0.0,
        1e-45,
        -1e-45,
        1.1754942e-38,
        -1.1754942e-38,
        1.17549435e-38,
        -1.17549435e-38,
        2.0**-140,
        -(2.0**-140),
        2.0**-126,
        -(2.0**-126),
        np.inf,
        -np.inf,
        np.nan,
        127.0,
        127.99999,
        128.0,
        200.0,
        88.0,
        88.7,
        89.0,
        -87.0,
        -103.0,
        -104.0,
        1e-8,
        -1e-8,
        2.0**-24,
        -(2.0**-24),
        2.0**-25,
        -(2.0**-25),
    ]
    flush = -np.linspace(120.0, 155.0, 701)  # exp2 results from normal through subnormal to zero
    tiny = -(2.0 ** -np.arange(30.0, 150.0, 0.5))  # below the sweep: exp2 ~ 1
    sub = -(np.arange(1, 65, dtype=np.float64) * 2.0**-149)
    return np.concatenate([v, flush, tiny, sub, -sub]).astype(np.float32)


def _unary_kernel() -> Any:
    if "unary" not in KERNELS:
        import triton
        import triton.language as tl

        @triton.jit
        def _unary_probe(X, Y, N, BLOCK: tl.constexpr, FN: tl.constexpr):
            offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < N
            x = tl.load(X + offs, mask=mask, other=0.0)
            if FN == 0:
                y = tl.math.exp2(x)
            else:
                y = tl.exp(x)
            tl.store(Y + offs, y, mask=mask)

        KERNELS["unary"] = _unary_probe
    return KERNELS["unary"]


def _apply(x_dev: Any, fn: str, device: str, faithful_kwargs: dict[str, Any] | None) -> Any:
    import torch
    import triton

    y = torch.empty_like(x_dev)
    n = x_dev.numel()
    block = 1024
    with run_context(device, faithful_kwargs):
        _unary_kernel()[(triton.cdiv(n, block),)](x_dev, y, n, BLOCK=block, FN=0 if fn == "exp2" else 1)
    return y


AMB_TOL = 2.0**-20


def offsets(x_dev: Any, y_dev: Any, fn: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """int8 ulp offsets of y from the correctly rounded fn(x) (float64 on the device, then rn to fp32), and
    (amb_idx, amb_bits, clip_idx, clip_bits) where the offset is not trustworthy / does not fit."""
    import torch

    x64 = x_dev.double()
    r64 = torch.exp2(x64) if fn == "exp2" else torch.exp(x64)
    ref = r64.float()
    mant, _ = torch.frexp(r64)  # r64 = mant * 2^e, mant in [0.5, 1)
    scaled = mant * 2.0**24
    frac = scaled - torch.floor(scaled)
    amb = (torch.abs(frac - 0.5) < AMB_TOL) & torch.isfinite(r64) & (r64 >= 2.0**-126)
    amb |= ~torch.isfinite(r64) | (r64 < 2.0**-126)
    yb = y_dev.view(torch.int32).long()
    rb = ref.view(torch.int32).long()
    d = yb - rb
    clip = (d.abs() > 127) & ~amb
    off = torch.where(amb | clip, torch.zeros_like(d), d).to(torch.int8)
    amb_idx = torch.nonzero(amb).flatten()
    clip_idx = torch.nonzero(clip).flatten()
    ybits = y_dev.view(torch.int32)
    return (
        off.cpu().numpy(),
        amb_idx.cpu().numpy(),
        ybits[amb_idx].cpu().numpy().view(np.uint32),
        clip_idx.cpu().numpy(),
        ybits[clip_idx].cpu().numpy().view(np.uint32),
    )


def exp_probe(
    *,
    device: str = "cuda",
    smoke: bool = False,
    chunk: int = 1 << 24,
    deadline: float | None = None,
    faithful_kwargs: dict[str, Any] | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, np.ndarray]:
    """Run every segment of :func:`exp_segments` and the edges; arrays keyed ``<segment>_<field>``."""
    import torch

    out: dict[str, np.ndarray] = {}
    segs = exp_segments(smoke)
    out["segments"] = np.array(json.dumps(segs))
    out["amb_tol"] = np.array([AMB_TOL])
    for seg in segs:
        if deadline is not None and time.monotonic() > deadline:
            log(f"exp probe: time budget reached before {seg['name']}")
            break
        n = segment_size(seg)
        offs, ambs, amb_y, clips, clip_y = [], [], [], [], []
        t0 = time.perf_counter()
        for start in range(0, n, chunk):
            stop = min(n, start + chunk)
            if device == "cuda":
                mags = torch.arange(
                    seg["lo"] + start * seg["stride"],
                    seg["lo"] + stop * seg["stride"],
                    seg["stride"],
                    dtype=torch.int64,
                    device="cuda",
                )
                bits = mags | (int(seg["sign"]) << 31)
                bits = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32)
                x = bits.view(torch.float32)
            else:
                x = torch.from_numpy(segment_inputs(seg, start, stop))
            y = _apply(x, seg["fn"], device, faithful_kwargs)
            o, ai, ay, ci, cy = offsets(x, y, seg["fn"])
            offs.append(o)
            ambs.append(ai + start)
            amb_y.append(ay)
            clips.append(ci + start)
            clip_y.append(cy)
        name = seg["name"]
        out[f"{name}_off"] = np.concatenate(offs)
        out[f"{name}_amb_idx"] = np.concatenate(ambs).astype(np.int64)
        out[f"{name}_amb_y"] = np.concatenate(amb_y).astype(np.uint32)
        out[f"{name}_clip_idx"] = np.concatenate(clips).astype(np.int64)
        out[f"{name}_clip_y"] = np.concatenate(clip_y).astype(np.uint32)
        o = out[f"{name}_off"]
        log(
            f"exp probe {name}: {n} inputs in {time.perf_counter() - t0:.1f} s; offsets "
            f"{dict(zip(*np.unique(o, return_counts=True), strict=True))}, "
            f"amb {out[f'{name}_amb_idx'].size}, "
            f"clip {out[f'{name}_clip_idx'].size}"
        )
    edges = exp_edges()
    for fn in ("exp2", "exp"):
        x = torch.from_numpy(edges).to(device)
        y = _apply(x, fn, device, faithful_kwargs)
        out[f"edges_{fn}_y"] = y.cpu().numpy().view(np.uint32)
    out["edges_x"] = edges
    return out
