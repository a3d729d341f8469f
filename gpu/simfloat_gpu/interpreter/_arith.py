"""Elementwise float arithmetic of the Triton interpreter: add/sub/mul (rounded once, or contracted to an
fma), division, remainder, negation, fma, comparisons, the generic binary/unary/ternary ops."""

from __future__ import annotations

import numpy as np
import triton.language as tl
from triton.runtime import interpreter as ti

import simfloat.ops as sops
from simfloat_gpu.interpreter._formats import FP8, RNE, decode, round_to
from simfloat_gpu.interpreter._fusion import PRODUCT, call_chain, carry_product, contracting, fused_operands
from simfloat_gpu.interpreter._state import (
    F64,
    POLICY,
    TensorHandle,
    cfg,
    check_model_output,
    fmt_of,
    ftype,
    kernel_frame,
    make_handle,
    rounds,
    stock_method,
    unsupported,
)

_ROUNDED = {"add": sops.add, "sub": sops.sub, "mul": sops.mul}


def rounded_binary(op: str):
    """fadd/fsub/fmul: the exact result rounded once into the operands' format (add.f32, add.bf16, ...); with
    contraction, an add/sub of a product of the same basic block is one fma (fma.rn), rounded once."""
    fn = _ROUNDED[op]

    def method(self, lhs, rhs):
        name = ftype(lhs)
        if name is None:
            return stock_method(ti.InterpreterBuilder, f"create_f{op}")(self, lhs, rhs)
        if op != "mul" and contracting():
            fused = fused_operands(op, lhs, rhs, name)
            if fused is not None:
                fmt = fmt_of(name) if rounds("fma") else F64
                return make_handle(sops.fma(*fused, fmt), name, lhs.dtype)
        fmt = fmt_of(name) if rounds(op) else F64
        a, b = decode(lhs.data, name), decode(rhs.data, name)
        out = make_handle(fn(a, b, fmt), name, lhs.dtype)
        if op == "mul" and contracting():
            a, b = np.broadcast_arrays(a, b)
            setattr(out, PRODUCT, (a, b, call_chain(kernel_frame())))
        return out

    method.__name__ = f"create_f{op}"
    return method


