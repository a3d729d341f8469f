"""Attention through the emulator inside torch models (torch is an optional dependency: this module imports it,
``import simfloat`` does not).

* :func:`attention` — ``softmax(scale * q @ k^T [mask]) @ v`` as a :class:`torch.autograd.Function` whose forward
  is :func:`simfloat.attention.flash` (or :func:`~simfloat.attention.baseline`) under a precision plan and whose
  backward is :func:`~simfloat.attention.flash_backward` (or :func:`~simfloat.attention.baseline_backward`)
  under a backward plan: the emulated kernels' numerics decide every value, torch only carries the tensors.
* :func:`emulate_sdpa` — a context manager routing ``torch.nn.functional.scaled_dot_product_attention`` to
  :func:`attention` in the calling thread.
* :func:`capture_sdpa` — a context manager recording every such call (q, k, v, its options, the module that
  made it, and the gradient dO that reaches it in the backward pass) into one file for
  :func:`simfloat.attribute` (``simfloat attribute --inputs``), without changing what the model computes.

Inside either block torch's fused fast path of ``nn.MultiheadAttention`` / ``nn.TransformerEncoderLayer``
(eval mode under ``torch.no_grad``), which bypasses ``scaled_dot_product_attention``, is turned off
(``torch.backends.mha.set_fastpath_enabled(False)``), so those modules are routed and recorded too. What still
bypasses it (``nn.MultiheadAttention`` with ``need_weights=True``, torch's default, which forms the attention
weights itself; code that bound the function before the block) is named in a :class:`RoutingWarning`, and so
is a block that ends with no call routed or recorded.

Tensors are (batch, heads, seq, head_dim) of any float dtype; the result has the query's dtype and device (the
emulator runs on the CPU in float64 and holds values of the plan's output format, which the cast into the
dtype keeps when the dtype can hold them). Values enter the emulator as they are: cast q, k, v to the kernel's
input dtype first (``q.to(torch.bfloat16)`` for a bf16 kernel) to emulate a model feeding that kernel; the
gradient then arrives in that dtype too. The (batch, heads) pairs run on the engine's threads
(``numba.set_num_threads``), bitwise identical for any thread count.

Grouped-query attention (k, v with fewer heads than q, a divisor of them): the forward maps query head h to kv
head h // (heads // kv_heads) as the emulator does, and so does the backward: ``flash_backward`` accumulates dk,
dv of a kv head over its group's query heads in the Triton kernel's order (step G1 of
:mod:`simfloat.attention.backward`), ``baseline_backward`` sums torch's per-head gradients of the repeated k, v.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

try:
    import torch
except ImportError as _err:  # the optional dependency: say which extra brings it
    raise ImportError(f"simfloat.torch needs torch ({_err}): pip install 'simfloat-emu[train]'") from _err

from simfloat.attention import backward_plan as _backward_plan
from simfloat.attention import baseline, baseline_backward, flash, flash_backward, lse_from_stats
from simfloat.attention import plan as _plan
from simfloat.attention._backward_inputs import scale_of as _scale_of
from simfloat.attention.backward_plan import BackwardPlan, backward_presets
from simfloat.attention.plan import Plan, presets

__all__ = [
    "AttentionConfig",
    "RoutingWarning",
    "attention",
    "capture_sdpa",
    "config",
    "emulate_sdpa",
    "reference_attention",
    "timings",
]


class RoutingWarning(UserWarning):
    """An attention that :func:`emulate_sdpa` could not route (or :func:`capture_sdpa` could not record)
    because it did not go through ``scaled_dot_product_attention``, or a block that saw no such call."""


KERNELS = ("flash", "baseline")


@dataclass(frozen=True)
class AttentionConfig:
    """Everything :func:`attention` runs under, checked once (see :func:`config`).

    Attributes:
        plan: forward :class:`~simfloat.attention.Plan`. backward_plan: :class:`~simfloat.attention.BackwardPlan`.
        kernel: ``"flash"`` or ``"baseline"``. causal: top-left aligned mask. block_m, block_n: flash tiles.
        scale: softmax scale or None (1/sqrt(head_dim)).
    """

    plan: Plan
    backward_plan: BackwardPlan
    kernel: str
    causal: bool
    block_m: int
    block_n: int
    scale: float | None


def _default_backward(pl: Plan) -> BackwardPlan:
    table, fwd = backward_presets(), presets()
    if pl.name in table and fwd.get(pl.name) == pl:
        return table[pl.name]
    raise ValueError(
        f"backward_plan is needed for plan {pl.name!r}: only an unchanged preset has a backward preset of its name "
        f"(backward presets: {', '.join(table)})"
    )


def config(
    *,
    plan: Plan | str,
    backward_plan: BackwardPlan | str | None = None,
    kernel: str | None = None,
    causal: bool = False,
    block_m: int = 64,
    block_n: int = 64,
    scale: float | None = None,
) -> AttentionConfig:
    """Check and bundle the settings of :func:`attention`.

    Args:
        plan: forward plan or preset name. backward_plan: backward plan or preset name; None: the backward
            preset of the same name (only for an unchanged preset plan).
        kernel: ``"flash"`` or ``"baseline"``; None: the plan's kernel (:meth:`Plan.kernels`: ``pytorch-`` plans
            baseline, every other plan flash).
        causal, block_m, block_n, scale: as :func:`simfloat.attention.flash`.

    Returns:
        The :class:`AttentionConfig`.

    Raises:
        TypeError, ValueError: a bad plan, kernel, flag, block size or scale (named); a kernel the plan is not
            for; a flash backward plan whose ``exp2`` differs from the forward's (the lse would be in the wrong
            units).
    """
    pl = _plan(plan)
    bp = _default_backward(pl) if backward_plan is None else _backward_plan(backward_plan)
    if kernel is None:
        kernel = pl.kernels()[0]
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if kernel not in pl.kernels():
        raise ValueError(f"plan {pl.name!r} is for the {pl.kernels()[0]} kernel, not {kernel!r}")
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    for name, b in (("block_m", block_m), ("block_n", block_n)):
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1:
            raise ValueError(f"{name} must be a positive int, got {b!r}")
    if scale is not None:
        scale = _scale_of(scale, 1)
    if kernel == "flash" and bp.exp2 != pl.exp2:
        raise ValueError(
            f"plan {pl.name!r} has exp2={pl.exp2} but backward_plan {bp.name!r} has exp2={bp.exp2}: the backward "
            "reads the forward's lse in the forward's units (log2 with exp2), so the two must agree"
        )
    return AttentionConfig(pl, bp, kernel, bool(causal), int(block_m), int(block_n), scale)


def _numpy(x: torch.Tensor) -> np.ndarray:
    return x.detach().to(device="cpu", dtype=torch.float64).contiguous().numpy()


def _tensor(x: np.ndarray, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x)).to(device=device, dtype=dtype)


_timing_lock = threading.Lock()
_seconds = {"forward": 0.0, "backward": 0.0}
_calls = {"forward": 0, "backward": 0}


def _count(what: str, t0: float) -> None:
    with _timing_lock:
        _seconds[what] += time.perf_counter() - t0
        _calls[what] += 1


def timings(reset: bool = False) -> dict[str, float]:
    """Wall time spent in :func:`attention`'s forward and backward (all threads, since import or the last reset).

    Args:
        reset: set the counters to zero after reading them.

    Returns:
        ``{"forward_s", "backward_s", "forward_calls", "backward_calls"}``: seconds from the tensors' arrival to
        the result tensors (conversions included) and the number of calls.
    """
    with _timing_lock:
        out = {
            "forward_s": _seconds["forward"],
            "backward_s": _seconds["backward"],
            "forward_calls": float(_calls["forward"]),
            "backward_calls": float(_calls["backward"]),
        }
        if reset:
            for d in (_seconds, _calls):
                for key in d:
                    d[key] = 0
    return out


def _mask_numpy(m: torch.Tensor | None) -> np.ndarray | None:
    """An SDPA attn_mask as the emulator takes it: bool stays bool (True keeps), a float mask float64 (exact)."""
    if m is None:
        return None
    m = m.detach().to("cpu")
    if m.dtype == torch.bool:
        return m.contiguous().numpy()
    return m.to(torch.float64).contiguous().numpy()


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cfg, mask=None):
        t0 = time.perf_counter()
        qa, ka, va = _numpy(q), _numpy(k), _numpy(v)
        ctx.mask = mask
        if cfg.kernel == "flash":
            o, m, l = flash(  # noqa: E741
                qa,
                ka,
                va,
                plan=cfg.plan,
                block_m=cfg.block_m,
                block_n=cfg.block_n,
                causal=cfg.causal,
                scale=cfg.scale,
                return_stats=True,
                attn_mask=mask,
            )
            ctx.o, ctx.lse = o, lse_from_stats(m, l, plan=cfg.backward_plan)
        else:
            o = baseline(qa, ka, va, plan=cfg.plan, causal=cfg.causal, scale=cfg.scale, attn_mask=mask)
        ctx.arrays, ctx.cfg = (qa, ka, va), cfg
        ctx.like = tuple((x.dtype, x.device) for x in (q, k, v))
        out = _tensor(o, q.dtype, q.device)
        _count("forward", t0)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        t0 = time.perf_counter()
        cfg = ctx.cfg
        qa, ka, va = ctx.arrays
        do = _numpy(grad_out)
        if cfg.kernel == "flash":
            dq, dk, dv = flash_backward(
                qa,
                ka,
                va,
                ctx.o,
                do,
                ctx.lse,
                plan=cfg.backward_plan,
                block_m=cfg.block_m,
                block_n=cfg.block_n,
                causal=cfg.causal,
                scale=cfg.scale,
                attn_mask=ctx.mask,
            )
        else:
            dq, dk, dv = baseline_backward(
                qa, ka, va, do, plan=cfg.backward_plan, causal=cfg.causal, scale=cfg.scale, attn_mask=ctx.mask
            )
        (tq, dq_dev), (tk, dk_dev), (tv, dv_dev) = ctx.like
        grads = _tensor(dq, tq, dq_dev), _tensor(dk, tk, dk_dev), _tensor(dv, tv, dv_dev)
        _count("backward", t0)
        return grads + (None, None)


def _check_tensors(q: object, k: object, v: object) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if not x.is_floating_point():
            raise TypeError(f"{name} must have a floating dtype, got {x.dtype}")
        if x.dim() != 4:
            raise ValueError(f"{name} must be (batch, heads, seq, head_dim), got shape {tuple(x.shape)}")
    assert isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape[0] != q.shape[0] or v.shape[0] != q.shape[0]:
        raise ValueError(f"q, k, v must share the batch size, got {q.shape[0]}, {k.shape[0]}, {v.shape[0]}")
    if k.shape[1] != v.shape[1]:
        raise ValueError(f"k and v must have as many heads, got {k.shape[1]} and {v.shape[1]}")
    if k.shape[1] < 1 or q.shape[1] % k.shape[1]:
        raise ValueError(f"q's heads ({q.shape[1]}) must be a multiple of k's and v's ({k.shape[1]})")


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    plan: Plan | str | AttentionConfig,
    backward_plan: BackwardPlan | str | None = None,
    kernel: str | None = None,
    causal: bool = False,
    block_m: int = 64,
    block_n: int = 64,
    scale: float | None = None,
    attn_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Emulated attention with an emulated backward, differentiable in q, k, v.

    Args:
        q: (batch, heads, seq_q, head_dim) float tensor (any float dtype, any device: computed on the CPU).
        k: (batch, kv_heads, seq_k, head_dim); v: (batch, kv_heads, seq_k, head_dim_v), q's dtype; kv_heads
            divides heads (grouped-query attention, see the module docstring).
        plan: forward plan or preset name, or an :class:`AttentionConfig` (then the other settings must be left
            at their defaults). backward_plan, kernel, causal, block_m, block_n, scale: see :func:`config`.
        attn_mask: None, or SDPA's mask: a bool tensor (True keeps) or a float tensor added to the scaled
            scores, broadcastable to (batch, heads, seq_q, seq_k) (:func:`simfloat.attention.flash`'s
            ``attn_mask``: how each kernel adds it, and a row that sees no key gives 0, as torch's). Not
            differentiable (a mask that requires grad is an error).

    Returns:
        (batch, heads, seq_q, head_dim_v) tensor of q's dtype and device: the emulator's output cast into it.
        Its gradient runs the emulated backward (flash: on the forward's stored output and lse).

    Raises:
        TypeError, ValueError: bad tensors (named), shapes, dtypes or settings (see :func:`config`); the
            emulator's errors for non-finite values.
    """
    if isinstance(plan, AttentionConfig):
        if (backward_plan, kernel, causal, block_m, block_n, scale) != (None, None, False, 64, 64, None):
            raise ValueError("pass either an AttentionConfig as plan or the settings, not both")
        cfg = plan
    else:
        cfg = config(
            plan=plan,
            backward_plan=backward_plan,
            kernel=kernel,
            causal=causal,
            block_m=block_m,
            block_n=block_n,
            scale=scale,
        )
    _check_tensors(q, k, v)
    if attn_mask is not None:
        if not isinstance(attn_mask, torch.Tensor):
            raise TypeError(f"attn_mask must be a torch.Tensor or None, got {type(attn_mask).__name__}")
        if attn_mask.requires_grad:
            raise NotImplementedError("attn_mask requires grad: the emulator has no gradient for the mask")
        if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
            raise TypeError(f"attn_mask must be bool (True keeps) or floating (added), got {attn_mask.dtype}")
    return _Attention.apply(q, k, v, cfg, _mask_numpy(attn_mask))


