"""The replacements :func:`simfloat_gpu.interpreter.faithful` installs into triton's interpreter (imports triton).

Every function here replaces one method of ``triton.runtime.interpreter.InterpreterBuilder`` (``self`` is the
builder), ``ReduceOps`` or ``ScanOps``. They read the active configuration from :data:`STACK` (the innermost
``faithful()`` block) and fall back to the saved stock method (:data:`STOCK`) only for non-floating data
(integers, booleans, pointers), whose stock numerics are exact. A floating-point operation without a model
raises ``NotImplementedError`` naming the operation and the dtype.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import triton.language as tl
from triton._C.libtriton import ir
from triton.runtime import interpreter as ti

import simfloat
import simfloat.ops as sops
from simfloat.accumulate import BlockFMA, Chunked, Sequential, matmul
from simfloat.formats import FloatFormat
from simfloat.formats import format as sformat
from simfloat_gpu.interpreter._formats import (
    FORMATS,
    FP8,
    RNE,
    RTZ,
    UNSUPPORTED,
    FaithfulNotImplementedError,
    decode,
    encode,
    fraction_to_f32,
    ints_to_values,
    round_to,
    to_storage,
    values_to_ints,
)

TensorHandle = ti.TensorHandle

#: active configurations, innermost last (managed by simfloat_gpu.interpreter)
STACK: list = []
#: stock attributes saved at installation: (owner, name) -> original
STOCK: dict = {}

#: log2(e) as Triton's NVIDIA lowering of tl.exp materializes it: an fp32 constant
LOG2E_F32 = np.float32(1.4426950408889634)
_F32_TINY = np.float32(2.0**-126)
_FP8_INSTR_K = 32  # k of one fp8 wgmma instruction (m64nNk32)


def cfg():
    return STACK[-1]


def _stock(owner, name):
    return STOCK[(owner, name)]


def _unsupported(what: str, dtype: str, why: str = "") -> NotImplementedError:
    msg = f"faithful(): {what} on {dtype} has no model in simfloat_gpu.interpreter"
    return FaithfulNotImplementedError(msg + (f" ({why})" if why else ""))


def ftype(handle) -> str | None:
    """The triton name of a handle's floating-point dtype, or None for integers, booleans and pointers."""
    dt = handle.dtype
    if isinstance(dt, tl.pointer_type):
        return None
    dt = getattr(dt, "scalar", dt)
    if not dt.is_floating():
        return None
    if handle.data.dtype == np.bool_:
        return None  # a comparison result labelled with its operands' dtype by the stock builder
    name = dt.name
    if name not in FORMATS:
        raise _unsupported("any arithmetic", name, UNSUPPORTED.get(name, "unknown float type"))
    return name


def _fmt(name: str) -> FloatFormat:
    return FORMATS[name]


def _handle(values, name: str, dtype) -> TensorHandle:
    return TensorHandle(to_storage(values, name), dtype.scalar if hasattr(dtype, "scalar") else dtype)


def _check_model_output(out, like: np.ndarray, what: str) -> np.ndarray:
    if not isinstance(out, np.ndarray) or out.dtype != np.float32 or out.shape != like.shape:
        got = f"{type(out).__name__} {getattr(out, 'dtype', '')} {getattr(out, 'shape', '')}".strip()
        raise TypeError(f"faithful(): the {what} model must return a float32 ndarray of shape {like.shape}, got {got}")
    return out


def _flush(x: np.ndarray) -> np.ndarray:
    """Subnormal fp32 values -> zero of the same sign (what .ftz does to inputs and outputs)."""
    return np.where(np.abs(x) < _F32_TINY, np.copysign(np.float32(0.0), x), x).astype(np.float32)


# ----------------------------------------------------------------------------------------------------
# elementwise arithmetic
# ----------------------------------------------------------------------------------------------------

_ROUNDED = {"add": sops.add, "sub": sops.sub, "mul": sops.mul}


