"""The GPU validation campaign: cross-validation grids (``validate``, ``validate_bwd``), hardware probes
(``probes``), model fits (``fit``) and the one GPU job (``gpu_run``); the ``simfloat-gpu`` command (``cli``).

Depends on simfloat, :mod:`simfloat_gpu.kernels` and :mod:`simfloat_gpu.interpreter`; nothing imports it.
Nothing is imported here, so that ``TRITON_INTERPRET`` can be set before a kernel module loads.
"""
