"""A hardware profile (:mod:`simfloat.profiles`) from the files of one GPU run (``simfloat-gpu run``).

:func:`fit_profile` turns the probes into a :class:`~simfloat.profiles.HardwareProfile`, part by part, each
with its status from the probes it reproduces (never "bit-exact" unless every probe output is):

* tensor cores: per input format and MMA instruction (wgmma / mma.sync, read off the probe's PTX), a search of
  :func:`dot_space` (block, fraction bits, alignment, output rounding, tf32 conversion, split-k, fp8 through
  fp16 mma.sync) by :func:`search_dot` for the model that reproduces every output of every probe tile of the
  group, then its overflow and zero-sign rules from the probes' ``overflow`` / ``negtiny`` rows
  (:func:`simfloat_gpu.campaign.fit.settle_rules`; unsettled: the defaults) (``dot_models`` given: only those
  models are scored, e.g. to check a profile against its probes);
* exp2: the table T-/T+ read off the binades (-2, -1] and [1, 2) (``exp2_neg_binade``, ``exp2_pos_binade``);
  that table and correctly rounded 2^x, each with and without flushing subnormals, scored on the held-out
  sweep and edge inputs;
* exp: ``tl.exp`` as ex2(rn32(x * rn32(log2 e))) with the chosen exp2, not flushed, or correctly rounded,
  scored on ``exp_sweep`` and the edges;
* tl.sum: per layout, the plan rules (``h200-mma`` with 1, 2 or 4 warps along the row; ``sequential``)
  replayed on the FPRev design of every probe shape;
* isa: FMA contraction, exp2 instruction and division of the compiled flash kernels (isa.tar.xz).

Each part keeps the candidate that reproduces the most probe outputs (ties: the first candidate); the report
rows give, per part, probe and design family, the bit-exact count, so a part that is not exact shows where.
"""

from __future__ import annotations

import dataclasses
import io
import json
import tarfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from simfloat.profiles import (
    DotPart,
    Exp2Part,
    ExpPart,
    HardwareProfile,
    IsaPart,
    SumPart,
    measured_status,
    model_label,
    tl_sum,
)

__all__ = [
    "ENV_KEYS",
    "dot_space",
    "ex2_table_from_binades",
    "family_summary",
    "fit_profile",
    "search_dot",
    "sum_rule_outputs",
]

#: the environment entries a profile keeps
ENV_KEYS = ("gpu", "capability", "sm_count", "driver", "cuda", "torch", "triton", "time_utc")
_LOG2E_F32 = np.float32(1.4426950408889634)


def _mma_kind(ptx: str) -> str:
    return "wgmma" if ptx.startswith("wgmma") else "mma.sync"


# -- tensor cores ----------------------------------------------------------------------------------------------

#: the operand formats' least normal exponents: what a subnormal operand counts with when products are aligned
#: by their operands' exponent sum (``BlockFMA.operand_emin``)
_OPERAND_EMIN = {"bf16": -126, "fp16": -14, "tf32": -126, "e4m3": -6, "e5m2": -14}
_FP8 = ("e4m3", "e5m2")
_OUT_MODES = ("toward_zero", "nearest_even")
_ALIGNS = ("exponent_sum", "product")


def _block_fma(block: int, f: int, align: str, emin: int, **kw: Any) -> Any:
    from simfloat.accumulate import BlockFMA

    return BlockFMA(block, f, align=align, operand_emin=emin if align == "exponent_sum" else None, **kw)


