"""Studies at scale: a grid of runs (a TOML SPEC) on Dask, each finished run committed at once to a resumable
SQLite store, and a report of the store as tables and plots.

* :func:`run_sweep` — run the configs of a SPEC that the store lacks; returns a :class:`SweepResult`.
* :func:`load` — the store as a pandas DataFrame, one row per finished run.
* :func:`load_spec` — read, check and expand a SPEC (:class:`Spec`; errors are :class:`SpecError`).
* :func:`report` — per metric a CSV, a markdown table and a plot, grouped by grid axes.

Dask (``dask.distributed``) is needed only to run a sweep, pandas to load a store, matplotlib for the plots
(the ``sweep`` extra); none of them is imported with this package.
"""

from simfloat.sweep.report import Report, report
from simfloat.sweep.runner import SweepResult, run_sweep
from simfloat.sweep.spec import BUILTIN_KINDS, Spec, SpecError, config_hash, load_spec
from simfloat.sweep.store import load

__all__ = [
    "BUILTIN_KINDS",
    "Report",
    "Spec",
    "SpecError",
    "SweepResult",
    "config_hash",
    "load",
    "load_spec",
    "report",
    "run_sweep",
]
