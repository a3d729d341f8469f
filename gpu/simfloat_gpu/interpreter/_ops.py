"""The patch table: which replacement :func:`simfloat_gpu.interpreter.faithful` installs for which method of
triton's interpreter (imports triton).

Every replacement takes the place of one method of ``triton.runtime.interpreter.InterpreterBuilder`` (``self``
is the builder), ``ReduceOps``, ``ScanOps`` or ``GridExecutor``. They read the active configuration from
:data:`simfloat_gpu.interpreter._state.STACK` (the innermost ``faithful()`` block) and fall back to the saved
stock method (:data:`~simfloat_gpu.interpreter._state.STOCK`) only for non-floating data (integers, booleans,
pointers), whose stock numerics are exact. A floating-point operation without a model raises
``NotImplementedError`` naming the operation and the dtype. The replacements live by concept: ``_state``
(configuration, carriers, sites), ``_fusion`` (FMA contraction, the launch hook), ``_arith`` (elementwise
arithmetic and comparisons), ``_math`` (exp2/exp/log/sqrt), ``_casts`` (casts, constants), ``_dot``
(``tl.dot``, atomics), ``_reduce`` (reductions, scans) and ``_carriers`` (memory and the stock methods of a
per-site run).
"""

from __future__ import annotations

from triton.runtime import interpreter as ti

from simfloat_gpu.interpreter._arith import (
    FCMP,
    binary_op,
    create_approx_divf,
    create_broadcast,
    create_ceil,
    create_expand_dims,
    create_fabs,
    create_fdiv,
    create_floor,
    create_fma,
    create_fneg,
    create_frem,
    create_precise_divf,
    rounded_binary,
    ternary_op,
    unary_op,
)
from simfloat_gpu.interpreter._carriers import (
    create_bitcast,
    create_masked_load,
    create_masked_store,
    create_splat,
    create_unsplat,
    guarded,
    to_tensor,
    validate_np_data_size,
)
from simfloat_gpu.interpreter._casts import (
    cast_impl,
    convert_float_guard,
    create_fp_to_fp,
    get_bf16,
    get_fp16,
    get_fp32,
    get_fp64,
    get_null_value,
)
from simfloat_gpu.interpreter._dot import create_atomic_rmw, create_dot, create_dot_scaled
from simfloat_gpu.interpreter._fusion import grid_call
from simfloat_gpu.interpreter._math import (
    create_cos,
    create_erf,
    create_exp,
    create_exp2,
    create_log,
    create_log2,
    create_precise_sqrt,
    create_rsqrt,
    create_sin,
    create_sqrt,
)
from simfloat_gpu.interpreter._reduce import (
    generic_reduce,
    generic_scan,
    reduce_min_max,
    reduce_sum,
    scan_cumprod,
    scan_cumsum,
)

# ----------------------------------------------------------------------------------------------------
# the patch table
# ----------------------------------------------------------------------------------------------------

_BUILDER = {
    "binary_op": binary_op,
    "unary_op": unary_op,
    "ternary_op": ternary_op,
    "create_fadd": rounded_binary("add"),
    "create_fsub": rounded_binary("sub"),
    "create_fmul": rounded_binary("mul"),
    "create_fdiv": create_fdiv,
    "create_precise_divf": create_precise_divf,
    "create_approx_divf": create_approx_divf,
    "create_frem": create_frem,
    "create_fneg": create_fneg,
    "create_expand_dims": create_expand_dims,
    "create_broadcast": create_broadcast,
    "create_fma": create_fma,
    "create_floor": create_floor,
    "create_ceil": create_ceil,
    "create_fabs": create_fabs,
    "create_exp": create_exp,
    "create_exp2": create_exp2,
    "create_log": create_log,
    "create_log2": create_log2,
    "create_sqrt": create_sqrt,
    "create_precise_sqrt": create_precise_sqrt,
    "create_rsqrt": create_rsqrt,
    "create_sin": create_sin,
    "create_cos": create_cos,
    "create_erf": create_erf,
    "cast_impl": cast_impl,
    "create_fp_to_fp": create_fp_to_fp,
    "get_bf16": get_bf16,
    "get_fp16": get_fp16,
    "get_fp32": get_fp32,
    "get_fp64": get_fp64,
    "get_null_value": get_null_value,
    "create_splat": create_splat,
    "create_unsplat": create_unsplat,
    "create_bitcast": create_bitcast,
    "create_masked_load": create_masked_load,
    "create_masked_store": create_masked_store,
    "create_dot": create_dot,
    "create_dot_scaled": create_dot_scaled,
    "create_atomic_rmw": create_atomic_rmw,
    **FCMP,
    **{
        n: guarded(n, w, a)
        for n, w, a in (
            ("create_descriptor_load", "a tensor-descriptor load", True),
            ("create_descriptor_store", "a tensor-descriptor store", True),
            ("create_descriptor_gather", "a tensor-descriptor gather", True),
            ("create_descriptor_scatter", "a tensor-descriptor scatter", True),
            ("create_tensor_pointer_load", "a block-pointer load", True),
            ("create_tensor_pointer_store", "a block-pointer store", True),
            ("create_atomic_cas", "an atomic compare-and-swap", False),
            ("create_atomic_load", "an atomic load", False),
            ("create_atomic_store", "an atomic store", False),
        )
    },
}


def patch_table() -> list[tuple[object, str, object]]:
    """(owner, attribute, replacement) for every attribute present in the installed triton."""
    table = [(ti.InterpreterBuilder, name, fn) for name, fn in _BUILDER.items() if name in vars(ti.InterpreterBuilder)]
    table += [
        (ti.ReduceOps, "sum", reduce_sum),
        (ti.ReduceOps, "min_max", reduce_min_max),
        (ti.ReduceOps, "generic_reduce", generic_reduce),
        (ti.ScanOps, "cumsum", scan_cumsum),
        (ti.ScanOps, "cumprod", scan_cumprod),
        (ti.ScanOps, "generic_scan", generic_scan),
        (ti.ReduceScanOpInterface, "to_tensor", to_tensor),
        (ti.GridExecutor, "__call__", grid_call),
        (ti, "_convert_float", convert_float_guard),
        (ti, "_validate_np_data_size", validate_np_data_size),
    ]
    return [(owner, name, fn) for owner, name, fn in table if hasattr(owner, name)]