# -- the modules making the calls, torch's fast path, and what bypasses SDPA --------------------------------


@dataclass
class _Block:
    """One emulate_sdpa or capture_sdpa block of one thread: how many calls it saw, which modules it warned of."""

    what: str  # "emulate_sdpa" or "capture_sdpa"
    verb: str  # "routed" or "recorded"
    calls: int = 0
    warned: set[int] = field(default_factory=set)


_lock = threading.Lock()
_local = threading.local()  # .stack: [(AttentionConfig, _Block)] of emulate_sdpa; .blocks: [_Block]; .modules
_installed: list[object] = []  # [original sdpa] while any thread is inside emulate_sdpa
_users = [0]
_tracking: dict[str, Any] = {"users": 0, "handles": [], "fastpath": None}
_names: dict[tuple[int, int], str | None] = {}


def _thread(name: str) -> list[Any]:
    out = getattr(_local, name, None)
    if out is None:
        out = []
        setattr(_local, name, out)
    return out


def _count_call() -> None:
    """A call routed or recorded in this thread: every open block and every running module hears of it."""
    for blk in _thread("blocks"):
        blk.calls += 1
    _local.sdpa_calls = getattr(_local, "sdpa_calls", 0) + 1


def _child_name(parent: torch.nn.Module, child: torch.nn.Module) -> str | None:
    key = (id(parent), id(child))
    if key not in _names:
        _names[key] = next((n for n, m in parent.named_modules() if m is child and n), None)
    return _names[key]


