"""The float64 carriers of a per-site run (:mod:`simfloat_gpu.interpreter.lines`): memory with its exact
shadow, splats, the storage check, bitcasts, and the stock methods that cannot take carriers."""

from __future__ import annotations

import numpy as np
import triton.language as tl
from triton.runtime import interpreter as ti

from simfloat_gpu.interpreter._formats import FORMATS, RNE, UNSUPPORTED, FaithfulNotImplementedError, decode, encode
from simfloat_gpu.interpreter._state import POLICY, SHADOW, TensorHandle, ftype, stock_method, unsupported, wide_guard


def validate_np_data_size(np_array, tl_dtype):
    """TensorHandle's storage check, letting float64 carriers through during a site run."""
    if POLICY and np_array.dtype == np.float64 and not isinstance(tl_dtype, tl.pointer_type):
        if getattr(tl_dtype, "scalar", tl_dtype).is_floating():
            return True
    return stock_method(ti, "_validate_np_data_size")(np_array, tl_dtype)


def create_splat(self, ret_ty, arg):
    if POLICY and ftype(arg) is not None:
        v = np.asarray(decode(arg.data, ftype(arg)), dtype=np.float64).reshape(-1)[0]
        return TensorHandle(np.full(ret_ty.shape, v, dtype=np.float64), arg.dtype.scalar)
    return stock_method(ti.InterpreterBuilder, "create_splat")(self, ret_ty, arg)


def create_unsplat(self, arg):
    if POLICY and ftype(arg) is not None:
        v = np.asarray(decode(arg.data, ftype(arg)), dtype=np.float64).reshape(-1)[0]
        return TensorHandle(np.full((1,), v, dtype=np.float64), arg.dtype.scalar)
    return stock_method(ti.InterpreterBuilder, "create_unsplat")(self, arg)


def to_tensor(self, ret, dtype):
    """ReduceOps/ScanOps results: float64 carriers stay float64 during a site run."""
    scalar = getattr(dtype, "scalar", dtype)
    if POLICY and isinstance(ret, np.ndarray) and ret.dtype == np.float64 and scalar.is_floating():
        if ret.shape:
            return tl.core.tensor(TensorHandle(ret, scalar), tl.block_type(scalar, list(ret.shape)))
        return tl.core.tensor(TensorHandle(ret.reshape(1), scalar), scalar)
    return stock_method(ti.ReduceScanOpInterface, "to_tensor")(self, ret, dtype)


def create_bitcast(self, src, dst_type):
    if POLICY and (ftype(src) is not None or getattr(dst_type, "scalar", dst_type).is_floating()):
        wide_guard("bitcast", src)
        if not isinstance(dst_type, tl.pointer_type) and getattr(dst_type, "scalar", dst_type).is_floating():
            raise FaithfulNotImplementedError(
                "faithful(): bitcast to a float type is not supported in a per-site attribution run"
            )
    return stock_method(ti.InterpreterBuilder, "create_bitcast")(self, src, dst_type)


def create_masked_load(self, ptrs, mask, other, *rest, **kw):
    """Loads of floats during a site run: the memory's values as float64 carriers, the exact values the kernel
    stored earlier in this run (:data:`SHADOW`) in place of their rounded copies."""
    stock = stock_method(ti.InterpreterBuilder, "create_masked_load")
    elem = ptrs.get_element_ty()
    if not POLICY or not elem.is_floating():
        return stock(self, ptrs, mask, other, *rest, **kw)
    name = elem.name
    if name not in FORMATS:
        raise unsupported("load", name, UNSUPPORTED.get(name, "unknown float type"))
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
    stock = stock_method(ti.InterpreterBuilder, "create_masked_store")
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


def guarded(name: str, what: str, any_dtype: bool):
    """A stock method that cannot take float64 carriers: raises during a site run (``any_dtype``: whatever the
    operands, as for tensor descriptors, whose element type the handles do not show)."""

    def method(self, *args, **kwargs):
        if POLICY:
            if any_dtype:
                raise FaithfulNotImplementedError(
                    f"faithful(): {what} is not supported in a per-site attribution run (simfloat_gpu.interpreter."
                    "lines): its float64 carriers cannot go through it"
                )
            wide_guard(what, *[a for a in args if isinstance(a, TensorHandle)])
        return stock_method(ti.InterpreterBuilder, name)(self, *args, **kwargs)

    method.__name__ = name
    return method
