"""Triton kernels whose knobs mirror simfloat's emulator, a faithful CPU execution mode for Triton, and
cross-validation. Depends on simfloat; simfloat never imports gpu.

Nothing is imported here on purpose: ``@triton.jit`` chooses between the compiled kernel and the CPU
interpreter when a kernel module is *imported* (it reads ``TRITON_INTERPRET`` at decoration time), so
callers must be free to set that variable before importing e.g. :mod:`gpu.flash_attention`.
"""