def dot_space(fmt: str, mma: str) -> list[Any]:
    """The tensor-core models the fit searches for one operand format and MMA instruction, in the order
    ties are broken (the first model that reproduces every probe wins).

    Every :class:`~simfloat.accumulate.BlockFMA` of: block (products per step) 4, 8, 16, 32 (fp8: 16, 32, 64);
    fraction bits F 22..28 (fp8: 10..16); alignment by the operands' exponent sum (subnormal operands counted
    at the format's least normal exponent) or by each product's exponent; output rounding toward zero or to
    nearest even (fp8: into e8m13 or float32); tf32: the fp32 operands converted toward zero, to nearest even
    or to nearest away; then each of these as split-k in two halves (:func:`simfloat.accumulate.split_k`, fp32
    combine). fp8 through ``mma.sync`` adds the operands converted to fp16 and reordered into k16 steps
    (:class:`~simfloat.accumulate.Interleaved`, chunks of 32, groups of 1, 2 or 4 consecutive k) over blocks of
    8 or 16 with F 24..26.

    Args:
        fmt: operand format (``bf16``, ``fp16``, ``tf32``, ``e4m3``, ``e5m2``).
        mma: ``"wgmma"`` or ``"mma.sync"``.

    Raises:
        ValueError: an unknown format or instruction.
    """
    from simfloat.accumulate import Interleaved, split_k
    from simfloat.formats import FloatFormat

    if fmt not in _OPERAND_EMIN:
        raise ValueError(f"dot_space: unknown operand format {fmt!r}; formats: {', '.join(_OPERAND_EMIN)}")
    if mma not in ("wgmma", "mma.sync"):
        raise ValueError(f"dot_space: mma must be 'wgmma' or 'mma.sync', got {mma!r}")
    emin = _OPERAND_EMIN[fmt]
    plain: list[Any] = []
    if fmt in _FP8:
        for align in _ALIGNS:
            for block in (16, 32, 64):
                for f in range(10, 17):
                    for mant in (13, 23):
                        out = FloatFormat(f"e8m{mant}", 8, mant) if mant != 23 else "float32"
                        for mode in _OUT_MODES:
                            plain.append(_block_fma(block, f, align, emin, out_fmt=out, out_mode=mode))
    else:
        convs: tuple[str | None, ...] = ("toward_zero", "nearest_even", "nearest_away") if fmt == "tf32" else (None,)
        for align in _ALIGNS:
            for block in (4, 8, 16, 32):
                for f in range(22, 29):
                    for mode in _OUT_MODES:
                        for conv in convs:
                            kw: dict[str, Any] = {"input_fmt": "tfloat32", "input_mode": conv} if conv else {}
                            plain.append(_block_fma(block, f, align, emin, out_mode=mode, **kw))
    space = plain + [split_k(2, m) for m in plain if fmt not in _FP8]
    if fmt in _FP8 and mma == "mma.sync":
        for group in (2, 1, 4):
            for block in (16, 8):
                for f in (25, 24, 26):
                    for mode in _OUT_MODES:
                        inner = _block_fma(block, f, "exponent_sum", _OPERAND_EMIN["fp16"], out_mode=mode)
                        space.append(Interleaved(inner, chunk=32, group=group))
    return space


def _subset(prob: dict[str, Any], per_family: int, seed: int) -> np.ndarray:
    """Rows of a probe, up to ``per_family`` of each design family (sorted)."""
    rng = np.random.default_rng(seed)
    fam = np.asarray(prob["family"])[: prob["rows"]]
    pick = []
    for f in np.unique(fam):
        rows = np.flatnonzero(fam == f)
        pick.append(rng.choice(rows, size=min(per_family, rows.size), replace=False))
    return np.sort(np.concatenate(pick))


def _score_group(model: Any, probs: Sequence[tuple[str, dict[str, Any]]], sels: Sequence[np.ndarray | None]) -> int:
    from simfloat_gpu.campaign import fit as F

    total = 0
    for (_, prob), sel in zip(probs, sels, strict=True):
        try:
            total += int(F.score_dot(model, prob, sel)[1].sum())
        except ValueError:  # a model the probe's shape does not admit (e.g. K not a multiple of its chunk)
            return -1
    return total


