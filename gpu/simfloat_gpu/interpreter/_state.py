"""The shared state of :func:`simfloat_gpu.interpreter.faithful`'s replacements: the configuration stack,
the saved stock methods, the site policy and its float64 carriers, and the helpers every op module uses (the
float type of a handle, handles of the format or carriers, the kernel line executing now).

Every function here replaces one method of ``triton.runtime.interpreter.InterpreterBuilder`` (``self`` is the
builder), ``ReduceOps`` or ``ScanOps``. They read the active configuration from :data:`STACK` (the innermost
``faithful()`` block) and fall back to the saved stock method (:data:`STOCK`) only for non-floating data
(integers, booleans, pointers), whose stock numerics are exact. A floating-point operation without a model
raises ``NotImplementedError`` naming the operation and the dtype.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import triton
import triton.language as tl
from triton.runtime import interpreter as ti

from simfloat.formats import FloatFormat
from simfloat_gpu.interpreter._formats import FORMATS, UNSUPPORTED, FaithfulNotImplementedError, to_storage

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
SKIP_DIRS = (os.path.dirname(os.path.abspath(triton.__file__)), os.path.dirname(os.path.abspath(__file__)))
F64 = "float64"

#: log2(e) as Triton's NVIDIA lowering of tl.exp materializes it: an fp32 constant
LOG2E_F32 = np.float32(1.4426950408889634)
_F32_TINY = np.float32(2.0**-126)


def cfg():
    return STACK[-1]


def stock_method(owner, name):
    return STOCK[(owner, name)]


def unsupported(what: str, dtype: str, why: str = "") -> NotImplementedError:
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
        raise unsupported("any arithmetic", name, UNSUPPORTED.get(name, "unknown float type"))
    return name


def fmt_of(name: str) -> FloatFormat:
    return FORMATS[name]


def make_handle(values, name: str, dtype) -> TensorHandle:
    scalar = dtype.scalar if hasattr(dtype, "scalar") else dtype
    if POLICY:
        return TensorHandle(np.asarray(values, dtype=np.float64), scalar)
    return TensorHandle(to_storage(values, name), scalar)


def storage(values, name: str) -> np.ndarray:
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
        if not os.path.abspath(f.f_code.co_filename).startswith(SKIP_DIRS):
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


def wide_guard(what: str, *handles) -> None:
    if POLICY and any(ftype(h) is not None for h in handles if h is not None):
        raise FaithfulNotImplementedError(
            f"faithful(): {what} on floats is not supported in a per-site attribution run (simfloat_gpu."
            "interpreter.lines): its float64 carriers cannot go through it"
        )


def check_model_output(out, like: np.ndarray, what: str) -> np.ndarray:
    if not isinstance(out, np.ndarray) or out.dtype != np.float32 or out.shape != like.shape:
        got = f"{type(out).__name__} {getattr(out, 'dtype', '')} {getattr(out, 'shape', '')}".strip()
        raise TypeError(f"faithful(): the {what} model must return a float32 ndarray of shape {like.shape}, got {got}")
    return out


def flush_subnormals(x: np.ndarray) -> np.ndarray:
    """Subnormal fp32 values -> zero of the same sign (what .ftz does to inputs and outputs)."""
    out_dtype = np.float64 if x.dtype == np.float64 else np.float32
    return np.where(np.abs(x) < _F32_TINY, np.copysign(np.float32(0.0), x), x).astype(out_dtype)
