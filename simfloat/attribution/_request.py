"""attribute()'s arguments once checked (:func:`simfloat.attribution._core.attribute` builds it)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simfloat.attention import Plan
from simfloat.attribution.captured import SdpaCall


@dataclass(frozen=True)
class Request:
    """attribute()'s arguments, checked: the operands (NaN/inf and head counts checked), plans, ops, tiles,
    the evaluated rows ``sel`` (None: all) and the traced rows ``t_sel`` (indices into the evaluated ones)."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    causal: bool
    scale: float | None
    rec: SdpaCall | None
    plans: list[Plan]
    ops: list[str]
    bm: int
    bn: int
    sel: np.ndarray | None
    tile_list: list[tuple[int, int]]
    bns: list[int]
    pairs: dict[str, Plan]
    t_sel: np.ndarray
    mask: np.ndarray | None = None  # (..., evaluated rows, seq_k): a masked call's dense mask, or None

    @property
    def seq_q(self) -> int:
        return int(self.q.shape[-2])

    @property
    def seq_k(self) -> int:
        return int(self.k.shape[-2])