def _rounded_binary(op: str):
    """fadd/fsub/fmul: the exact result rounded once into the operands' format (add.f32, add.bf16, ...)."""
    fn = _ROUNDED[op]

    def method(self, lhs, rhs):
        name = ftype(lhs)
        if name is None:
            return _stock(ti.InterpreterBuilder, f"create_f{op}")(self, lhs, rhs)
        r = fn(decode(lhs.data, name), decode(rhs.data, name), _fmt(name))
        return _handle(r, name, lhs.dtype)

    method.__name__ = f"create_f{op}"
    return method


def _div32(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """fp32 ``/`` (NVIDIA: div.full.f32) under the configured ``div`` model."""
    model = cfg().div
    if model == "correctly_rounded":
        return sops.div(a, b, "float32")
    a, b = np.broadcast_arrays(a.astype(np.float32), b.astype(np.float32))
    return _check_model_output(model(np.array(a), np.array(b)), a, "div")


def create_fdiv(self, lhs, rhs):
    """``x / y``. fp32: the ``div`` model (div.full.f32 on the GPU); fp16/bf16: the fp32 quotient rounded to
    the format (cvt.f32 -> div.full.f32 -> cvt.rn); fp64: correctly rounded (div.rn.f64)."""
    name = ftype(lhs)
    if name is None:
        return _stock(ti.InterpreterBuilder, "create_fdiv")(self, lhs, rhs)
    a, b = decode(lhs.data, name), decode(rhs.data, name)
    if name == "fp64":
        r = sops.div(a, b, "float64")
    elif name == "fp32":
        r = _div32(a, b)
    elif name in ("fp16", "bf16"):
        r = round_to(_div32(a, b), name, RNE, cfg().fp8_overflow)
    else:
        raise _unsupported("division", name)
    return _handle(r, name, lhs.dtype)


def create_precise_divf(self, lhs, rhs):
    """``tl.math.div_rn`` / ``fdiv(ieee_rounding=True)``: correctly rounded (div.rn)."""
    name = ftype(lhs)
    if name is None:
        return _stock(ti.InterpreterBuilder, "create_precise_divf")(self, lhs, rhs)
    return _handle(sops.div(decode(lhs.data, name), decode(rhs.data, name), _fmt(name)), name, lhs.dtype)


def create_approx_divf(self, lhs, rhs):
    raise _unsupported("tl.math.fdiv(approx=True)", str(ftype(lhs) or lhs.dtype), "div.approx.f32")


def create_frem(self, lhs, rhs):
    """``x % y`` on floats: fmod, which is exact."""
    name = ftype(lhs)
    if name is None:
        return _stock(ti.InterpreterBuilder, "create_frem")(self, lhs, rhs)
    a, b = decode(lhs.data, name), decode(rhs.data, name)
    with np.errstate(invalid="ignore"):
        r = np.fmod(a, b)
    return _handle(r, name, lhs.dtype)


def _negate(data: np.ndarray, name: str) -> np.ndarray:
    if name == "bf16":
        return data ^ np.uint16(0x8000)
    if name in FP8:
        return data ^ np.uint8(0x80)
    return np.negative(data)


def create_fneg(self, arg):
    name = ftype(arg)
    if name is None:
        return _stock(ti.InterpreterBuilder, "create_fneg")(self, arg)
    return TensorHandle(_negate(arg.data, name), arg.dtype.scalar)


def create_fma(self, x, y, z):
    """``tl.fma``: one rounding of the exact ``x*y + z`` into the format (fma.rn.f32/.f16/.bf16/.f64)."""
    name = ftype(z)
    if name is None:
        return _stock(ti.InterpreterBuilder, "create_fma")(self, x, y, z)
    r = sops.fma(decode(x.data, name), decode(y.data, name), decode(z.data, name), _fmt(name))
    return _handle(r, name, z.dtype)


# comparisons: ordered ones are false when either operand is NaN, unordered ones true
def _fcmp(op, ordered: bool):
    def method(self, lhs, rhs):
        name = ftype(lhs)
        if name is None:
            return _stock(ti.InterpreterBuilder, "binary_op")(self, lhs, rhs, op)
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
        return _stock(ti.InterpreterBuilder, "binary_op")(self, lhs, rhs, op)
    a, b = decode(lhs.data, name), decode(rhs.data, name)
    if any(op is o for o in _EXACT_BINARY):
        return _handle(op(a, b), name, lhs.dtype)
    if any(op is o for o in _CMP_OPS.values()):
        r = op(a, b)
        if op is np.not_equal:
            r = r & ~(np.isnan(a) | np.isnan(b))
        return TensorHandle(np.asarray(r, dtype=np.bool_), tl.int1)
    for uf, fn in _GENERIC_ROUNDED.items():
        if op is uf:
            return _handle(fn(a, b, _fmt(name)), name, lhs.dtype)
    raise _unsupported(f"elementwise {getattr(op, '__name__', op)}", name)


def unary_op(self, arg, op):
    """Generic unary op: negation, floor/ceil/trunc (exact); integers -> stock; other float ops raise."""
    name = ftype(arg)
    if name is None:
        return _stock(ti.InterpreterBuilder, "unary_op")(self, arg, op)
    if op is np.negative:
        return TensorHandle(_negate(arg.data, name), arg.dtype.scalar)
    if any(op is o for o in (np.floor, np.ceil, np.trunc)):
        return _handle(op(decode(arg.data, name)), name, arg.dtype)
    raise _unsupported(f"elementwise {getattr(op, '__name__', op)}", name)


def ternary_op(self, lhs, rhs, other, op):
    """``where`` moves bits (stock); ``clip`` (tl.clamp) compares decoded values; integers -> stock."""
    name = ftype(other)
    if op is np.where or name is None:
        return _stock(ti.InterpreterBuilder, "ternary_op")(self, lhs, rhs, other, op)
    if op is np.clip:
        r = np.clip(decode(lhs.data, name), decode(rhs.data, name), decode(other.data, name))
        return _handle(r, name, other.dtype)
    raise _unsupported(f"elementwise {getattr(op, '__name__', op)}", name)


def create_floor(self, arg):
    return unary_op(self, arg, np.floor)


def create_ceil(self, arg):
    return unary_op(self, arg, np.ceil)


# ----------------------------------------------------------------------------------------------------
# transcendental functions and square roots
# ----------------------------------------------------------------------------------------------------


def _only_fp32(arg, what: str, why64: str) -> np.ndarray:
    name = ftype(arg)
    if name != "fp32":
        raise _unsupported(what, str(name or arg.dtype), why64 if name == "fp64" else "")
    return np.asarray(arg.data, dtype=np.float32)


def exp2_f32(x: np.ndarray, ftz: bool) -> np.ndarray:
    """The configured exp2 model on an fp32 array; ``ftz`` flushes subnormal inputs and outputs."""
    model = cfg().exp2
    if ftz:
        x = _flush(x)
    if model == "correctly_rounded":
        y = sops.exp2(x, "float32")
    else:
        y = _check_model_output(model(np.array(x, dtype=np.float32)), x, "exp2")
    return _flush(y) if ftz else y


def create_exp2(self, arg):
    """``tl.exp2`` / ``tl.math.exp2`` (fp32): NVIDIA lowers it to ``ex2.approx.ftz.f32``; computed by the
    ``exp2`` model, with flushing when ``ftz=True``."""
    x = _only_fp32(arg, "tl.exp2", "GPU: libdevice __nv_exp2")
    return TensorHandle(exp2_f32(x, cfg().ftz), arg.dtype.scalar)


def create_exp(self, arg):
    """``tl.exp`` (fp32): NVIDIA lowers it to ``ex2.approx.f32(mul.f32(x, 1.4426950f))`` -- the product is
    rounded to fp32 first, then the ``exp2`` model applies (no .ftz on this instruction)."""
    x = _only_fp32(arg, "tl.exp", "GPU: libdevice __nv_exp")
    t = sops.mul(x, LOG2E_F32, "float32")
    return TensorHandle(exp2_f32(t, False), arg.dtype.scalar)


def _log2_cr(x: np.ndarray) -> np.ndarray:
    """log2 of fp32 values correctly rounded to fp32: the float64 log2 decides unless it lies within 2**-48
    (relative) of a rounding boundary; then a double-double log (simfloat.ops.log_dd, 2**-100) decides."""
    x64 = x.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.log2(x64)
        w = np.abs(y) * 2.0**-48
        lo = simfloat.round(y - w, "float32")
        hi = simfloat.round(y + w, "float32")
    r = simfloat.round(y, "float32")
    for i in np.flatnonzero((lo != hi) & np.isfinite(y)):
        r.flat[i] = log2_near_boundary(float(x64.flat[i]))
    return r.astype(np.float32)


def log2_near_boundary(x: float) -> float:
    """log2 of a positive finite fp32 value rounded to fp32 from a double-double natural log (relative error
    below 2**-100; fp32 log2 values are never that close to a rounding boundary)."""
    h, lo_part = sops.log_dd(x)
    return fraction_to_f32((Fraction(h) + Fraction(lo_part)) / _LN2)


def _ln2_fraction(bits: int = 400) -> Fraction:
    one = 1 << bits
    return Fraction(sum(one // (k << k) for k in range(1, bits + 1)), one)  # ln 2 = sum 1/(k 2**k)


_LN2 = _ln2_fraction()


def _log_model(which: str, x: np.ndarray) -> np.ndarray:
    model = getattr(cfg(), which)
    if model == "correctly_rounded":
        return sops.log(x, "float32") if which == "log" else _log2_cr(x)
    return _check_model_output(model(np.array(x, dtype=np.float32)), x, which)


def create_log(self, arg):
    """``tl.log`` (fp32; GPU: libdevice __nv_logf, within 1 ulp): the ``log`` model."""
    x = _only_fp32(arg, "tl.log", "GPU: libdevice __nv_log")
    return TensorHandle(_log_model("log", x).astype(np.float32), arg.dtype.scalar)


def create_log2(self, arg):
    """``tl.log2`` (fp32; GPU: libdevice __nv_log2f): the ``log2`` model."""
    x = _only_fp32(arg, "tl.log2", "GPU: libdevice __nv_log2")
    return TensorHandle(_log_model("log2", x).astype(np.float32), arg.dtype.scalar)


def create_sqrt(self, arg):
    """``tl.sqrt``: fp32 -> the ``sqrt`` model (GPU: sqrt.approx.ftz.f32; flushing when ``ftz=True``);
    fp64 -> correctly rounded."""
    name = ftype(arg)
    if name == "fp64":
        return _handle(sops.sqrt(arg.data, "float64"), name, arg.dtype)
    x = _only_fp32(arg, "tl.sqrt", "")
    c = cfg()
    if c.ftz:
        x = _flush(x)
    if c.sqrt == "correctly_rounded":
        y = sops.sqrt(x, "float32")
    else:
        y = _check_model_output(c.sqrt(np.array(x)), x, "sqrt")
    return TensorHandle(_flush(y) if c.ftz else y.astype(np.float32), arg.dtype.scalar)


def create_precise_sqrt(self, arg):
    """``tl.sqrt_rn``: correctly rounded (sqrt.rn)."""
    name = ftype(arg)
    if name not in ("fp32", "fp64"):
        raise _unsupported("tl.sqrt_rn", str(name or arg.dtype))
    return _handle(sops.sqrt(arg.data, _fmt(name)), name, arg.dtype)


def _no_model(what: str, why: str):
    def method(self, arg):
        name = ftype(arg)
        raise _unsupported(what, str(name or arg.dtype), why)

    return method


create_rsqrt = _no_model("tl.rsqrt", "GPU: rsqrt.approx.ftz.f32")
create_sin = _no_model("tl.sin", "GPU: sin.approx / libdevice")
create_cos = _no_model("tl.cos", "GPU: cos.approx / libdevice")
create_erf = _no_model("tl.erf", "GPU: libdevice __nv_erff")


# ----------------------------------------------------------------------------------------------------
# casts
# ----------------------------------------------------------------------------------------------------


def _convert(self, src, dst, mode: str, stock):
    """Any cast touching a float type (see simfloat_gpu.interpreter's docstring for the table)."""
    dst = getattr(dst, "scalar", dst)
    s_name = ftype(src)
    d_float = dst.is_floating()
    if s_name is None and not d_float:
        return stock()
    d_name = dst.name if d_float else None
    if d_float and d_name not in FORMATS:
        raise _unsupported("cast", f"{src.dtype} -> {d_name}", UNSUPPORTED.get(d_name, ""))
    c = cfg()
    if s_name is not None:
        vals = decode(src.data, s_name)
        if not d_float:
            return TensorHandle(values_to_ints(vals, ti._get_np_dtype(dst)), dst)
        if d_name in FP8:
            if s_name == "fp64":
                raise _unsupported("cast", f"fp64 -> {d_name}", "Triton cannot lower it for NVIDIA")
            if mode == RTZ and not (s_name == "fp32" and d_name == "fp8e5"):
                raise _unsupported(
                    "cast with fp_downcast_rounding='rtz'",
                    f"{s_name} -> {d_name}",
                    "Triton 3.9 cannot lower it for sm90; only fp32 -> fp8e5 has rtz",
                )
        return TensorHandle(encode(vals, d_name, mode, c.fp8_overflow), dst)
    vals = ints_to_values(src.data, d_name)
    return TensorHandle(encode(vals, d_name, RNE, c.fp8_overflow), dst)


def cast_impl(self, src, dst_type):
    """fp_trunc/fp_ext/si_to_fp/ui_to_fp/fp_to_si/fp_to_ui (and int casts): round to nearest even."""
    stock = _stock(ti.InterpreterBuilder, "cast_impl")
    return _convert(self, src, dst_type, RNE, lambda: stock(self, src, dst_type))


def create_fp_to_fp(self, src, dst_type, rounding_mode):
    """fp8 casts and explicit rounding modes: RTZ -> toward zero, RTNE/None -> nearest even."""
    mode = RTZ if rounding_mode == ir.ROUNDING_MODE.RTZ else RNE
    stock = _stock(ti.InterpreterBuilder, "create_fp_to_fp")
    return _convert(self, src, dst_type, mode, lambda: stock(self, src, dst_type, rounding_mode))


def get_bf16(self, value):
    """bf16 constants: the Python float rounded once to bf16 (stock: via fp32, truncated)."""
    return TensorHandle(encode(np.array([value], dtype=np.float64), "bf16", RNE, "ieee"), tl.bfloat16)


# ----------------------------------------------------------------------------------------------------
# dot
# ----------------------------------------------------------------------------------------------------


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
            raise _unsupported("tl.dot", f"{a_name} x {b_name}", f"no fp8 tensor-core model for {cfg().arch}")
        n = int(max_num_imprecise_acc or 0)
        if n <= k and not isinstance(model, Chunked):
            # Triton's sm90 WGMMA lowering: the MMA accumulates into a zeroed partial sum for at least n
            # products (whole instructions of k=32), then adds it into the fp32 accumulator (add.f32)
            chunk = max(_FP8_INSTR_K, -(-n // _FP8_INSTR_K) * _FP8_INSTR_K)
            model = Chunked(chunk=min(chunk, k), inner=model, outer_fmt="float32", outer_mode=RNE)
        return "fp8", model
    if a_name != b_name:
        raise _unsupported("tl.dot", f"{a_name} x {b_name}")
    if a_name == "fp32":
        if input_precision == ir.INPUT_PRECISION.TF32:
            return "tf32", models["tf32"]
        if input_precision == ir.INPUT_PRECISION.IEEE:
            return "ieee", models["ieee"]
        raise _unsupported(f"tl.dot(input_precision={input_precision})", "fp32")
    if a_name in ("bf16", "fp16", "fp64"):
        return a_name, models[a_name]
    raise _unsupported("tl.dot", f"{a_name} x {b_name}")


def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    """tl.dot: ``d`` enters the accumulation model as its incoming accumulator; int8 x int8 -> exact int32."""
    a_name, b_name = ftype(a), ftype(b)
    if a_name is None or b_name is None:
        if a.data.dtype == np.int8 and b.data.dtype == np.int8:
            exact = np.matmul(a.data.astype(np.int64), b.data.astype(np.int64)) + d.data.astype(np.int64)
            wrapped = ((exact + 2**31) % 2**32) - 2**31  # the MMA's int32 accumulator wraps
            return TensorHandle(wrapped.astype(np.int32), d.dtype.scalar)
        raise _unsupported("tl.dot", f"{a.dtype} x {b.dtype}")
    d_name = ftype(d)
    key, model = _dot_model(a_name, b_name, input_precision, max_num_imprecise_acc, a.data.shape[-1])
    if d_name is None or not _fits(acc_format(model), _fmt(d_name)):
        raise _unsupported(
            "tl.dot",
            f"{a_name} x {b_name} -> {d_name}",
            f"the {key!r} model accumulates in {acc_format(model).name}; pass dot={{{key!r}: "
            f"<model with a {d_name} accumulator>}}",
        )
    a64 = decode(a.data, a_name).astype(np.float64)
    b64 = decode(b.data, b_name).astype(np.float64)
    c64 = np.broadcast_to(decode(d.data, d_name).astype(np.float64), a64.shape[:-1] + b64.shape[-1:])
    r = matmul(a64, b64, np.ascontiguousarray(c64), acc=model)
    return _handle(r, d_name, d.dtype)


def create_dot_scaled(self, *args, **kwargs):
    raise _unsupported("tl.dot_scaled", "mx formats", "no block-scaled MMA model")


def create_atomic_rmw(self, rmw_op, ptr, val, *args, **kwargs):
    name = ftype(val)
    if name is not None and name not in ("fp32", "fp64"):
        raise _unsupported(f"atomic {rmw_op}", name)
    return _stock(ti.InterpreterBuilder, "create_atomic_rmw")(self, rmw_op, ptr, val, *args, **kwargs)


# ----------------------------------------------------------------------------------------------------
# reductions and scans
# ----------------------------------------------------------------------------------------------------


def reduce_sum(self, input):
    """tl.sum / tl.reduce(..., _sum_combine) on floats: simfloat.ops.sum in the configured order."""
    name = ftype(input.handle)
    if name is None:
        return _stock(ti.ReduceOps, "sum")(self, input)
    c = cfg()
    vals = decode(input.handle.data, name)
    if c.reduce_order not in sops.ORDERS:  # a hardware rule (simfloat.profiles.tl_sum): fp32 only
        if name != "fp32" or self.axis is None or vals.ndim == 0:
            raise _unsupported(
                "tl.sum", name, f"reduce_order={c.reduce_order!r} is an fp32 rule over one axis of a tile"
            )
        from simfloat.profiles import tl_sum

        moved = np.moveaxis(vals, self.axis, -1)
        flat = tl_sum(moved.reshape(-1, moved.shape[-1]), c.reduce_order, c.reduce_warps_n)
        r = np.asarray(flat, dtype=np.float64).reshape(moved.shape[:-1])
    else:
        r = np.asarray(
            sops.sum(
                vals, _fmt(name), axis=self.axis, order=c.reduce_order, fan_in=c.reduce_fan_in, chunk=c.reduce_chunk
            )
        )
    if self.keep_dims:
        r = np.expand_dims(r, self.axis) if self.axis is not None else r.reshape((1,) * vals.ndim)
    return self.to_tensor(to_storage(r, name), input.dtype)


def reduce_min_max(self, input, val_reduce_op, idx_reduce_op=None):
    """tl.max/min/argmax/argmin: exact; bf16/fp8 are decoded first (stock compares their bit patterns)."""
    t = input[0] if isinstance(input, tuple) else input
    name = ftype(t.handle)
    if name not in ("bf16",) + FP8:
        return _stock(ti.ReduceOps, "min_max")(self, input, val_reduce_op, idx_reduce_op)
    vals = decode(t.handle.data, name)
    out = []
    if val_reduce_op:
        val = val_reduce_op(vals, axis=self.axis, keepdims=self.keep_dims)
        out.append(self.to_tensor(to_storage(val, name), t.dtype))
    if idx_reduce_op:
        out.append(self.to_tensor(idx_reduce_op(vals, axis=self.axis, keepdims=self.keep_dims), tl.int32))
    return tuple(out) if len(out) == 2 else out[0]


def _needs_sequential(what: str, tensors) -> None:
    names = [ftype(t.handle) for t in tensors]
    floats = [n for n in names if n is not None]
    if floats and cfg().reduce_order != "sequential":
        raise _unsupported(
            what,
            floats[0],
            f"only the sequential order is modelled; faithful(reduce_order={cfg().reduce_order!r}) asks for another",
        )


def generic_reduce(self, input):
    """Custom combine functions: the stock left fold, whose arithmetic goes through the patched builder."""
    _needs_sequential("tl.reduce with a custom combine_fn", input)
    return _stock(ti.ReduceOps, "generic_reduce")(self, input)


def _scan(self, input, fn, what):
    name = ftype(input.handle)
    if name is None:
        return None
    _needs_sequential(what, [input])
    vals = np.moveaxis(decode(input.handle.data, name), self.axis, -1)
    out = np.empty(vals.shape, dtype=vals.dtype)
    if vals.shape[-1]:
        out[..., 0] = vals[..., 0]
    for j in range(1, vals.shape[-1]):
        out[..., j] = fn(out[..., j - 1], vals[..., j], _fmt(name))
    return [self.to_tensor(to_storage(np.moveaxis(out, -1, self.axis), name), input.dtype)]


def scan_cumsum(self, input):
    r = _scan(self, input, sops.add, "tl.cumsum")
    return r if r is not None else _stock(ti.ScanOps, "cumsum")(self, input)


def scan_cumprod(self, input):
    r = _scan(self, input, sops.mul, "tl.cumprod")
    return r if r is not None else _stock(ti.ScanOps, "cumprod")(self, input)


def generic_scan(self, input):
    _needs_sequential("tl.associative_scan with a custom combine_fn", input)
    return _stock(ti.ScanOps, "generic_scan")(self, input)


def convert_float_guard(input, input_dtype, output_dtype, rounding_mode):
    """Replaces the stock ``_convert_float`` while faithful() is active: any path that still reaches it is one
    this module does not cover."""
    raise _unsupported(f"stock conversion _convert_float({input_dtype} -> {output_dtype})", str(input_dtype))


# ----------------------------------------------------------------------------------------------------
# the patch table
# ----------------------------------------------------------------------------------------------------

_BUILDER = {
    "binary_op": binary_op,
    "unary_op": unary_op,
    "ternary_op": ternary_op,
    "create_fadd": _rounded_binary("add"),
    "create_fsub": _rounded_binary("sub"),
    "create_fmul": _rounded_binary("mul"),
    "create_fdiv": create_fdiv,
    "create_precise_divf": create_precise_divf,
    "create_approx_divf": create_approx_divf,
    "create_frem": create_frem,
    "create_fneg": create_fneg,
    "create_fma": create_fma,
    "create_floor": create_floor,
    "create_ceil": create_ceil,
    "create_exp": create_exp,
    "create_exp2": create_exp2,
    "create_log": create_log,
    "create_log2": create_log2,
    "create_sqrt": create_sqrt,
    "create_precise_sqrt": create_precise_sqrt,
    "create_rsqrt": create_rsqrt,
    "create_sin": create_sin,
    "create_cos": create_cos,
    "create_erf": create_erf,
    "cast_impl": cast_impl,
    "create_fp_to_fp": create_fp_to_fp,
    "get_bf16": get_bf16,
    "create_dot": create_dot,
    "create_dot_scaled": create_dot_scaled,
    "create_atomic_rmw": create_atomic_rmw,
    **FCMP,
}


def patch_table() -> list[tuple[object, str, object]]:
    """(owner, attribute, replacement) for every attribute present in the installed triton."""
    table = [(ti.InterpreterBuilder, name, fn) for name, fn in _BUILDER.items() if name in vars(ti.InterpreterBuilder)]
    table += [
        (ti.ReduceOps, "sum", reduce_sum),
        (ti.ReduceOps, "min_max", reduce_min_max),
        (ti.ReduceOps, "generic_reduce", generic_reduce),
        (ti.ScanOps, "cumsum", scan_cumsum),
        (ti.ScanOps, "cumprod", scan_cumprod),
        (ti.ScanOps, "generic_scan", generic_scan),
        (ti, "_convert_float", convert_float_guard),
    ]
    return [(owner, name, fn) for owner, name, fn in table if hasattr(owner, name)]
