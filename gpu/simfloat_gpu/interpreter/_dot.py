"""``tl.dot`` of the Triton interpreter (the configured accumulation models; int8 exact) and atomics."""

from __future__ import annotations

import numpy as np
from triton._C.libtriton import ir
from triton.runtime import interpreter as ti

from simfloat.accumulate import BlockFMA, Chunked, Sequential, matmul
from simfloat.formats import FloatFormat
from simfloat.formats import format as sformat
from simfloat_gpu.interpreter._formats import FP8, RNE, decode
from simfloat_gpu.interpreter._state import (
    POLICY,
    TensorHandle,
    cfg,
    fmt_of,
    ftype,
    make_handle,
    rounds,
    stock_method,
    unsupported,
    wide_guard,
)

_FP8_INSTR_K = 32  # k of one fp8 wgmma instruction (m64nNk32)


def acc_format(model) -> FloatFormat:
    """Format of a model's accumulator (the values tl.dot returns)."""
    if isinstance(model, Chunked):
        return sformat(model.outer_fmt)
    if isinstance(model, Sequential):
        return sformat(model.fmt)
    if isinstance(model, BlockFMA):
        return sformat(model.out_fmt)
    raise TypeError(f"not an accumulation model: {model!r}")


def _fits(inner: FloatFormat, outer: FloatFormat) -> bool:
    tiny_in = inner.emin - inner.mantissa_bits
    return (
        inner.mantissa_bits <= outer.mantissa_bits
        and inner.emax <= outer.emax
        and inner.emin >= outer.emin
        and tiny_in >= outer.emin - outer.mantissa_bits
    )


def _dot_model(a_name: str, b_name: str, input_precision, max_num_imprecise_acc, k: int):
    models = cfg().dot
    if a_name in FP8 and b_name in FP8:
        model = models.get("fp8")
        if model is None:
            raise unsupported("tl.dot", f"{a_name} x {b_name}", f"no fp8 tensor-core model for {cfg().arch}")
        n = int(max_num_imprecise_acc or 0)
        if n <= k and not isinstance(model, Chunked):
            # Triton's sm90 WGMMA lowering: the MMA accumulates into a zeroed partial sum for at least n
            # products (whole instructions of k=32), then adds it into the fp32 accumulator (add.f32)
            chunk = max(_FP8_INSTR_K, -(-n // _FP8_INSTR_K) * _FP8_INSTR_K)
            model = Chunked(chunk=min(chunk, k), inner=model, outer_fmt="float32", outer_mode=RNE)
        return "fp8", model
    if a_name != b_name:
        raise unsupported("tl.dot", f"{a_name} x {b_name}")
    if a_name == "fp32":
        if input_precision == ir.INPUT_PRECISION.TF32:
            return "tf32", models["tf32"]
        if input_precision == ir.INPUT_PRECISION.IEEE:
            return "ieee", models["ieee"]
        raise unsupported(f"tl.dot(input_precision={input_precision})", "fp32")
    if a_name in ("bf16", "fp16", "fp64"):
        return a_name, models[a_name]
    raise unsupported("tl.dot", f"{a_name} x {b_name}")


def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    """tl.dot: ``d`` enters the accumulation model as its incoming accumulator; int8 x int8 -> exact int32."""
    a_name, b_name = ftype(a), ftype(b)
    if a_name is None or b_name is None:
        if a.data.dtype == np.int8 and b.data.dtype == np.int8:
            exact = np.matmul(a.data.astype(np.int64), b.data.astype(np.int64)) + d.data.astype(np.int64)
            wrapped = ((exact + 2**31) % 2**32) - 2**31  # the MMA's int32 accumulator wraps
            return TensorHandle(wrapped.astype(np.int32), d.dtype.scalar)
        raise unsupported("tl.dot", f"{a.dtype} x {b.dtype}")
    d_name = ftype(d)
    key, model = _dot_model(a_name, b_name, input_precision, max_num_imprecise_acc, a.data.shape[-1])
    if POLICY and d_name is not None and not rounds("dot"):
        model = _EXACT_DOT  # the exact mode: float64 products, summed in k order in float64
    elif d_name is None or not _fits(acc_format(model), fmt_of(d_name)):
        raise unsupported(
            "tl.dot",
            f"{a_name} x {b_name} -> {d_name}",
            f"the {key!r} model accumulates in {acc_format(model).name}; pass dot={{{key!r}: "
            f"<model with a {d_name} accumulator>}}",
        )
    a64 = decode(a.data, a_name).astype(np.float64)
    b64 = decode(b.data, b_name).astype(np.float64)
    c64 = np.broadcast_to(decode(d.data, d_name).astype(np.float64), a64.shape[:-1] + b64.shape[-1:])
    r = matmul(a64, b64, np.ascontiguousarray(c64), acc=model)
    return make_handle(r, d_name, d.dtype)


#: the exact mode's tl.dot: products rounded to float64, summed in k order in float64 (the emulator's fp64 plan)
_EXACT_DOT = Sequential("float64", product_fmt="float64")


def create_dot_scaled(self, *args, **kwargs):
    raise unsupported("tl.dot_scaled", "mx formats", "no block-scaled MMA model")


def create_atomic_rmw(self, rmw_op, ptr, val, *args, **kwargs):
    name = ftype(val)
    wide_guard(f"atomic {rmw_op}", val)
    if name is not None and name not in ("fp32", "fp64"):
        raise unsupported(f"atomic {rmw_op}", name)
    return stock_method(ti.InterpreterBuilder, "create_atomic_rmw")(self, rmw_op, ptr, val, *args, **kwargs)
