"""A hardware profile (:mod:`simfloat.profiles`) from the files of one GPU run (``simfloat-gpu run``).

:func:`fit_profile` turns the probes into a :class:`~simfloat.profiles.HardwareProfile`, part by part, each
with its status from the probes it reproduces (never "bit-exact" unless every probe output is):

* tensor cores: per input format and MMA instruction (wgmma / mma.sync, read off the probe's PTX), the model
  :func:`simfloat_gpu.campaign.fit.fit_dot` finds best over every probe tile of that group (``dot_models``
  given: only those candidates are scored, e.g. to check a profile against its probes);
* exp2: the table T-/T+ read off the binades (-2, -1] and [1, 2) (``exp2_neg_binade``, ``exp2_pos_binade``),
  scored on the held-out sweep and edge inputs;
* exp: ``tl.exp`` as ex2(rn32(x * rn32(log2 e))) with that table, not flushed, scored on ``exp_sweep``;
* tl.sum: per layout, the plan rules (``h200-mma`` with 1, 2 or 4 warps along the row; ``sequential``)
  replayed on the FPRev design of every probe shape;
* isa: FMA contraction, exp2 instruction and division of the compiled flash kernels (isa.tar.xz).
"""

from __future__ import annotations

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
)

__all__ = ["ENV_KEYS", "ex2_table_from_binades", "fit_profile", "sum_rule_outputs"]

#: the environment entries a profile keeps
ENV_KEYS = ("gpu", "capability", "sm_count", "driver", "cuda", "torch", "triton", "time_utc")
_LOG2E_F32 = np.float32(1.4426950408889634)


def _mma_kind(ptx: str) -> str:
    return "wgmma" if ptx.startswith("wgmma") else "mma.sync"


# -- tensor cores ----------------------------------------------------------------------------------------------


def _fit_dots(
    z: Any, dot_models: Mapping[tuple[str, str], Any] | None, coarse_rows: int, log: Callable[[str], None]
) -> tuple[list[DotPart], list[dict[str, Any]]]:
    from simfloat_gpu.campaign import fit as F

    groups: dict[tuple[str, str], list[tuple[str, dict[str, np.ndarray]]]] = {}
    for name, v in F._variants(z, "dot").items():
        if "error" in v:
            log(f"dot {name}: not recorded ({v['error']})")
            continue
        fmt = name.split("_")[0]
        groups.setdefault((fmt, _mma_kind(str(v["mma"][0]))), []).append((name, v))
    parts, rows = [], []
    for (fmt, mma), variants in sorted(groups.items()):
        if dot_models is not None:
            cands = [dot_models[(fmt, mma)]] if (fmt, mma) in dot_models else []
            if not cands:
                log(f"dot {fmt} {mma}: no candidate model given, part left out")
                continue
        else:  # the best model of each tile, then the one best over all tiles of the group
            cands = []
            for name, v in variants:
                res = F.fit_dot(name, v, coarse_rows=coarse_rows, log=log)
                if all(res["model"] != c for c in cands):
                    cands.append(res["model"])
        probs = [(name, F.dot_problem(name, v)) for name, v in variants]
        scored = []
        for model in cands:
            per = [(name, F.score_dot(model, prob)[1]) for name, prob in probs]
            exact = sum(int(e.sum()) for _, e in per)
            total = sum(int(e.size) for _, e in per)
            scored.append((exact, total, model, per))
        exact, total, model, per = max(scored, key=lambda r: r[0])  # first of the best: fit_dot's order
        shapes = tuple("x".join(str(int(s)) for s in v["shape"]) for _, v in variants)
        status = measured_status(exact, total)
        parts.append(DotPart(fmt, mma, model, shapes, status))
        for name, e in per:
            rows.append({"part": f"tensor core {fmt} {mma}", "probe": name, "exact": int(e.sum()), "n": int(e.size)})
        log(f"tensor core {fmt} {mma} ({', '.join(shapes)}): {model}: {status}")
    return parts, rows


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
    rows: list[dict[str, Any]] = []
    held = [("exp2_sweep", True)]
    edges = next((z for z in zs if "edges_x" in z.files), None)
    exact = total = 0
    for seg, ftz in held:
        if seg in segs:
            x, y = segs[seg]
            ok = int(_same_bits(hardware.ex2_approx(x, ftz=ftz, table=name), y).sum())
            rows.append({"part": "exp2", "probe": seg, "exact": ok, "n": int(x.size)})
            exact, total = exact + ok, total + int(x.size)
    if edges is not None:
        ex, ey = edges["edges_x"].astype(np.float32), edges["edges_exp2_y"].view(np.float32)
        with np.errstate(over="ignore", invalid="ignore"):
            ok = int(_same_bits(hardware.ex2_approx(ex, ftz=True, table=name), ey).sum())
        rows.append({"part": "exp2", "probe": "edges", "exact": ok, "n": int(ex.size)})
        exact, total = exact + ok, total + int(ex.size)
    if total == 0:
        raise ValueError("exp2: no held-out inputs (exp2_sweep or edges) to score the table on")
    sha = hardware.ex2_table_sha256(table)
    file = "ex2_h200.bin.xz" if name == "h200" else f"ex2_{sha[:16]}.bin.xz"
    exp2 = Exp2Part("table", file, sha, True, measured_status(exact, total))
    log(f"exp2: table {file} (held out: {exact}/{total}): {exp2.status}")
    exp = None
    if "exp_sweep" in segs:
        x, y = segs["exp_sweep"]
        ok_e = _same_bits(_tl_exp(x, name), y)
        n_ok, n = int(ok_e.sum()), int(x.size)
        rows.append({"part": "exp", "probe": "exp_sweep", "exact": n_ok, "n": n})
        if edges is not None:
            ex, ey = edges["edges_x"].astype(np.float32), edges["edges_exp_y"].view(np.float32)
            ok = int(_same_bits(_tl_exp(ex, name), ey).sum())
            rows.append({"part": "exp", "probe": "edges", "exact": ok, "n": int(ex.size)})
            n_ok, n = n_ok + ok, n + int(ex.size)
        exp = ExpPart("exp2_of_scaled", measured_status(n_ok, n))
        log(f"exp: ex2(rn32(x * log2e)), not flushed: {exp.status}")
    return exp2, exp, table, rows


