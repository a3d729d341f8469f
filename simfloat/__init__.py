"""simfloat: bit-exact CPU emulation of low-precision floating point and of attention kernels.

Imports need only numpy and numba; torch, triton, pandas and matplotlib load lazily where used.
"""

from simfloat import attention, bounds, ops
from simfloat.accumulate import BlockFMA, Chunked, Sequential, dot, matmul, split_k, tensor_core
from simfloat.attribution import Attribution, attribute
from simfloat.blockscale import BlockFormat, BlockQuantized, block_format, quantize_block
from simfloat.explanation import Explanation, explain
from simfloat.formats import (
    FloatFormat,
    bfloat16,
    float4_e2m1fn,
    float6_e2m3fn,
    float6_e3m2fn,
    float8_e3m4,
    float8_e4m3,
    float8_e4m3fn,
    float8_e4m3fnuz,
    float8_e5m2,
    float8_e5m2fnuz,
    float8_e8m0fnu,
    float16,
    float32,
    float64,
    format,
    formats,
    tfloat32,
    ue4m3,
)
from simfloat.rounding import RoundingMode, round
from simfloat.tolerances import Tolerance, tolerance
from simfloat.trace import Tracer

__version__ = "0.1.0"

__all__ = [
    "Attribution",
    "BlockFMA",
    "BlockFormat",
    "BlockQuantized",
    "block_format",
    "quantize_block",
    "Chunked",
    "Sequential",
    "Explanation",
    "Tolerance",
    "Tracer",
    "attention",
    "attribute",
    "bounds",
    "dot",
    "explain",
    "matmul",
    "ops",
    "split_k",
    "tensor_core",
    "tolerance",
    "FloatFormat",
    "RoundingMode",
    "bfloat16",
    "float4_e2m1fn",
    "float6_e2m3fn",
    "float6_e3m2fn",
    "float8_e3m4",
    "float8_e4m3",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "float16",
    "float32",
    "float64",
    "format",
    "formats",
    "round",
    "tfloat32",
    "ue4m3",
]
