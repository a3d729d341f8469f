"""Argument checks shared by the attention kernels: shapes, dtypes, layouts, block sizes, scale, plan and tracer;
the warnings for inputs that are not values of the plan's input format and for outputs an overflow made
non-finite."""

from __future__ import annotations

import math
import threading
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from simfloat.attention._masks import MaskSpec
from simfloat.attention.backward_plan import BackwardPlan
from simfloat.attention.plan import Plan, plan
from simfloat.formats import format as _format
from simfloat.trace import Tracer

__all__ = [
    "LAYOUTS",
    "InputFormatWarning",
    "Inputs",
    "KernelOverflowWarning",
    "check_input_format",
    "check_layout",
    "check_output",
    "check_qkv",
    "from_layout",
    "group_kv",
    "input_format",
    "kv_group",
    "kv_repeats",
    "not_representable",
    "operand",
    "prepare",
    "to_layout",
]


class InputFormatWarning(UserWarning):
    """Operands that are not values of the plan's input format (fp32 activations under a bf16 plan): the
    emulator uses them as they are, where the kernel's caller would have rounded them into its input dtype,
    so the result is not the kernel's. Filter it with ``warnings.filterwarnings("ignore",
    category=InputFormatWarning)``."""


class KernelOverflowWarning(RuntimeWarning):
    """Finite inputs gave non-finite outputs: an op's result overflowed its format (the message names the op,
    its format and where); the GPU kernel would give the same NaN or infinity."""


#: Operand layouts: (..., heads, seq, head_dim) as torch's scaled_dot_product_attention, or (..., seq, heads,
#: head_dim) as flash-attn's flash_attn_func.
LAYOUTS = ("bhsd", "bshd")


def input_format(p: Plan | BackwardPlan | str) -> str | None:
    """The input format of a plan's kernel (its q, k, v dtype): the plan's ``input_format`` field
    (:attr:`~simfloat.attention.Plan.input_format`; ``"fp32"`` for the tf32 kernels, which read fp32 inputs),
    None for plans that take any input (``fp64``, ...). A name is resolved as :func:`~simfloat.attention.plan`
    resolves it (a preset, ``triton-<fmt>@<profile>``); an unknown name has none (it stops later, with its own
    message)."""
    if isinstance(p, str):
        try:
            p = plan(p)
        except ValueError:
            return None
    return p.input_format


def not_representable(x: np.ndarray, fmt: str) -> int:
    """How many values of ``x`` are not values of ``fmt`` (rounding them into it would change them; NaN counts as
    a value; :meth:`~simfloat.formats.FloatFormat.holds`, plain numpy: the check compiles nothing)."""
    return int(x.size - np.count_nonzero(_format(fmt).holds(x)))


def check_input_format(arrays: dict[str, np.ndarray], pl: Plan | BackwardPlan, *, stacklevel: int = 3) -> None:
    """Warn (:class:`InputFormatWarning`) if an operand holds values that are not values of the plan's input
    format (:func:`input_format`; plans without one take any input). The one check every entry point makes.

    Args:
        arrays: the operands by name (``{"q": q, ...}``).
        pl: the plan. stacklevel: as for :func:`warnings.warn` (1: this function's line).
    """
    fmt = input_format(pl)
    if fmt is None:
        return
    bad = {name: not_representable(x, fmt) for name, x in arrays.items()}
    bad = {name: n for name, n in bad.items() if n}
    if not bad:
        return
    names = ", ".join(bad)
    counts = "; ".join(f"{name}: {n} of {arrays[name].size}" for name, n in bad.items())
    warnings.warn(
        f"{names} hold{'s' if len(bad) == 1 else ''} values that are not {fmt} values ({counts}): plan "
        f"{pl.name}'s kernel takes {fmt} inputs, so its caller rounds them first (simfloat.round(x, {fmt!r}); "
        f"in torch x.to(<the {fmt} dtype>)), but here they are used as they are and the result is not the kernel's",
        InputFormatWarning,
        stacklevel=stacklevel,
    )


def check_layout(layout: object) -> str:
    """``layout`` checked: one of :data:`LAYOUTS`.

    Raises:
        ValueError: another value.
    """
    if layout not in LAYOUTS:
        raise ValueError(
            f"layout must be 'bhsd' or 'bshd' ((..., heads, seq, head_dim) as torch, or (..., seq, heads, "
            f"head_dim) as flash-attn), got {layout!r}"
        )
    return str(layout)


