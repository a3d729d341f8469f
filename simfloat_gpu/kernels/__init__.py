"""The Triton kernels the emulator mirrors: ``flash_attention`` (FA2 forward), ``flash_attention_bwd`` (FA2
backward), ``int8_attention`` and ``fp8_attention``. Each documents its op order with the step labels
(T1..T14, ...) that simfloat's plans use.

Nothing is imported here: ``@triton.jit`` chooses between the compiled kernel and the CPU interpreter when a
kernel module is imported (it reads ``TRITON_INTERPRET`` then), so callers must be free to set that variable
before importing e.g. :mod:`simfloat_gpu.kernels.flash_attention`.
"""
