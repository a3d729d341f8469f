"""Reductions and scans of the Triton interpreter: tl.sum in the configured order, exact min/max, cumsum,
cumprod; custom combine functions only in the sequential order."""

from __future__ import annotations

import numpy as np
import triton.language as tl
from triton.runtime import interpreter as ti

import simfloat.ops as sops
from simfloat_gpu.interpreter._formats import FP8, RNE, decode, round_to
from simfloat_gpu.interpreter._state import F64, POLICY, cfg, fmt_of, ftype, rounds, stock_method, storage, unsupported


def reduce_sum(self, input):
    """tl.sum / tl.reduce(..., _sum_combine) on floats: simfloat.ops.sum in the configured order."""
    name = ftype(input.handle)
    if name is None:
        return stock_method(ti.ReduceOps, "sum")(self, input)
    c = cfg()
    vals = decode(input.handle.data, name)
    if not rounds("sum"):
        order = c.reduce_order if c.reduce_order in sops.ORDERS else "sequential"
        r = np.asarray(sops.sum(vals, F64, axis=self.axis, order=order, fan_in=c.reduce_fan_in, chunk=c.reduce_chunk))
    elif POLICY and c.reduce_order == "sequential" and self.axis is not None and vals.shape[self.axis]:
        # a site run, carriers possibly not of the format: the first element rounded into the format, then
        # each exact addition of the next element rounded once (the emulator's sequential row sum; simfloat.ops.sum
        # would round every element as it is loaded). Identical to simfloat.ops.sum on values of the format, so
        # the all-sites run keeps the plain run's bits.
        moved = np.moveaxis(np.asarray(vals, dtype=np.float64), self.axis, -1)
        acc = np.asarray(round_to(moved[..., 0], name, RNE, "ieee"), dtype=np.float64)
        for j in range(1, moved.shape[-1]):
            acc = np.asarray(sops.add(acc, moved[..., j], fmt_of(name)), dtype=np.float64)
        r = acc
    elif c.reduce_order not in sops.ORDERS:  # a hardware rule (simfloat.profiles.tl_sum): fp32 only
        if name != "fp32" or self.axis is None or vals.ndim == 0:
            raise unsupported(
                "tl.sum", name, f"reduce_order={c.reduce_order!r} is an fp32 rule over one axis of a tile"
            )
        from simfloat.profiles import tl_sum

        moved = np.moveaxis(vals, self.axis, -1)
        flat = tl_sum(moved.reshape(-1, moved.shape[-1]), c.reduce_order, c.reduce_warps_n)
        r = np.asarray(flat, dtype=np.float64).reshape(moved.shape[:-1])
    else:
        r = np.asarray(
            sops.sum(
                vals, fmt_of(name), axis=self.axis, order=c.reduce_order, fan_in=c.reduce_fan_in, chunk=c.reduce_chunk
            )
        )
    if self.keep_dims:
        r = np.expand_dims(r, self.axis) if self.axis is not None else r.reshape((1,) * vals.ndim)
    return self.to_tensor(storage(r, name), input.dtype)


def reduce_min_max(self, input, val_reduce_op, idx_reduce_op=None):
    """tl.max/min/argmax/argmin: exact; bf16/fp8 are decoded first (stock compares their bit patterns)."""
    t = input[0] if isinstance(input, tuple) else input
    name = ftype(t.handle)
    if name not in ("bf16",) + FP8 and not (POLICY and name is not None):
        return stock_method(ti.ReduceOps, "min_max")(self, input, val_reduce_op, idx_reduce_op)
    vals = decode(t.handle.data, name)
    out = []
    if val_reduce_op:
        val = val_reduce_op(vals, axis=self.axis, keepdims=self.keep_dims)
        out.append(self.to_tensor(storage(val, name), t.dtype))
    if idx_reduce_op:
        out.append(self.to_tensor(idx_reduce_op(vals, axis=self.axis, keepdims=self.keep_dims), tl.int32))
    return tuple(out) if len(out) == 2 else out[0]


def _needs_sequential(what: str, tensors) -> None:
    names = [ftype(t.handle) for t in tensors]
    floats = [n for n in names if n is not None]
    if floats and cfg().reduce_order != "sequential":
        raise unsupported(
            what,
            floats[0],
            f"only the sequential order is modelled; faithful(reduce_order={cfg().reduce_order!r}) asks for another",
        )


def generic_reduce(self, input):
    """Custom combine functions: the stock left fold, whose arithmetic goes through the patched builder."""
    _needs_sequential("tl.reduce with a custom combine_fn", input)
    return stock_method(ti.ReduceOps, "generic_reduce")(self, input)


def _scan(self, input, fn, what):
    name = ftype(input.handle)
    if name is None:
        return None
    _needs_sequential(what, [input])
    vals = np.moveaxis(decode(input.handle.data, name), self.axis, -1)
    out = np.empty(vals.shape, dtype=vals.dtype)
    fmt = fmt_of(name) if rounds(what.removeprefix("tl.")) else F64
    if vals.shape[-1]:
        out[..., 0] = vals[..., 0]
    for j in range(1, vals.shape[-1]):
        out[..., j] = fn(out[..., j - 1], vals[..., j], fmt)
    return [self.to_tensor(storage(np.moveaxis(out, -1, self.axis), name), input.dtype)]


def scan_cumsum(self, input):
    r = _scan(self, input, sops.add, "tl.cumsum")
    return r if r is not None else stock_method(ti.ScanOps, "cumsum")(self, input)


def scan_cumprod(self, input):
    r = _scan(self, input, sops.mul, "tl.cumprod")
    return r if r is not None else stock_method(ti.ScanOps, "cumprod")(self, input)


def generic_scan(self, input):
    _needs_sequential("tl.associative_scan with a custom combine_fn", input)
    return stock_method(ti.ScanOps, "generic_scan")(self, input)
