"""Accumulation models for dot products and matrix products, and the tensor-core presets.

A model says how ``c + sum_k a[k] * b[k]`` is accumulated, rounding by rounding:

* :class:`Sequential` — ``c = round(c + a[k]*b[k])`` in order of k; products exact (one rounding per step, what an
  FMA loop does) or rounded into ``product_fmt`` first.
* :class:`Chunked` — k split into chunks of ``chunk``; each chunk accumulated from zero with an inner model; the
  chunk results added to ``c`` in order (split-k with ``chunk = ceil(K / splits)``, see :func:`split_k`).
* :class:`BlockFMA` — the tensor-core model: the exact products of each block of ``block`` consecutive k,
  together with the incoming accumulator, are aligned to the largest exponent among them (a product's own
  exponent, as Fasi et al. 2021 and Khattak & Mikaitis 2025 describe it, or the sum of its operands' exponents,
  as MMA-Sim, Xie et al. 2025, models it) and truncated (toward zero, sign-magnitude) to
  ``fraction_bits`` bits below that exponent; the aligned terms are summed exactly, normalized once and rounded
  into ``out_fmt`` with ``out_mode`` (toward zero for fp32 output). The result re-enters the next block as its
  accumulator.
* :class:`Interleaved` — k reordered before a :class:`BlockFMA`: each chunk's groups of consecutive k dealt in
  turn into the chunk's MMA steps (how Triton feeds fp8 operands, converted to fp16, to mma.sync on sm_90:
  :func:`fp8_mma_sync`).

Every model checks its formats and modes when it is made (a misspelt mode is a ValueError at once, naming the
field).

:func:`tensor_core` returns the presets (sm70, sm80, sm89, sm90, sm100, sm120; per MMA instruction,
:data:`INSTRUCTIONS`; fp32 or fp16 results; block-scaled kinds run through :func:`matmul_scaled`);
:func:`matmul` and :func:`dot` apply any other model.

The package, one layer each: :mod:`~simfloat.accumulate.models` (the model records),
:mod:`~simfloat.accumulate.presets` (the instruction table and the tensor-core presets),
:mod:`~simfloat.accumulate.scalar` (the scalar dots, one rounding at a time: the reference),
``_rows`` (the vector row kernels, bit for bit the scalar dots), :mod:`~simfloat.accumulate.api` (the products).
"""

from simfloat.accumulate.api import dot, matmul, matmul_scaled
from simfloat.accumulate.models import (
    AccParams,
    BlockFMA,
    Chunked,
    Interleaved,
    Model,
    Sequential,
    acc_params,
    split_k,
)
from simfloat.accumulate.presets import INSTRUCTIONS, VARIANTS, fp8_mma_sync, tensor_core
from simfloat.accumulate.scalar import dot_acc, dot_scaled_acc

__all__ = [
    "INSTRUCTIONS",
    "VARIANTS",
    "AccParams",
    "BlockFMA",
    "Chunked",
    "Interleaved",
    "Model",
    "Sequential",
    "acc_params",
    "dot",
    "dot_acc",
    "dot_scaled_acc",
    "fp8_mma_sync",
    "matmul",
    "matmul_scaled",
    "split_k",
    "tensor_core",
]