def _caller() -> tuple[str, str]:
    """(qualified name, class name) of the innermost module running in this thread, its name taken within the
    outermost one (``"layers.0.self_attn"``; ``""`` for the outermost itself; ``"<no module>"`` outside any)."""
    mods = [m for m, _ in _thread("modules")]
    if not mods:
        return "<no module>", ""
    parts: list[str] = []
    for parent, child in zip(mods, mods[1:], strict=False):
        name = _child_name(parent, child)
        if name is None:  # a module called by one it does not belong to: named from there on
            parts = []
        else:
            parts.append(name)
    return ".".join(parts), type(mods[-1]).__name__


def _pre_hook(module: torch.nn.Module, args: object) -> None:
    _thread("modules").append((module, getattr(_local, "sdpa_calls", 0)))


def _post_hook(module: torch.nn.Module, args: object, out: object) -> None:
    mods = _thread("modules")
    if not mods or mods[-1][0] is not module:
        return
    qualname = _caller()[0]
    _, before = mods.pop()
    blocks = _thread("blocks")
    if not blocks or not isinstance(module, torch.nn.MultiheadAttention):
        return
    if getattr(_local, "sdpa_calls", 0) == before and id(module) not in blocks[-1].warned:
        blk = blocks[-1]
        blk.warned.add(id(module))
        warnings.warn(
            f"{blk.what}: nn.MultiheadAttention {qualname or type(module).__name__!r} computed its attention without "
            f"scaled_dot_product_attention, so it was not {blk.verb}: with need_weights=True (torch's default) it "
            "forms the attention weights itself; call it with need_weights=False (as nn.TransformerEncoderLayer "
            "does) to have it " + blk.verb,
            RoutingWarning,
            stacklevel=2,
        )


