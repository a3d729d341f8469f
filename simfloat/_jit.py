"""The one numba decorator every kernel uses, and the few LLVM intrinsics numba does not expose.

``fastmath`` is never enabled: it lets LLVM contract ``a*b + c`` into an FMA and reassociate sums, which would make
the emulator silently compute something other than what it claims. Results are cached on disk so the test suite and
the CLI do not recompile on every start. numba keys a cached function by its own source file only, not by the
helpers compiled into it, so a changed helper would leave stale machine code in use: at import, the caches of this
package are deleted whenever any of its source files differs from when they were written.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast, get_type_hints

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba._dispatcher import compute_fingerprint
from numba.core import cgutils
from numba.core.types.function_type import WrapperAddressProtocol
from numba.extending import intrinsic, typeof_impl

from simfloat import _compiling

__all__ = [
    "Kernel",
    "kernel",
    "fingerprint",
    "type_of",
    "jit",
    "kjit",
    "ljit",
    "pjit",
    "f64_bits",
    "bits_f64",
    "f32_bits",
    "bits_f32",
    "fma64",
    "fma32",
]


# A source file can hold compiled code only if it names a decorator or an intrinsic; the others (the CLI, the
# sweep, attribution, the torch bridge, ...) are pure Python that no jitted function reads, so editing them leaves
# every cached machine code valid.
_COMPILED = re.compile(rb"\b(?:jit|ljit|pjit|njit|intrinsic)\b")


def _drop_stale_caches(root: Path | None = None, cache_dir: str | None = None) -> None:
    """Delete the numba cache files of ``root`` (this package by default) when a source file under it that can
    hold compiled code changed since they were written: those in its ``__pycache__`` folders and, where a
    ``NUMBA_CACHE_DIR`` is set (``cache_dir``; numba's by default), those numba keeps there for its folders."""
    if root is None:
        root = Path(__file__).resolve().parent
    if cache_dir is None:
        cache_dir = getattr(numba.config, "CACHE_DIR", "")
    h = hashlib.sha256(numba.__version__.encode())
    folders = set()
    for p in sorted(root.rglob("*.py")):
        text = p.read_bytes()
        if _COMPILED.search(text):
            h.update(p.relative_to(root).as_posix().encode() + b"\0" + text)
            folders.add(p.parent)
    digest = h.hexdigest()
    _drop_if_changed(root / "__pycache__" / "numba-sources.sha256", digest, [root])
    if cache_dir:  # numba's folder for a source folder d there: "<d's name>_<sha1 of d's absolute path>"
        base = Path(cache_dir)
        keyed = [base / f"{d.name}_{hashlib.sha1(str(d.resolve()).encode()).hexdigest()}" for d in sorted(folders)]
        key = hashlib.sha1(str(root.resolve()).encode()).hexdigest()[:16]
        _drop_if_changed(base / f"numba-sources-{root.name}-{key}.sha256", digest, keyed)


def _drop_if_changed(stamp: Path, digest: str, folders: list[Path]) -> None:
    """Delete the cache files under ``folders`` unless ``stamp`` holds ``digest``; then write it there."""
    try:
        if stamp.exists() and stamp.read_text() == digest:
            return
        for d in folders:
            for f in list(d.rglob("*.nbi")) + list(d.rglob("*.nbc")):
                f.unlink(missing_ok=True)
        stamp.parent.mkdir(parents=True, exist_ok=True)
        tmp = stamp.with_name(f"{stamp.name}.{os.getpid()}")
        tmp.write_text(digest)
        os.replace(tmp, stamp)  # atomic: a process starting at the same moment never reads half a stamp
    except OSError:  # a read-only installation: numba then caches elsewhere, or not at all
        pass


_drop_stale_caches()
_compiling.install()  # the notice on the first compilation, and the compile clock of the progress bars


def _memoize_inlined_ir() -> None:
    """Let numba build a helper's IR once for all the call sites that inline it.

    numba inlines an ``inline="always"`` function (``ljit``) by running its front end (bytecode to IR, the untyped
    passes, its own inlining of nested helpers) again at every call site, then copying the result; the copy is all
    the call site needs, since numba mutates only the copy. Keyed by the function, the caller's flags and locals,
    the IR is now built once per process and copied per site: the same IR, so the same machine code, for less
    compiling (measured in docs/results/cold-start.md). numba compiles under one lock, so the memo needs none. A
    numba whose inliner has another shape is left as it is.
    """
    try:
        from numba.core.inline_closurecall import InlineWorker
    except ImportError:  # pragma: no cover - another numba layout: keep numba's own inliner
        return
    if getattr(InlineWorker, "_simfloat_memo", False) or not hasattr(InlineWorker, "inline_function"):
        return
    built: dict[tuple[Any, ...], Any] = {}

    def inline_function(self: Any, caller_ir: Any, block: Any, i: int, function: Any, arg_typs: Any = None) -> Any:
        self.flags.enable_ssa = False  # as numba's run_untyped_passes leaves the caller's flags, hit or miss
        key = (function, type(self.pipeline), repr(self.flags), repr(sorted(self.locals.items())))
        callee_ir = built.get(key)
        if callee_ir is None:
            callee_ir = built[key] = self.run_untyped_passes(function)
        # inline_ir copies callee_ir before it changes anything, so the memoized IR stays as built
        return self.inline_ir(caller_ir, block, i, callee_ir, function.__code__.co_freevars, arg_typs=arg_typs)

    worker: Any = InlineWorker
    worker.inline_function = inline_function
    worker._simfloat_memo = True


_memoize_inlined_ir()

# Scalar workers and serial drivers.
jit = numba.njit(cache=True, fastmath=False, nogil=True, error_model="numpy")
# Small branch-free helpers inlined into the caller's loops (numba IR inlining), so LLVM can vectorize the loop.
ljit = numba.njit(cache=True, fastmath=False, nogil=True, error_model="numpy", inline="always")
# Kernels called only through a Kernel value (a pointer) from compiled code: no CPython wrapper, whose unboxing of
# the loop's records costs seconds of compiling per function. Not callable from Python (numba would crash).
kjit = cast(Any, numba.njit)(cache=True, fastmath=False, nogil=True, error_model="numpy", no_cpython_wrapper=True)
# Drivers that loop over independent elements or rows with prange.
pjit = numba.njit(cache=True, fastmath=False, nogil=True, error_model="numpy", parallel=True)


class Kernel(WrapperAddressProtocol):
    """A compiled function as a value of numba's first-class function type, for callers that pick one of several
    kernels of one signature at run time (the forms of a dot: block FMA, sequential, float64 loops).

    A caller that takes a Kernel is compiled once for every kernel of that signature, and the kernel it calls is
    compiled (or loaded from the cache) only when a Kernel of it is first passed: a plan compiles the forms it
    uses, and the callers' machine code never holds the callees' (numba would otherwise link and optimize the
    whole callee tree again into every caller). The call goes through a pointer, and the callee increments and
    decrements the count of every array of the records it is passed (numba's reference counting, atomic): for
    kernels that do a tile's work per call, not for per-row or per-element helpers.

    Args:
        fn: a :data:`jit` function. sig: its numba signature, with the argument types exactly as the callers
            pass them (an array's layout, dtype and mutability included).
    """

    def __init__(self, fn: Any, sig: Any) -> None:
        self.fn, self.sig = fn, sig
        self._addr: int | None = None

    def __wrapper_address__(self) -> int:
        if self._addr is None:
            cres = self.fn.get_compile_result(self.sig)
            self._addr = int(cres.library.get_pointer_to_function(cres.fndesc.llvm_cfunc_wrapper_name))
        return self._addr

    def signature(self) -> Any:
        return self.sig

    def __reduce__(self) -> tuple[Any, ...]:  # the address is this process's: another one looks it up anew
        return (Kernel, (self.fn, self.sig))

    def __repr__(self) -> str:
        return f"Kernel({self.fn.py_func.__qualname__})"


@typeof_impl.register(Kernel)
def _typeof_kernel(val: Kernel, c: Any) -> Any:
    """A Kernel's numba type, made once (numba's own typeof of a first-class function builds it per call, which
    the dispatcher does for every call taking one: milliseconds per flash call)."""
    t = val.__dict__.get("_type")
    if t is None:
        t = val.__dict__["_type"] = types.FunctionType(val.sig)
    return t


_KERNELS: dict[tuple[int, Any], Kernel] = {}
_TYPES: dict[tuple[type, bytes], Any] = {}


def fingerprint(x: Any) -> tuple[type, bytes] | None:
    """A key of ``x``'s numba type, cheap to compute (numba's dispatcher's own: records of arrays and numbers
    in microseconds, where :func:`numba.typeof` takes milliseconds); None for a value it does not cover."""
    try:
        return type(x), compute_fingerprint(x)
    except (TypeError, ValueError, NotImplementedError):
        return None


def type_of(x: Any) -> Any:
    """:func:`numba.typeof` of ``x``, remembered per :func:`fingerprint`."""
    key = fingerprint(x)
    if key is None:
        return numba.typeof(x)
    t = _TYPES.get(key)
    if t is None:
        t = _TYPES[key] = numba.typeof(x)
    return t


def kernel(fn: Any, sig: Any) -> Kernel:
    """The :class:`Kernel` of ``fn`` for ``sig``, one per process (its address looked up once)."""
    key = (id(fn), sig)
    k = _KERNELS.get(key)
    if k is None:
        k = _KERNELS[key] = Kernel(fn, sig)
    return k


_DTYPES: dict[tuple[type, tuple[str, ...]], np.dtype] = {}
_LEAVES = {bool: np.bool_, int: np.int64, float: np.float64}


def record_dtype(cls: type, skip: tuple[str, ...] = ()) -> np.dtype:
    """The numpy structured dtype of a NamedTuple class, from its declared field types: ``bool``, ``int``
    (int64), ``float`` (float64) and NamedTuples of those (nested records); ``skip``: top-level fields left out.

    Raises:
        TypeError: a field (not skipped) of another type.
    """
    key = (cls, skip)
    dt = _DTYPES.get(key)
    if dt is None:
        fields: list[tuple[str, Any]] = []
        for name, t in get_type_hints(cls).items():
            if name in skip:
                continue
            if isinstance(t, type) and issubclass(t, tuple) and hasattr(t, "_fields"):
                fields.append((name, record_dtype(t)))
            elif t in _LEAVES:
                fields.append((name, _LEAVES[t]))
            else:
                raise TypeError(f"{cls.__name__}.{name} is declared {t!r}: a record holds bool, int, float, records")
        dt = _DTYPES[key] = np.dtype(fields, align=True)
    return dt


def record_of(nt: Any, skip: tuple[str, ...] = ()) -> Any:
    """A NamedTuple of numbers (nested NamedTuples allowed) as a numpy structured record with the same field names
    and the declared field types (:func:`record_dtype`).

    Compiled code reads its fields as it reads the tuple's (``r.a.b``), but numba passes a record to a function
    as one pointer, where it passes a tuple as every one of its numbers: a kernel taking a plan's few hundred
    parameters compiles in a fraction of the time. Nothing writes the record. Python reads a field as
    ``r["a"]["b"]`` (a ``numpy.void``: a ``numpy.record``'s attribute access costs microseconds a field, and
    numba's dispatcher types it more slowly). ``skip``: top-level fields left out (arrays, which a record cannot
    hold; the caller passes them apart)."""
    a = np.zeros(1, dtype=record_dtype(type(nt), skip))  # zeros: the padding bytes too, so equal tuples, equal bytes
    a[0] = tuple(v for n, v in zip(nt._fields, nt, strict=True) if n not in skip) if skip else nt
    return a[0]


@intrinsic
def _f64_bits(typingctx, x):
    """The IEEE-754 bit pattern of a float64 as uint64 (a register bitcast, no memory round trip)."""
    if x != types.float64:
        return None
    sig = types.uint64(types.float64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return sig, codegen


@intrinsic
def _bits_f64(typingctx, b):
    """The float64 whose IEEE-754 bit pattern is the uint64 ``b``."""
    if b != types.uint64:
        return None
    sig = types.float64(types.uint64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return sig, codegen


@intrinsic
def _fma64(typingctx, a, b, c):
    """``a*b + c`` with a single rounding (llvm.fma is always fused: hardware FMA or a correctly rounded libm call)."""
    if not (a == types.float64 and b == types.float64 and c == types.float64):
        return None
    sig = types.float64(types.float64, types.float64, types.float64)

    def codegen(context, builder, signature, args):
        dbl = ir.DoubleType()
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(dbl, [dbl, dbl, dbl]), "llvm.fma.f64")
        return builder.call(fn, args)

    return sig, codegen


@intrinsic
def _fma32(typingctx, a, b, c):
    """float32 ``a*b + c`` with a single rounding (llvm.fma.f32)."""
    if not (a == types.float32 and b == types.float32 and c == types.float32):
        return None
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        flt = ir.FloatType()
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(flt, [flt, flt, flt]), "llvm.fma.f32")
        return builder.call(fn, args)

    return sig, codegen


@intrinsic
def _f32_bits(typingctx, x):
    """The IEEE-754 bit pattern of a float32 as int32."""
    if x != types.float32:
        return None
    sig = types.int32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


@intrinsic
def _bits_f32(typingctx, b):
    """The float32 whose IEEE-754 bit pattern is the int32 ``b``."""
    if b != types.int32:
        return None
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


# The intrinsics under the signatures their callers see (numba's ``@intrinsic`` objects declare the typing
# context as a parameter, which a static checker would otherwise demand at every call).
f64_bits = cast(Callable[[Any], Any], _f64_bits)
bits_f64 = cast(Callable[[Any], Any], _bits_f64)
fma64 = cast(Callable[[Any, Any, Any], Any], _fma64)
fma32 = cast(Callable[[Any, Any, Any], Any], _fma32)
f32_bits = cast(Callable[[Any], Any], _f32_bits)
bits_f32 = cast(Callable[[Any], Any], _bits_f32)
