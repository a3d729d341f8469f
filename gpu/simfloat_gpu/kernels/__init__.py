"""The Triton kernels the emulator mirrors: ``flash_attention`` (FA2 forward), ``flash_attention_bwd`` (FA2
backward), ``int8_attention`` (INT-FlashAttention), ``fp8_attention`` (FlashAttention-3 style FP8) and
``sage_attention`` (SageAttention2 style INT8 / FP8). Each documents its op order with the step labels
(T1..T14, ...) that simfloat's plans use; what the forward kernels share (a query tile's prologue and
epilogue, the launchers' checks) is in ``common``.

Nothing is imported here: ``@triton.jit`` chooses between the compiled kernel and the CPU interpreter when a
kernel module is imported (it reads ``TRITON_INTERPRET`` then), so callers must be free to set that variable
before importing e.g. :mod:`simfloat_gpu.kernels.flash_attention`.
"""
