"""The replacements :func:`simfloat_gpu.interpreter.faithful` installs into triton's interpreter (imports triton).

Every function here replaces one method of ``triton.runtime.interpreter.InterpreterBuilder`` (``self`` is the
builder), ``ReduceOps`` or ``ScanOps``. They read the active configuration from :data:`STACK` (the innermost
``faithful()`` block) and fall back to the saved stock method (:data:`STOCK`) only for non-floating data
(integers, booleans, pointers), whose stock numerics are exact. A floating-point operation without a model
raises ``NotImplementedError`` naming the operation and the dtype.
"""

from __future__ import annotations

import ast
import linecache
import math
import os
import sys
from fractions import Fraction

import numpy as np
import triton
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
#: the active site policy of :mod:`simfloat_gpu.interpreter.lines` (None: no site run). While set, every float
#: handle carries float64 values ("carriers") instead of its storage, and each float op asks the policy whether
#: its site rounds as the hardware does or computes exactly (float64).
POLICY: list = []
#: float64 values stored by the kernel during a site run: byte address -> exact value (the narrow memory holds
#: the value rounded to nearest; loads read this first)
SHADOW: dict = {}
#: the ``enable_fp_fusion`` keyword of the launches in progress (None: not given), innermost last
LAUNCH_FUSION: list = []
_SKIP_DIRS = (os.path.dirname(os.path.abspath(triton.__file__)), os.path.dirname(os.path.abspath(__file__)))
_F64 = "float64"

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
    scalar = dtype.scalar if hasattr(dtype, "scalar") else dtype
    if POLICY:
        return TensorHandle(np.asarray(values, dtype=np.float64), scalar)
    return TensorHandle(to_storage(values, name), scalar)


def _store(values, name: str) -> np.ndarray:
    """Storage of ``values`` (float64 carriers during a site run)."""
    return np.asarray(values, dtype=np.float64) if POLICY else to_storage(values, name)


# ----------------------------------------------------------------------------------------------------
# sites (simfloat_gpu.interpreter.lines)
# ----------------------------------------------------------------------------------------------------


def kernel_frame():
    """The frame of the kernel source line executing now: the innermost frame outside triton and this package
    (the interpreter runs the kernel's Python body), or None."""
    f = sys._getframe(1)
    while f is not None:
        if not os.path.abspath(f.f_code.co_filename).startswith(_SKIP_DIRS):
            return f
        f = f.f_back
    return None


def find_site(op: str) -> tuple[str, int, str]:
    """(file, line, op) of the kernel source line executing now (see :func:`kernel_frame`)."""
    f = kernel_frame()
    if f is None:
        return ("<unknown>", 0, op)
    return (f.f_code.co_filename, f.f_lineno, op)


def rounds(op: str) -> bool:
    """Whether the float op ``op`` executing now rounds as the hardware does (always, outside a site run)."""
    if not POLICY:
        return True
    return bool(POLICY[-1].visit(find_site(op)))


def _wide_guard(what: str, *handles) -> None:
    if POLICY and any(ftype(h) is not None for h in handles if h is not None):
        raise FaithfulNotImplementedError(
            f"faithful(): {what} on floats is not supported in a per-site attribution run (simfloat_gpu."
            "interpreter.lines): its float64 carriers cannot go through it"
        )


def _check_model_output(out, like: np.ndarray, what: str) -> np.ndarray:
    if not isinstance(out, np.ndarray) or out.dtype != np.float32 or out.shape != like.shape:
        got = f"{type(out).__name__} {getattr(out, 'dtype', '')} {getattr(out, 'shape', '')}".strip()
        raise TypeError(f"faithful(): the {what} model must return a float32 ndarray of shape {like.shape}, got {got}")
    return out


def _flush(x: np.ndarray) -> np.ndarray:
    """Subnormal fp32 values -> zero of the same sign (what .ftz does to inputs and outputs)."""
    out_dtype = np.float64 if x.dtype == np.float64 else np.float32
    return np.where(np.abs(x) < _F32_TINY, np.copysign(np.float32(0.0), x), x).astype(out_dtype)


