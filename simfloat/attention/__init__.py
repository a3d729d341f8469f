"""Emulated attention kernels under precision plans, bit for bit, with error attribution.

* :func:`flash` — flash attention (FA2 online softmax; FA1 and lazy-rescaling variants), mirroring the Triton
  kernel of ``gpu/flash_attention.py`` op for op under a ``triton-<fmt>`` plan.
* :func:`baseline` — standard attention: full scores, softmax, P.V.
* :class:`Plan` / :func:`plan` — the format and rounding of every op (presets: fp64, all-<fmt>, triton-<fmt>,
  pytorch-<fmt>).

Both kernels take (..., seq, head_dim) float32/float64 arrays and return float64 arrays holding values of the
plan's output format; pass ``trace=simfloat.Tracer()`` to attribute the error to ops and kv blocks.
"""

from simfloat.attention.baseline import baseline
from simfloat.attention.flash import flash
from simfloat.attention.plan import BASELINE_OPS, FLASH_OPS, OpSpec, Plan, plan, presets

__all__ = ["BASELINE_OPS", "FLASH_OPS", "OpSpec", "Plan", "baseline", "flash", "plan", "presets"]