def from_layout(x: Any, layout: str, name: str) -> Any:
    """An operand in ``layout`` as (..., heads, seq, head_dim) (a view; non-arrays are left to
    :func:`operand`'s message).

    Raises:
        ValueError: a ``bshd`` operand with fewer than three dimensions.
    """
    if check_layout(layout) == "bhsd" or not isinstance(x, np.ndarray):
        return x
    if x.ndim < 3:
        raise ValueError(
            f"{name} must have shape (..., seq, heads, head_dim) with layout 'bshd' (three or more dims), got {x.shape}"
        )
    return np.swapaxes(x, -3, -2)


def to_layout(x: np.ndarray, layout: str) -> np.ndarray:
    """A (..., heads, seq, head_dim) result in ``layout`` (contiguous)."""
    return x if layout == "bhsd" else np.ascontiguousarray(np.swapaxes(x, -3, -2))


class Inputs:
    """Validated operands as contiguous float64 (L, S, D) arrays plus what the kernels need."""

    def __init__(
        self,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        lead: tuple[int, ...],
        scale: float,
        causal: bool,
        plan: Plan,
        trace: Tracer | None,
    ) -> None:
        self.q, self.k, self.v, self.lead = q, k, v, lead
        self.scale, self.causal, self.plan, self.trace = scale, causal, plan, trace
        self.mask: MaskSpec | None = None  # a masked call's resolved mask

    @property
    def n_lead(self) -> int:
        return self.q.shape[0]


def operand(x: object, name: str, *, finite: bool = True, stacklevel: int = 4) -> np.ndarray:
    """``x`` checked as an attention operand: a float32/float64 numpy array of shape (..., seq, head_dim) (a
    float16 or ml_dtypes array is widened exactly to float32, as :func:`simfloat.round` does).

    Args:
        x: the operand. name: its name in messages.
        finite: a NaN or infinity is an error (named with its first index: it would make the outputs, and
            every deviation from the golden ones, NaN without a word); False: a RuntimeWarning naming it, and
            the kernels propagate it as the GPU would.

    Raises:
        TypeError: not a numpy array, or another dtype.
        ValueError: fewer than two dimensions, or (``finite``) a NaN or infinity.
    """
    from simfloat.rounding import narrow_float

    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(x).__name__}")
    if narrow_float(x.dtype):  # float16, ml_dtypes' bfloat16 / float8_*: exactly float32 values
        x = x.astype(np.float32)
    if x.dtype not in (np.float32, np.float64):
        raise TypeError(
            f"{name} must have dtype float32 or float64 (or float16, or an ml_dtypes bfloat16 or float8_* dtype, "
            f"widened exactly), got {x.dtype}"
        )
    if x.ndim < 2:
        raise ValueError(f"{name} must have shape (..., seq, head_dim), got {x.shape}")
    bad = ~np.isfinite(x)
    if bad.any():
        idx = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), x.shape))
        n = int(np.count_nonzero(bad))
        msg = (
            f"{name} has a non-finite value ({float(x[idx])}) at index {idx} ({n} of its {x.size} values "
            f"{'is' if n == 1 else 'are'} NaN or infinite)"
        )
        if finite:
            raise ValueError(msg + ": the kernels take finite inputs")
        warnings.warn(msg + ": it propagates into the outputs", RuntimeWarning, stacklevel=stacklevel)
    return x


def kv_group(q_heads: int, kv_heads: int, name: str = "k") -> int:
    """How many query heads share one key/value head (grouped-query and multi-query attention).

    Query head ``h`` reads key/value head ``h // group``. The one rule for the emulator and the Triton kernels.

    Args:
        q_heads: number of query heads (>= 1).
        kv_heads: number of key/value heads (>= 1).
        name: the key/value operand named in messages.

    Returns:
        ``q_heads // kv_heads`` (1: one key/value head per query head).

    Raises:
        ValueError: ``kv_heads`` does not divide ``q_heads`` (or either is < 1).
    """
    if q_heads < 1 or kv_heads < 1 or q_heads % kv_heads:
        raise ValueError(
            f"q has {q_heads} head{'' if q_heads == 1 else 's'} and {name} has {kv_heads}: grouped-query "
            f"attention needs the number of q heads to be a multiple of the number of {name} heads (q head h "
            f"reads {name} head h // (q_heads // kv_heads))"
        )
    return q_heads // kv_heads