# ----------------------------------------------------------------------------------------------------
# elementwise arithmetic
# ----------------------------------------------------------------------------------------------------

_ROUNDED = {"add": sops.add, "sub": sops.sub, "mul": sops.mul}

# ----------------------------------------------------------------------------------------------------
# FMA contraction (fp fusion): a multiply's handle carries its exact operands; an add or subtract that
# consumes it in the same straight-line code computes fma(a, b, +-c) rounded once, as LLVM's NVPTX backend
# does with fp fusion on (every fadd/fsub whose operand is an fmul of the same basic block, whatever the
# fmul's other uses: NVPTX enables aggressive FMA fusion). Every other consumer reads the handle's data, the
# rounded product.
# ----------------------------------------------------------------------------------------------------

#: attribute of a multiply's TensorHandle: (a, b, origin), origin = the multiply's :func:`call_chain`
_PRODUCT = "_simfloat_product"
#: filename -> (source lines, ((first line, last line) of every for/while loop, ...) or None)
_LOOPS: dict = {}


def contracting() -> bool:
    """Whether the launch in progress contracts multiply-adds: ``faithful(contract=True/False)`` decides when
    given; otherwise the launch's ``enable_fp_fusion`` keyword, else Triton's default (``contract_default``)."""
    c = cfg()
    if c.contract is not None:
        return bool(c.contract)
    if LAUNCH_FUSION and LAUNCH_FUSION[-1] is not None:
        return bool(LAUNCH_FUSION[-1])
    return bool(c.contract_default)


def _loops(filename: str):
    """(first, last) lines of every ``for``/``while`` loop of a source file, or None if it cannot be read."""
    lines = linecache.getlines(filename)
    hit = _LOOPS.get(filename)
    if hit is not None and hit[0] is lines:
        return hit[1]
    loops = None
    if lines:
        try:
            tree = ast.parse("".join(lines))
        except (SyntaxError, ValueError):
            tree = None
        if tree is not None:
            kinds = (ast.For, ast.AsyncFor, ast.While)
            loops = tuple((n.lineno, n.end_lineno or n.lineno) for n in ast.walk(tree) if isinstance(n, kinds))
    _LOOPS[filename] = (lines, loops)
    return loops


def _innermost(loops, line: int):
    best = None
    for lo, hi in loops:
        if lo <= line <= hi and (best is None or lo > best[0]):
            best = (lo, hi)
    return best


def call_chain(frame) -> tuple:
    """((frame, line, instruction offset), ...) of the kernel frames from ``frame`` out to the launch: the
    kernel's line, the lines of the @jit helpers' calls (Triton inlines them: one function on the GPU). The
    frames themselves are kept (a finished helper's frame stays distinct from a later call's)."""
    chain = []
    f = frame
    while f is not None and f.f_code is not _GRID_CALL_CODE:
        if not os.path.abspath(f.f_code.co_filename).startswith(_SKIP_DIRS):
            chain.append((f, f.f_lineno, f.f_lasti))
        f = f.f_back
    return tuple(chain)


def _in_loop(code, line: int) -> bool:
    loops = _loops(code.co_filename)
    return loops is None or _innermost(loops, line) is not None


