"""FlashAttention-4's (sm100) mix of its software exp2 with the hardware exp2, as data for the forward loop.

The kernel (``flash_attn/cute/flash_fwd_sm100.py``, ``softmax.py``) computes P for a row of a 128-key tile in
four fragments of 32 elements; within a fragment the pairs of elements take the polynomial exp2
(:func:`simfloat.hardware.ex2_poly_f32`) or the hardware's by position, from three numbers ``(freq, res,
start_frg)`` that its tuning table picks per head dim, causal mask and fp8 inputs (the table of the source read,
flash-attention at commit 0251105, August 2026). :func:`ex2_schedule` resolves that table; :func:`ex2_poly_mask`
turns a schedule into the per-position flags the loops read (``FlashParams.ex2_poly``).

Not modelled: the pack-GQA override (``freq`` 32 or 10 for packed GQA without a causal mask), local attention
and SM103 (which uses the hardware exp2 only); the 2-CTA choice follows the interface's rule for a dense batch.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["FA4_TILE_N", "ex2_poly_mask", "ex2_schedule"]

#: FlashAttention-4's key tile (``n_block_size``) and the fragment the exp2 mix is laid out over
FA4_TILE_N = 128
_FRG = 32
#: (2-CTA, causal, padded head dim) -> (freq, res, start_frg): the published tuning knobs (sm100, not sm103)
_TUNING: dict[tuple[bool, bool, int], tuple[int, int, int]] = {
    (True, False, 128): (10, 4, 1),
    (False, True, 128): (16, 4, 1),
    (True, False, 192): (16, 4, 0),
    (False, True, 192): (32, 4, 1),
    (True, False, 256): (14, 6, 0),
    (True, True, 256): (14, 6, 0),
}
#: the fp8 overrides (head dims >= 96)
_FP8_TUNING: dict[tuple[bool, bool, int], tuple[int, int, int]] = {
    (True, False, 128): (10, 4, 1),
    (False, True, 128): (8, 4, 1),
}


def ex2_schedule(head_dim: int, head_dim_v: int, causal: bool, seq_q: int, fp8: bool) -> tuple[int, int, int]:
    """FlashAttention-4's ``(freq, res, start_frg)`` for a dense forward call (``freq`` 0: hardware exp2 only).

    Args:
        head_dim, head_dim_v: the head dims of Q/K and V (padded to multiples of 16 as the kernel does).
        causal: the causal mask; seq_q: query rows (the 2-CTA kernel needs more than 256); fp8: fp8 inputs.
    """
    hd = int(math.ceil(head_dim / 16) * 16)
    hdv = int(math.ceil(head_dim_v / 16) * 16)
    if hd == 256 and hdv == 256:  # the dedicated 2-CTA head-dim-256 kernel (its own defaults: freq 4, res 3, start 0)
        return _TUNING.get((True, causal, 256), (4, 3, 0))
    two_cta = (not causal) and hd in (128, 192) and hdv == 128 and seq_q > 2 * FA4_TILE_N
    tune = _TUNING.get((two_cta, causal, hd))
    enable = hd <= 128 or (hd == 192 and two_cta and not causal)
    if fp8 and hd >= 96 and (two_cta, causal, hd) in _FP8_TUNING:
        tune = _FP8_TUNING[(two_cta, causal, hd)]
    if tune is not None:
        enable = tune[0] > 0
    if not enable:
        return (0, 4, 1)
    freq, res, start = tune if tune is not None else (16, 4, 1)
    return (freq, res, start)


def ex2_poly_mask(schedule: tuple[int, int, int], block_n: int, bn: int) -> np.ndarray:
    """(bn,) int8, read-only: 1 where a key position of the 128-key tile takes the polynomial exp2.

    Args:
        schedule: ``(freq, res, start_frg)``; block_n: the tile requested; bn: the tile run (``block_n``
            clamped to a shorter sequence: the first ``bn`` positions of the one tile).

    Raises:
        ValueError: a schedule with freq > 0 and ``block_n`` not 128 (the mix is laid out over the kernel's tile).
    """
    freq, res, start = schedule
    mask = np.zeros(FA4_TILE_N, dtype=np.int8)
    if freq > 0:
        if block_n != FA4_TILE_N:
            raise ValueError(
                f"FlashAttention-4's exp2 mix is laid out over its {FA4_TILE_N}-key tile: run the plan with "
                f"block_n={FA4_TILE_N}, got {block_n}"
            )
        n_frg = FA4_TILE_N // _FRG
        for jj in range(FA4_TILE_N):
            j, k = divmod(jj, _FRG)
            k -= k % 2
            hw = k % freq < freq - res or j >= n_frg - 1 or j < start
            mask[jj] = 0 if hw else 1
    out = np.ascontiguousarray(mask[:bn]) if freq > 0 else np.zeros(0, dtype=np.int8)
    out.setflags(write=False)
    return out
