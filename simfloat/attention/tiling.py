"""Tile-size rules: FlashAttention-1's choice of block sizes from the on-chip memory size.

FlashAttention-1 (Dao et al. 2022, Algorithm 1) sets the key block to ``B_c = ceil(M / (4 d))`` and the query
block to ``B_r = min(ceil(M / (4 d)), d)``, with ``M`` the on-chip SRAM size in elements and ``d`` the head
dimension. A tile rule is written ``"fa1:M=<elements>"`` wherever tiles are chosen (``flash(tiles=...)``,
``simfloat attribute --tiles``).
"""

from __future__ import annotations

import re

__all__ = ["fa1_tiles", "pick_tiles", "resolve_tiles"]

_FA1 = re.compile(r"^fa1:m=(\d+)$")


def fa1_tiles(M: int, d: int) -> tuple[int, int]:  # noqa: N803 (the paper's name)
    """FlashAttention-1's tiles for SRAM size ``M`` (elements) and head dimension ``d``.

    Args:
        M: on-chip memory in elements (> 0).
        d: head dimension (> 0).

    Returns:
        ``(block_m, block_n) = (min(ceil(M / (4 d)), d), ceil(M / (4 d)))``: query rows and keys per tile.

    Raises:
        TypeError: a non-integer argument. ValueError: an argument < 1.
    """
    for name, x in (("M", M), ("d", d)):
        if isinstance(x, bool) or not isinstance(x, int):
            raise TypeError(f"fa1_tiles: {name} must be an int, got {type(x).__name__}")
        if x < 1:
            raise ValueError(f"fa1_tiles: {name} must be >= 1, got {x}")
    bc = -(-M // (4 * d))
    return min(bc, d), bc


def resolve_tiles(rule: object, d: int) -> tuple[int, int]:
    """``(block_m, block_n)`` of a tile rule for head dimension ``d``.

    Args:
        rule: ``"fa1:M=<elements>"`` (case-insensitive; see :func:`fa1_tiles`).
        d: the head dimension of q and k.

    Raises:
        TypeError: ``rule`` is not a string. ValueError: an unknown rule or a bad M.
    """
    if not isinstance(rule, str):
        raise TypeError(f"tiles must be a rule string such as 'fa1:M=98304', got {type(rule).__name__}")
    m = _FA1.match(rule.strip().lower().replace(" ", ""))
    if m is None:
        raise ValueError(f"tiles: unknown tile rule {rule!r}; known: 'fa1:M=<elements>' (e.g. 'fa1:M=98304')")
    return fa1_tiles(int(m.group(1)), d)


def pick_tiles(block_m: int | None, block_n: int | None, tiles: object, d: int) -> tuple[int, int]:
    """The tile sizes of a call: explicit ``block_m``/``block_n`` (default 64 each) or a rule ``tiles``.

    Raises:
        ValueError: both a rule and an explicit block size, or a bad rule.
    """
    if tiles is None:
        return (64 if block_m is None else block_m), (64 if block_n is None else block_n)
    if block_m is not None or block_n is not None:
        raise ValueError(f"tiles={tiles!r} chooses block_m and block_n: pass either tiles or block_m/block_n")
    return resolve_tiles(tiles, d)