def same_block(origin: tuple, chain: tuple) -> bool:
    """Whether a multiply made at ``origin`` (its :func:`call_chain`) and an add executing at ``chain`` lie in one
    basic block of the compiled kernel, as far as the source shows. In the innermost function call both are in
    (helpers are inlined), at lines ``m`` and ``a`` (an op inside a helper counts at the helper's call): the add
    a later instruction than the multiply (not the same call made again), inside the same innermost loop, with
    no loop starting in between; inside a helper the op is in none of the helper's loops. ``if`` statements do
    not separate (Triton resolves constexpr conditions at compile time, LLVM turns small runtime ones into
    selects). Source that cannot be read (a kernel made by ``exec``): the same line only."""
    if not origin or not chain:
        return False
    # the innermost frame both chains share (frames compared from the launch inwards)
    k = 0
    while k < min(len(origin), len(chain)) and origin[-1 - k][0] is chain[-1 - k][0]:
        k += 1
    if k == 0:
        return False
    for f, line, _ in origin[: len(origin) - k] + chain[: len(chain) - k]:
        if _in_loop(f.f_code, line):
            return False
    frame, line_m, pos_m = origin[len(origin) - k]
    _, line_a, pos_a = chain[len(chain) - k]
    if pos_a <= pos_m:  # an earlier instruction, or the same call again: another iteration
        return False
    if line_a == line_m:
        return True
    code = frame.f_code
    loops = _loops(code.co_filename)
    if loops is None:
        return False
    if _innermost(loops, line_m) != _innermost(loops, line_a):
        return False
    return not any(line_m < lo <= line_a for lo, _ in loops)


def _fused_operands(op: str, lhs, rhs, name: str):
    """(a, b, c) of the fma an add/sub contracts to (``p - c`` -> fma(a, b, -c), ``c - p`` -> fma(-a, b, c);
    with two products the left one is fused, LLVM's choice when their use counts tie), or None."""
    chain = None
    for side, h in ((0, lhs), (1, rhs)):
        prod = getattr(h, _PRODUCT, None)
        if prod is None or h.dtype != lhs.dtype:
            continue
        if chain is None:
            chain = call_chain(kernel_frame())
        a, b, origin = prod
        if not same_block(origin, chain):
            continue
        c = decode((rhs if side == 0 else lhs).data, name)
        if op == "add":
            return a, b, c
        return (a, b, np.negative(c)) if side == 0 else (np.negative(a), b, c)
    return None


def _carry_product(src, out, transform) -> None:
    """A value-preserving op on a product (negation, expand_dims, broadcast: no instruction on the GPU, or one
    LLVM folds into the fma) passes its operands on, transformed."""
    prod = getattr(src, _PRODUCT, None)
    if prod is not None and out is not src:
        a, b, origin = prod
        setattr(out, _PRODUCT, (*transform(a, b), origin))


def _rounded_binary(op: str):
    """fadd/fsub/fmul: the exact result rounded once into the operands' format (add.f32, add.bf16, ...); with
    contraction, an add/sub of a product of the same basic block is one fma (fma.rn), rounded once."""
    fn = _ROUNDED[op]

    def method(self, lhs, rhs):
        name = ftype(lhs)
        if name is None:
            return _stock(ti.InterpreterBuilder, f"create_f{op}")(self, lhs, rhs)
        if op != "mul" and contracting():
            fused = _fused_operands(op, lhs, rhs, name)
            if fused is not None:
                fmt = _fmt(name) if rounds("fma") else _F64
                return _handle(sops.fma(*fused, fmt), name, lhs.dtype)
        fmt = _fmt(name) if rounds(op) else _F64
        a, b = decode(lhs.data, name), decode(rhs.data, name)
        out = _handle(fn(a, b, fmt), name, lhs.dtype)
        if op == "mul" and contracting():
            a, b = np.broadcast_arrays(a, b)
            setattr(out, _PRODUCT, (a, b, call_chain(kernel_frame())))
        return out

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
    if name == "fp64" or not rounds("div"):
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
    fmt = _fmt(name) if rounds("div_rn") else _F64
    return _handle(sops.div(decode(lhs.data, name), decode(rhs.data, name), fmt), name, lhs.dtype)


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
        return _stock(ti.InterpreterBuilder, "create_fneg")(self, arg)
    out = TensorHandle(_negate(arg.data, name), arg.dtype.scalar)
    _carry_product(arg, out, lambda a, b: (np.negative(a), b))
    return out


def create_expand_dims(self, arg, axis):
    out = _stock(ti.InterpreterBuilder, "create_expand_dims")(self, arg, axis)
    _carry_product(arg, out, lambda a, b: (np.expand_dims(a, axis), np.expand_dims(b, axis)))
    return out


