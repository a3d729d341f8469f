"""A faithful Triton interpreter: triton's CPU interpreter with simfloat's numerics in place of numpy's.

Running any Triton kernel faithfully on a CPU
---------------------------------------------
1. Set ``TRITON_INTERPRET=1`` before triton is first imported in the process (``export TRITON_INTERPRET=1``,
   or ``os.environ.setdefault("TRITON_INTERPRET", "1")`` at the very top of the script / ``conftest.py``):
   triton decorates its own ``tl.sum``, ``tl.max``, ... when it is imported.
2. Put the kernel's tensors on the CPU (``torch.float16/bfloat16/float32``, ``torch.float8_e4m3fn/e5m2``,
   integers) and launch it inside the context manager::

       from simfloat_gpu.interpreter import faithful, faithful_config
       with faithful():                                # or faithful(exp2=my_ex2_model, ftz=True, ...)
           kernel[grid](x, y, out, n, BLOCK=128)
           settings = faithful_config()                # what was used, JSON-friendly, for the record

   In pytest, use the ``faithful_interpreter`` fixture (``from simfloat_gpu.interpreter import faithful_interpreter``;
   keyword arguments through ``@pytest.mark.parametrize("faithful_interpreter", [{...}], indirect=True)``).
3. Nothing else changes: grids, masks, loads/stores, ``tl.where``, reshapes are the stock interpreter's (they
   move bits and are right). On exit (also on an exception) the stock interpreter is back.

Supported: triton 3.6.x and 3.9.x (checked at entry, as is that ``TRITON_INTERPRET=1`` took effect; both
raise ``RuntimeError`` with the fix). Blocks nest (the innermost settings apply; the stock interpreter returns
when the outermost exits). The patches are process-global: do not launch interpreted kernels from other
threads meanwhile.

What it computes (the GPU column is what Triton 3.9 emits for sm_90, read from the PTX of small kernels)
-----------------------------------------------------------------------------------------------------------
Every floating-point operation decodes its operands to values (bf16 ``uint16`` bits and fp8 ``uint8`` codes
exactly), computes with :mod:`simfloat`, and stores the result back in the storage the interpreter expects.
Anything floating-point that has no model here raises ``NotImplementedError`` naming the op and the dtype:
there is no silent fallback to the stock numerics (integer, boolean and pointer arithmetic stay stock: it is
exact). Inside a kernel triton wraps exceptions in ``InterpreterError``; the ``faithful()`` block re-raises
ours as :class:`FaithfulNotImplementedError` (a ``NotImplementedError``) when it exits.

==========================  =================================  ==============================================
operation                   GPU (sm_90)                         faithful()
==========================  =================================  ==============================================
+ - * on fp16/bf16/fp32/64  add/mul.{f16,bf16,f32,f64} (rn)     exact result rounded once into the dtype
                                                                (simfloat.ops.add/sub/mul)
a * b + c, a * b - c,       fp fusion on (Triton's default):    one rounding (simfloat.ops.fma), see "FMA
c - a * b (contracted)      fma.rn.{f32,f16,bf16,f64}           contraction"; ``contract=False``: two
``/`` fp32                  div.full.f32 (approximate)          ``div`` model (default correctly rounded)
``/`` fp16/bf16             cvt.f32, div.full.f32, cvt.rn       ``div`` model in fp32, then rounded (rn)
div_rn, fdiv(ieee=True)     div.rn.f32                          correctly rounded
tl.fma                      fma.rn.{f32,f16,bf16,f64}           one rounding (simfloat.ops.fma)
tl.exp2 (fp32)              ex2.approx.ftz.f32                  ``exp2`` model; ``ftz`` flushes in/outputs
tl.exp (fp32)               ex2.approx.f32(mul.f32(x, log2e))   ``exp2``(rn32(x * 1.4426950f)), never flushed
tl.log / tl.log2 (fp32)     libdevice __nv_logf/__nv_log2f      ``log`` / ``log2`` model (default: correctly
                                                                rounded)
tl.sqrt (fp32)              sqrt.approx.ftz.f32                 ``sqrt`` model; ``ftz`` flushes in/outputs
tl.sqrt_rn                  sqrt.rn.f32                         correctly rounded
comparisons, min/max,       exact                               exact on decoded values (unordered compares
neg, floor/ceil, clamp                                          true on NaN, ordered false)
fp32/64 -> fp16/bf16        cvt.rn / cvt.rz                     round to nearest even / toward zero (the
                                                                ``fp_downcast_rounding`` given)
-> fp8 e4m3 / e5m2          cvt.rn.satfinite.{e4m3,e5m2}x2      nearest even; overflow and +-inf -> +-max
                                                                (``fp8_overflow="ieee"``: ml_dtypes' policy)
fp32 -> e5m2, rtz           cvt.rz.f16.f32 + top byte           toward zero (inf kept); other rtz -> fp8
                                                                casts do not compile for sm_90: raise
fp8 -> wider                cvt.rn.f16x2.{e4m3,e5m2}x2          exact, NaN/inf kept
float -> int                cvt.rzi (saturating, NaN -> 0)      same
int -> float                cvt.rn                              round to nearest even, from the exact integer
tl.dot bf16/fp16            wgmma / mma.sync                    ``dot`` model, default tensor_core("sm90", dt)
tl.dot fp32, tf32           mma .tf32 fed raw fp32              tensor_core("sm90", "tf32") (operands
                                                                truncated to tf32)
tl.dot fp32, ieee           fma.rn.f32 loop                     Sequential("float32"): fused, k in order
tl.dot fp8                  wgmma ...e4m3/e5m2                  tensor_core("sm90", "e4m3"); with
                                                                max_num_imprecise_acc=n <= K: chunks of
                                                                max(32, n) products added in fp32 (Triton's
                                                                WGMMA partial accumulator)
tl.dot int8                 imma                                exact int32 (wrapping)
tl.sum / tl.reduce(sum)     per-thread + shuffle tree           simfloat.ops.sum, ``reduce_order`` (or the
                                                                mma-layout rule ``"h200-mma"``)
tl.max/min/argmax           exact                               exact (bf16/fp8 decoded first)
tl.cumsum/cumprod           parallel scan                       sequential only (other orders raise)
==========================  =================================  ==============================================

``tl.dot(a, b, acc)``: ``acc`` enters the model as its incoming accumulator
(``simfloat.accumulate.matmul(a, b, c=acc)``), as the MMA accumulates into C -- the stock interpreter adds it
after the product (one more rounding).

Defaults and why
----------------
* ``dot=None``: ``tensor_core(arch, dtype)`` for bf16/fp16/tf32/fp8 (``arch="sm90"``: the H100/H200 model the
  emulator's ``triton-<fmt>`` plans use), ``Sequential("float32")`` for ``input_precision="ieee"``,
  ``Sequential("float64")`` for fp64. Override per key with ``dot={"bf16": model, "fp16": ...,
  "tf32": ..., "ieee": ..., "fp8": ..., "fp64": ...}`` or one model for every key. A model whose accumulator
  format does not fit the ``acc`` dtype (e.g. an fp16 accumulator, ``out_dtype=tl.float16``) raises.
* ``exp2="correctly_rounded"`` (exact 2**x rounded once to fp32, simfloat.ops.exp2): the GPU's ex2.approx is
  not correctly rounded (about 2 ulp); pass a callable ``f(x: float32 ndarray) -> float32 ndarray`` of the
  same shape (e.g. a model fitted on the device) to reproduce it. The same convention holds for ``log``,
  ``log2``, ``sqrt`` and ``div`` (``div`` takes two broadcast float32 arrays). Correct rounding is the default
  because it is what the emulator's kernels compute (``simfloat.attention``) and it has no free parameters.
* ``ftz=False``: as the emulator; ``True`` models the ``.ftz`` of ex2.approx.ftz / sqrt.approx.ftz.
* ``reduce_order="sequential"``: ``simfloat.ops.sum``'s default and the order the emulator uses for the row
  sums (flash attention's l_ij); "pairwise" (``reduce_fan_in``), "chunked" (``reduce_chunk``) and "numpy"
  (the stock interpreter's np.sum, bit for bit on a contiguous axis) are the alternatives, and ``"h200-mma"``
  (fp32) the H200's measured tree in the tensor-core accumulator layout, which ``hardware=`` profiles set.
  The GPU's tree depends on the layout, which the interpreter does not see; choose the order the comparison
  needs and record it with :func:`faithful_config`.
* ``fp8_overflow="satfinite"``: what Triton's casts compile to on sm_89+.
* ``contract=None``: multiply-adds contract as the launch compiles them (fp fusion on unless the launch or
  Triton's knobs turn it off), so that a kernel written with ``*`` and ``+`` gets the GPU's bits; ``False`` gives
  the two roundings the interpreter computed before (see "FMA contraction").

FMA contraction
---------------
With fp fusion on (Triton's default through 3.9; ``enable_fp_fusion=False`` per launch,
``TRITON_DEFAULT_FP_FUSION=0`` or ``TRITON_FORCE_DISABLE_FP_FUSION=1`` turn it off; Triton 3.9 warns that 3.10
turns it off by default) LLVM's NVPTX backend fuses every fp add or subtract whose operand is a multiply of the
same basic block into ``fma.rn`` -- ``a*b + c``, ``c + a*b``, ``a*b - c`` -> fma(a, b, -c), ``c - a*b`` -> fma(-a,
b, c), ``-(a*b) + c`` -- in fp32, fp64, fp16 and bf16 (sm_90: fma.rn.f16 / .bf16; Triton computes fp16 and bf16
arithmetic in the format, it does not promote to fp32). NVPTX fuses aggressively: a multiply with other uses is
fused into each add and kept for the others. With fusion off it emits ``mul.rn``/``add.rn``, which ptxas does not
fuse either.

``faithful(contract=None)`` (the default) does the same as far as the kernel's source shows: a float multiply's
result carries its operands, and an add/subtract that consumes it -- directly, negated, or through ``[:, None]`` /
broadcasting -- in the same straight-line code computes the fma, rounded once (its site op in a site run is
``fma``); every other use reads the rounded product. Same straight-line code: the innermost call that holds both
(``@jit`` helpers are inlined), the add a later instruction than the multiply (not the same call made again in
another iteration), in the same innermost loop, no loop starting between them; ``if`` statements do not separate
(constexpr conditions vanish, LLVM makes small runtime ones selects). With two products (``a*b + c*d``) the left
one is fused. ``contract=False`` rounds every op (what ``enable_fp_fusion=False`` compiles); ``contract=True``
contracts whatever the launch says. With ``contract=None`` Triton's knobs are read when the block is entered and
the launch keyword at each launch.

Where the GPU can differ (the compiled code decides, not the source): LLVM sinks a multiply whose only use lies
after a loop into that block and fuses it, and fuses a loop-invariant add it hoists out of a loop (faithful() does
neither); a layout conversion Triton inserts between product and add prevents fusion where faithful() fuses (e.g. a
row statistic added to a vector loaded in another layout, depending on ``num_warps``); ``tl.sum``/``tl.reduce`` of
a product fuses products into the per-thread additions of the reduction (faithful() rounds each product first);
ptxas (``--fmad=true``) may fuse a ``mul``/``add`` pair LLVM left, e.g. across iterations of an unrolled loop. The
test kernels of tests/gpu/test_gpu_contract.py were checked against the PTX of triton 3.9 for sm_90.

Per-site attribution
--------------------
:mod:`simfloat_gpu.interpreter.lines` runs a kernel inside ``faithful()`` with each floating-point op a *site*
(source line and op) that rounds as above or computes exactly in float64, chosen per site
(``site_run(SitePolicy(...))``); :mod:`simfloat_gpu.campaign.attribute` builds the per-line error attribution
on it. Outside a site run nothing of it is active.

Limitations
-----------
* FMA contraction follows the source, not the compiled code: see "FMA contraction" for where the GPU's choice
  can differ. Kernels that must not depend on it write ``tl.fma`` (as simfloat_gpu/kernels/ do throughout).
* tl.sin/cos/rsqrt/erf, fp64 exp/log, tl.dot_scaled, tf32x3/bf16x3 dots, fnuz and e4b15 fp8, bf16/fp16 atomics
  raise. fp32 atomics are applied in program order (the GPU's order is nondeterministic).
* bf16 constants (``tl.full(..., tl.bfloat16)``) are the Python float rounded once to bf16.
* triton 3.6's interpreter itself fails with numpy >= 2.4 where a tensor is used as a Python index (``range``
  bounds such as simfloat_gpu/kernels/flash_attention.py's ``hi``), stock or faithful; the numerics patches work on 3.6.
* NaN payloads: bf16/fp16/fp8 results take NVIDIA's canonical NaN (0x7FFF / 0x7F).
* Not thread-safe; the settings live in module state while a block is active. Inside the block numba runs
  single-threaded in the calling thread (``numba.set_num_threads(1)``, restored on exit): simfloat's results
  do not depend on it, and the interpreter's small arrays would otherwise pay a parallel start-up per op.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from simfloat_gpu.interpreter._formats import FaithfulNotImplementedError

__all__ = ["faithful", "faithful_config", "FaithfulNotImplementedError", "SUPPORTED_TRITON", "DOT_KEYS"]

#: (major, minor) versions of triton whose interpreter this module patches.
SUPPORTED_TRITON = ((3, 6), (3, 9))
#: keys of the ``dot=`` mapping: operand dtype (fp32 split by input_precision)
DOT_KEYS = ("bf16", "fp16", "fp8", "tf32", "ieee", "fp64")
_FN_PARAMS = ("exp2", "log", "log2", "sqrt", "div")
_FP8_OVERFLOW = ("satfinite", "ieee")

# patches currently installed: (owner, name, original or _MISSING)
_SAVED: list[tuple[object, str, object]] = []
_SAVED_OPTIONS: list[object] = []
_SAVED_THREADS: list[int] = []
_MISSING = object()


@dataclasses.dataclass(frozen=True)
class _Config:
    dot: dict
    arch: str
    exp2: Any
    log: Any
    log2: Any
    sqrt: Any
    div: Any
    ftz: bool
    reduce_order: str
    reduce_fan_in: int
    reduce_chunk: int
    reduce_warps_n: int
    fp8_overflow: str
    triton_version: str
    contract: bool | None = None
    contract_default: bool = True

    def as_dict(self) -> dict[str, Any]:
        def fn_name(f: Any) -> str:
            if isinstance(f, str):
                return f
            return f"{getattr(f, '__module__', '?')}.{getattr(f, '__qualname__', repr(f))}"

        out: dict[str, Any] = {
            "dot": {k: repr(v) for k, v in self.dot.items()},
            "arch": self.arch,
            "ftz": self.ftz,
            "reduce_order": self.reduce_order,
            "reduce_fan_in": self.reduce_fan_in,
            "reduce_chunk": self.reduce_chunk,
            "reduce_warps_n": self.reduce_warps_n,
            "fp8_overflow": self.fp8_overflow,
            "triton_version": self.triton_version,
            "exp": "exp2(rn32(x * 1.4426950f))",
            "contract": "fp fusion of the launch" if self.contract is None else self.contract,
            "contract_default": self.contract_default,
        }
        out.update({p: fn_name(getattr(self, p)) for p in _FN_PARAMS})
        return out


def _default_dots(arch: str) -> dict:
    from simfloat.accumulate import Sequential, tensor_core

    dots = {
        "bf16": tensor_core(arch, "bf16"),
        "fp16": tensor_core(arch, "fp16"),
        "tf32": tensor_core(arch, "tf32"),
        "ieee": Sequential("float32"),
        "fp64": Sequential("float64"),
    }
    if arch == "sm90":
        dots["fp8"] = tensor_core(arch, "e4m3")
    return dots


def _resolve_dots(dot: Any, arch: str) -> dict:
    from simfloat.accumulate import BlockFMA, Chunked, Sequential, acc_params

    models = (Sequential, BlockFMA, Chunked)
    dots = _default_dots(arch)
    if dot is None:
        return dots
    if isinstance(dot, models):
        given = {k: dot for k in DOT_KEYS}
    elif isinstance(dot, Mapping):
        unknown = sorted(set(dot) - set(DOT_KEYS))
        if unknown:
            raise ValueError(f"faithful(dot=...): unknown keys {unknown}; known: {', '.join(DOT_KEYS)}")
        given = dict(dot)
    else:
        raise TypeError(
            "faithful(dot=...) takes None, an accumulation model (Sequential, BlockFMA, "
            f"Chunked) or a mapping {{key: model}} with keys {', '.join(DOT_KEYS)}; "
            f"got {type(dot).__name__}"
        )
    for k, m in given.items():
        if not isinstance(m, models):
            raise TypeError(f"faithful(dot=...)[{k!r}] must be Sequential, BlockFMA or Chunked, got {type(m).__name__}")
        acc_params(m)  # validates the model
    dots.update(given)
    return dots


def _hardware_settings(
    hardware: Any, dot: Any, arch: str, exp2: Any, reduce_order: str | None = None
) -> tuple[Any, str, Any, str | None]:
    """faithful()'s dot, arch, exp2 and reduce_order with a hardware profile's models (see :func:`faithful`)."""
    import functools
    from collections.abc import Mapping

    from simfloat.accumulate import BlockFMA, Chunked, Sequential
    from simfloat.hardware import ex2_approx
    from simfloat.profiles import load_profile

    prof = load_profile(hardware)
    if prof.arch in ("sm80", "sm90"):
        arch = prof.arch
    dots: dict[str, Any] = {}
    for key, fmt in (("bf16", "bf16"), ("fp16", "fp16"), ("tf32", "tf32"), ("fp8", "e4m3")):
        part = prof.dot(fmt)
        if part is not None and isinstance(part.model, (Sequential, BlockFMA, Chunked)):
            dots[key] = part.model
    if isinstance(dot, Mapping):
        dots.update(dot)
    elif dot is not None:
        dots = dot
    impl = prof.exp2_impl()
    if exp2 == "correctly_rounded" and impl != "correctly_rounded":
        ftz = prof.exp2.ftz if prof.exp2 is not None else True
        exp2 = functools.partial(ex2_approx, ftz=ftz, table=impl)
    mma_sum = prof.sum("mma")
    if reduce_order is None and mma_sum is not None:
        if mma_sum.rule is None:
            raise ValueError(
                f"faithful(hardware={prof.name!r}): the profile's tl.sum order of the mma layout has no rule "
                f"({mma_sum.status}); pass reduce_order= explicitly"
            )
        reduce_order = mma_sum.rule
    return (dots or None), arch, exp2, reduce_order


def _check_fn(name: str, value: Any) -> Any:
    if name == "exp2" and value == "h200":  # the H200's measured ex2.approx.ftz.f32 (simfloat.hardware)
        from simfloat.hardware import ex2_approx

        return ex2_approx
    if value == "correctly_rounded" or (callable(value) and not isinstance(value, str)):
        return value
    raise ValueError(
        f"faithful({name}=...) must be 'correctly_rounded' or a callable taking float32 "
        f"ndarray(s) and returning a float32 ndarray; got {value!r}"
    )


def _check_int(name: str, value: Any, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"faithful({name}=...) must be an int, got {type(value).__name__}")
    if value < lo:
        raise ValueError(f"faithful({name}=...) must be >= {lo}, got {value}")
    return value


def _check_environment() -> str:
    """Triton version and TRITON_INTERPRET; returns the version string."""
    try:
        import triton
    except ImportError as exc:
        from simfloat_gpu import INSTALL_HINT

        raise ImportError(
            f"simfloat_gpu.interpreter.faithful() runs Triton's interpreter and needs triton ({exc}); install the "
            f"GPU side: {INSTALL_HINT}"
        ) from exc

    version = str(triton.__version__)
    m = re.match(r"(\d+)\.(\d+)", version)
    if m is None or (int(m.group(1)), int(m.group(2))) not in SUPPORTED_TRITON:
        supported = " and ".join(f"{a}.{b}.x" for a, b in SUPPORTED_TRITON)
        raise RuntimeError(
            f"simfloat_gpu.interpreter.faithful() supports triton {supported}; the installed triton is "
            f"{version}. Its interpreter internals may differ: install a supported version or "
            "check simfloat_gpu/interpreter/NOTES.md against the new source first."
        )
    import triton.language as tl

    fix = (
        "set TRITON_INTERPRET=1 before triton is first imported (export it in the shell, or put "
        "os.environ.setdefault('TRITON_INTERPRET', '1') at the top of the script or tests/conftest.py)"
    )
    if type(tl.standard.sum).__name__ != "InterpretedFunction":
        raise RuntimeError(
            "faithful(): TRITON_INTERPRET=1 did not take effect -- triton was imported "
            f"without it, so kernels compile for a GPU instead of running in the interpreter; "
            f"{fix}"
        )
    knobs = getattr(triton, "knobs", None)
    interpret = getattr(knobs.runtime, "interpret", None) if knobs is not None else None
    if interpret is None:
        interpret = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
    if not interpret:
        raise RuntimeError(
            f"faithful(): TRITON_INTERPRET is not set now, so kernels decorated from here on "
            f"would not be interpreted; {fix}"
        )
    return version


def _triton_fp_fusion_default() -> bool:
    """Whether Triton compiles a launch without ``enable_fp_fusion=`` with fp fusion on: its knobs
    ``TRITON_DEFAULT_FP_FUSION`` (default on through 3.9) and ``TRITON_FORCE_DISABLE_FP_FUSION``."""
    import triton

    lang = getattr(getattr(triton, "knobs", None), "language", None)
    if lang is not None and hasattr(lang, "default_fp_fusion"):
        return bool(lang.default_fp_fusion) and not bool(getattr(lang, "force_disable_fp_fusion", False))

    def flag(var: str, default: str) -> bool:
        return os.environ.get(var, default).lower() in ("1", "true", "on", "yes")

    return flag("TRITON_DEFAULT_FP_FUSION", "1") and not flag("TRITON_FORCE_DISABLE_FP_FUSION", "0")


def _install() -> None:
    import triton.runtime.interpreter as ti

    from simfloat_gpu.interpreter import _ops as _interp_ops
    from simfloat_gpu.interpreter import _state as _interp_state

    try:
        for owner, name, fn in _interp_ops.patch_table():
            original = vars(owner).get(name, _MISSING) if isinstance(owner, type) else getattr(owner, name)
            _interp_state.STOCK[(owner, name)] = original
            _SAVED.append((owner, name, original))
            setattr(owner, name, fn)
        import numba

        # the interpreter's arrays are tiny: numba's parallel drivers would spend ~10 ms per call starting
        # threads. simfloat's results do not depend on the thread count, so this only changes the speed.
        _SAVED_THREADS.append(numba.get_num_threads())
        numba.set_num_threads(1)
        builder = ti.interpreter_builder
        options = builder.options
        _SAVED_OPTIONS.append(options)
        if "max_num_imprecise_acc_default" in {f.name for f in dataclasses.fields(options)}:
            # the sm_90 default (the interpreter's is 0): fp8 dots accumulate without promotion unless asked
            builder.options = dataclasses.replace(options, max_num_imprecise_acc_default=2**30)
    except BaseException:
        _restore()
        raise


def _restore() -> None:
    while _SAVED:
        owner, name, original = _SAVED.pop()
        if original is _MISSING:
            delattr(owner, name)
        else:
            setattr(owner, name, original)
    if _SAVED_THREADS:
        import numba

        numba.set_num_threads(_SAVED_THREADS.pop())
    if _SAVED_OPTIONS:
        import triton.runtime.interpreter as ti

        ti.interpreter_builder.options = _SAVED_OPTIONS.pop()
        _SAVED_OPTIONS.clear()


@contextlib.contextmanager
def faithful(
    *,
    dot: Any = None,
    arch: str = "sm90",
    exp2: str | Callable = "correctly_rounded",
    log: str | Callable = "correctly_rounded",
    log2: str | Callable = "correctly_rounded",
    sqrt: str | Callable = "correctly_rounded",
    div: str | Callable = "correctly_rounded",
    ftz: bool = False,
    reduce_order: str | None = None,
    reduce_fan_in: int = 2,
    reduce_chunk: int = 32,
    reduce_warps_n: int = 1,
    fp8_overflow: str = "satfinite",
    hardware: Any = None,
    contract: bool | None = None,
) -> Iterator[dict[str, Any]]:
    """Run interpreted Triton kernels with simfloat's numerics inside the block (see the module docstring).

    Args:
        dot: accumulation model(s) for ``tl.dot``: None (defaults), one model for every key, or a mapping with
            keys ``"bf16"``, ``"fp16"``, ``"fp8"``, ``"tf32"``, ``"ieee"`` (fp32 operands by input_precision),
            ``"fp64"``.
        arch: tensor-core presets of the defaults, ``"sm90"`` or ``"sm80"`` (no fp8 there).
        exp2, log, log2, sqrt, div: ``"correctly_rounded"`` or a callable on float32 ndarrays returning
            float32 (models of ex2.approx, libdevice logf/log2f, sqrt.approx, div.full).
        ftz: flush subnormal inputs and outputs of exp2 and sqrt (the GPU's .ftz variants).
        reduce_order: ``"sequential"``, ``"pairwise"``, ``"chunked"`` or ``"numpy"`` for tl.sum
            (simfloat.ops.sum), or ``"h200-mma"`` (fp32 only: the tensor-core accumulator layout's order,
            :func:`simfloat.profiles.tl_sum`, the emulator's ``sum_order="h200-mma"``). ``None``:
            ``"sequential"``, or with ``hardware`` the profile's tl.sum rule of the mma layout.
        reduce_fan_in, reduce_chunk: parameters of the pairwise and chunked orders.
        reduce_warps_n: warps along the reduced axis for ``"h200-mma"`` (1, 2 or 4; the emulator's flash
            uses 4 where block_m < 64 and block_m < head_dim, else 1).
        fp8_overflow: ``"satfinite"`` (NVIDIA cvt) or ``"ieee"`` (the format's policy, as ml_dtypes).
        hardware: a hardware profile (:class:`simfloat.profiles.HardwareProfile`, a shipped name such as
            ``"h200"`` or a profile file): its tensor-core models become the ``dot`` defaults (the wgmma part
            of each format; ``"fp8"`` from e4m3's; models the njit kernels cannot run, e.g. fp8 through
            mma.sync, are left out) and its exp2 table the ``exp2`` model (with its ``.ftz``), its arch the
            ``arch`` if sm80/sm90. ``dot`` entries and an ``exp2`` other than ``"correctly_rounded"`` given
            with it take precedence. Its tl.sum rule of the mma layout becomes ``reduce_order`` unless one is
            given; the interpreter does not know a tile's layout, so the rule applies to every float tl.sum
            (in the flash kernel the only one is l_ij over P, which is in the mma layout).
        contract: FMA contraction of ``a * b + c`` (fp fusion). ``None`` (default): what the GPU compiles -- a
            launch's ``enable_fp_fusion=`` keyword, else Triton's default (on in 3.9 unless
            ``TRITON_DEFAULT_FP_FUSION=0`` or ``TRITON_FORCE_DISABLE_FP_FUSION=1``); contraction then fuses every
            float add/subtract whose operand is a multiply of the same straight-line code into one fma, rounded
            once (see "FMA contraction" in the module docstring). ``False``: never (each op rounds, as
            ``enable_fp_fusion=False`` compiles); ``True``: always, whatever the launch says.

    Yields:
        The active settings, as :func:`faithful_config` returns them.

    Raises:
        ImportError: triton is not installed (the message gives the install command).
        RuntimeError: unsupported triton version, or TRITON_INTERPRET=1 not in effect.
        ValueError, TypeError: invalid settings.
    """
    from simfloat.ops import ORDERS

    if hardware is not None:
        dot, arch, exp2, reduce_order = _hardware_settings(hardware, dot, arch, exp2, reduce_order)
    if reduce_order is None:
        reduce_order = "sequential"
    if not isinstance(arch, str) or arch.lower() not in ("sm80", "sm90"):
        raise ValueError(f"faithful(arch=...) must be 'sm80' or 'sm90', got {arch!r}")
    arch = arch.lower()
    if not isinstance(ftz, bool):
        raise TypeError(f"faithful(ftz=...) must be a bool, got {type(ftz).__name__}")
    from simfloat.profiles import SUM_RULES

    orders = ORDERS + tuple(r for r in SUM_RULES if r not in ORDERS)
    if reduce_order not in orders:
        raise ValueError(f"faithful(reduce_order=...) must be one of {', '.join(orders)}, got {reduce_order!r}")
    if reduce_warps_n not in (1, 2, 4) or isinstance(reduce_warps_n, bool):
        raise ValueError(f"faithful(reduce_warps_n=...) must be 1, 2 or 4, got {reduce_warps_n!r}")
    if fp8_overflow not in _FP8_OVERFLOW:
        raise ValueError(f"faithful(fp8_overflow=...) must be 'satfinite' or 'ieee', got {fp8_overflow!r}")
    if contract is not None and not isinstance(contract, bool):
        raise TypeError(f"faithful(contract=...) must be None, True or False, got {type(contract).__name__}")
    fns = {
        name: _check_fn(name, value)
        for name, value in (("exp2", exp2), ("log", log), ("log2", log2), ("sqrt", sqrt), ("div", div))
    }
    config = _Config(
        dot=_resolve_dots(dot, arch),
        arch=arch,
        ftz=ftz,
        reduce_order=reduce_order,
        reduce_fan_in=_check_int("reduce_fan_in", reduce_fan_in, 2),
        reduce_chunk=_check_int("reduce_chunk", reduce_chunk, 1),
        reduce_warps_n=reduce_warps_n,
        fp8_overflow=fp8_overflow,
        triton_version=_check_environment(),
        contract=contract,
        contract_default=_triton_fp_fusion_default(),
        **fns,
    )
    from simfloat_gpu.interpreter import _state as _interp_state

    stack = _interp_state.STACK
    if not stack:
        _install()
    stack.append(config)
    try:
        yield config.as_dict()
    except Exception as exc:
        # triton wraps kernel exceptions in InterpreterError(repr(e)); surface ours as what they are
        cause = _our_cause(exc)
        if cause is not None and cause is not exc:
            raise FaithfulNotImplementedError(*cause.args) from exc
        raise
    finally:
        if not stack or stack[-1] is not config:
            raise RuntimeError("faithful() blocks were exited out of order")
        stack.pop()
        if not stack:
            _restore()


def _our_cause(exc: BaseException) -> BaseException | None:
    seen = 0
    e: BaseException | None = exc
    while e is not None and seen < 20:
        if isinstance(e, FaithfulNotImplementedError):
            return e
        e = e.__cause__ or e.__context__
        seen += 1
    return None


def faithful_config() -> dict[str, Any] | None:
    """Settings of the innermost active :func:`faithful` block (JSON-friendly), or None outside any block."""
    import sys

    ops = sys.modules.get("simfloat_gpu.interpreter._state")
    if ops is None or not ops.STACK:
        return None
    return ops.STACK[-1].as_dict()


try:  # the pytest fixture, without making pytest a dependency
    import pytest as _pytest
except ImportError:  # pragma: no cover
    _pytest = None

if _pytest is not None:
    __all__ += ["faithful_interpreter"]

    @_pytest.fixture
    def faithful_interpreter(request):  # type: ignore[no-untyped-def]
        """pytest fixture: the test body runs inside ``faithful(**kwargs)``; kwargs come from
        ``@pytest.mark.parametrize("faithful_interpreter", [{...}], indirect=True)`` (default: none)."""
        kwargs = getattr(request, "param", None) or {}
        with faithful(**kwargs) as config:
            yield config
