"""Fit simfloat's models to the hardware probes (CPU side, after ``simfloat_gpu.campaign.gpu_run``); the command
line is :mod:`simfloat_gpu.campaign.fit_cli` (``simfloat-gpu fit``), the hardware profile fitted from every part
:mod:`simfloat_gpu.campaign.fit_profile`.

Inputs are recognised by their keys:

* ``probes.npz`` (:mod:`simfloat_gpu.campaign.probes` dot + sum): **(a)** every dot variant is replayed through
  :func:`simfloat.accumulate.matmul` under candidate :class:`~simfloat.accumulate.BlockFMA` models (block
  size, fraction bits F, output rounding, fp8 accumulator mantissa, tf32 operand conversion), coarse on a
  subset and then the best few on every output; the table gives the best model, its bitwise agreement overall,
  per design family and per launch (zero / designed incoming accumulator), and the published preset's
  agreement; then what the ``overflow`` / ``negtiny`` rows say of the best model's overflow and zero-sign rules
  (:func:`settle_rules`). Outputs compare as float32 bits. **(c)** every sum variant: the LCA-size matrix of
  the FPRev design gives the reduction tree of ``tl.sum`` (checked for consistency over both row placements),
  compared with simfloat.ops.sum's orders.
* ``exp2.npz`` / ``exp2_binades.npz`` (:func:`simfloat_gpu.campaign.probes.exp_probe`): **(b)** ulp-offset statistics
per
  segment; a *periodic table* model (2^x = T[frac(x)] * 2^floor(x), T read off the [-2, -1) binade, the
  fraction of |x| < 1 inputs fixed to 23 bits by truncation / rounding) and a *compact* model (y = rn32(2^x +
  s ulp), one shift s per bucket of the top k fraction bits), each scored on held-out inputs.
  :func:`ex2_approx` evaluates a saved model (``--save-ex2``) on float32 arrays and can be passed to
  ``simfloat_gpu.interpreter.faithful(exp2=...)``.
* ``isa.tar.xz`` (:mod:`simfloat_gpu.campaign.probes` isa): the instruction facts of each compiled kernel, printed.

An input with none of these keys is an error.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "decode",
    "fit_dot",
    "fit_sum",
    "tree_from_lca",
    "fit_exp",
    "Ex2Model",
    "ex2_approx",
    "load_ex2_model",
    "probe_variants",
    "compare_plans",
    "RULES",
    "settle_rules",
    "with_rules",
]

FP8 = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}


# ----------------------------------------------------------------------------------------------------
# (a) dot
# ----------------------------------------------------------------------------------------------------


def decode(bits: np.ndarray, fmt: str) -> np.ndarray:
    """Raw bits of an operand format -> float64 values."""
    bits = np.asarray(bits)
    if fmt == "bf16":
        return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if fmt == "fp16":
        return bits.astype(np.uint16).view(np.float16).astype(np.float64)
    if fmt == "tf32":
        return bits.astype(np.uint32).view(np.float32).astype(np.float64)
    if fmt in FP8:
        import ml_dtypes

        return bits.astype(np.uint8).view(getattr(ml_dtypes, FP8[fmt])).astype(np.float64)
    raise ValueError(f"unknown format {fmt!r}")


def probe_variants(z: Any, kind: str) -> dict[str, dict[str, np.ndarray]]:
    """The variants of one probe kind ("dot", "sum") in a probes.npz: ``{variant: {field: array}}`` from its
    ``<kind>_<variant>__<field>`` keys."""
    out: dict[str, dict[str, np.ndarray]] = {}
    for key in z.files:
        if not key.startswith(kind + "_") or "__" not in key:
            continue
        name, field = key.split("__", 1)
        out.setdefault(name[len(kind) + 1 :], {})[field] = z[key]
    return out


def _candidates(fmt: str) -> list[tuple[str, Any]]:
    from simfloat.accumulate import BlockFMA, Sequential
    from simfloat.formats import FloatFormat

    cands: list[tuple[str, Any]] = [
        ("sequential fp32 (FMA loop)", Sequential("float32")),
        ("sm90 preset (exponent-sum alignment)", _preset(fmt)),
    ]
    modes = ("toward_zero", "nearest_even")
    if fmt in FP8:
        from simfloat.accumulate import fp8_mma_sync  # the M < 64 path: fp16 mma.sync, alternating k pairs

        cands.append(("fp8_mma_sync (fp16 mma.sync on converted operands, k in alternating pairs)", fp8_mma_sync()))
        for block in (16, 32, 64):
            for f in range(10, 17):
                for mant in (13, 23):
                    out_fmt = FloatFormat(f"e8m{mant}", 8, mant) if mant != 23 else "float32"
                    for mode in modes:
                        cands.append(
                            (
                                f"BlockFMA({block}, F={f}, out e8m{mant}, {mode})",
                                BlockFMA(block, f, out_fmt=out_fmt, out_mode=mode),
                            )
                        )
        return cands
    convs = ("toward_zero", "nearest_even", "nearest_away") if fmt == "tf32" else (None,)
    for block in (4, 8, 16, 32):
        for f in range(22, 29):
            for mode in modes:
                for conv in convs:
                    kw = dict(input_fmt="tfloat32", input_mode=conv) if conv else {}
                    cands.append(
                        (
                            f"BlockFMA({block}, F={f}, {mode}{', tf32 ' + conv if conv else ''})",
                            BlockFMA(block, f, out_mode=mode, **kw),
                        )
                    )
    return cands


#: the operand formats the dot probes use (simfloat.formats names)
_PROBE_FORMATS = ("bf16", "fp16", "tf32", "e4m3", "e5m2")


def _preset(fmt: str) -> Any:
    from simfloat.accumulate import tensor_core

    if fmt not in _PROBE_FORMATS:
        raise ValueError(f"no sm90 preset for probe format {fmt!r}; probe formats: {', '.join(_PROBE_FORMATS)}")
    return tensor_core("sm90", fmt)


def _predict(model: Any, a: np.ndarray, b: np.ndarray, c0: np.ndarray) -> np.ndarray:
    from simfloat.accumulate import matmul

    return matmul(a, b, c0, acc=model)


def dot_problem(name: str, v: dict[str, np.ndarray]) -> dict[str, Any]:
    """One dot variant's recorded probe as arrays: ``a`` (rows, 1, K), ``b`` (rows, K, keep), ``c0`` (rows,
    keep) the designed incoming accumulator, ``c`` (2, rows, keep) the GPU's outputs (launch 0: zero
    accumulator, 1: ``c0``), ``family`` per row and the ``families`` names."""
    fmt = name.split("_")[0]
    a = decode(v["a_bits"], fmt)  # (T, BM, K)
    b = decode(v["b_bits"], fmt)  # (T, K, keep)
    c0 = v["c0"].astype(np.float64)  # (T, BM, keep)
    c = v["c"].astype(np.float64)  # (2, T, BM, keep)
    t, bm, k = a.shape
    rows = int(v["rows"][0])
    return {
        "a": a.reshape(t * bm, k)[:rows][:, None, :],
        "b": np.repeat(b, bm, axis=0)[:rows],  # each row's own tile of B
        "c0": c0.reshape(t * bm, -1)[:rows],
        "c": c.reshape(2, t * bm, -1)[:, :rows],
        "family": v["family"],
        "families": [str(x) for x in v["families"]],
        "rows": rows,
    }


#: the two rules of :class:`~simfloat.accumulate.BlockFMA` the probes' ``overflow`` / ``negtiny`` rows ask, each
#: field's values (the default first)
RULES: dict[str, tuple[str, ...]] = {"overflow": ("round", "inf"), "zero_sign": ("exact", "positive")}


def with_rules(model: Any, **fields: Any) -> Any:
    """``model`` with the BlockFMA fields ``fields`` (:data:`RULES`) replaced, in its inner BlockFMA for a
    :class:`~simfloat.accumulate.Chunked` or :class:`~simfloat.accumulate.Interleaved`; ``None`` for a model
    without a BlockFMA (Sequential)."""
    import dataclasses

    from simfloat.accumulate import BlockFMA, Chunked, Interleaved

    if isinstance(model, BlockFMA):
        return dataclasses.replace(model, **fields)
    if isinstance(model, (Chunked, Interleaved)) and isinstance(model.inner, BlockFMA):
        return dataclasses.replace(model, inner=dataclasses.replace(model.inner, **fields))
    return None


def _same_bits(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Equal as float32 bit patterns (so -0.0 and +0.0 differ), every NaN one pattern."""
    bx = np.asarray(x, dtype=np.float32).view(np.uint32)
    by = np.asarray(y, dtype=np.float32).view(np.uint32)
    return (bx == by) | (np.isnan(x) & np.isnan(y))