@contextlib.contextmanager
def _tracked(what: str, verb: str) -> Iterator[_Block]:
    """While any block is open: module hooks (who makes each call, which MultiheadAttention bypasses SDPA) and
    torch's MHA fast path off (it bypasses SDPA). Yields this thread's new block; warns at its end if it saw no
    call."""
    with _lock:
        if _tracking["users"] == 0:
            mm = torch.nn.modules.module
            _tracking["handles"] = [
                mm.register_module_forward_pre_hook(_pre_hook),
                mm.register_module_forward_hook(_post_hook, always_call=True),
            ]
            _tracking["fastpath"] = torch.backends.mha.get_fastpath_enabled()
            torch.backends.mha.set_fastpath_enabled(False)
        _tracking["users"] += 1
    blk = _Block(what, verb)
    blocks = _thread("blocks")
    blocks.append(blk)
    try:
        yield blk
    finally:
        blocks.remove(blk)
        with _lock:
            _tracking["users"] -= 1
            if _tracking["users"] == 0:
                for h in _tracking["handles"]:
                    h.remove()
                _tracking["handles"] = []
                torch.backends.mha.set_fastpath_enabled(_tracking["fastpath"])
                _names.clear()
    if blk.calls == 0:
        warnings.warn(
            f"{what}: no call of torch.nn.functional.scaled_dot_product_attention was {verb} in this block (code "
            "that bound the function before it, `from torch.nn.functional import scaled_dot_product_attention`, "
            "is not, nor is attention computed by hand)",
            RoutingWarning,
            stacklevel=4,
        )