def _tl_exp(x: np.ndarray, table: str) -> np.ndarray:
    from simfloat import hardware

    xf = np.asarray(x, dtype=np.float32)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        t = (xf.astype(np.float64) * np.float64(_LOG2E_F32)).astype(np.float32)
        return hardware.ex2_approx(t, ftz=False, table=table)


# -- tl.sum ----------------------------------------------------------------------------------------------------


def sum_rule_outputs(x: np.ndarray, rule: str, warps_n: int = 1) -> np.ndarray:
    """Row sums of float32 rows ``x`` (R, n) in a plan rule's order, fp32 additions: ``"sequential"`` or
    ``"h200-mma"`` with ``warps_n`` warps along the row (simfloat.attention's ``row_sum`` order 1)."""
    x = np.asarray(x, dtype=np.float32)
    n = x.shape[1]
    if rule == "sequential":
        s = x[:, 0].copy()
        for j in range(1, n):
            s = s + x[:, j]
        return s
    if rule != "h200-mma":
        raise ValueError(f"unknown sum rule {rule!r}")
    nw = max(1, min(warps_n, (n + 7) // 8))
    period = 8 * warps_n

    def lane(w: int, t: int) -> np.ndarray:
        cols = [c for base in range(8 * w + 2 * t, n, period) for c in range(base, min(base + 2, n))]
        if not cols:
            return np.zeros(x.shape[0], dtype=np.float32)
        s = x[:, cols[0]].copy()
        for c in cols[1:]:
            s = s + x[:, c]
        return s

    lw = []
    for w in range(nw):
        lt = [lane(w, t) for t in range(4)]
        lw.append((lt[0] + lt[2]) + (lt[1] + lt[3]))
    if nw == 1:
        return lw[0]
    if nw == 2:
        return lw[0] + lw[1]
    return (lw[0] + lw[2]) + (lw[1] + lw[3])


def _fit_sums(z: Any, log: Callable[[str], None]) -> tuple[list[SumPart], list[dict[str, Any]]]:
    from simfloat_gpu.campaign import fit as F
    from simfloat_gpu.campaign.probes import sum_design

    variants = [(name, v) for name, v in F._variants(z, "sum").items() if "error" not in v]
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
    coarse_rows: int = 768,
    log: Callable[[str], None] = print,
) -> tuple[HardwareProfile, np.ndarray | None, list[dict[str, Any]]]:
    """A profile from the files of ``simfloat-gpu run`` (probes.npz, exp2*.npz, isa.tar.xz).

    Args:
        inputs: the files (recognised by their contents).
        name: the profile's name (default: the GPU's slug recorded by the run, e.g. ``"h200"``).
        dot_models: ``{(input format, "wgmma" | "mma.sync"): model}``: score only these (no search).
        coarse_rows: rows of fit_dot's coarse search.
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
            got, r = _fit_dots(z, dot_models, coarse_rows, log)
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
