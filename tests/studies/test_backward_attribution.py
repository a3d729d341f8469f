"""``simfloat attribute --pass backward``: per-op isolation and ablation of the gradient error."""

import numpy as np
import pytest

import simfloat as sf
from simfloat.attribution.backward import BWD_ATTRIBUTION_OPS, attribute_backward


def _inputs(seed=0, seq=40, d=16):
    rng = np.random.default_rng(seed)
    return tuple(sf.round(rng.standard_normal((2, seq, d)), "bf16") for _ in range(4))


def test_isolation_and_ablation_of_the_bf16_casts():
    pytest.importorskip("pandas")
    q, k, v, do = _inputs()
    res = attribute_backward(q, k, v, do, "triton-bf16", tiles=[(16, 16), (32, 16)], causal=True)
    assert len(res.isolation) == len(res.ablation) == 2 * len(BWD_ATTRIBUTION_OPS) and len(res.tiles) == 2 * 2
    rows = [r for t in (res.tiles, res.isolation, res.ablation) for r in t.to_dict("records")]
    first = {(r["kind"], r["op"]): r for r in rows if (r["block_m"], r["block_n"]) == (16, 16)}
    full = first[("full", "")]
    # the gradients are stored in bf16: alone, that cast deviates by about half a bf16 ulp of the largest value
    iso = first[("isolation", "grad")]
    assert 2.0**-10 < iso["dq_max"] < 2.0**-7
    # an fp32 op alone deviates far less than a bf16 one
    assert first[("isolation", "delta")]["dq_max"] < 1e-3 * iso["dq_max"]
    # every bf16 op ablated leaves the full plan's deviation at most as it is, up to the remaining roundings
    assert first[("ablation", "grad")]["dv_max"] < full["dv_max"]
    for r in rows:
        assert all(np.isfinite(r[c]) and r[c] >= 0 for c in ("dq_max", "dk_max", "dv_max", "dq_rms"))
    with pytest.raises(ValueError, match="unknown backward ops"):
        attribute_backward(q, k, v, do, ops=["pv"])


def test_cli_pass_backward_writes_csv_png_and_summary(tmp_path, capsys):
    pytest.importorskip("pandas")
    pytest.importorskip("matplotlib")
    from simfloat.cli import main

    rc = main(
        ["attribute", "--quick", "--pass", "backward", "--seq", "24", "--tiles", "8x16", "16x8", "--out", str(tmp_path)]
    )
    assert rc == 0
    for name in ("backward_attribution.csv", "backward_attribution.png", "backward_summary.txt"):
        assert (tmp_path / name).stat().st_size > 0
    text = (tmp_path / "backward_summary.txt").read_text()
    assert "isolation" in text and "ablation" in text and "ds_cast" in text
    import pandas as pd

    assert (tmp_path / "backward_steps.png").stat().st_size > 0
    steps = pd.read_csv(tmp_path / "backward_steps.csv")
    # quick tile 16x16 and seq 24: block_n sweep 8, 16, 24 at the full length; length sweep 16, 24
    points = steps[["sweep", "block_n", "seq_k", "steps"]].drop_duplicates()
    assert [tuple(r) for r in points.itertuples(index=False)] == [
        ("block_n", 8, 24, 3),
        ("block_n", 16, 24, 2),
        ("block_n", 24, 24, 1),
        ("seq", 16, 16, 1),
        ("seq", 16, 24, 2),
    ]
    # per point: the full plan, the forward's share, the top isolated ops and the accumulating dots
    iso = steps[steps.kind == "isolation"].groupby(["sweep", "block_n", "seq_k"]).op.apply(list)
    assert all(len(ops) == len(set(ops)) and {"dq", "dk", "dv", "grad"} <= set(ops) for ops in iso)
    assert (steps.groupby(["sweep", "block_n", "seq_k"]).kind.apply(lambda k: list(k)[:2] == ["full", "forward"])).all()
    assert "vs rescaling steps" in text


def _golden_grads(q, k, v, do, causal):
    """float64 attention gradients by the textbook formulas (independent of the emulator)."""
    scale = 1.0 / np.sqrt(q.shape[-1])
    s = scale * q @ np.swapaxes(k, -1, -2)
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], dtype=bool)), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    o = p @ v
    dp = do @ np.swapaxes(v, -1, -2)
    ds = p * (dp - np.sum(do * o, axis=-1, keepdims=True))
    return scale * ds @ k, scale * np.swapaxes(ds, -1, -2) @ q, np.swapaxes(p, -1, -2) @ do