# -- routing torch.nn.functional.scaled_dot_product_attention ------------------------------------------------


def _routed_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    stack = getattr(_local, "stack", None)
    original = _installed[0] if _installed else torch.nn.functional.scaled_dot_product_attention
    if not stack:  # another thread's emulation: this thread keeps torch's own kernel
        kw = {"attn_mask": attn_mask, "dropout_p": dropout_p, "is_causal": is_causal, "scale": scale}
        return original(query, key, value, enable_gqa=enable_gqa, **kw)  # type: ignore[operator]
    base: AttentionConfig = stack[-1][0]
    if attn_mask is not None and is_causal:
        raise ValueError("emulate_sdpa: pass attn_mask or is_causal=True, not both (as torch requires)")
    if dropout_p != 0.0:
        raise NotImplementedError(f"emulate_sdpa: dropout_p must be 0 (got {dropout_p}): dropout is not emulated")
    if query.dim() == 3:  # (batch, seq, dim): one head
        query, key, value = (x.unsqueeze(1) for x in (query, key, value))
        if attn_mask is not None and attn_mask.dim() == 3:  # (batch, seq_q, seq_k): the head axis
            attn_mask = attn_mask.unsqueeze(1)
        squeeze = True
    else:
        squeeze = False
    if query.dim() == 4 and key.dim() == 4 and key.shape[1] != query.shape[1] and not enable_gqa:
        raise ValueError(
            f"query has {query.shape[1]} heads and key {key.shape[1]}: pass enable_gqa=True for grouped-query "
            "attention (as torch requires)"
        )
    cfg = config(
        plan=base.plan,
        backward_plan=base.backward_plan,
        kernel=base.kernel,
        causal=bool(is_causal),
        block_m=base.block_m,
        block_n=base.block_n,
        scale=scale if scale is not None else base.scale,
    )
    out = attention(query, key, value, plan=cfg, attn_mask=attn_mask)
    _count_call()
    return out.squeeze(1) if squeeze else out