def create_broadcast(self, arg, shape):
    out = _stock(ti.InterpreterBuilder, "create_broadcast")(self, arg, shape)
    _carry_product(arg, out, lambda a, b: (np.broadcast_to(a, out.data.shape), np.broadcast_to(b, out.data.shape)))
    return out


def create_fma(self, x, y, z):
    """``tl.fma``: one rounding of the exact ``x*y + z`` into the format (fma.rn.f32/.f16/.bf16/.f64)."""
    name = ftype(z)
    if name is None:
        return _stock(ti.InterpreterBuilder, "create_fma")(self, x, y, z)
    fmt = _fmt(name) if rounds("fma") else _F64
    r = sops.fma(decode(x.data, name), decode(y.data, name), decode(z.data, name), fmt)
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
            fmt = _fmt(name) if rounds(fn.__name__) else _F64
            return _handle(fn(a, b, fmt), name, lhs.dtype)
    raise _unsupported(f"elementwise {getattr(op, '__name__', op)}", name)


def unary_op(self, arg, op):
    """Generic unary op: negation, floor/ceil/trunc (exact); integers -> stock; other float ops raise."""
    name = ftype(arg)
    if name is None:
        return _stock(ti.InterpreterBuilder, "unary_op")(self, arg, op)
    if op is np.negative:
        return TensorHandle(_negate(arg.data, name), arg.dtype.scalar)
    if op is np.abs:
        return _handle(np.abs(decode(arg.data, name)), name, arg.dtype)
    if any(op is o for o in (np.floor, np.ceil, np.trunc)):
        return _handle(op(decode(arg.data, name)), name, arg.dtype)
    raise _unsupported(f"elementwise {getattr(op, '__name__', op)}", name)


def ternary_op(self, lhs, rhs, other, op):
    """``where`` moves bits (stock); ``clip`` (tl.clamp) compares decoded values; integers -> stock."""
    name = ftype(other)
    if op is np.where and name is not None and POLICY:  # both branches as float64 carriers
        r = np.where(lhs.data, decode(rhs.data, name), decode(other.data, name))
        return _handle(r, name, other.dtype)
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


def create_fabs(self, arg):
    """``tl.abs`` on floats: the stock method masks the sign bit of the storage; carriers need ``np.abs``."""
    if POLICY and ftype(arg) is not None:
        return unary_op(self, arg, np.abs)
    return _stock(ti.InterpreterBuilder, "create_fabs")(self, arg)


# ----------------------------------------------------------------------------------------------------
# transcendental functions and square roots
# ----------------------------------------------------------------------------------------------------


def _only_fp32(arg, what: str, why64: str) -> np.ndarray:
    name = ftype(arg)
    if name != "fp32":
        raise _unsupported(what, str(name or arg.dtype), why64 if name == "fp64" else "")
    if arg.data.dtype == np.float64:  # a carrier of a site run: the exact value, possibly not an fp32
        return arg.data
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


def _libm(fn, x: np.ndarray) -> np.ndarray:
    """``fn`` (a ``math`` function) on each float64 value: the exact mode's exp/exp2, as the emulator's float64
    plans compute them (libm, rounded once to float64)."""
    flat = np.asarray(x, dtype=np.float64).reshape(-1)
    out = np.empty(flat.shape)
    for i, v in enumerate(flat.tolist()):
        try:
            out[i] = fn(v)
        except OverflowError:
            out[i] = math.inf
    return out.reshape(np.shape(x))


def create_exp2(self, arg):
    """``tl.exp2`` / ``tl.math.exp2`` (fp32): NVIDIA lowers it to ``ex2.approx.ftz.f32``; computed by the
    ``exp2`` model, with flushing when ``ftz=True``."""
    x = _only_fp32(arg, "tl.exp2", "GPU: libdevice __nv_exp2")
    if not rounds("exp2"):
        return _handle(_libm(math.exp2, x), "fp32", arg.dtype)
    return _handle(exp2_f32(x, cfg().ftz), "fp32", arg.dtype)


