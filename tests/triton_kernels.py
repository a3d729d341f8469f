"""Triton kernels shared by the stock-interpreter and faithful-interpreter tests: the same kernel shows a stock
failure in one file and its fix in the other. Imported only after TRITON_INTERPRET=1 is set (tests/conftest.py)."""

import triton
import triton.language as tl


@triton.jit
def _cast_kernel(X, Y, n, BLOCK: tl.constexpr):
    r = tl.arange(0, BLOCK)
    x = tl.load(X + r, mask=r < n)
    tl.store(Y + r, x.to(Y.dtype.element_ty), mask=r < n)


@triton.jit
def _cast_rounding_kernel(X, Y, n, BLOCK: tl.constexpr, ROUNDING: tl.constexpr):
    r = tl.arange(0, BLOCK)
    x = tl.load(X + r, mask=r < n)
    tl.store(Y + r, x.to(Y.dtype.element_ty, fp_downcast_rounding=ROUNDING), mask=r < n)


@triton.jit
def _fma_kernel(A, B, C, Y, N: tl.constexpr):
    r = tl.arange(0, N)
    tl.store(Y + r, tl.fma(tl.load(A + r), tl.load(B + r), tl.load(C + r)))