@contextlib.contextmanager
def emulate_sdpa(
    *,
    plan: Plan | str,
    backward_plan: BackwardPlan | str | None = None,
    kernel: str | None = None,
    block_m: int = 64,
    block_n: int = 64,
    scale: float | None = None,
) -> Iterator[AttentionConfig]:
    """Route ``torch.nn.functional.scaled_dot_product_attention`` to :func:`attention` under these settings.

    Inside the block, calls from **this thread** run the emulator (``is_causal`` and ``scale`` are taken from
    each call; a call's ``scale`` overrides the one given here); calls from other threads keep torch's kernel.
    The attribute ``torch.nn.functional.scaled_dot_product_attention`` is replaced while any thread is inside
    such a block (entries and exits under a lock) and restored when the last one leaves; blocks nest (the inner
    settings win until it exits). torch's MHA fast path is off meanwhile (see the module docstring), so
    ``nn.TransformerEncoderLayer`` and ``nn.MultiheadAttention(..., need_weights=False)`` are routed in eval
    mode too.

    Args:
        plan, backward_plan, kernel, block_m, block_n, scale: see :func:`config` (``causal`` comes from each
            call's ``is_causal``).

    Yields:
        The :class:`AttentionConfig` in force (``causal`` False; each call sets its own).

    Raises:
        ValueError: on entry, the errors of :func:`config`; inside, differing head counts without ``enable_gqa``.
        TypeError: on entry, the errors of :func:`config`.
        NotImplementedError: inside, a ``dropout_p`` other than 0, or an ``attn_mask`` that requires grad.

    Warns:
        RoutingWarning: an ``nn.MultiheadAttention`` that computed attention without the function (named), and
            a block that routed no call.
    """
    cfg = config(plan=plan, backward_plan=backward_plan, kernel=kernel, block_m=block_m, block_n=block_n, scale=scale)
    with _lock:
        if _users[0] == 0:
            _installed[:] = [torch.nn.functional.scaled_dot_product_attention]
            torch.nn.functional.scaled_dot_product_attention = _routed_sdpa
        _users[0] += 1
    stack = _thread("stack")
    try:
        with _tracked("emulate_sdpa", "routed") as blk:
            stack.append((cfg, blk))
            try:
                yield cfg
            finally:
                stack.pop()
    finally:
        with _lock:
            _users[0] -= 1
            if _users[0] == 0:
                torch.nn.functional.scaled_dot_product_attention = _installed[0]  # type: ignore[assignment]
                _installed.clear()


# -- recording the calls ---------------------------------------------------------------------------------------


def _stored(x: torch.Tensor) -> np.ndarray:
    """A tensor as the capture file stores it: bfloat16 as float32 (exact), other dtypes as themselves."""
    x = x.detach().to("cpu")
    if x.dtype == torch.bfloat16:
        x = x.to(torch.float32)
    return x.contiguous().numpy()


