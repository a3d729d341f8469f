"""Sites and site policies of the faithful interpreter: which of a kernel's floating-point ops round as the
hardware does and which compute exactly, one source line at a time.

A *site* is ``(file, line, op)``: the kernel source line executing when a floating-point op runs (the innermost
Python frame outside triton and this package: Triton's interpreter runs the kernel's own Python body) and the
op's name: ``add``, ``sub``, ``mul``, ``div``, ``div_rn``, ``fma``, ``exp``, ``exp2``, ``log``, ``log2``,
``sqrt``, ``sqrt_rn``, ``cast`` (a conversion into a float format), ``const`` (a Python float materialized as
an fp32/fp16/bf16 constant), ``dot``, ``sum``, ``cumsum``, ``cumprod``. Two ops of the same name on one line
are one site. Exact ops (comparisons, min/max, negation, ``tl.where``, loads, stores, reshapes) are no sites. An
add or subtract that faithful() contracts with a multiply (``faithful(contract=...)``, on by default as the GPU
compiles it) is an ``fma`` site at the add's line; the multiply stays a ``mul`` site, whose rounding reaches only
the product's other uses.

Inside :func:`site_run` (itself inside :func:`simfloat_gpu.interpreter.faithful`), every float value of the
kernel is carried as float64 ("carrier"), and a :class:`SitePolicy` decides per site:

* rounding: the op as :func:`faithful` computes it (the hardware's numerics), its result rounded into the
  op's format; its operands are whatever the carriers hold (exact values where earlier sites were exact). The
  correctly rounded defaults take them as they are; a model on float32 arrays (a callable ``exp2``/``log``/
  ``div``... model, a hardware profile's ex2 table, the ``h200-mma`` sum) sees them rounded to nearest fp32
  first; a sequential ``tl.sum`` rounds its first element, then each addition (the emulator's row sum);
* exact: the op in float64 -- elementwise ops rounded once to float64, ``exp``/``exp2`` libm's float64 values,
  ``tl.dot`` ``Sequential("float64")`` (float64 products summed in k order, from the incoming accumulator),
  ``tl.sum`` in the configured order in float64, and casts into a float format the identity.

That is the float64 world of the emulator's ``fp64`` plan, so the all-exact run is the same golden the
emulator's attribution measures against. Memory keeps its dtypes: a float load decodes the stored value, a
store writes the value rounded to nearest into the buffer's dtype and keeps the exact value in a shadow
table by byte address, which later loads of the same run read, and :func:`exact_values` reads back after the
launch. With every site rounding, the carriers hold exactly the values a plain faithful() run stores, so the
outputs are the same bits.

Conversions to integers are no sites: they convert as the hardware does in every run (an integer carries no
fraction), so a kernel that quantizes keeps its integer conversion in the golden run too.

Site runs were built and tested on triton 3.9's interpreter. Not supported in a site run (they raise
``FaithfulNotImplementedError``): float atomics, tensor descriptors and
block pointers, bitcasts of floats; outputs computed by the host after the launch (only what the kernel stores
has exact values). Data-dependent control flow on float values (rare in Triton) may visit different sites in
different runs; :class:`SitePolicy` records what each run visited.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import numpy as np

__all__ = ["Site", "SitePolicy", "SiteVisits", "site_run", "exact_values", "MODES"]

#: policy modes: every site rounds, none does, only the given sites round (isolation), all but them (ablation)
MODES = ("hardware", "exact", "only", "except")


class Site(NamedTuple):
    """One floating-point op of a kernel's source: ``file`` (absolute path), ``line`` (1-based), ``op``."""

    file: str
    line: int
    op: str


@dataclasses.dataclass
class SiteVisits:
    """What one run saw of a site: how many op executions, and (``const`` only) whether rounding the constant
    changed its value."""

    count: int = 0
    inexact: bool = False