def search_dot(
    fmt: str,
    mma: str,
    variants: Sequence[tuple[str, dict[str, np.ndarray]]],
    *,
    space: Sequence[Any] | None = None,
    stages: Sequence[int] = (4, 48),
    keep: int = 12,
    log: Callable[[str], None] = print,
) -> tuple[Any, int, int, list[dict[str, Any]], list[Any]]:
    """The model of ``space`` (default :func:`dot_space`) that reproduces the most outputs of every probe
    tile of one (format, MMA) group, found in stages: every model on a few rows of each design family of every
    tile (``stages``: rows per family), the best ``keep`` (all that tie with the best, at most ``keep``) on more
    rows, then those on every output; ties go to the first in ``space``.

    Returns:
        The model, its bit-exact outputs, the outputs scored, the per-(tile, family) rows (``part``, ``probe``,
        ``family``, ``exact``, ``n``) and the other models that reproduce every output (the probes cannot
        tell them apart).
    """
    from simfloat_gpu.campaign import fit as F

    cands = list(dot_space(fmt, mma) if space is None else space)
    if not cands:
        raise ValueError(f"search_dot: no candidate models for {fmt} {mma}")
    probs = [(name, F.dot_problem(name, v)) for name, v in variants]
    n_start = len(cands)
    for stage, per_family in enumerate(stages):
        sels = [_subset(p, per_family, seed=stage) for _, p in probs]
        scored = [(_score_group(m, probs, sels), i, m) for i, m in enumerate(cands)]
        best = max(s for s, _, _ in scored)
        top = [r for r in scored if r[0] == best]  # every model that ties with the best goes on
        if len(top) < keep:  # few tie: the runners-up too, in score order
            rest = sorted((r for r in scored if 0 <= r[0] < best), key=lambda r: (-r[0], r[1]))
            top += rest[: keep - len(top)]
        cands = [m for _, _, m in sorted(top, key=lambda r: r[1])]
    full = []
    for m in cands:
        per = [(name, prob, F.score_dot(m, prob)[1]) for name, prob in probs]
        full.append((sum(int(e.sum()) for _, _, e in per), m, per))
    total = sum(int(e.size) for _, _, e in full[0][2])
    exact, model, per = max(full, key=lambda r: r[0])  # max keeps the first of equals: space order
    ties = [m for s, m, _ in full if s == total and m is not model]
    rows = []
    for name, prob, e in per:
        fams, fam = prob["families"], np.asarray(prob["family"])[: prob["rows"]]
        for f in np.unique(fam):
            sel = e[:, fam == f]
            rows.append(
                {
                    "part": f"tensor core {fmt} {mma}",
                    "probe": name,
                    "family": fams[int(f)],
                    "exact": int(sel.sum()),
                    "n": int(sel.size),
                }
            )
    log(
        f"tensor core {fmt} {mma}: searched {n_start} models, {len(cands)} scored on every output; best "
        f"{exact}/{total}" + (f"; {len(ties)} other model(s) also reproduce every output" if ties else "")
    )
    return model, exact, total, rows, ties


def _fit_dots(
    z: Any, dot_models: Mapping[tuple[str, str], Any] | None, log: Callable[[str], None]
) -> tuple[list[DotPart], list[dict[str, Any]]]:
    from simfloat_gpu.campaign import fit as F

    groups: dict[tuple[str, str], list[tuple[str, dict[str, np.ndarray]]]] = {}
    for name, v in F.probe_variants(z, "dot").items():
        if "error" in v:
            log(f"dot {name}: not recorded ({v['error']})")
            continue
        fmt = name.split("_")[0]
        groups.setdefault((fmt, _mma_kind(str(v["mma"][0]))), []).append((name, v))
    parts, rows = [], []
    for (fmt, mma), variants in sorted(groups.items()):
        space = None
        if dot_models is not None:
            if (fmt, mma) not in dot_models:
                log(f"dot {fmt} {mma}: no candidate model given, part left out")
                continue
            space = [dot_models[(fmt, mma)]]
        model, exact, total, r, _ = search_dot(fmt, mma, variants, space=space, log=log)
        if space is None:  # what the overflow / negtiny rows say of the two rules (fit.settle_rules)
            settled, _ = F.settle_rules(model, [F.dot_problem(n, v) for n, v in variants], log=log)
            if settled != model:
                model, exact, total, r, _ = search_dot(fmt, mma, variants, space=[settled], log=log)
        shapes = tuple("x".join(str(int(s)) for s in v["shape"]) for _, v in variants)
        status = measured_status(exact, total)
        parts.append(DotPart(fmt, mma, model, shapes, status))
        rows += r
        log(f"tensor core {fmt} {mma} ({', '.join(shapes)}): {model_label(model)}: {status}")
        log("  " + family_summary(r))
    return parts, rows