def _predictions(model: Any, prob: dict[str, Any]) -> np.ndarray:
    """(2, rows, keep) predicted outputs of a :func:`dot_problem` (zero and designed incoming accumulator)."""
    c0 = prob["c0"]
    out = [_predict(model, prob["a"], prob["b"], cin[:, None, :])[:, 0, :] for cin in (np.zeros_like(c0), c0)]
    return np.stack(out)


def settle_rules(
    model: Any, probs: Sequence[dict[str, Any]], log: Callable[[str], None] = print
) -> tuple[Any, dict[str, dict[str, Any]]]:
    """Which value of each rule of :data:`RULES` the probes (:func:`dot_problem` dicts of one format and
    instruction) support, for a fitted ``model``: each value scored as bits on every output, one rule at a time.

    Returns:
        The model with the values chosen, and per rule: ``value``; ``outputs``, how many outputs the values
        predict differently (0: the probes do not settle the rule, the model's own value is kept); ``exact``,
        per value the outputs (of those) it reproduces.
    """
    report: dict[str, dict[str, Any]] = {}
    if with_rules(model) is None:
        return model, report
    for rule, values in RULES.items():
        preds = {v: [_predictions(with_rules(model, **{rule: v}), p) for p in probs] for v in values}
        differ = [~_same_bits(a, b) for a, b in zip(*preds.values(), strict=True)]
        exact = {
            v: int(
                sum(int((_same_bits(pr, p["c"]) & d).sum()) for pr, p, d in zip(preds[v], probs, differ, strict=True))
            )
            for v in values
        }
        n = int(sum(int(d.sum()) for d in differ))
        current = getattr(model.inner if not hasattr(model, rule) else model, rule)
        value = max(values, key=lambda v: (exact[v], v == current)) if n else current
        model = with_rules(model, **{rule: value})
        report[rule] = {"value": value, "outputs": n, "exact": exact}
        told = f"{value} ({exact[value]}/{n} outputs that tell the values apart)" if n else f"{value} (unsettled)"
        log(f"  {rule}: {told}")
    return model, report


