"""The vector engine of the forward flash kernel: one loop for every plan, with or without quantizers
(:mod:`~simfloat.attention.vector.forward`), bit for bit the reference engine's
(:mod:`simfloat.attention.reference`), which this package never imports.
"""