class SitePolicy:
    """Which sites round as the hardware does in one :func:`site_run`; records the sites the run visits.

    Args:
        mode: ``"hardware"`` (every site rounds), ``"exact"`` (none), ``"only"`` (only ``sites`` round: their
            isolation) or ``"except"`` (every site but ``sites``: their ablation).
        sites: the sites of ``"only"`` / ``"except"``.

    Raises:
        ValueError: unknown mode, or sites given to ``"hardware"`` / ``"exact"``.
    """

    def __init__(self, mode: str, sites: Iterable[Site] = ()) -> None:
        if mode not in MODES:
            raise ValueError(f"SitePolicy mode must be one of {', '.join(MODES)}, got {mode!r}")
        chosen = frozenset(Site(*s) for s in sites)
        if chosen and mode in ("hardware", "exact"):
            raise ValueError(f"SitePolicy({mode!r}) takes no sites")
        self.mode = mode
        self.sites = chosen
        #: every site visited, in the order first visited
        self.visits: dict[Site, SiteVisits] = {}

    def rounds(self, site: Site) -> bool:
        """Whether ``site`` rounds under this policy."""
        if self.mode == "hardware":
            return True
        if self.mode == "exact":
            return False
        return (site in self.sites) == (self.mode == "only")

    def visit(self, site: tuple[str, int, str], inexact: bool = False) -> bool:
        """Called by the interpreter's ops: records the visit, returns whether the op rounds."""
        s = Site(*site)
        v = self.visits.get(s)
        if v is None:
            v = self.visits[s] = SiteVisits()
        v.count += 1
        v.inexact = v.inexact or inexact
        return self.rounds(s)


@contextlib.contextmanager
def site_run(policy: SitePolicy) -> Iterator[SitePolicy]:
    """Run interpreted kernels under ``policy`` inside the block (see the module docstring). Read the kernel's
    outputs with :func:`exact_values` before the block ends.

    Raises:
        RuntimeError: no :func:`simfloat_gpu.interpreter.faithful` block is active, or site runs are nested.
        TypeError: ``policy`` is not a :class:`SitePolicy`.
    """
    if not isinstance(policy, SitePolicy):
        raise TypeError(f"site_run() takes a SitePolicy, got {type(policy).__name__}")
    from simfloat_gpu.interpreter import _state

    if not _state.STACK:
        raise RuntimeError("site_run() must be used inside a simfloat_gpu.interpreter.faithful() block")
    if _state.POLICY:
        raise RuntimeError("site_run() blocks do not nest")
    _state.SHADOW.clear()
    _state.POLICY.append(policy)
    try:
        yield policy
    finally:
        _state.POLICY.pop()
        _state.SHADOW.clear()


def exact_values(tensor: Any) -> np.ndarray:
    """The float64 values of a CPU float tensor (torch) after a launch inside :func:`site_run`: where the kernel
    stored an element in this run, the exact value it stored; elsewhere the tensor's own value.

    Args:
        tensor: a strided CPU torch tensor of a float dtype, any shape.

    Returns:
        float64 ndarray of the tensor's shape.

    Raises:
        RuntimeError: called outside :func:`site_run`.
        TypeError: not a float tensor on the CPU.
    """
    from simfloat_gpu.interpreter import _state

    if not _state.POLICY:
        raise RuntimeError("exact_values() reads the shadow of a site run: call it inside site_run()")
    if not (hasattr(tensor, "data_ptr") and hasattr(tensor, "stride") and tensor.is_floating_point()):
        raise TypeError(f"exact_values() takes a float torch tensor, got {type(tensor).__name__}")
    if tensor.device.type != "cpu":
        raise TypeError(f"exact_values() takes a CPU tensor, got one on {tensor.device}")
    vals = tensor.detach().double().numpy().copy()
    if not _state.SHADOW or vals.size == 0:
        return vals
    offs = np.zeros((), dtype=np.int64)
    for size, stride in zip(tensor.shape, tensor.stride(), strict=True):
        offs = offs[..., None] + np.arange(size, dtype=np.int64) * stride
    addrs = tensor.data_ptr() + offs * tensor.element_size()
    shadow = _state.SHADOW
    flat = vals.reshape(-1)
    for i, a in enumerate(np.asarray(addrs).reshape(-1).tolist()):
        v = shadow.get(a)
        if v is not None:
            flat[i] = v
    return flat.reshape(vals.shape)