def score_dot(model: Any, prob: dict[str, Any], sel: np.ndarray | None = None) -> tuple[float, np.ndarray]:
    """Bitwise agreement of ``model`` with a :func:`dot_problem` on the rows ``sel`` (default all): the mean
    and the (2, rows, keep) boolean array (zero and designed incoming accumulator). Outputs compare as float32
    bits (-0.0 and +0.0 differ), any NaN matching any NaN."""
    sel = np.arange(prob["rows"]) if sel is None else sel
    c0 = prob["c0"][sel]
    eq = []
    for launch, cin in ((0, np.zeros_like(c0)), (1, c0)):
        pred = _predict(model, prob["a"][sel], prob["b"][sel], cin[:, None, :])[:, 0, :]
        eq.append(_same_bits(pred, prob["c"][launch, sel]))
    e = np.stack(eq)
    return float(e.mean()), e


def fit_dot(
    name: str, v: dict[str, np.ndarray], *, coarse_rows: int = 768, top: int = 3, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Best BlockFMA model for one dot variant (see the module docstring). The result holds the best
    model's label and (``"model"``) the model itself, its agreement and (``"exact"``, ``"total"``) the count
    of bit-exact outputs, and (``"rules"``) what the probe says of the overflow and zero-sign rules
    (:func:`settle_rules`; the model carries the values chosen)."""
    fmt = name.split("_")[0]
    if "error" in v:
        return {"variant": name, "error": str(v["error"])}
    prob = dot_problem(name, v)
    rows = prob["rows"]
    fam = prob["family"]
    fams = prob["families"]

    def score(model: Any, sel: np.ndarray) -> tuple[float, np.ndarray]:
        return score_dot(model, prob, sel)

    rng = np.random.default_rng(0)
    sub = np.sort(rng.choice(rows, size=min(coarse_rows, rows), replace=False))
    coarse = []
    for label, model in _candidates(fmt):
        coarse.append((score(model, sub)[0], label, model))
    coarse.sort(key=lambda r: -r[0])
    allrows = np.arange(rows)
    best = []
    for _, label, model in coarse[:top]:
        s, e = score(model, allrows)
        best.append((s, label, model, e))
    best.sort(key=lambda r: -r[0])
    s, label, model, e = best[0]
    settled, rules = settle_rules(model, [prob], log=log)
    if settled != model:
        model = settled
        s, e = score(model, allrows)
        label += ", " + ", ".join(f"{r} {rules[r]['value']}" for r in rules)
    per_family = {fams[f]: round(float(e[:, fam == f].mean()), 4) for f in np.unique(fam)}
    preset_score, _ = score(_preset(fmt), allrows)
    res = {
        "variant": name,
        "mma": str(v["mma"][0]) if "mma" in v else "",
        "best": label,
        "agreement": round(s, 5),
        "zero_acc": round(float(e[0].mean()), 5),
        "designed_acc": round(float(e[1].mean()), 5),
        "per_family": per_family,
        "preset_sm90": round(preset_score, 5),
        "runners_up": [(lab, round(sc, 5)) for sc, lab, _, _ in best[1:]],
        "model": model,
        "rules": rules,
        "exact": int(e.sum()),
        "total": int(e.size),
    }
    log(
        f"dot {name}: best {label} {s:.4%} (zero acc {res['zero_acc']:.4f}, designed acc "
        f"{res['designed_acc']:.4f}); sm90 preset {preset_score:.4%}; {res['mma']}"
    )
    return res


# ----------------------------------------------------------------------------------------------------
# (c) sum
# ----------------------------------------------------------------------------------------------------


def tree_from_lca(lca: np.ndarray) -> Any:
    """The reduction tree (nested tuples of leaf indices) from an n x n matrix of LCA subtree sizes, or raise
    ValueError if the matrix is not a tree's (FPRev)."""
    n = lca.shape[0]
    nodes: set[frozenset] = {frozenset([i]) for i in range(n)}
    for i in range(n):
        for s in np.unique(lca[i][np.arange(n) != i]):
            members = frozenset([i] + [j for j in range(n) if j != i and lca[i, j] <= s])
            if len(members) != s:
                raise ValueError(f"inconsistent LCA sizes: leaf {i}, size {s}, {len(members)} members")
            nodes.add(members)
    ordered = sorted(nodes, key=len)

    def build(node: frozenset) -> Any:
        if len(node) == 1:
            return next(iter(node))
        children = []
        covered: set[int] = set()
        for cand in sorted((x for x in ordered if len(x) < len(node) and x <= node), key=len, reverse=True):
            if not (cand & covered):
                children.append(cand)
                covered |= cand
        if covered != set(node):
            raise ValueError("children do not cover their parent")
        return tuple(build(c) for c in sorted(children, key=min))

    return build(frozenset(range(n)))


def _tree_str(tree: Any) -> str:
    return str(tree).replace(" ", "")


def _order_tree(n: int, order: str, **kw: Any) -> Any:
    """The tree of a simfloat.ops.sum order, measured with the same design."""
    from simfloat.ops import sum as ssum
    from simfloat_gpu.campaign.probes import sum_design

    pairs, x = sum_design(n)
    y = ssum(x, "float32", order=order, **kw)
    lca = np.zeros((n, n))
    p = len(pairs)
    lca[pairs[:, 0], pairs[:, 1]] = n - y[:p]
    lca[pairs[:, 1], pairs[:, 0]] = n - y[:p]
    return tree_from_lca(lca)


def fit_sum(name: str, v: dict[str, np.ndarray], log: Callable[[str], None] = print) -> dict[str, Any]:
    from simfloat_gpu.campaign.probes import sum_design

    if "error" in v:
        return {"variant": name, "error": str(v["error"])}
    bm, bn = (int(x) for x in v["shape"][:2])
    pairs, _ = sum_design(bn)
    p = len(pairs)
    res: dict[str, Any] = {"variant": name}
    for layout in ("y_mma", "y_blocked"):
        y = v[layout].astype(np.float64)
        first, second = y[:p], y[p:][::-1]
        consistent = bool(np.array_equal(first, second))
        lca = np.zeros((bn, bn))
        lca[pairs[:, 0], pairs[:, 1]] = bn - first
        lca[pairs[:, 1], pairs[:, 0]] = bn - first
        entry: dict[str, Any] = {"rows_consistent": consistent}
        try:
            tree = tree_from_lca(lca)
            entry["tree"] = _tree_str(tree)
            matches = []
            for label, kw in (
                ("sequential", {}),
                ("pairwise", {"fan_in": 2}),
                ("numpy", {}),
                ("chunked-8", {"chunk": 8}),
                ("chunked-16", {"chunk": 16}),
            ):
                order = label.split("-")[0]
                if order == "chunked":
                    kw = {"chunk": int(label.split("-")[1])}
                try:
                    if _order_tree(bn, order, **kw) == tree:
                        matches.append(label)
                except Exception:
                    pass
            entry["matches_simfloat_order"] = matches
        except ValueError as exc:
            entry["tree"] = f"not a tree: {exc}"
        res[layout] = entry
        log(
            f"sum {name} {layout}: consistent over rows {consistent}; matches "
            f"{entry.get('matches_simfloat_order')}; "
            f"tree {entry['tree'][:160]}{'...' if len(entry['tree']) > 160 else ''}"
        )
    return res


# ----------------------------------------------------------------------------------------------------
# (b) exp2
# ----------------------------------------------------------------------------------------------------


def _cr(x: np.ndarray, fn: str) -> np.ndarray:
    from simfloat import ops

    return (ops.exp2 if fn == "exp2" else ops.exp)(x.astype(np.float32), "float32").astype(np.float32)


def _cr_mode(x: np.ndarray, mode: str) -> np.ndarray:
    from simfloat import ops

    return ops.exp2(x.astype(np.float32), "float32", mode).astype(np.float32)


def segment_values(z: Any, seg: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) float32 of one exp-probe segment, y reconstructed from the ulp offsets and raw exceptions."""
    from simfloat_gpu.campaign.probes import segment_inputs

    name = seg["name"]
    x = segment_inputs(seg)
    step = int(z[f"{name}_decimated"][0]) if f"{name}_decimated" in z.files else 1
    off = z[f"{name}_off"].astype(np.int64)
    if step > 1:
        x = x[::step]
    ref = _cr(x, seg["fn"])
    y = (ref.view(np.uint32).astype(np.int64) + off[: x.size]).astype(np.uint32)
    for kind in ("amb", "clip"):
        idx = z[f"{name}_{kind}_idx"]
        if step > 1:
            keep = idx % step == 0
            idx = idx[keep] // step
            y[idx] = z[f"{name}_{kind}_y"][keep]
        else:
            y[idx] = z[f"{name}_{kind}_y"]
    return x, y.view(np.float32)


class Ex2Model:
    """ex2.approx as fitted. ``table``: the periodic model, 2^23 int8 ulp offsets of T(f) = approx(f - 2) from
    the correctly rounded value on the [-2, -1) grid (2^x = T(frac x) * 2^(floor x + 2), the fraction of |x| <
    1 inputs fixed to 23 bits by ``frac_rounding``); else ``shifts``: the compact model, y = rn32(2^x + s *
    ulp)
    with s = shifts[top k bits of frac x] / 32 (int8, in 1/32 ulp)."""

    def __init__(
        self,
        table: np.ndarray | None = None,
        shifts: np.ndarray | None = None,
        k: int = 0,
        frac_rounding: str = "trunc",
        ftz: bool = True,
    ) -> None:
        self.table, self.shifts, self.k, self.frac_rounding, self.ftz = table, shifts, k, frac_rounding, ftz

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return ex2_approx(x, self)

    def save(self, path: Path) -> None:
        arrays: dict[str, Any] = {
            "k": np.array([self.k]),
            "frac_rounding": np.array(self.frac_rounding),
            "ftz": np.array([self.ftz]),
        }
        if self.table is not None:
            arrays["table"] = self.table
        if self.shifts is not None:
            arrays["shifts"] = self.shifts
        np.savez_compressed(path, **arrays)


def load_ex2_model(path: Path) -> Ex2Model:
    """An :class:`Ex2Model` saved by ``python -m simfloat_gpu.campaign.fit ... --save-ex2 PATH``."""
    with np.load(path) as z:
        return Ex2Model(
            z["table"] if "table" in z.files else None,
            z["shifts"] if "shifts" in z.files else None,
            int(z["k"][0]),
            str(z["frac_rounding"]),
            bool(z["ftz"][0]),
        )


SHIFT_GRID = np.arange(-64, 33)  # candidate shifts, 1/32 ulp: [-2, +1] ulp


def _exact_and_ulp(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ex = np.exp2(x.astype(np.float64))
    return ex, np.spacing(ex.astype(np.float32)).astype(np.float64)


def _shift_predict(x: np.ndarray, shifts: np.ndarray, k: int) -> np.ndarray:
    ex, ulp = _exact_and_ulp(x)
    _, fi = _split(x, "trunc")
    return (ex + shifts[fi >> (23 - k)].astype(np.float64) / 32.0 * ulp).astype(np.float32)


def _shift_fit(x: np.ndarray, y: np.ndarray, k: int) -> np.ndarray:
    """Per bucket of the top k fraction bits, the shift that reproduces the most outputs."""
    ex, ulp = _exact_and_ulp(x)
    _, fi = _split(x, "trunc")
    bucket = fi >> (23 - k)
    yb = y.view(np.uint32)
    counts = np.stack(
        [
            np.bincount(
                bucket, weights=((ex + s / 32.0 * ulp).astype(np.float32).view(np.uint32) == yb), minlength=2**k
            )
            for s in SHIFT_GRID
        ]
    )
    return SHIFT_GRID[np.argmax(counts, axis=0)].astype(np.int8)


def _split(x: np.ndarray, rounding: str) -> tuple[np.ndarray, np.ndarray]:
    """x = i + f with f on the 2^-23 grid, f in [0, 1): (i, f * 2^23 as int64)."""
    x64 = x.astype(np.float64)
    i = np.floor(x64)
    f = (x64 - i) * 2.0**23  # exact: x - floor(x) is exact in float64 for float32 x
    if rounding == "trunc":
        fi = np.floor(f)
    elif rounding == "round":
        fi = np.round(f)
    else:
        raise ValueError(rounding)
    carry = fi >= 2**23
    return (i + carry).astype(np.int64), np.where(carry, fi - 2**23, fi).astype(np.int64)


def ex2_approx(x: np.ndarray, model: Ex2Model) -> np.ndarray:
    """A CPU model of the GPU's ex2.approx.ftz.f32 on a float32 array (see :class:`Ex2Model`)."""
    x = np.asarray(x, dtype=np.float32)
    shape = x.shape
    xf = x.reshape(-1)
    if model.ftz:
        xf = np.where(np.abs(xf) < np.float32(2.0**-126), np.float32(0.0), xf)
    out = np.empty(xf.size, dtype=np.float32)
    finite = np.isfinite(xf) & (xf > -126.0) & (xf < 128.0)
    xs = xf[finite]
    if model.table is not None:
        i, fi = _split(xs, model.frac_rounding)
        base = _cr((fi.astype(np.float64) * 2.0**-23 - 2.0).astype(np.float32), "exp2")  # on the grid: exact
        t = (base.view(np.uint32).astype(np.int64) + model.table[fi]).astype(np.uint32).view(np.float32)
        y = np.ldexp(t.astype(np.float64), (i + 2).astype(np.int64)).astype(np.float32)
    elif model.shifts is not None:
        y = _shift_predict(xs, model.shifts, model.k)
    else:
        y = _cr(xs, "exp2")
    out[finite] = y
    with np.errstate(over="ignore"):
        out[~finite] = np.exp2(xf[~finite].astype(np.float64)).astype(np.float32)
    if model.ftz:
        out = np.where(np.abs(out) < np.float32(2.0**-126), np.float32(0.0), out)
    return out.reshape(shape)


def _offsets_of(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    ref = _cr(x, "exp2")
    return y.view(np.uint32).astype(np.int64) - ref.view(np.uint32).astype(np.int64)


def fit_exp(zs: Sequence[Any], log: Callable[[str], None] = print, save: Path | None = None) -> dict[str, Any]:
    """Offset statistics and ex2 models from exp-probe files (any of them may hold any segment)."""
    described = {seg["name"]: seg for z in zs if "segments" in z.files for seg in json.loads(str(z["segments"]))}
    segs: dict[str, tuple[np.ndarray, np.ndarray, dict[str, Any]]] = {}
    for name, seg in described.items():
        for z in zs:  # exp2_binades.npz may hold the binade segments without their description
            if f"{name}_off" in z.files:
                x, y = segment_values(z, seg)
                segs[name] = (x, y, seg)
    res: dict[str, Any] = {"segments": {}}
    for name, (x, y, seg) in segs.items():
        ref = _cr(x, seg["fn"])
        d = y.view(np.uint32).astype(np.int64) - ref.view(np.uint32).astype(np.int64)
        vals, counts = np.unique(d, return_counts=True)
        res["segments"][name] = {
            "n": int(x.size),
            "exact": round(float(np.mean(d == 0)), 5),
            "offsets": {int(a): int(b) for a, b in zip(vals, counts, strict=True)},
        }
        log(
            f"exp {name}: {x.size} inputs, correctly rounded {np.mean(d == 0):.2%}, offsets "
            f"{res['segments'][name]['offsets']}"
        )
    model = None
    if "exp2_neg_binade" in segs:
        x, y, _ = segs["exp2_neg_binade"]
        full = x.size == 2**23
        _, fi = _split(x, "trunc")
        table = np.zeros(2**23, dtype=np.int8)
        table[fi] = np.clip(_offsets_of(x, y), -128, 127)
        if full:
            res["periodic"] = {}
            for rounding in ("trunc", "round"):
                m = Ex2Model(table=table, frac_rounding=rounding)
                scores = {}
                for name in ("exp2_sweep", "exp2_pos_binade"):
                    if name in segs:
                        xs, ys, _ = segs[name]
                        pred = m(xs)
                        big = np.abs(xs) >= 1
                        scores[name] = {
                            "|x|>=1": round(float(np.mean(pred[big] == ys[big])), 6) if big.any() else None,
                            "|x|<1": round(float(np.mean(pred[~big] == ys[~big])), 6) if (~big).any() else None,
                        }
                res["periodic"][rounding] = scores
                log(f"exp2 periodic table model (fraction {rounding}): {scores}")
            best = max(
                res["periodic"], key=lambda r: sum(v or 0 for s in res["periodic"][r].values() for v in s.values())
            )
            model = Ex2Model(table=table, frac_rounding=best)
        # compact models: fitted on the even inputs of the binade, scored on the odd ones and on the sweep
        res["compact"] = {}
        for k in (6, 8, 10, 12, 14, 16):
            m = Ex2Model(shifts=_shift_fit(x[::2], y[::2], k), k=k)
            held = float(np.mean(m(x[1::2]) == y[1::2]))
            sweep = None
            if "exp2_sweep" in segs:
                xs, ys, _ = segs["exp2_sweep"]
                sweep = float(np.mean(m(xs) == ys))
            res["compact"][k] = {"held_out_binade": round(held, 5), "sweep": None if sweep is None else round(sweep, 5)}
            shown = "-" if sweep is None else f"{sweep:.4%}"
            log(f"exp2 compact model k={k}: held-out {held:.4%}, sweep {shown}")
        if model is None:
            kbest = max(res["compact"], key=lambda kk: res["compact"][kk]["held_out_binade"])
            model = Ex2Model(shifts=_shift_fit(x, y, kbest), k=kbest)
    z = next((z for z in zs if "edges_x" in z.files), None)
    if z is not None:
        ex, ey = z["edges_x"], z["edges_exp2_y"].view(np.float32)
        if model is not None:
            pred = model(ex)
            same = (pred.view(np.uint32) == ey.view(np.uint32)) | (np.isnan(pred) & np.isnan(ey))
            res["edges_model_agreement"] = round(float(np.mean(same)), 4)
        flush = ex < -126
        res["edges"] = {
            "flushed_to_zero_below_-126": bool(np.all(ey[flush & np.isfinite(ex)] == 0)),
            "subnormal_inputs_give_1": bool(np.all(ey[(np.abs(ex) < 2.0**-126) & (ex != 0)] == 1.0)),
        }
        log(f"exp2 edges: {res['edges']}, model {res.get('edges_model_agreement')}")
    if save is not None and model is not None:
        model.save(save)
        log(f"saved the ex2 model to {save}")
    return res


# ----------------------------------------------------------------------------------------------------
# fixtures: the emulator's triton-<fmt> and h200-<fmt> plans against the recorded GPU outputs
# ----------------------------------------------------------------------------------------------------


def compare_plans(
    fix_dir: Path,
    prefixes: Sequence[str] = ("triton", "h200"),
    *,
    max_cost: float | None = None,
    ids: Sequence[str] | None = None,
    log: Callable[[str], None] = print,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Every fixture config against the emulator under each plan family (``triton-<fmt>``: sm90 dot
    presets, correctly rounded exp2, sequential l_ij; ``h200-<fmt>``: + the measured ex2.approx and tl.sum
    order); int8 configs with their int8 presets (:mod:`simfloat_gpu.campaign.kinds`). Rows
    (:func:`simfloat_gpu.campaign.report.pivot`): id, kind, fmt,
    blocks and, per prefix P, ``P:out``, ``P:out32``, ``P:m``, ``P:l`` (bitwise agreement).

    Raises:
        AssertionError: a config's regenerated inputs differ from the recorded ones, or a comparison failed.
    """
    from simfloat_gpu.campaign.fixtures import compare_fixtures
    from simfloat_gpu.campaign.report import pivot

    env, rows = compare_fixtures(fix_dir, max_cost=max_cost, families=prefixes, ids=ids, log=log)
    bad = [(r.id, r.status) for r in rows if r.status.startswith("error")]
    if bad:
        raise AssertionError(f"fixture comparisons failed: {bad[:4]}")
    return env, pivot([r for r in rows if r.status == "ok"])