def test_backward_steps_table_and_one_point_against_a_direct_run():
    from simfloat.attention import backward_plan, flash, flash_backward, lse_from_stats
    from simfloat.attribution.backward import backward_steps, default_seqs, top_isolated
    from simfloat.metrics import error_metrics

    q, k, v, do = _inputs(seed=3)
    rows = backward_steps(
        q,
        k,
        v,
        do,
        plan="triton-bf16",
        block_m=8,
        block_n=16,
        block_ns=[8, 40],
        seqs=[16, 33],
        causal=True,
        ops=["grad"],
    )
    got = [(r["sweep"], r["seq_k"], r["block_n"], r["steps"], r["q_tiles"], r["kind"], r["op"]) for r in rows]
    want = []
    for sweep, n, bn, steps, qt in (
        ("block_n", 40, 8, 5, 5),
        ("block_n", 40, 40, 1, 5),
        ("seq", 16, 16, 1, 2),
        ("seq", 33, 16, 3, 5),
    ):
        want += [
            (sweep, n, bn, steps, qt, kind, op) for kind, op in (("full", ""), ("forward", ""), ("isolation", "grad"))
        ]
    assert got == want
    for r in rows:
        assert r["seq_q"] == r["seq_k"] and r["block_m"] == 8
        for g in ("dq", "dk", "dv"):
            assert {f"{g}_{m}" for m in ("max", "rms", "max_abs", "rmse", "rel_l1")} <= r.keys()
    # the point (length 33, tile 8x16) by hand: forward, lse, backward, deviation from textbook float64 gradients
    n = 33
    qs, ks, vs, dos = (x[:, :n] for x in (q, k, v, do))
    o, m, l = flash(qs, ks, vs, plan="triton-bf16", return_stats=True, block_m=8, block_n=16, causal=True)  # noqa: E741
    lse = lse_from_stats(m, l, plan=backward_plan("triton-bf16"))
    grads = flash_backward(qs, ks, vs, o, dos, lse, plan="triton-bf16", block_m=8, block_n=16, causal=True)
    golden = _golden_grads(qs, ks, vs, dos, causal=True)
    full = next(r for r in rows if r["sweep"] == "seq" and r["seq_k"] == n and r["kind"] == "full")
    for name, g, w in zip(("dq", "dk", "dv"), grads, golden, strict=True):
        ref = error_metrics(g, w)
        assert ref["rel_l1"] > 0
        for key in ("max_abs", "rmse", "rel_l1"):
            assert full[f"{name}_{key}"] == pytest.approx(ref[key], rel=1e-6)
        assert full[f"{name}_max"] == pytest.approx(ref["max_abs"] / np.abs(w).max(), rel=1e-6)
    assert default_seqs(40, 16) == [16, 32, 40] and default_seqs(16, 16) == [16]
    iso = [
        dict(block_m=8, block_n=8, kind="isolation", op=o, dq_max=x, dk_max=0.0, dv_max=0.0)
        for o, x in (("a", 1e-3), ("b", 1e-1), ("c", 1e-2))
    ]
    assert top_isolated(iso, 2) == ["b", "c"]
    with pytest.raises(ValueError, match="exceed the inputs' length"):
        backward_steps(q, k, v, do, seqs=[41], block_ns=())
    with pytest.raises(ValueError, match="block_n must be a positive int"):
        backward_steps(q, k, v, do, block_ns=[0], seqs=())


def test_cli_seqs_longer_than_the_inputs_is_refused(tmp_path, capsys):
    from simfloat.cli import main

    argv = ["attribute", "--quick", "--pass", "backward", "--seq", "24", "--seqs", "32", "--out", str(tmp_path)]
    assert main(argv) == 2
    assert "--seqs 32: longer than the inputs" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["bool", "window"])
def test_masked_backward_attribution_is_the_masked_gradients_deviation(kind):
    """attribute_backward with a mask (as attribute()): every forward and backward run takes it, so the full
    row is the masked gradients' deviation from the masked fp64 gradients, and differs from the unmasked one."""
    pytest.importorskip("pandas")
    from simfloat.attention import flash, flash_backward, lse_from_stats
    from simfloat.attribution.backward import backward_steps

    q, k, v, do = _inputs(seed=3, seq=40)
    if kind == "bool":
        keep = np.random.default_rng(4).random((40, 40)) < 0.6
        keep[:, 0] = True
        mask = {"attn_mask": keep}
    else:
        mask = {"window": (9, 2), "key_lengths": np.array([33, 40])}
    res = attribute_backward(q, k, v, do, "triton-bf16", tiles=[(16, 16)], ops=["ds_cast"], **mask)
    kw = dict(block_m=16, block_n=16, **mask)

    def grads(fwd, bwd):
        o, m, l = flash(q, k, v, plan=fwd, return_stats=True, **kw)  # noqa: E741
        return flash_backward(q, k, v, o, do, lse_from_stats(m, l, plan=bwd), plan=bwd, **kw)

    from simfloat.attribution.backward import _plans

    bp, fp, g64, f64 = _plans("triton-bf16")
    got, golden = grads(fp, bp), grads(f64, g64)
    full = res.tiles[res.tiles.kind == "full"].iloc[0]
    for name, g, w in zip(("dq", "dk", "dv"), got, golden, strict=True):
        assert full[f"{name}_max"] == float(np.abs(g - w).max() / np.abs(w).max())
    plain = attribute_backward(q, k, v, do, "triton-bf16", tiles=[(16, 16)], ops=["ds_cast"])
    assert plain.tiles[plain.tiles.kind == "full"].iloc[0]["dq_max"] != full["dq_max"]
    assert res.meta["masked"] and not plain.meta["masked"]
    steps = backward_steps(q, k, v, do, block_m=16, block_n=16, block_ns=(8,), seqs=(16, 40), ops=["ds_cast"], **mask)
    assert {r["seq_q"] for r in steps} == {16, 40}
    assert all(np.isfinite(r["dq_max"]) for r in steps)
