"""simfloat's GPU side, three packages that simfloat itself never imports:

* :mod:`simfloat_gpu.kernels`: the Triton kernels whose knobs mirror the emulator's plans;
* :mod:`simfloat_gpu.interpreter`: ``faithful()``, Triton's CPU interpreter with simfloat's numerics, usable
  on any Triton kernel;
* :mod:`simfloat_gpu.campaign`: cross-validation, hardware probes, fits and the GPU job (``simfloat-gpu``).

Nothing is imported here on purpose (see :mod:`simfloat_gpu.kernels`).
"""

#: the version of the simfloat-emu-gpu distribution (gpu/pyproject.toml reads it)
__version__ = "0.1.0"

#: what a message about missing torch / triton tells the user to run (the distribution that installs this
#: package with its dependencies)
INSTALL_HINT = "pip install 'simfloat-emu-gpu'"