def create_exp(self, arg):
    """``tl.exp`` (fp32): NVIDIA lowers it to ``ex2.approx.f32(mul.f32(x, 1.4426950f))`` -- the product is
    rounded to fp32 first, then the ``exp2`` model applies (no .ftz on this instruction)."""
    x = _only_fp32(arg, "tl.exp", "GPU: libdevice __nv_exp")
    if not rounds("exp"):
        return _handle(_libm(math.exp, x), "fp32", arg.dtype)
    t = sops.mul(x, LOG2E_F32, "float32")
    return _handle(exp2_f32(t, False), "fp32", arg.dtype)


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
    if not rounds("log"):
        with np.errstate(divide="ignore", invalid="ignore"):
            return _handle(np.log(x.astype(np.float64)), "fp32", arg.dtype)
    return _handle(_log_model("log", x).astype(np.float32), "fp32", arg.dtype)


def create_log2(self, arg):
    """``tl.log2`` (fp32; GPU: libdevice __nv_log2f): the ``log2`` model."""
    x = _only_fp32(arg, "tl.log2", "GPU: libdevice __nv_log2")
    if not rounds("log2"):
        with np.errstate(divide="ignore", invalid="ignore"):
            return _handle(np.log2(x.astype(np.float64)), "fp32", arg.dtype)
    return _handle(_log_model("log2", x).astype(np.float32), "fp32", arg.dtype)


def create_sqrt(self, arg):
    """``tl.sqrt``: fp32 -> the ``sqrt`` model (GPU: sqrt.approx.ftz.f32; flushing when ``ftz=True``);
    fp64 -> correctly rounded."""
    name = ftype(arg)
    if name == "fp64":
        return _handle(sops.sqrt(arg.data, "float64"), name, arg.dtype)
    x = _only_fp32(arg, "tl.sqrt", "")
    if not rounds("sqrt"):
        return _handle(sops.sqrt(x.astype(np.float64), "float64"), name, arg.dtype)
    c = cfg()
    if c.ftz:
        x = _flush(x)
    if c.sqrt == "correctly_rounded":
        y = sops.sqrt(x, "float32")
    else:
        y = _check_model_output(c.sqrt(np.array(x)), x, "sqrt")
    return _handle(_flush(y) if c.ftz else y.astype(np.float32), "fp32", arg.dtype)


def create_precise_sqrt(self, arg):
    """``tl.sqrt_rn``: correctly rounded (sqrt.rn)."""
    name = ftype(arg)
    if name not in ("fp32", "fp64"):
        raise _unsupported("tl.sqrt_rn", str(name or arg.dtype))
    fmt = _fmt(name) if rounds("sqrt_rn") else _F64
    return _handle(sops.sqrt(decode(arg.data, name), fmt), name, arg.dtype)


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
        if POLICY and d_name == "fp64":
            return _handle(vals, d_name, dst)  # exact in every mode
        if POLICY and not rounds("cast"):
            return _handle(vals, d_name, dst)  # the exact mode: a cast is the identity
        if d_name in FP8:
            if s_name == "fp64":
                raise _unsupported("cast", f"fp64 -> {d_name}", "Triton cannot lower it for NVIDIA")
            if mode == RTZ and not (s_name == "fp32" and d_name == "fp8e5"):
                raise _unsupported(
                    "cast with fp_downcast_rounding='rtz'",
                    f"{s_name} -> {d_name}",
                    "Triton 3.9 cannot lower it for sm90; only fp32 -> fp8e5 has rtz",
                )
        if POLICY:
            return _handle(round_to(vals, d_name, mode, c.fp8_overflow), d_name, dst)
        return TensorHandle(encode(vals, d_name, mode, c.fp8_overflow), dst)
    if POLICY:
        if d_name == "fp64" or not rounds("cast"):
            return _handle(np.asarray(src.data).astype(np.float64), d_name, dst)
        return _handle(round_to(ints_to_values(src.data, d_name), d_name, RNE, c.fp8_overflow), d_name, dst)
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
    return _stock(ti.InterpreterBuilder, "get_fp16")(self, value)


