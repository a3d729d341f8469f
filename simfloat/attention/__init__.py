"""Emulated attention kernels under precision plans, bit for bit, with error attribution.

* :func:`flash` — flash attention (FA2 online softmax; FA1 and lazy-rescaling variants), mirroring the Triton
  kernel of ``simfloat_gpu/kernels/flash_attention.py`` op for op under a ``triton-<fmt>`` plan.
* :func:`flash_backward` / :func:`baseline_backward` — the backward pass (dq, dk, dv) under a
  :class:`BackwardPlan`, mirroring ``simfloat_gpu/kernels/flash_attention_bwd.py`` / torch's eager autograd.
* :func:`baseline` — standard attention: full scores, softmax, P.V.
* :func:`flash_varlen` — packed variable-length sequences (cumulative offsets); :func:`flash_decode` — decode
  over a (paged) KV cache, with split-KV and the combine (:func:`combine_splits`).
* :class:`Plan` / :func:`plan` — the format and rounding of every op, quantizers (:class:`Quant`) included for the
  quantized kernels; one preset table (fp64, all-<fmt>, triton-<fmt>, h200-<fmt>, pytorch-<fmt>; int8-*, fp8-*,
  sage2-*, sage3-*, ...). ``QuantPlan``, ``quant_plan`` and ``quant_presets`` are deprecated aliases.
* :func:`int8_flash` / :func:`fp8_flash` — quantized flash attention (INT-FlashAttention; FlashAttention-3
  FP8 scaling, incoherent processing), mirroring ``simfloat_gpu/kernels/int8_attention.py`` /
  ``simfloat_gpu/kernels/fp8_attention.py`` op for
  op under a :class:`Plan` whose quantizers (:class:`Quant`) are ops like any other (:func:`flash` runs such a
  plan too).

Both kernels take (..., seq, head_dim) float32/float64 arrays and return float64 arrays holding values of the
plan's output format; pass ``trace=simfloat.Tracer()`` to attribute the error to ops and kv blocks.
"""

from simfloat.attention._inputs import InputFormatWarning, KernelOverflowWarning
from simfloat.attention.backward import (
    BACKWARD_STATES,
    TRACED_BACKWARD_OPS,
    baseline_backward,
    flash_backward,
    lse_from_stats,
)
from simfloat.attention.backward_plan import BACKWARD_OPS, BackwardPlan, backward_plan, backward_presets
from simfloat.attention.baseline import baseline
from simfloat.attention.decode import COMBINES, combine_splits, flash_decode, kv_splits, num_splits_heuristic
from simfloat.attention.flash import flash
from simfloat.attention.plan import (
    BASELINE_OPS,
    FLASH_OPS,
    OpSpec,
    Plan,
    QuantPlan,
    plan,
    presets,
    quant_plan,
    quant_presets,
    sum_once,
)
from simfloat.attention.quant import EXACT, QUANTIZERS, Quant
from simfloat.attention.quant_plan import QUANT_OPS
from simfloat.attention.quantized import (
    fp8_flash,
    hadamard_rotation,
    int8_flash,
    mean_key,
    quant_flash,
    quantize,
    smooth_keys,
    smooth_queries,
)
from simfloat.attention.tiling import fa1_tiles
from simfloat.attention.varlen import check_cu_seqlens, flash_varlen

__all__ = [
    "BACKWARD_OPS",
    "BACKWARD_STATES",
    "COMBINES",
    "BASELINE_OPS",
    "EXACT",
    "FLASH_OPS",
    "QUANTIZERS",
    "QUANT_OPS",
    "TRACED_BACKWARD_OPS",
    "BackwardPlan",
    "InputFormatWarning",
    "KernelOverflowWarning",
    "OpSpec",
    "Plan",
    "Quant",
    "QuantPlan",
    "backward_plan",
    "backward_presets",
    "baseline",
    "baseline_backward",
    "check_cu_seqlens",
    "combine_splits",
    "fa1_tiles",
    "flash",
    "flash_backward",
    "flash_decode",
    "flash_varlen",
    "fp8_flash",
    "hadamard_rotation",
    "int8_flash",
    "kv_splits",
    "lse_from_stats",
    "num_splits_heuristic",
    "plan",
    "presets",
    "mean_key",
    "quant_flash",
    "quant_plan",
    "quant_presets",
    "quantize",
    "smooth_keys",
    "smooth_queries",
    "sum_once",
]
