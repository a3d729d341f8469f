"""Where an attention kernel's numeric error comes from: per-op isolation and ablation, tile and
rescaling-step studies, flash vs baseline, and per-kv-block traces, all against the float64 golden output.

* :func:`attribute` — the whole study for one or more flash plans; returns an :class:`Attribution`.
* :func:`isolation_plan`, :func:`ablation_plan`, :func:`reference_plan` — the plans it runs.
* :func:`baseline_plan_for` / :data:`BASELINE_PAIRS` — which baseline plan a flash plan is compared with.
* :func:`load_capture` / :class:`SdpaCall` — a model's own attention calls, recorded by
  :func:`simfloat.torch.capture_sdpa`, which :func:`attribute` takes.
* :class:`Estimate` — how long an attribution will take (``attribute(..., estimate=...)``).
* :func:`deviation` — the metrics (max_abs, mean_abs, rms, rel_rms); :func:`literature` — the literature's
  (:data:`LITERATURE`, :mod:`simfloat.metrics`), added to the flash-vs-baseline table.

pandas is needed for the tables, matplotlib for ``Attribution.plot``, tqdm for progress bars.
"""

from simfloat.attribution._core import (
    LITERATURE,
    METRICS,
    AttributionInterrupted,
    attribute,
    default_block_ns,
    default_tiles,
    deviation,
    literature,
    select_rows,
)
from simfloat.attribution._estimate import Estimate
from simfloat.attribution._plans import (
    BASELINE_PAIRS,
    ablation_plan,
    baseline_plan_for,
    describe,
    isolation_plan,
    reference_plan,
)
from simfloat.attribution._result import Attribution
from simfloat.attribution.captured import Capture, SdpaCall, load_capture

__all__ = [
    "BASELINE_PAIRS",
    "LITERATURE",
    "METRICS",
    "Attribution",
    "AttributionInterrupted",
    "Capture",
    "Estimate",
    "SdpaCall",
    "ablation_plan",
    "attribute",
    "baseline_plan_for",
    "default_block_ns",
    "default_tiles",
    "describe",
    "deviation",
    "isolation_plan",
    "literature",
    "load_capture",
    "reference_plan",
    "select_rows",
]