def family_summary(rows: Sequence[Mapping[str, Any]]) -> str:
    """``family x% (exact/n), ...`` over report rows (summed over probes), in first-seen order."""
    acc: dict[str, list[int]] = {}
    for r in rows:
        a = acc.setdefault(str(r.get("family", r["probe"])), [0, 0])
        a[0] += int(r["exact"])
        a[1] += int(r["n"])
    return ", ".join(f"{f} {100.0 * e / n:.4g}% ({e}/{n})" for f, (e, n) in acc.items() if n)


# -- exp2 / exp ------------------------------------------------------------------------------------------------


def ex2_table_from_binades(neg: tuple[np.ndarray, np.ndarray], pos: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """The int8[2^24] table of :mod:`simfloat.hardware` (ulp offsets of T-(f), then T+(f)) from every float32
    of (-2, -1] (``neg``: inputs, outputs) and of [1, 2) (``pos``).

    Raises:
        ValueError: the binades are not complete, or an offset lies outside -2..+1 ulp (the packed table
            cannot hold it).
    """
    two23 = 1 << 23
    table = np.zeros(2 * two23, dtype=np.int64)
    for half, (x, y), sign, scale in ((0, neg, -1.0, 2.0), (1, pos, 1.0, 0.5)):
        x = np.asarray(x, dtype=np.float32)
        if x.size != two23:
            raise ValueError(
                f"ex2 table: the {'negative' if half == 0 else 'positive'} binade has {x.size} inputs, not 2^23"
            )
        f = np.rint((np.abs(x.astype(np.float64)) - 1.0) * two23).astype(np.int64)
        base = np.exp2(sign * f * 2.0**-23).astype(np.float32)  # as simfloat.hardware.ex2_approx_f32 builds it
        t = (np.asarray(y, dtype=np.float32).astype(np.float64) * scale).astype(np.float32)  # exact: a power of 2
        off = t.view(np.uint32).astype(np.int64) - base.view(np.uint32).astype(np.int64)
        table[half * two23 + f] = off
    lo, hi = int(table.min()), int(table.max())
    if lo < -2 or hi > 1:
        raise ValueError(f"ex2 table: offsets {lo}..{hi} ulp fall outside -2..+1 (the table format's range)")
    return table.astype(np.int8)


def _same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32)
    return (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))


