"""FMA contraction (fp fusion) of the Triton interpreter's float multiplies and adds, and the launch hook
that notes a launch's ``enable_fp_fusion`` keyword.

FMA contraction (fp fusion): a multiply's handle carries its exact operands; an add or subtract that
consumes it in the same straight-line code computes fma(a, b, +-c) rounded once, as LLVM's NVPTX backend
does with fp fusion on (every fadd/fsub whose operand is an fmul of the same basic block, whatever the
fmul's other uses: NVPTX enables aggressive FMA fusion). Every other consumer reads the handle's data, the
rounded product.
"""

from __future__ import annotations

import ast
import linecache
import os

import numpy as np
from triton.runtime import interpreter as ti

from simfloat_gpu.interpreter._formats import decode
from simfloat_gpu.interpreter._state import LAUNCH_FUSION, SKIP_DIRS, cfg, kernel_frame, stock_method

#: attribute of a multiply's TensorHandle: (a, b, origin), origin = the multiply's :func:`call_chain`
PRODUCT = "_simfloat_product"
#: filename -> (source lines, ((first line, last line) of every for/while loop, ...) or None)
_LOOPS: dict = {}


def contracting() -> bool:
    """Whether the launch in progress contracts multiply-adds: ``faithful(contract=True/False)`` decides when
    given; otherwise the launch's ``enable_fp_fusion`` keyword, else Triton's default (``contract_default``)."""
    c = cfg()
    if c.contract is not None:
        return bool(c.contract)
    if LAUNCH_FUSION and LAUNCH_FUSION[-1] is not None:
        return bool(LAUNCH_FUSION[-1])
    return bool(c.contract_default)


def _loops(filename: str):
    """(first, last) lines of every ``for``/``while`` loop of a source file, or None if it cannot be read."""
    lines = linecache.getlines(filename)
    hit = _LOOPS.get(filename)
    if hit is not None and hit[0] is lines:
        return hit[1]
    loops = None
    if lines:
        try:
            tree = ast.parse("".join(lines))
        except (SyntaxError, ValueError):
            tree = None
        if tree is not None:
            kinds = (ast.For, ast.AsyncFor, ast.While)
            loops = tuple((n.lineno, n.end_lineno or n.lineno) for n in ast.walk(tree) if isinstance(n, kinds))
    _LOOPS[filename] = (lines, loops)
    return loops


def _innermost(loops, line: int):
    best = None
    for lo, hi in loops:
        if lo <= line <= hi and (best is None or lo > best[0]):
            best = (lo, hi)
    return best


def call_chain(frame) -> tuple:
    """((frame, line, instruction offset), ...) of the kernel frames from ``frame`` out to the launch: the
    kernel's line, the lines of the @jit helpers' calls (Triton inlines them: one function on the GPU). The
    frames themselves are kept (a finished helper's frame stays distinct from a later call's)."""
    chain = []
    f = frame
    while f is not None and f.f_code is not _GRID_CALL_CODE:
        if not os.path.abspath(f.f_code.co_filename).startswith(SKIP_DIRS):
            chain.append((f, f.f_lineno, f.f_lasti))
        f = f.f_back
    return tuple(chain)


def _in_loop(code, line: int) -> bool:
    loops = _loops(code.co_filename)
    return loops is None or _innermost(loops, line) is not None


def same_block(origin: tuple, chain: tuple) -> bool:
    """Whether a multiply made at ``origin`` (its :func:`call_chain`) and an add executing at ``chain`` lie in one
    basic block of the compiled kernel, as far as the source shows. In the innermost function call both are in
    (helpers are inlined), at lines ``m`` and ``a`` (an op inside a helper counts at the helper's call): the add
    a later instruction than the multiply (not the same call made again), inside the same innermost loop, with
    no loop starting in between; inside a helper the op is in none of the helper's loops. ``if`` statements do
    not separate (Triton resolves constexpr conditions at compile time, LLVM turns small runtime ones into
    selects). Source that cannot be read (a kernel made by ``exec``): the same line only."""
    if not origin or not chain:
        return False
    # the innermost frame both chains share (frames compared from the launch inwards)
    k = 0
    while k < min(len(origin), len(chain)) and origin[-1 - k][0] is chain[-1 - k][0]:
        k += 1
    if k == 0:
        return False
    for f, line, _ in origin[: len(origin) - k] + chain[: len(chain) - k]:
        if _in_loop(f.f_code, line):
            return False
    frame, line_m, pos_m = origin[len(origin) - k]
    _, line_a, pos_a = chain[len(chain) - k]
    if pos_a <= pos_m:  # an earlier instruction, or the same call again: another iteration
        return False
    if line_a == line_m:
        return True
    code = frame.f_code
    loops = _loops(code.co_filename)
    if loops is None:
        return False
    if _innermost(loops, line_m) != _innermost(loops, line_a):
        return False
    return not any(line_m < lo <= line_a for lo, _ in loops)


def fused_operands(op: str, lhs, rhs, name: str):
    """(a, b, c) of the fma an add/sub contracts to (``p - c`` -> fma(a, b, -c), ``c - p`` -> fma(-a, b, c);
    with two products the left one is fused, LLVM's choice when their use counts tie), or None."""
    chain = None
    for side, h in ((0, lhs), (1, rhs)):
        prod = getattr(h, PRODUCT, None)
        if prod is None or h.dtype != lhs.dtype:
            continue
        if chain is None:
            chain = call_chain(kernel_frame())
        a, b, origin = prod
        if not same_block(origin, chain):
            continue
        c = decode((rhs if side == 0 else lhs).data, name)
        if op == "add":
            return a, b, c
        return (a, b, np.negative(c)) if side == 0 else (np.negative(a), b, c)
    return None


def carry_product(src, out, transform) -> None:
    """A value-preserving op on a product (negation, expand_dims, broadcast: no instruction on the GPU, or one
    LLVM folds into the fma) passes its operands on, transformed."""
    prod = getattr(src, PRODUCT, None)
    if prod is not None and out is not src:
        a, b, origin = prod
        setattr(out, PRODUCT, (*transform(a, b), origin))


def grid_call(self, *args, **kwargs):
    """``GridExecutor.__call__`` (a launch): notes the launch's ``enable_fp_fusion`` keyword for
    :func:`contracting` (the stock interpreter drops it)."""
    fusion = kwargs.get("enable_fp_fusion")
    if fusion is not None and not isinstance(fusion, bool):
        raise TypeError(f"enable_fp_fusion must be a bool, got {type(fusion).__name__}")
    LAUNCH_FUSION.append(fusion)
    try:
        return stock_method(ti.GridExecutor, "__call__")(self, *args, **kwargs)
    finally:
        LAUNCH_FUSION.pop()


_GRID_CALL_CODE = grid_call.__code__
