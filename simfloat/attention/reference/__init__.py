"""The scalar reference engine of the forward flash kernel: one loop for every plan, with or without quantizers
(one rounding at a time; the test oracle of the vector engine, and where traces are recorded).

:mod:`~simfloat.attention.reference.forward` holds the loop (:func:`~simfloat.attention.reference.forward.units`)
and its records: the operands (:class:`~simfloat.attention.reference.forward.Operands`, in ``_operands``), the
tracer's record arrays with the plan's op columns (:class:`~simfloat.attention.reference.forward.Trace`, in
``_trace`` with the trace hooks), the float64 shadow of traced runs (``_shadow``) and the params
(:class:`simfloat.attention._flash_params.FlashParams`); :mod:`~simfloat.attention.reference.backward` the
backward loop.
"""