@contextlib.contextmanager
def capture_sdpa(path: str | os.PathLike[str], *, backward: bool = True) -> Iterator[list[dict[str, Any]]]:
    """Record every ``torch.nn.functional.scaled_dot_product_attention`` call into one file at ``path``.

    Each call's q, k, v (as it received them), its options (``attn_mask``, ``dropout_p``, ``is_causal``,
    ``scale``, ``enable_gqa``), the module that made it (its qualified name in the model, e.g.
    ``"layers.0.self_attn"``, and class) and, when ``backward``, the gradient dO that arrives at its output in
    a backward pass run inside the block (the first one) go into a numpy ``.npz`` file with a JSON index
    (:mod:`simfloat.attribution.captured`), one entry per call, written as the calls come (arrays are not kept
    in memory) and finished when the block exits (also on an error). What the model computes does not change:
    each call runs the function that was in place (torch's, or :func:`emulate_sdpa`'s inside such a block) and
    returns its result, the gradient hooks return nothing. Calls from every thread are recorded. torch's MHA
    fast path is off inside the block (see the module docstring): in eval mode under ``torch.no_grad`` the
    modules then compute through ``scaled_dot_product_attention`` instead of the fused kernel.

    Read the file with :func:`simfloat.attribution.load_capture`; attribute a call with
    ``simfloat.attribute(path, call=N)`` or ``simfloat attribute --inputs PATH --call N``. Calls whose options
    the emulator does not model yet (a mask other than the causal one, dropout) are recorded, and refused at
    attribution with a message naming the option.

    Args:
        path: the file to write (``.npz``; replaced if it exists).
        backward: also record each call's output gradient.

    Yields:
        The index as it grows: one dict per recorded call (``call``, ``module``, ``module_type``, ``dtype``,
        the options, ``shape_q``/``shape_k``/``shape_v``, whether ``attn_mask`` and ``do`` were stored).

    Warns:
        RoutingWarning: as :func:`emulate_sdpa` (an ``nn.MultiheadAttention`` not recorded; no call at all).
    """
    from simfloat.attribution.captured import CaptureWriter

    writer = CaptureWriter(path)
    inner: Callable[..., torch.Tensor] = torch.nn.functional.scaled_dot_product_attention

    def recording(
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
        **extra: Any,
    ) -> torch.Tensor:
        out = inner(
            query,
            key,
            value,
            attn_mask=attn_mask,
            dropout_p=dropout_p,
            is_causal=is_causal,
            scale=scale,
            enable_gqa=enable_gqa,
            **extra,
        )
        module, module_type = _caller()
        entry = dict(
            module=module,
            module_type=module_type,
            dtype=str(query.dtype).removeprefix("torch."),
            dropout_p=float(dropout_p),
            is_causal=bool(is_causal),
            scale=None if scale is None else float(scale),
            enable_gqa=bool(enable_gqa),
            extra=sorted(extra),
        )
        arrays = {"q": _stored(query), "k": _stored(key), "v": _stored(value)}
        if attn_mask is not None:
            arrays["attn_mask"] = _stored(attn_mask)
        i = writer.add_call(entry, arrays)
        _count_call()
        if backward and isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda g: writer.add_grad(i, _stored(g)))
        return out

    torch.nn.functional.scaled_dot_product_attention = recording
    try:
        with _tracked("capture_sdpa", "recorded"):
            yield writer.entries
    finally:
        torch.nn.functional.scaled_dot_product_attention = inner
        writer.close()


def reference_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False, scale: float | None = None
) -> torch.Tensor:
    """Plain torch ``softmax(scale * q @ k^T [mask]) @ v`` in the tensors' dtype (for comparisons; GQA by
    repeating k and v).

    Args:
        q: (batch, heads, seq_q, d); k, v: (batch, kv_heads, seq_k, d[_v]). causal: top-left aligned mask.
        scale: softmax scale (default 1/sqrt(d)).

    Returns:
        (batch, heads, seq_q, d_v) tensor.
    """
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if causal:
        mask = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ v
