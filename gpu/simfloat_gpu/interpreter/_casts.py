"""Casts between float types (and to/from integers) and float constants of the Triton interpreter."""

from __future__ import annotations

import numpy as np
import triton.language as tl
from triton._C.libtriton import ir
from triton.runtime import interpreter as ti

from simfloat_gpu.interpreter._formats import (
    FORMATS,
    FP8,
    RNE,
    RTZ,
    UNSUPPORTED,
    decode,
    encode,
    ints_to_values,
    round_to,
    values_to_ints,
)
from simfloat_gpu.interpreter._state import (
    POLICY,
    TensorHandle,
    cfg,
    find_site,
    ftype,
    make_handle,
    rounds,
    stock_method,
    unsupported,
)


def _convert(self, src, dst, mode: str, stock):
    """Any cast touching a float type (see simfloat_gpu.interpreter's docstring for the table)."""
    dst = getattr(dst, "scalar", dst)
    s_name = ftype(src)
    d_float = dst.is_floating()
    if s_name is None and not d_float:
        return stock()
    d_name = dst.name if d_float else None
    if d_float and d_name not in FORMATS:
        raise unsupported("cast", f"{src.dtype} -> {d_name}", UNSUPPORTED.get(d_name, ""))
    c = cfg()
    if s_name is not None:
        vals = decode(src.data, s_name)
        if not d_float:
            return TensorHandle(values_to_ints(vals, ti._get_np_dtype(dst)), dst)
        if POLICY and d_name == "fp64":
            return make_handle(vals, d_name, dst)  # exact in every mode
        if POLICY and not rounds("cast"):
            return make_handle(vals, d_name, dst)  # the exact mode: a cast is the identity
        if d_name in FP8:
            if s_name == "fp64":
                raise unsupported("cast", f"fp64 -> {d_name}", "Triton cannot lower it for NVIDIA")
            if mode == RTZ and not (s_name == "fp32" and d_name == "fp8e5"):
                raise unsupported(
                    "cast with fp_downcast_rounding='rtz'",
                    f"{s_name} -> {d_name}",
                    "Triton 3.9 cannot lower it for sm90; only fp32 -> fp8e5 has rtz",
                )
        if POLICY:
            return make_handle(round_to(vals, d_name, mode, c.fp8_overflow), d_name, dst)
        return TensorHandle(encode(vals, d_name, mode, c.fp8_overflow), dst)
    if POLICY:
        if d_name == "fp64" or not rounds("cast"):
            return make_handle(np.asarray(src.data).astype(np.float64), d_name, dst)
        return make_handle(round_to(ints_to_values(src.data, d_name), d_name, RNE, c.fp8_overflow), d_name, dst)
    vals = ints_to_values(src.data, d_name)
    return TensorHandle(encode(vals, d_name, RNE, c.fp8_overflow), dst)


def cast_impl(self, src, dst_type):
    """fp_trunc/fp_ext/si_to_fp/ui_to_fp/fp_to_si/fp_to_ui (and int casts): round to nearest even."""
    stock = stock_method(ti.InterpreterBuilder, "cast_impl")
    return _convert(self, src, dst_type, RNE, lambda: stock(self, src, dst_type))


def create_fp_to_fp(self, src, dst_type, rounding_mode):
    """fp8 casts and explicit rounding modes: RTZ -> toward zero, RTNE/None -> nearest even."""
    mode = RTZ if rounding_mode == ir.ROUNDING_MODE.RTZ else RNE
    stock = stock_method(ti.InterpreterBuilder, "create_fp_to_fp")
    return _convert(self, src, dst_type, mode, lambda: stock(self, src, dst_type, rounding_mode))


def _const(value, name: str, dtype):
    """A Python float materialized as a ``name`` constant during a site run: site op ``const``; the exact mode
    keeps the Python value. The policy learns whether the rounding changed the value (it never depends on the
    data, so a constant that rounds exactly once does so in every run)."""
    v = np.array([value], dtype=np.float64)
    r = round_to(v, name, RNE, "ieee")
    site = find_site("const")
    inexact = not np.array_equal(r, v, equal_nan=True)
    keep = POLICY[-1].visit(site, inexact=inexact)
    return TensorHandle(r if keep else v, dtype)


def get_bf16(self, value):
    """bf16 constants: the Python float rounded once to bf16 (stock: via fp32, truncated)."""
    if POLICY:
        return _const(value, "bf16", tl.bfloat16)
    return TensorHandle(encode(np.array([value], dtype=np.float64), "bf16", RNE, "ieee"), tl.bfloat16)


def get_fp16(self, value):
    if POLICY:
        return _const(value, "fp16", tl.float16)
    return stock_method(ti.InterpreterBuilder, "get_fp16")(self, value)


def get_fp32(self, value):
    if POLICY:
        return _const(value, "fp32", tl.float32)
    return stock_method(ti.InterpreterBuilder, "get_fp32")(self, value)


def get_fp64(self, value):
    if POLICY:
        return TensorHandle(np.array([value], dtype=np.float64), tl.float64)
    return stock_method(ti.InterpreterBuilder, "get_fp64")(self, value)


def get_null_value(self, type):
    if POLICY and not isinstance(type, tl.pointer_type) and getattr(type, "scalar", type).is_floating():
        return TensorHandle(np.zeros(1, dtype=np.float64), type)
    return stock_method(ti.InterpreterBuilder, "get_null_value")(self, type)


def convert_float_guard(input, input_dtype, output_dtype, rounding_mode):
    """Replaces the stock ``_convert_float`` while faithful() is active: any path that still reaches it is one
    this module does not cover."""
    raise unsupported(f"stock conversion _convert_float({input_dtype} -> {output_dtype})", str(input_dtype))