def _fit_exp(
    zs: Sequence[Any], log: Callable[[str], None]
) -> tuple[Exp2Part | None, ExpPart | None, np.ndarray | None, list[dict[str, Any]]]:
    from simfloat import hardware
    from simfloat_gpu.campaign import fit as F

    described = {seg["name"]: seg for z in zs if "segments" in z.files for seg in json.loads(str(z["segments"]))}
    segs: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name, seg in described.items():
        for z in zs:
            if f"{name}_off" in z.files:
                segs[name] = F.segment_values(z, seg)
    if "exp2_neg_binade" not in segs or "exp2_pos_binade" not in segs:
        log("exp2: the binade segments are missing, part left out")
        return None, None, None, []
    try:
        table = ex2_table_from_binades(segs["exp2_neg_binade"], segs["exp2_pos_binade"])
    except ValueError as exc:
        log(f"exp2: no table model ({exc}), part left out")
        return None, None, None, []
    name = hardware.register_ex2_table(table)
    edges = next((z for z in zs if "edges_x" in z.files), None)
    held: list[tuple[str, np.ndarray, np.ndarray]] = []  # (probe, x, y) the exp2 models are scored on
    if "exp2_sweep" in segs:
        held.append(("exp2_sweep", *segs["exp2_sweep"]))
    if edges is not None:
        held.append(("edges", edges["edges_x"].astype(np.float32), edges["edges_exp2_y"].view(np.float32)))
    if not held:
        raise ValueError("exp2: no held-out inputs (exp2_sweep or edges) to score the table on")
    sha = hardware.ex2_table_sha256(table)
    file = "ex2_h200.bin.xz" if name == "h200" else f"ex2_{sha[:16]}.bin.xz"
    cands = [(Exp2Part("table", file, sha, ftz), name) for ftz in (True, False)]
    cands += [(Exp2Part("correctly_rounded", ftz=ftz), "correctly_rounded") for ftz in (True, False)]
    exp2, rows = _pick(
        "exp2",
        cands,
        held,
        lambda c, x: _ex2(x, c[1], c[0].ftz),
        lambda c, st: dataclasses.replace(c[0], status=st),
        lambda c: f"{c[0].model} {c[0].table or ''} ftz {c[0].ftz}".replace("  ", " "),
    )
    log(f"exp2: {exp2.model} {exp2.table or ''} (ftz {exp2.ftz}): {exp2.status}; {family_summary(rows[-len(held) :])}")
    exp = None
    impl = name if exp2.model == "table" else "correctly_rounded"
    if "exp_sweep" in segs:
        held_e = [("exp_sweep", *segs["exp_sweep"])]
        if edges is not None:
            held_e.append(("edges", edges["edges_x"].astype(np.float32), edges["edges_exp_y"].view(np.float32)))
        cands_e = [("exp2_of_scaled", impl), ("correctly_rounded", "correctly_rounded")]
        exp, rows_e = _pick(
            "exp",
            cands_e,
            held_e,
            lambda c, x: _tl_exp(x, c[1]) if c[0] != "correctly_rounded" else _cr_exp(x),
            lambda c, st: ExpPart(c[0], st),
            lambda c: str(c[0]),
        )
        rows += rows_e
        log(f"exp: {exp.model}: {exp.status}; {family_summary(rows_e[-len(held_e) :])}")
    return exp2, exp, table, rows


def _pick(
    part: str,
    cands: Sequence[Any],
    held: Sequence[tuple[str, np.ndarray, np.ndarray]],
    run: Callable[[Any, np.ndarray], np.ndarray],
    make: Callable[[Any, str], Any],
    label: Callable[[Any], str],
) -> tuple[Any, list[dict[str, Any]]]:
    """The candidate that reproduces the most held-out outputs (ties: the first), as a part with its status,
    and the report rows of every candidate (``model`` names it: ``label(c)``; the chosen one's rows come
    last)."""
    scored = []
    for c in cands:
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            per = [(probe, int(_same_bits(run(c, x), y).sum()), int(x.size)) for probe, x, y in held]
        scored.append((sum(e for _, e, _ in per), c, per))
    exact, best, per = max(scored, key=lambda r: r[0])
    total = sum(n for _, _, n in per)
    chosen = make(best, measured_status(exact, total))
    rows = [
        {"part": part, "model": label(c), "probe": probe, "family": probe, "exact": e, "n": n}
        for _, c, p in scored
        if c is not best
        for probe, e, n in p
    ]
    rows += [
        {"part": part, "model": label(best), "probe": probe, "family": probe, "exact": e, "n": n} for probe, e, n in per
    ]
    return chosen, rows