def get_fp32(self, value):
    if POLICY:
        return _const(value, "fp32", tl.float32)
    return _stock(ti.InterpreterBuilder, "get_fp32")(self, value)


def get_fp64(self, value):
    if POLICY:
        return TensorHandle(np.array([value], dtype=np.float64), tl.float64)
    return _stock(ti.InterpreterBuilder, "get_fp64")(self, value)


def get_null_value(self, type):
    if POLICY and not isinstance(type, tl.pointer_type) and getattr(type, "scalar", type).is_floating():
        return TensorHandle(np.zeros(1, dtype=np.float64), type)
    return _stock(ti.InterpreterBuilder, "get_null_value")(self, type)


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
    if POLICY and d_name is not None and not rounds("dot"):
        model = _EXACT_DOT  # the exact mode: float64 products, summed in k order in float64
    elif d_name is None or not _fits(acc_format(model), _fmt(d_name)):
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


#: the exact mode's tl.dot: products rounded to float64, summed in k order in float64 (the emulator's fp64 plan)
_EXACT_DOT = Sequential("float64", product_fmt="float64")


def create_dot_scaled(self, *args, **kwargs):
    raise _unsupported("tl.dot_scaled", "mx formats", "no block-scaled MMA model")


def create_atomic_rmw(self, rmw_op, ptr, val, *args, **kwargs):
    name = ftype(val)
    _wide_guard(f"atomic {rmw_op}", val)
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
    if not rounds("sum"):
        order = c.reduce_order if c.reduce_order in sops.ORDERS else "sequential"
        r = np.asarray(sops.sum(vals, _F64, axis=self.axis, order=order, fan_in=c.reduce_fan_in, chunk=c.reduce_chunk))
    elif POLICY and c.reduce_order == "sequential" and self.axis is not None and vals.shape[self.axis]:
        # a site run, carriers possibly not of the format: the first element rounded into the format, then
        # each exact addition of the next element rounded once (the emulator's sequential row sum; simfloat.ops.sum
        # would round every element as it is loaded). Identical to simfloat.ops.sum on values of the format, so
        # the all-sites run keeps the plain run's bits.
        moved = np.moveaxis(np.asarray(vals, dtype=np.float64), self.axis, -1)
        acc = np.asarray(round_to(moved[..., 0], name, RNE, "ieee"), dtype=np.float64)
        for j in range(1, moved.shape[-1]):
            acc = np.asarray(sops.add(acc, moved[..., j], _fmt(name)), dtype=np.float64)
        r = acc
    elif c.reduce_order not in sops.ORDERS:  # a hardware rule (simfloat.profiles.tl_sum): fp32 only
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
    return self.to_tensor(_store(r, name), input.dtype)


def reduce_min_max(self, input, val_reduce_op, idx_reduce_op=None):
    """tl.max/min/argmax/argmin: exact; bf16/fp8 are decoded first (stock compares their bit patterns)."""
    t = input[0] if isinstance(input, tuple) else input
    name = ftype(t.handle)
    if name not in ("bf16",) + FP8 and not (POLICY and name is not None):
        return _stock(ti.ReduceOps, "min_max")(self, input, val_reduce_op, idx_reduce_op)
    vals = decode(t.handle.data, name)
    out = []
    if val_reduce_op:
        val = val_reduce_op(vals, axis=self.axis, keepdims=self.keep_dims)
        out.append(self.to_tensor(_store(val, name), t.dtype))
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
    fmt = _fmt(name) if rounds(what.removeprefix("tl.")) else _F64
    if vals.shape[-1]:
        out[..., 0] = vals[..., 0]
    for j in range(1, vals.shape[-1]):
        out[..., j] = fn(out[..., j - 1], vals[..., j], fmt)
    return [self.to_tensor(_store(np.moveaxis(out, -1, self.axis), name), input.dtype)]


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
# float64 carriers of a site run: memory, splats, validation
# ----------------------------------------------------------------------------------------------------


