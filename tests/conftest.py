"""Shared test set-up.

Triton reads TRITON_INTERPRET when it is first imported (it wraps tl.sum and friends then), so it is set here,
before any test module can import triton: every Triton kernel in the suite runs on the CPU interpreter.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