def _ex2(x: np.ndarray, table: str, ftz: bool) -> np.ndarray:
    from simfloat import hardware, ops

    if table != "correctly_rounded":
        return hardware.ex2_approx(x, ftz=ftz, table=table)
    xf = np.asarray(x, dtype=np.float32)
    tiny = np.float32(2.0**-126)
    if ftz:
        xf = np.where(np.abs(xf) < tiny, np.float32(0.0), xf)
    y = np.asarray(ops.exp2(xf, "float32"), dtype=np.float32)
    return np.where(np.abs(y) < tiny, np.float32(0.0), y) if ftz else y


def _cr_exp(x: np.ndarray) -> np.ndarray:
    from simfloat import ops

    return np.asarray(ops.exp(np.asarray(x, dtype=np.float32), "float32"), dtype=np.float32)


def _tl_exp(x: np.ndarray, table: str) -> np.ndarray:
    xf = np.asarray(x, dtype=np.float32)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        t = (xf.astype(np.float64) * np.float64(_LOG2E_F32)).astype(np.float32)
        return _ex2(t, table, False)


# -- tl.sum ----------------------------------------------------------------------------------------------------


#: the row sums of a plan's tl.sum rule (:func:`simfloat.profiles.tl_sum`), replayed on the probe designs
sum_rule_outputs = tl_sum


def _fit_sums(z: Any, log: Callable[[str], None]) -> tuple[list[SumPart], list[dict[str, Any]]]:
    from simfloat_gpu.campaign import fit as F
    from simfloat_gpu.campaign.probes import sum_design

    variants = [(name, v) for name, v in F.probe_variants(z, "sum").items() if "error" not in v]
    if not variants:
        return [], []
    rules = [("h200-mma", w) for w in (1, 2, 4)] + [("sequential", 1)]
    parts, rows = [], []
    for layout in ("mma", "blocked"):
        per_rule = {r: 0 for r in ("h200-mma", "sequential")}
        total = 0
        shapes = []
        detail = []
        widest = max(variants, key=lambda nv: int(nv[1]["shape"][1]))
        for name, v in variants:
            bm, bn = (int(s) for s in v["shape"][:2])
            shapes.append(f"{bm}x{bn}")
            _, x = sum_design(bn)
            y = v[f"y_{layout}"].astype(np.float32)
            best: dict[str, int] = {}
            for rule, w in rules:
                ok = int(_same_bits(sum_rule_outputs(x, rule, w), y).sum())
                best[rule] = max(best.get(rule, 0), ok)
            for r in per_rule:
                per_rule[r] += best[r]
            total += int(y.size)
            detail.append((name, best, int(y.size)))
        rule = max(per_rule, key=lambda r: per_rule[r])
        exact = per_rule[rule]
        tree = ""
        if exact != total:  # no rule: keep the measured tree of the widest tile (FPRev)
            tree = str(F.fit_sum(widest[0], widest[1], log=lambda _s: None)[f"y_{layout}"]["tree"])
        status = measured_status(exact, total)
        part = SumPart(layout, rule if exact == total else None, tuple(shapes), tree, status)
        parts.append(part)
        for name, best, n in detail:
            rows.append({"part": f"tl.sum {layout}", "probe": name, "exact": best[rule], "n": n})
        log(f"tl.sum {layout}: rule {part.rule} (best: {rule}, warps along the row 1/2/4 as fits): {status}")
        log("  " + family_summary(rows[-len(detail) :]))
    return parts, rows


# -- isa -------------------------------------------------------------------------------------------------------