def validate_np_data_size(np_array, tl_dtype):
    """TensorHandle's storage check, letting float64 carriers through during a site run."""
    if POLICY and np_array.dtype == np.float64 and not isinstance(tl_dtype, tl.pointer_type):
        if getattr(tl_dtype, "scalar", tl_dtype).is_floating():
            return True
    return _stock(ti, "_validate_np_data_size")(np_array, tl_dtype)


def create_splat(self, ret_ty, arg):
    if POLICY and ftype(arg) is not None:
        v = np.asarray(decode(arg.data, ftype(arg)), dtype=np.float64).reshape(-1)[0]
        return TensorHandle(np.full(ret_ty.shape, v, dtype=np.float64), arg.dtype.scalar)
    return _stock(ti.InterpreterBuilder, "create_splat")(self, ret_ty, arg)


def create_unsplat(self, arg):
    if POLICY and ftype(arg) is not None:
        v = np.asarray(decode(arg.data, ftype(arg)), dtype=np.float64).reshape(-1)[0]
        return TensorHandle(np.full((1,), v, dtype=np.float64), arg.dtype.scalar)
    return _stock(ti.InterpreterBuilder, "create_unsplat")(self, arg)


def to_tensor(self, ret, dtype):
    """ReduceOps/ScanOps results: float64 carriers stay float64 during a site run."""
    scalar = getattr(dtype, "scalar", dtype)
    if POLICY and isinstance(ret, np.ndarray) and ret.dtype == np.float64 and scalar.is_floating():
        if ret.shape:
            return tl.core.tensor(TensorHandle(ret, scalar), tl.block_type(scalar, list(ret.shape)))
        return tl.core.tensor(TensorHandle(ret.reshape(1), scalar), scalar)
    return _stock(ti.ReduceScanOpInterface, "to_tensor")(self, ret, dtype)


def create_bitcast(self, src, dst_type):
    if POLICY and (ftype(src) is not None or getattr(dst_type, "scalar", dst_type).is_floating()):
        _wide_guard("bitcast", src)
        if not isinstance(dst_type, tl.pointer_type) and getattr(dst_type, "scalar", dst_type).is_floating():
            raise FaithfulNotImplementedError(
                "faithful(): bitcast to a float type is not supported in a per-site attribution run"
            )
    return _stock(ti.InterpreterBuilder, "create_bitcast")(self, src, dst_type)


def create_masked_load(self, ptrs, mask, other, *rest, **kw):
    """Loads of floats during a site run: the memory's values as float64 carriers, the exact values the kernel
    stored earlier in this run (:data:`SHADOW`) in place of their rounded copies."""
    stock = _stock(ti.InterpreterBuilder, "create_masked_load")
    elem = ptrs.get_element_ty()
    if not POLICY or not elem.is_floating():
        return stock(self, ptrs, mask, other, *rest, **kw)
    name = elem.name
    if name not in FORMATS:
        raise _unsupported("load", name, UNSUPPORTED.get(name, "unknown float type"))
    raw = stock(self, ptrs, mask, None, *rest, **kw)
    vals = np.array(decode(raw.data, name), dtype=np.float64)
    m = np.broadcast_to(np.asarray(mask.data, dtype=bool), vals.shape)
    if SHADOW:
        addrs = np.broadcast_to(ptrs.data, vals.shape)
        for idx in zip(*np.nonzero(m), strict=True):
            a = int(addrs[idx])
            if a in SHADOW:
                vals[idx] = SHADOW[a]
    if other is not None:
        vals = np.where(m, vals, np.broadcast_to(decode(other.data, name), vals.shape))
    else:
        vals = np.where(m, vals, 0.0)
    return TensorHandle(vals, elem)


