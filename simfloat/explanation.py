"""Explain the difference between a kernel's attention output and a reference output.

:func:`explain` reruns the emulator under the plan on the same inputs and asks whether ``|out - ref|`` stays
inside the band the plan's own numerics give (the emulator's ``|flash(plan) - ref|`` on these inputs, fitted
by :func:`simfloat.tolerances.fit_tolerance` to the confidence asked); where it does not, it looks for the
patterns of the usual kernel bugs: non-finite values, a layout mix-up ((b, h, s, d) against (b, s, h, d)),
permuted heads, the wrong mask, a key tile left out, errors confined to the last partial query tile or to tile
boundaries, rows with tied maxima; and says which heads, rows and query tiles are outside.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from simfloat.attention import Plan, baseline, flash
from simfloat.attention import plan as _plan
from simfloat.attention._inputs import from_layout, kv_repeats
from simfloat.tolerances import Tolerance, check_confidence, fit_tolerance

__all__ = ["Explanation", "Finding", "explain"]

#: the verdicts: the first two are explained by the plan's numerics
VERDICTS = ("bitwise", "inside-band", "outside-band")

#: the kinds of :class:`Finding`
KINDS = (
    "nonfinite",
    "layout",
    "heads-permuted",
    "mask",
    "key-tile-dropped",
    "key-tile-boundary",
    "last-query-tile",
    "tile-boundary",
    "tied-maxima",
    "outside-band",
)

_MATCH = 0.999  # share of elements inside the band for a candidate explanation (layout, heads, mask, keys)


@dataclass(frozen=True)
class Finding:
    """One diagnosis of :func:`explain`.

    Attributes:
        kind: one of :data:`KINDS`.
        message: what was found, in words.
        heads: the (flattened leading index, i.e. ``batch * heads + head``) heads concerned.
        rows: the query rows concerned (of any of those heads).
        tiles: the query tiles (``row // block_m``) concerned.
        share: the share of the outside-band elements this finding covers (0..1; 1 for a finding about the
            whole output such as a layout mix-up).
    """

    kind: str
    message: str
    heads: tuple[int, ...] = ()
    rows: tuple[int, ...] = ()
    tiles: tuple[int, ...] = ()
    share: float = 1.0


@dataclass(frozen=True)
class Explanation:
    """What :func:`explain` found.

    Attributes:
        verdict: ``"bitwise"`` (out equals the emulator's output bit for bit), ``"inside-band"`` (every element
            of ``|out - ref|`` inside the plan's band: explained by its numerics) or ``"outside-band"``.
        plan: the plan's name.
        tolerance: the band, ``|out - ref| <= atol + rtol |ref|``.
        outside: number of elements of out outside the band (non-finite mismatches included).
        size: number of elements of out.
        max_ratio: max over elements of ``|out - ref| / (atol + rtol |ref|)`` (finite elements; 0 when empty).
        emulator_max_ratio: the same for the emulator's output (<= 1 by construction of the band).
        findings: the diagnoses, most specific first (empty when explained).
    """

    verdict: str
    plan: str
    tolerance: Tolerance
    outside: int
    size: int
    max_ratio: float
    emulator_max_ratio: float
    findings: tuple[Finding, ...] = field(default_factory=tuple)

    @property
    def explained(self) -> bool:
        """Whether the difference is what the plan's numerics produce (verdict bitwise or inside-band)."""
        return self.verdict in ("bitwise", "inside-band")

    def kinds(self) -> tuple[str, ...]:
        """The kinds of the findings, in order."""
        return tuple(f.kind for f in self.findings)

    def __str__(self) -> str:
        t = self.tolerance
        head = {
            "bitwise": f"explained: out equals the emulator's output under {self.plan} bit for bit",
            "inside-band": f"explained: |out - ref| is inside the band of {self.plan}'s numerics",
            "outside-band": f"NOT explained by {self.plan}'s numerics: {self.outside} of {self.size} elements "
            "outside its band",
        }[self.verdict]
        lines = [
            head,
            f"  band: |out - ref| <= {t.atol:.3g} + {t.rtol:.3g} |ref| (the emulator's own error on these inputs, "
            f"largest at {self.emulator_max_ratio:.3g} of it); out reaches {self.max_ratio:.3g} of it",
        ]
        for f in self.findings:
            lines.append(f"  - {f.kind}: {f.message}")
        return "\n".join(lines)


def _short(xs: tuple[int, ...] | list[int], limit: int = 12) -> str:
    xs = list(xs)
    if len(xs) <= limit:
        return ", ".join(map(str, xs))
    return ", ".join(map(str, xs[:limit])) + f", ... ({len(xs)} in all)"


def _ratio(out: np.ndarray, ref: np.ndarray, tol: Tolerance) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        return np.asarray(np.abs(out - ref) / (tol.atol + tol.rtol * np.abs(ref) + 1e-300))


def _inside_share(out: np.ndarray, ref: np.ndarray, tol: Tolerance) -> float:
    if out.shape != ref.shape or out.size == 0:
        return 0.0
    return float(np.mean(tol.inside(out, ref)))


def _where(mask: np.ndarray, block_m: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(heads, rows, tiles) of a (lead, seq_q, dv) mask."""
    heads = tuple(int(h) for h in np.nonzero(mask.any(axis=(1, 2)))[0])
    rows = tuple(int(r) for r in np.nonzero(mask.any(axis=(0, 2)))[0])
    tiles = tuple(sorted({r // block_m for r in rows}))
    return heads, rows, tiles


def explain(
    out: np.ndarray,
    ref: np.ndarray,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    plan: Plan | str,
    causal: bool = False,
    scale: float | None = None,
    block_m: int = 64,
    block_n: int = 64,
    layout: str = "bhsd",
    confidence: float = 0.99,
    tolerance: tuple[float, float] | None = None,
) -> Explanation:
    """Say whether ``out - ref`` is what ``plan``'s numerics produce, and if not, where and of what kind.

    The emulator runs the plan on q, k, v (flash for a flash plan, else baseline); its own distance to ``ref``
    gives the band (:func:`simfloat.tolerances.fit_tolerance` of it at ``confidence``, or ``tolerance`` when
    given). ``out`` inside the band everywhere is explained; otherwise the findings say what the outside
    elements look like (:data:`KINDS`): non-finite values in out but not in ref (which rows), out matching ref
    under a (b, h, s, d) <-> (b, s, h, d) mix-up or with its heads permuted, out matching the attention with
    the other causal mask, with one key tile left out (the last partial one, typically) or the keys at the key-tile
    boundaries (an off-by-one), errors confined to
    the last partial query tile or to the first / last row of query tiles, rows whose scores have tied maxima;
    else the heads, rows and query tiles outside.

    Args:
        out: the kernel's output, (..., seq_q, head_dim_v) as ``ref`` (or ``ref``'s shape with the head and
            sequence axes swapped: a layout mix-up, diagnosed).
        ref: the reference output (e.g. the float64 attention, or a trusted implementation), (..., seq_q,
            head_dim_v).
        q: (..., seq_q, head_dim); k: (..., seq_k, head_dim); v: (..., seq_k, head_dim_v): the inputs both
            were computed from (values of the kernel's input format).
        plan: the plan of the kernel's numerics (a :class:`~simfloat.attention.Plan` or preset name).
        causal, scale, block_m, block_n: as the kernel ran (tiles: flash plans).
        layout: ``"bhsd"`` (default) or ``"bshd"``: the layout of q, k, v, ref (and of out).
        confidence: of the band (:func:`simfloat.tolerances.fit_tolerance`), in (0, 1).
        tolerance: ``(rtol, atol)`` to use as the band instead.

    Returns:
        An :class:`Explanation` (``str()`` of it is a summary; ``.explained``, ``.findings``).

    Raises:
        ValueError: shapes that do not fit together, a bad layout, confidence or tolerance, non-finite inputs or
            reference where out is expected to be compared.
        TypeError: arguments of the wrong type.
    """
    pl = _plan(plan) if isinstance(plan, str) else plan
    if not isinstance(pl, Plan):
        raise TypeError(f"plan must be a Plan or a preset name, got {type(plan).__name__}")
    conf = check_confidence(confidence)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    for name, b in (("block_m", block_m), ("block_n", block_n)):
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1:
            raise ValueError(f"{name} must be a positive int, got {b!r}")
    qa, ka, va, ra = (np.asarray(from_layout(x, layout, n)) for x, n in ((q, "q"), (k, "k"), (v, "v"), (ref, "ref")))
    oa = np.asarray(out)
    if layout == "bshd" and oa.ndim == 4 and oa.shape == np.asarray(ref).shape:
        oa = np.asarray(from_layout(oa, layout, "out"))
    for name, x in (("out", oa), ("ref", ra), ("q", qa), ("k", ka), ("v", va)):
        if x.dtype.kind not in "fiu":
            raise TypeError(f"{name} must be a real array, got dtype {x.dtype}")
    for name, x in (("q", qa), ("k", ka), ("v", va)):
        if not np.all(np.isfinite(x)):
            raise ValueError(f"{name} holds NaN or infinite values: the kernels take finite inputs")
    if qa.ndim < 2 or ka.ndim < 2 or va.ndim < 2:
        raise ValueError(f"q, k, v need at least (seq, head_dim): got {qa.shape}, {ka.shape}, {va.shape}")
    want = np.broadcast_shapes(qa.shape[:-2], ka.shape[:-2]) + (qa.shape[-2], va.shape[-1])
    if ra.shape != want:
        raise ValueError(f"ref has shape {ra.shape}; q, k, v give outputs of shape {want}")
    if tolerance is not None:
        if len(tolerance) != 2 or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0 for x in tolerance
        ):
            raise ValueError(f"tolerance must be (rtol, atol), two finite numbers >= 0, got {tolerance!r}")
    q64, k64, v64, ref64 = (x.astype(np.float64) for x in (qa, ka, va, ra))
    o64 = oa.astype(np.float64)

    # the emulator's output on these inputs, and the band
    if "flash" in pl.kernels():
        emu_out = flash(qa, ka, va, plan=pl, causal=causal, scale=scale, block_m=int(block_m), block_n=int(block_n))
    else:
        emu_out = baseline(qa, ka, va, plan=pl, causal=causal, scale=scale)
    emu = np.asarray(emu_out, dtype=np.float64)
    fin = np.isfinite(emu) & np.isfinite(ref64)
    if tolerance is not None:
        tol = Tolerance(float(tolerance[0]), float(tolerance[1]))
    elif fin.any():
        err = np.where(fin, np.abs(emu - ref64), np.nan)
        tol = fit_tolerance([err], [np.where(fin, ref64, np.nan)], confidence=conf, by_row=False)
    else:
        tol = Tolerance(0.0, 0.0)
    emu_ratio = _ratio(emu, ref64, tol)
    emu_max = float(np.max(emu_ratio[fin])) if fin.any() else 0.0

    lead = int(np.prod(want[:-2], dtype=np.int64)) if len(want) > 2 else 1
    seq_q, dv = want[-2], want[-1]
    size = int(np.prod(want, dtype=np.int64))

    def result(verdict: str, outside: int, max_ratio: float, findings: list[Finding]) -> Explanation:
        return Explanation(verdict, pl.name, tol, outside, size, max_ratio, emu_max, tuple(findings))

    if o64.shape != want:
        # only a layout mix-up explains an output of another shape
        finding = _layout(o64, ref64, tol, want)
        if finding is None:
            raise ValueError(f"out has shape {o64.shape}; q, k, v give outputs of shape {want}")
        return result("outside-band", size, math.inf, [finding])
    if o64.shape == emu.shape and np.array_equal(o64, emu, equal_nan=True):
        return result("bitwise", 0, emu_max, [])
    inside = tol.inside(o64, ref64)
    both_nan = np.isnan(o64) & np.isnan(ref64)
    inside = inside | both_nan
    ratio = _ratio(o64, ref64, tol)
    finite = np.isfinite(ratio)
    max_ratio = float(np.max(ratio[finite])) if finite.any() else 0.0
    n_out = int(size - np.count_nonzero(inside))
    if n_out == 0:
        return result("inside-band", 0, max_ratio, [])

    bad = (~inside).reshape(lead, seq_q, dv)
    o3, r3 = o64.reshape(lead, seq_q, dv), ref64.reshape(lead, seq_q, dv)
    findings: list[Finding] = []
    f = _nonfinite(o3, r3, bad, block_m)
    if f is not None:
        findings.append(f)
    for f in (_layout(o64, ref64, tol, want), _heads(o64, ref64, tol)):
        if f is not None:
            findings.append(f)
    if not any(f.kind in ("layout", "heads-permuted") for f in findings):
        findings += _reruns(o64, q64, k64, v64, tol, causal, scale, int(block_n), bad, int(block_m))
        findings += _rows(bad, q64, k64, causal, scale, seq_q, int(block_m))
    if not findings or all(f.kind == "nonfinite" and f.share < 1 for f in findings):
        heads, rows, tiles = _where(bad, int(block_m))
        findings.append(
            Finding(
                "outside-band",
                f"{n_out} elements outside the band, up to {max_ratio:.3g} times it: heads {_short(heads)}, "
                f"rows {_short(rows)}, query tiles {_short(tiles)} (block_m {block_m})",
                heads,
                rows,
                tiles,
                1.0,
            )
        )
    return result("outside-band", n_out, max_ratio, findings)


def _nonfinite(o3: np.ndarray, r3: np.ndarray, bad: np.ndarray, block_m: int) -> Finding | None:
    nf = ~np.isfinite(o3) & np.isfinite(r3)
    if not nf.any():
        nf_ref = np.isfinite(o3) & ~np.isfinite(r3)
        if not nf_ref.any():
            return None
        heads, rows, tiles = _where(nf_ref, block_m)
        return Finding(
            "nonfinite",
            f"ref is NaN or infinite where out is finite: {int(nf_ref.sum())} elements, heads {_short(heads)}, "
            f"rows {_short(rows)}",
            heads,
            rows,
            tiles,
            float(nf_ref.sum()) / max(1, int(bad.sum())),
        )
    heads, rows, tiles = _where(nf, block_m)
    kinds = []
    if np.isnan(o3[nf]).any():
        kinds.append("NaN")
    if np.isinf(o3[nf]).any():
        kinds.append("Inf")
    whole = all(bool(nf[h, r].all()) for h in heads for r in rows if nf[h, r].any())
    return Finding(
        "nonfinite",
        f"{' and '.join(kinds)} in out but not in ref: {int(nf.sum())} elements"
        + (" (whole rows)" if whole else "")
        + f", heads {_short(heads)}, rows {_short(rows)}, query tiles {_short(tiles)}",
        heads,
        rows,
        tiles,
        float(nf.sum()) / max(1, int(bad.sum())),
    )


def _layout(o: np.ndarray, r: np.ndarray, tol: Tolerance, want: tuple[int, ...]) -> Finding | None:
    """out is ref in the other layout: transposed between (b, h, s, d) and (b, s, h, d), as an array of the
    other shape or as the same memory read with the other shape."""
    if len(want) < 4:
        return None
    h, s, d = want[-3], want[-2], want[-1]
    if h == 1:
        return None
    cands = []
    if o.shape == want[:-3] + (s, h, d):
        cands.append(
            ("out has shape (b, s, h, d), ref (b, h, s, d): heads and sequence swapped", np.swapaxes(o, -3, -2))
        )
    if o.shape == want:
        cands.append(
            (
                "out holds (b, s, h, d) memory read as (b, h, s, d): the kernel wrote the other layout",
                np.swapaxes(o.reshape(want[:-3] + (s, h, d)), -3, -2),
            )
        )
        cands.append(
            (
                "out holds (b, h, s, d) memory read as (b, s, h, d): the kernel wrote the other layout",
                np.swapaxes(o, -3, -2).reshape(want),
            )
        )
    for msg, x in cands:
        if x.shape == r.shape and _inside_share(x, r, tol) >= _MATCH:
            return Finding("layout", msg + " (then inside the band)", share=1.0)
    return None


def _heads(o: np.ndarray, r: np.ndarray, tol: Tolerance) -> Finding | None:
    """out's heads are ref's heads in another order (per batch index)."""
    if o.ndim < 3 or o.shape[-3] < 2:
        return None
    nh = o.shape[-3]
    o4 = o.reshape((-1,) + o.shape[-3:])
    r4 = r.reshape((-1,) + r.shape[-3:])
    moves = []
    for b in range(o4.shape[0]):
        perm = []
        for h in range(nh):
            if _inside_share(o4[b, h], r4[b, h], tol) >= _MATCH:
                perm.append(h)
                continue
            match = [g for g in range(nh) if g != h and _inside_share(o4[b, h], r4[b, g], tol) >= _MATCH]
            if not match:
                return None
            perm.append(match[0])
        if sorted(perm) != list(range(nh)):
            return None
        moves += [(b, h, g) for h, g in enumerate(perm) if g != h]
    if not moves:
        return None
    text = ", ".join(f"out head {h} = ref head {g}" + (f" (batch {b})" if o4.shape[0] > 1 else "") for b, h, g in moves)
    heads = tuple(sorted({b * nh + h for b, h, _ in moves}))
    return Finding("heads-permuted", f"heads permuted: {text}", heads, share=1.0)


def _reruns(
    o: np.ndarray,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    tol: Tolerance,
    causal: bool,
    scale: float | None,
    block_n: int,
    bad: np.ndarray,
    block_m: int,
) -> list[Finding]:
    """The float64 attention under the other causal mask, without one key tile, or without the keys at the
    key-tile boundaries: does one account for the outside elements (inside the band of it there)? Only the
    query rows holding outside elements are recomputed."""
    lead, seq_q, dv = bad.shape
    row_idx = np.nonzero(bad.any(axis=(0, 2)))[0]
    if row_idx.size == 0:
        return []
    o3 = o.reshape(lead, seq_q, dv)[:, row_idx]
    bad_r = bad[:, row_idx]
    seq_k = k.shape[-2]
    heads, rows, tiles = _where(bad, block_m)

    def accounts(keep: np.ndarray, mask: bool) -> bool:
        alt = _attention_keys(q, k, v, keep, mask, scale, row_idx).reshape(lead, row_idx.size, dv)
        ok = np.isfinite(alt) & np.isfinite(o3)
        ok[ok] = np.abs(o3[ok] - alt[ok]) <= tol.atol + tol.rtol * np.abs(alt[ok])
        return bool(np.mean(ok[bad_r]) >= _MATCH)

    everything = np.ones(seq_k, dtype=bool)
    if accounts(everything, not causal):
        return [
            Finding(
                "mask",
                f"out is the attention {'without' if causal else 'with'} the causal mask "
                f"(the kernel's mask is {'off' if causal else 'on'}): rows {_short(rows)}",
                heads,
                rows,
                tiles,
            )
        ]
    n_tiles = -(-seq_k // block_n)
    if n_tiles < 2 or n_tiles > 256:
        return []
    for t in [n_tiles - 1] + list(range(n_tiles - 1)):  # the last (partial) tile first
        keep = everything.copy()
        keep[t * block_n : (t + 1) * block_n] = False
        if accounts(keep, causal):
            lo, hi = t * block_n, min(seq_k, (t + 1) * block_n)
            partial = " (the last, partial tile)" if t == n_tiles - 1 and seq_k % block_n else ""
            return [
                Finding(
                    "key-tile-dropped",
                    f"out is the attention without keys {lo}..{hi - 1}, key tile {t}{partial} of block_n "
                    f"{block_n}: rows {_short(rows)}",
                    heads,
                    rows,
                    tiles,
                )
            ]
    for first, where in ((True, "first"), (False, "last")):
        edge = np.arange(block_n, seq_k, block_n) if first else np.arange(block_n - 1, seq_k - 1, block_n)
        keep = everything.copy()
        keep[edge] = False
        if accounts(keep, causal):
            return [
                Finding(
                    "key-tile-boundary",
                    f"out is the attention without the {where} key of each key tile boundary (keys "
                    f"{_short(tuple(int(j) for j in edge))} of block_n {block_n}): an off-by-one at the tile edge; "
                    f"rows {_short(rows)}",
                    heads,
                    rows,
                    tiles,
                )
            ]
    return []


def _attention_keys(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    keep: np.ndarray,
    causal: bool,
    scale: float | None,
    rows: np.ndarray,
) -> np.ndarray:
    """float64 attention of the query ``rows`` over the keys ``keep`` only (the causal mask by position)."""
    reps = kv_repeats(q.shape, k.shape, "k")
    if reps > 1:
        k = np.repeat(k, reps, axis=-3)
        v = np.repeat(v, reps, axis=-3)
    c = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    s = (q[..., rows, :] @ np.swapaxes(k, -1, -2)) * c
    vis = np.broadcast_to(keep[None, :], s.shape[-2:])
    if causal:
        vis = vis & (np.arange(s.shape[-1])[None, :] <= rows[:, None])
    s = np.where(vis, s, -np.inf)
    with np.errstate(invalid="ignore"):
        s = s - s.max(axis=-1, keepdims=True)
        p = np.exp(s)
        p /= p.sum(axis=-1, keepdims=True)
    return np.asarray(p @ v)


def _rows(
    bad: np.ndarray,
    q: np.ndarray,
    k: np.ndarray,
    causal: bool,
    scale: float | None,
    seq_q: int,
    block_m: int,
) -> list[Finding]:
    """Where the outside rows lie: the last partial query tile, tile-boundary rows, rows with tied maxima."""
    found: list[Finding] = []
    heads, rows, tiles = _where(bad, block_m)
    if not rows:
        return found
    rows_a = np.asarray(rows)
    n_full = (seq_q // block_m) * block_m
    if seq_q % block_m and rows_a.min() >= n_full:
        found.append(
            Finding(
                "last-query-tile",
                f"only the last, partial query tile is outside (rows {n_full}..{seq_q - 1}, tile {seq_q // block_m} "
                f"of block_m {block_m}): heads {_short(heads)}, rows {_short(rows)}",
                heads,
                rows,
                tiles,
            )
        )
    else:
        edge = (rows_a % block_m == 0) | (rows_a % block_m == block_m - 1) | (rows_a == seq_q - 1)
        if edge.all() and len(tiles) > 1:
            found.append(
                Finding(
                    "tile-boundary",
                    f"only rows at query-tile boundaries are outside (first / last row of tiles of block_m "
                    f"{block_m}): rows {_short(rows)}, heads {_short(heads)}",
                    heads,
                    rows,
                    tiles,
                )
            )
    # tied maxima of the float64 scores
    kk = k
    reps = kv_repeats(q.shape, k.shape, "k")
    if reps > 1:
        kk = np.repeat(k, reps, axis=-3)
    c = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    s = (q @ np.swapaxes(kk, -1, -2)) * c
    if causal:
        s = np.where(np.arange(s.shape[-1])[None, :] <= np.arange(s.shape[-2])[:, None], s, -np.inf)
    s3 = np.broadcast_to(s, bad.shape[:1] + s.shape[-2:]) if s.ndim == 2 else s.reshape(-1, *s.shape[-2:])
    ties = np.sum(s3 == s3.max(axis=-1, keepdims=True), axis=-1) >= 2  # (lead, seq_q)
    bad_rows = bad.any(axis=-1)
    n_bad = int(bad_rows.sum())
    n_tied_bad = int((bad_rows & ties).sum())
    if n_tied_bad and n_tied_bad >= 0.5 * n_bad:
        th, tr, tt = _where((bad_rows & ties)[:, :, None], block_m)
        found.append(
            Finding(
                "tied-maxima",
                f"{n_tied_bad} of the {n_bad} rows outside have tied maxima (two or more keys share the row's top "
                f"score): heads {_short(th)}, rows {_short(tr)}",
                th,
                tr,
                tt,
                n_tied_bad / n_bad,
            )
        )
    return found