def _fit_isa(path: Path, log: Callable[[str], None]) -> IsaPart | None:
    with tarfile.open(path) as t:
        member = next((m for m in t.getmembers() if m.name.endswith("isa.json")), None)
        if member is None:
            raise ValueError(f"{path}: no isa.json inside (not an isa.tar.xz of simfloat-gpu run)")
        facts = json.load(io.TextIOWrapper(t.extractfile(member)))  # type: ignore[arg-type]
    kernels = {k: dict(v["summary"]) for k, v in facts["kernels"].items() if k.startswith("flash") and "summary" in v}
    if not kernels:
        log("isa: no flash kernel facts, part left out")
        return None

    def common(key: str) -> tuple[Any, int]:
        values = [s.get(key) for s in kernels.values()]
        top = max(set(map(str, values)), key=lambda u: sum(str(x) == u for x in values))
        return next(x for x in values if str(x) == top), sum(str(x) == top for x in values)

    fma, n1 = common("qk_scale_minus_m_is_fma")
    ex2, n2 = common("exp2_instruction")
    div, n3 = common("division")
    n = len(kernels)
    part = IsaPart(bool(fma), str(ex2), str(div), kernels, measured_status(min(n1, n2, n3), n))
    log(
        f"isa: fma contraction {part.fma_contraction}, exp2 {part.exp2_instruction}, division {part.division}: "
        f"{part.status}"
    )
    return part


# -- the profile -----------------------------------------------------------------------------------------------


def fit_profile(
    inputs: Sequence[Path],
    *,
    name: str | None = None,
    dot_models: Mapping[tuple[str, str], Any] | None = None,
    log: Callable[[str], None] = print,
) -> tuple[HardwareProfile, np.ndarray | None, list[dict[str, Any]]]:
    """A profile from the files of ``simfloat-gpu run`` (probes.npz, exp2*.npz, isa.tar.xz).

    Args:
        inputs: the files (recognised by their contents).
        name: the profile's name (default: the GPU's slug recorded by the run, e.g. ``"h200"``).
        dot_models: ``{(input format, "wgmma" | "mma.sync"): model}``: score only these in place of the search
            of :func:`dot_space` (a group without an entry is left out).
        log: progress lines.

    Returns:
        The profile, its exp2 table (int8[2^24], or None) and the per-probe fit report rows
        (``part``, ``probe``, ``exact``, ``n``).

    Raises:
        ValueError: an input that is none of those files, or no environment recorded.
    """
    parts_dot: list[DotPart] = []
    sums: list[SumPart] = []
    isa = None
    env: dict[str, Any] = {}
    exp_files = []
    rows: list[dict[str, Any]] = []
    for path in map(Path, inputs):
        if path.suffixes[-2:] == [".tar", ".xz"]:
            isa = _fit_isa(path, log)
            continue
        z = np.load(path)
        dots = any(f.startswith("dot_") for f in z.files)
        has_sums = any(f.startswith("sum_") for f in z.files)
        exp = "segments" in z.files or any(f.endswith("_off") for f in z.files)
        if not (dots or has_sums or exp):
            raise ValueError(
                f"{path}: neither probes (dot_*, sum_*) nor exp2 segments: not an output of simfloat-gpu run"
            )
        if "meta" in z.files:
            env = dict(json.loads(str(z["meta"])).get("env", {}))
        if dots:
            got, r = _fit_dots(z, dot_models, log)
            parts_dot += got
            rows += r
        if has_sums:
            got_s, r = _fit_sums(z, log)
            sums += got_s
            rows += r
        if exp:
            exp_files.append(z)
    exp2 = exp_part = table = None
    if exp_files:
        exp2, exp_part, table, r = _fit_exp(exp_files, log)
        rows += r
    if not env:
        raise ValueError("no environment recorded in the inputs (probes.npz holds it): cannot name the GPU")
    cap = str(env.get("capability", ""))
    profile = HardwareProfile(
        name=name or str(env.get("gpu_slug") or "gpu"),
        arch="sm" + cap.replace(".", "") if cap else "",
        environment={k: str(env[k]) for k in ENV_KEYS if k in env},
        tensor_cores=tuple(parts_dot),
        exp2=exp2,
        exp=exp_part,
        sums=tuple(sums),
        isa=isa,
    )
    return profile, table, rows