def create_masked_store(self, ptrs, value, mask, *rest, **kw):
    """Stores of floats during a site run: the memory gets the value rounded to nearest into the pointer's
    dtype (exact for values that already are of the format, as every value of the all-sites run is), and
    :data:`SHADOW` the exact value."""
    stock = _stock(ti.InterpreterBuilder, "create_masked_store")
    name = ftype(value)
    if not POLICY or name is None:
        return stock(self, ptrs, value, mask, *rest, **kw)
    vals = np.asarray(decode(value.data, name), dtype=np.float64)
    narrow = TensorHandle(encode(vals, name, RNE, "ieee"), value.dtype)
    out = stock(self, ptrs, narrow, mask, *rest, **kw)
    m = np.broadcast_to(np.asarray(mask.data, dtype=bool), np.shape(ptrs.data))
    addrs = np.broadcast_to(ptrs.data, m.shape)[m]
    SHADOW.update(zip(addrs.tolist(), np.broadcast_to(vals, m.shape)[m].tolist(), strict=True))
    return out


def grid_call(self, *args, **kwargs):
    """``GridExecutor.__call__`` (a launch): notes the launch's ``enable_fp_fusion`` keyword for
    :func:`contracting` (the stock interpreter drops it)."""
    fusion = kwargs.get("enable_fp_fusion")
    if fusion is not None and not isinstance(fusion, bool):
        raise TypeError(f"enable_fp_fusion must be a bool, got {type(fusion).__name__}")
    LAUNCH_FUSION.append(fusion)
    try:
        return _stock(ti.GridExecutor, "__call__")(self, *args, **kwargs)
    finally:
        LAUNCH_FUSION.pop()


def _guarded(name: str, what: str, any_dtype: bool):
    """A stock method that cannot take float64 carriers: raises during a site run (``any_dtype``: whatever the
    operands, as for tensor descriptors, whose element type the handles do not show)."""

    def method(self, *args, **kwargs):
        if POLICY:
            if any_dtype:
                raise FaithfulNotImplementedError(
                    f"faithful(): {what} is not supported in a per-site attribution run (simfloat_gpu.interpreter."
                    "lines): its float64 carriers cannot go through it"
                )
            _wide_guard(what, *[a for a in args if isinstance(a, TensorHandle)])
        return _stock(ti.InterpreterBuilder, name)(self, *args, **kwargs)

    method.__name__ = name
    return method


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
    "create_expand_dims": create_expand_dims,
    "create_broadcast": create_broadcast,
    "create_fma": create_fma,
    "create_floor": create_floor,
    "create_ceil": create_ceil,
    "create_fabs": create_fabs,
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
    "get_fp16": get_fp16,
    "get_fp32": get_fp32,
    "get_fp64": get_fp64,
    "get_null_value": get_null_value,
    "create_splat": create_splat,
    "create_unsplat": create_unsplat,
    "create_bitcast": create_bitcast,
    "create_masked_load": create_masked_load,
    "create_masked_store": create_masked_store,
    "create_dot": create_dot,
    "create_dot_scaled": create_dot_scaled,
    "create_atomic_rmw": create_atomic_rmw,
    **FCMP,
    **{
        n: _guarded(n, w, a)
        for n, w, a in (
            ("create_descriptor_load", "a tensor-descriptor load", True),
            ("create_descriptor_store", "a tensor-descriptor store", True),
            ("create_descriptor_gather", "a tensor-descriptor gather", True),
            ("create_descriptor_scatter", "a tensor-descriptor scatter", True),
            ("create_tensor_pointer_load", "a block-pointer load", True),
            ("create_tensor_pointer_store", "a block-pointer store", True),
            ("create_atomic_cas", "an atomic compare-and-swap", False),
            ("create_atomic_load", "an atomic load", False),
            ("create_atomic_store", "an atomic store", False),
        )
    },
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
        (ti.ReduceScanOpInterface, "to_tensor", to_tensor),
        (ti.GridExecutor, "__call__", grid_call),
        (ti, "_convert_float", convert_float_guard),
        (ti, "_validate_np_data_size", validate_np_data_size),
    ]
    return [(owner, name, fn) for owner, name, fn in table if hasattr(owner, name)]


_GRID_CALL_CODE = grid_call.__code__