def _div32(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """fp32 ``/`` (NVIDIA: div.full.f32) under the configured ``div`` model."""
    model = cfg().div
    if model == "correctly_rounded":
        return sops.div(a, b, "float32")
    a, b = np.broadcast_arrays(a.astype(np.float32), b.astype(np.float32))
    return check_model_output(model(np.array(a), np.array(b)), a, "div")


def create_fdiv(self, lhs, rhs):
    """``x / y``. fp32: the ``div`` model (div.full.f32 on the GPU); fp16/bf16: the fp32 quotient rounded to
    the format (cvt.f32 -> div.full.f32 -> cvt.rn); fp64: correctly rounded (div.rn.f64)."""
    name = ftype(lhs)
    if name is None:
        return stock_method(ti.InterpreterBuilder, "create_fdiv")(self, lhs, rhs)
    a, b = decode(lhs.data, name), decode(rhs.data, name)
    if name == "fp64" or not rounds("div"):
        r = sops.div(a, b, "float64")
    elif name == "fp32":
        r = _div32(a, b)
    elif name in ("fp16", "bf16"):
        r = round_to(_div32(a, b), name, RNE, cfg().fp8_overflow)
    else:
        raise unsupported("division", name)
    return make_handle(r, name, lhs.dtype)


def create_precise_divf(self, lhs, rhs):
    """``tl.math.div_rn`` / ``fdiv(ieee_rounding=True)``: correctly rounded (div.rn)."""
    name = ftype(lhs)
    if name is None:
        return stock_method(ti.InterpreterBuilder, "create_precise_divf")(self, lhs, rhs)
    fmt = fmt_of(name) if rounds("div_rn") else F64
    return make_handle(sops.div(decode(lhs.data, name), decode(rhs.data, name), fmt), name, lhs.dtype)


def create_approx_divf(self, lhs, rhs):
    raise unsupported("tl.math.fdiv(approx=True)", str(ftype(lhs) or lhs.dtype), "div.approx.f32")


def create_frem(self, lhs, rhs):
    """``x % y`` on floats: fmod, which is exact."""
    name = ftype(lhs)
    if name is None:
        return stock_method(ti.InterpreterBuilder, "create_frem")(self, lhs, rhs)
    a, b = decode(lhs.data, name), decode(rhs.data, name)
    with np.errstate(invalid="ignore"):
        r = np.fmod(a, b)
    return make_handle(r, name, lhs.dtype)


def _negate(data: np.ndarray, name: str) -> np.ndarray:
    if data.dtype == np.float64:
        return np.negative(data)
    if name == "bf16":
        return data ^ np.uint16(0x8000)
    if name in FP8:
        return data ^ np.uint8(0x80)
    return np.negative(data)


def create_fneg(self, arg):
    name = ftype(arg)
    if name is None:
        return stock_method(ti.InterpreterBuilder, "create_fneg")(self, arg)
    out = TensorHandle(_negate(arg.data, name), arg.dtype.scalar)
    carry_product(arg, out, lambda a, b: (np.negative(a), b))
    return out


def create_expand_dims(self, arg, axis):
    out = stock_method(ti.InterpreterBuilder, "create_expand_dims")(self, arg, axis)
    carry_product(arg, out, lambda a, b: (np.expand_dims(a, axis), np.expand_dims(b, axis)))
    return out


def create_broadcast(self, arg, shape):
    out = stock_method(ti.InterpreterBuilder, "create_broadcast")(self, arg, shape)
    carry_product(arg, out, lambda a, b: (np.broadcast_to(a, out.data.shape), np.broadcast_to(b, out.data.shape)))
    return out


def create_fma(self, x, y, z):
    """``tl.fma``: one rounding of the exact ``x*y + z`` into the format (fma.rn.f32/.f16/.bf16/.f64)."""
    name = ftype(z)
    if name is None:
        return stock_method(ti.InterpreterBuilder, "create_fma")(self, x, y, z)
    fmt = fmt_of(name) if rounds("fma") else F64
    r = sops.fma(decode(x.data, name), decode(y.data, name), decode(z.data, name), fmt)
    return make_handle(r, name, z.dtype)


# comparisons: ordered ones are false when either operand is NaN, unordered ones true
def _fcmp(op, ordered: bool):
    def method(self, lhs, rhs):
        name = ftype(lhs)
        if name is None:
            return stock_method(ti.InterpreterBuilder, "binary_op")(self, lhs, rhs, op)
        a, b = decode(lhs.data, name), decode(rhs.data, name)
        r = op(a, b)
        unordered = np.isnan(a) | np.isnan(b)
        r = (r & ~unordered) if ordered else (r | unordered)
        return TensorHandle(np.asarray(r, dtype=np.bool_), tl.int1)

    return method


_CMP_OPS = {
    "LT": np.less,
    "GT": np.greater,
    "LE": np.less_equal,
    "GE": np.greater_equal,
    "EQ": np.equal,
    "NE": np.not_equal,
}
FCMP = {f"create_fcmp{o}{k}": _fcmp(op, o == "O") for k, op in _CMP_OPS.items() for o in ("O", "U")}

_EXACT_BINARY = (np.minimum, np.maximum, np.fmin, np.fmax)
_GENERIC_ROUNDED = {np.add: sops.add, np.subtract: sops.sub, np.multiply: sops.mul}


def binary_op(self, lhs, rhs, op):
    """Generic binary op: exact min/max (NaN rules of the ufunc) and comparisons on decoded values; integer
    operands go to the stock method; anything else on floats raises."""
    name = ftype(lhs)
    if name is None:
        return stock_method(ti.InterpreterBuilder, "binary_op")(self, lhs, rhs, op)
    a, b = decode(lhs.data, name), decode(rhs.data, name)
    if any(op is o for o in _EXACT_BINARY):
        return make_handle(op(a, b), name, lhs.dtype)
    if any(op is o for o in _CMP_OPS.values()):
        r = op(a, b)
        if op is np.not_equal:
            r = r & ~(np.isnan(a) | np.isnan(b))
        return TensorHandle(np.asarray(r, dtype=np.bool_), tl.int1)
    for uf, fn in _GENERIC_ROUNDED.items():
        if op is uf:
            fmt = fmt_of(name) if rounds(fn.__name__) else F64
            return make_handle(fn(a, b, fmt), name, lhs.dtype)
    raise unsupported(f"elementwise {getattr(op, '__name__', op)}", name)


def unary_op(self, arg, op):
    """Generic unary op: negation, floor/ceil/trunc (exact); integers -> stock; other float ops raise."""
    name = ftype(arg)
    if name is None:
        return stock_method(ti.InterpreterBuilder, "unary_op")(self, arg, op)
    if op is np.negative:
        return TensorHandle(_negate(arg.data, name), arg.dtype.scalar)
    if op is np.abs:
        return make_handle(np.abs(decode(arg.data, name)), name, arg.dtype)
    if any(op is o for o in (np.floor, np.ceil, np.trunc)):
        return make_handle(op(decode(arg.data, name)), name, arg.dtype)
    raise unsupported(f"elementwise {getattr(op, '__name__', op)}", name)


def ternary_op(self, lhs, rhs, other, op):
    """``where`` moves bits (stock); ``clip`` (tl.clamp) compares decoded values; integers -> stock."""
    name = ftype(other)
    if op is np.where and name is not None and POLICY:  # both branches as float64 carriers
        r = np.where(lhs.data, decode(rhs.data, name), decode(other.data, name))
        return make_handle(r, name, other.dtype)
    if op is np.where or name is None:
        return stock_method(ti.InterpreterBuilder, "ternary_op")(self, lhs, rhs, other, op)
    if op is np.clip:
        r = np.clip(decode(lhs.data, name), decode(rhs.data, name), decode(other.data, name))
        return make_handle(r, name, other.dtype)
    raise unsupported(f"elementwise {getattr(op, '__name__', op)}", name)


def create_floor(self, arg):
    return unary_op(self, arg, np.floor)


def create_ceil(self, arg):
    return unary_op(self, arg, np.ceil)


def create_fabs(self, arg):
    """``tl.abs`` on floats: the stock method masks the sign bit of the storage; carriers need ``np.abs``."""
    if POLICY and ftype(arg) is not None:
        return unary_op(self, arg, np.abs)
    return stock_method(ti.InterpreterBuilder, "create_fabs")(self, arg)