def group_kv(q: np.ndarray, x: np.ndarray, name: str) -> np.ndarray:
    """``x`` (a key or value operand) with each of its heads repeated for the query heads that read it.

    The head axis is the third from last: q (..., q_heads, seq_q, d), x (..., kv_heads, seq_k, d). A head
    count of 1 on either side is left to broadcasting (multi-query attention broadcasts already); otherwise
    query head ``h`` reads ``x``'s head ``h // (q_heads // kv_heads)`` (:func:`kv_group`). Running on the result
    is running with k and v repeated per head, so every kernel gives those bits.

    Args:
        q: (..., q_heads, seq_q, d) query operand (only its shape is read).
        x: (..., kv_heads, seq_k, d) key or value operand.
        name: ``x``'s name in messages.

    Returns:
        ``x``, or a (..., q_heads, seq_k, d) array of its heads repeated.

    Raises:
        ValueError: both have a head axis, neither head count is 1, and kv_heads does not divide q_heads.
    """
    reps = kv_repeats(q.shape, x.shape, name)
    return x if reps == 1 else np.repeat(x, reps, axis=-3)


def kv_repeats(q_shape: tuple[int, ...], x_shape: tuple[int, ...], name: str) -> int:
    """How many times :func:`group_kv` repeats each head of an operand of shape ``x_shape`` (1: not at all).

    Raises:
        ValueError: as :func:`group_kv`.
    """
    if len(q_shape) < 3 or len(x_shape) < 3:
        return 1
    hq, hk = q_shape[-3], x_shape[-3]
    if hq == hk or hk == 1 or hq == 1:
        return 1
    return kv_group(hq, hk, name)


