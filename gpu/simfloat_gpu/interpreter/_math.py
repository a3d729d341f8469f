"""Transcendental functions and square roots of the Triton interpreter (fp32 models: exp2, exp, log, log2,
sqrt; the functions without a model raise)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

import simfloat
import simfloat.ops as sops
from simfloat_gpu.interpreter._formats import decode, fraction_to_f32
from simfloat_gpu.interpreter._state import (
    F64,
    cfg,
    check_model_output,
    flush_subnormals,
    fmt_of,
    ftype,
    make_handle,
    rounds,
    unsupported,
)

#: log2(e) as Triton's NVIDIA lowering of tl.exp materializes it: an fp32 constant
LOG2E_F32 = np.float32(1.4426950408889634)


def _only_fp32(arg, what: str, why64: str) -> np.ndarray:
    name = ftype(arg)
    if name != "fp32":
        raise unsupported(what, str(name or arg.dtype), why64 if name == "fp64" else "")
    if arg.data.dtype == np.float64:  # a carrier of a site run: the exact value, possibly not an fp32
        return arg.data
    return np.asarray(arg.data, dtype=np.float32)


def exp2_f32(x: np.ndarray, ftz: bool) -> np.ndarray:
    """The configured exp2 model on an fp32 array; ``ftz`` flushes subnormal inputs and outputs."""
    model = cfg().exp2
    if ftz:
        x = flush_subnormals(x)
    if model == "correctly_rounded":
        y = sops.exp2(x, "float32")
    else:
        y = check_model_output(model(np.array(x, dtype=np.float32)), x, "exp2")
    return flush_subnormals(y) if ftz else y


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
        return make_handle(_libm(math.exp2, x), "fp32", arg.dtype)
    return make_handle(exp2_f32(x, cfg().ftz), "fp32", arg.dtype)


def create_exp(self, arg):
    """``tl.exp`` (fp32): NVIDIA lowers it to ``ex2.approx.f32(mul.f32(x, 1.4426950f))`` -- the product is
    rounded to fp32 first, then the ``exp2`` model applies (no .ftz on this instruction)."""
    x = _only_fp32(arg, "tl.exp", "GPU: libdevice __nv_exp")
    if not rounds("exp"):
        return make_handle(_libm(math.exp, x), "fp32", arg.dtype)
    t = sops.mul(x, LOG2E_F32, "float32")
    return make_handle(exp2_f32(t, False), "fp32", arg.dtype)


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
    return check_model_output(model(np.array(x, dtype=np.float32)), x, which)


def _log_op(which: str, exact, libdevice: str):
    """``tl.log`` / ``tl.log2`` (fp32; GPU: libdevice ``__nv_logf`` within 1 ulp / ``__nv_log2f``): the ``log`` /
    ``log2`` model; ``exact``: the float64 function of a site run's exact mode."""

    def method(self, arg):
        x = _only_fp32(arg, f"tl.{which}", f"GPU: libdevice {libdevice}")
        if not rounds(which):
            with np.errstate(divide="ignore", invalid="ignore"):
                return make_handle(exact(x.astype(np.float64)), "fp32", arg.dtype)
        return make_handle(_log_model(which, x).astype(np.float32), "fp32", arg.dtype)

    method.__name__ = f"create_{which}"
    return method


create_log = _log_op("log", np.log, "__nv_log")
create_log2 = _log_op("log2", np.log2, "__nv_log2")


def create_sqrt(self, arg):
    """``tl.sqrt``: fp32 -> the ``sqrt`` model (GPU: sqrt.approx.ftz.f32; flushing when ``ftz=True``);
    fp64 -> correctly rounded."""
    name = ftype(arg)
    if name == "fp64":
        return make_handle(sops.sqrt(arg.data, "float64"), name, arg.dtype)
    x = _only_fp32(arg, "tl.sqrt", "")
    if not rounds("sqrt"):
        return make_handle(sops.sqrt(x.astype(np.float64), "float64"), name, arg.dtype)
    c = cfg()
    if c.ftz:
        x = flush_subnormals(x)
    if c.sqrt == "correctly_rounded":
        y = sops.sqrt(x, "float32")
    else:
        y = check_model_output(c.sqrt(np.array(x)), x, "sqrt")
    return make_handle(flush_subnormals(y) if c.ftz else y.astype(np.float32), "fp32", arg.dtype)


def create_precise_sqrt(self, arg):
    """``tl.sqrt_rn``: correctly rounded (sqrt.rn)."""
    name = ftype(arg)
    if name not in ("fp32", "fp64"):
        raise unsupported("tl.sqrt_rn", str(name or arg.dtype))
    fmt = fmt_of(name) if rounds("sqrt_rn") else F64
    return make_handle(sops.sqrt(decode(arg.data, name), fmt), name, arg.dtype)


def _no_model(what: str, why: str):
    def method(self, arg):
        name = ftype(arg)
        raise unsupported(what, str(name or arg.dtype), why)

    return method


create_rsqrt = _no_model("tl.rsqrt", "GPU: rsqrt.approx.ftz.f32")
create_sin = _no_model("tl.sin", "GPU: sin.approx / libdevice")
create_cos = _no_model("tl.cos", "GPU: cos.approx / libdevice")
create_erf = _no_model("tl.erf", "GPU: libdevice __nv_erff")
