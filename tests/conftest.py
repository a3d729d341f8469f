"""Shared test set-up.

Triton reads TRITON_INTERPRET when it is first imported (it wraps tl.sum and friends then), so it is set here,
before any test module can import triton: every Triton kernel in the suite runs on the CPU interpreter.

Helper modules next to the tests (the exact rounding reference ``oracle``) import by their plain name under
any pytest import mode.

simfloat is imported here, in the process that starts the run: its stale-cache check (``simfloat._jit``) then
runs once before pytest-xdist starts its workers, which import it again and find the stamp written.
"""

import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")

_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

import simfloat  # noqa: E402, F401  (after TRITON_INTERPRET: simfloat never imports triton, but keep the order)