def block(value: object, name: str) -> int:
    """A positive int tile size."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return int(value)


def check_qkv(qa: np.ndarray, ka: np.ndarray, va: np.ndarray) -> None:
    """The shape rules of q, k, v (k and v mapped to q's heads or not) that the forward and backward kernels
    share: q and k of one head_dim, k and v of one sequence length, at least one key.

    Raises:
        ValueError: naming the rule and the shapes.
    """
    if ka.shape[-1] != qa.shape[-1]:
        raise ValueError(f"q and k head_dim differ: q {qa.shape}, k {ka.shape}")
    if ka.shape[-2] != va.shape[-2]:
        raise ValueError(f"k and v sequence lengths differ: k {ka.shape}, v {va.shape}")
    if ka.shape[-2] < 1:
        raise ValueError("k and v need at least one key (seq_k >= 1): softmax over no keys is undefined")


def prepare(
    q: object,
    k: object,
    v: object,
    *,
    plan_: object,
    causal: object,
    scale: object,
    trace: object,
    layout: str = "bhsd",
    formats: bool = True,
) -> Inputs:
    """Check and normalize the common arguments of :func:`flash`, :func:`baseline` and the quantized kernels.

    Key/value heads are mapped to query heads here (:func:`group_kv`: grouped-query and multi-query
    attention), so every kernel reads k and v repeated per query head. ``layout="bshd"`` operands are read as
    their (..., heads, seq, head_dim) transposes (:func:`from_layout`). ``formats``: warn for operands outside
    the plan's input format (:func:`check_input_format`).

    Raises:
        TypeError: non-array operands, dtypes other than float16/float32/float64 (and ml_dtypes'), wrong
            argument types.
        ValueError: inconsistent shapes, head counts that do not divide (:func:`kv_group`), no keys, a scale that
            is not finite and > 0, unknown plan or layout.

    Warns:
        RuntimeWarning: NaN or infinite operand values (the first one's index is named).
        InputFormatWarning: operands that are not values of the plan's input format.
    """
    pl = plan(plan_)  # type: ignore[arg-type]  # plan() raises TypeError for other types
    q, k, v = (from_layout(x, layout, n) for x, n in ((q, "q"), (k, "k"), (v, "v")))
    qa, ka, va = (operand(x, n, finite=False, stacklevel=5) for x, n in ((q, "q"), (k, "k"), (v, "v")))
    if formats:
        check_input_format({"q": qa, "k": ka, "v": va}, pl, stacklevel=4)
    ka, va = group_kv(qa, ka, "k"), group_kv(qa, va, "v")
    check_qkv(qa, ka, va)
    if qa.shape[-1] < 1 or va.shape[-1] < 1:
        raise ValueError(f"head_dim must be >= 1, got q {qa.shape}, v {va.shape}")
    try:
        lead = np.broadcast_shapes(qa.shape[:-2], ka.shape[:-2], va.shape[:-2])
    except ValueError as err:
        raise ValueError(f"leading dims do not broadcast: q {qa.shape}, k {ka.shape}, v {va.shape}") from err
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if scale is None:
        scale = 1.0 / math.sqrt(qa.shape[-1])
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating, np.integer)):
        raise TypeError(f"scale must be a real number or None, got {type(scale).__name__}")
    scale = float(scale)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be finite and > 0, got {scale}")
    if trace is not None and not isinstance(trace, Tracer):
        raise TypeError(f"trace must be a simfloat.Tracer or None, got {type(trace).__name__}")

    def flat(x: np.ndarray) -> np.ndarray:
        full = np.broadcast_to(x, lead + x.shape[-2:])
        return np.ascontiguousarray(full, dtype=np.float64).reshape((math.prod(lead),) + x.shape[-2:])

    return Inputs(flat(qa), flat(ka), flat(va), lead, scale, bool(causal), pl, trace)


_diagnosing = threading.local()


def _format_of(entry: object) -> str:
    for attr in ("fmt", "out_fmt", "outer_fmt"):
        f = getattr(entry, attr, None)
        if f is not None:
            return str(getattr(f, "name", f))
    return str(entry)


def _overflowed_op(
    x: Inputs, kernel: Callable[..., object], b: int, i: int, block_m: int, block_n: int
) -> tuple[str, int, float] | None:
    """(op, kv block, largest |float64 value|) of the first op whose result is not finite on row ``i`` of lead
    index ``b``: that row rerun alone through ``kernel``, traced (its keys: all, or the first i + 1 with a causal
    mask, which is the same dataflow). None if the trace finds none."""
    keys = min(i + 1, x.k.shape[1]) if x.causal else x.k.shape[1]
    spec = x.mask  # a masked call: the row with its own mask over every key
    extra = {} if spec is None else {"attn_mask": spec.row_mask(b, i)}
    if spec is not None:
        keys = x.k.shape[1]
    q1, k1, v1 = x.q[b : b + 1, i : i + 1], x.k[b : b + 1, :keys], x.v[b : b + 1, :keys]
    tr = Tracer()
    _diagnosing.on = True
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            if kernel.__name__ == "flash":
                kernel(q1, k1, v1, plan=x.plan, block_m=block_m, block_n=block_n, scale=x.scale, trace=tr, **extra)
            else:
                kernel(q1, k1, v1, plan=x.plan, scale=x.scale, trace=tr, **extra)
    finally:
        _diagnosing.on = False
    run = tr.runs[0]
    local = run["local"][0, 0]  # (kv block + epilogue, op, stat)
    for kv in range(local.shape[0]):
        for j, op in enumerate(run["ops"]):
            mx, _, count, ref = local[kv, j]
            if count > 0 and not math.isfinite(mx):
                return op, (kv if kv < local.shape[0] - 1 else -1), float(ref)
    return None


def check_output(
    out: np.ndarray, x: Inputs, kernel: Callable[..., object], *, block_m: int = 64, block_n: int = 64
) -> None:
    """Warn (:class:`KernelOverflowWarning`) if finite inputs gave non-finite outputs, naming the op that
    overflowed, its format and the kv block (found by rerunning the first such row traced).

    Args:
        out: the kernel's (n_lead, seq_q, d_v) output. x: its checked inputs. kernel: the entry point that
            made it (:func:`~simfloat.attention.flash` or :func:`~simfloat.attention.baseline`: passed in, since
            those import this module), rerun on the row. block_m, block_n: flash's tiles.
    """
    if getattr(_diagnosing, "on", False):
        return
    bad = ~np.isfinite(out)
    if not bad.any() or not all(np.isfinite(a).all() for a in (x.q, x.k, x.v)):
        return  # non-finite inputs were named already (a RuntimeWarning)
    b, i = (int(n) for n in np.unravel_index(int(np.argmax(bad.any(axis=-1))), bad.shape[:2]))
    found = _overflowed_op(x, kernel, b, i, block_m, block_n)
    name = kernel.__name__
    n = int(np.count_nonzero(bad))
    head = (
        f"{name} under plan {x.plan.name}: finite inputs gave {n} non-finite output value{'s' if n > 1 else ''} "
        f"(the first in row {i} of lead index {b})"
    )
    if found is None:
        why = "an intermediate result overflowed its format (the traced rerun of that row did not say which)"
    else:
        op, kv, ref = found
        where = "the epilogue" if kv == -1 else f"kv block {kv}"
        why = (
            f"op {op} overflowed {_format_of(getattr(x.plan, op))} in {where} (its exact result reaches {ref:.3g}), "
            "and what follows it turned that into NaN or infinity"
        )
    warnings.warn(
        f"{head}: {why}. The kernel on a GPU does the same; scale the inputs (or the softmax scale) down, or give "
        "that op a wider format",
        KernelOverflowWarning,
        stacklevel=3,
    )
