"""Issue 27's silent traps: each test here failed on the code before its fix (the names are imported inside the
tests, so a missing one fails that test alone). Tiny inputs (seq <= 64, head dim 8 or 16)."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

import simfloat as sf
from simfloat.attention import baseline, baseline_backward, flash, flash_backward, lse_from_stats, plan
from simfloat.attribution import attribute, deviation


def _category(name):
    """One of simfloat.attention's warning categories; ``Warning`` where it is missing (the code before the fix
    had none), so that a test then fails on the missing warning itself."""
    import simfloat.attention

    return getattr(simfloat.attention, name, Warning)


def _normal(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def _qkv(seq=40, d=16, lead=(1, 2), fmt="bf16", seed=0):
    g = np.random.default_rng(seed)
    xs = [g.standard_normal(lead + (seq, d)) for _ in range(3)]
    return tuple(xs if fmt is None else (sf.round(x, fmt) for x in xs))


# -- 1. inputs that are not values of the plan's input format ----------------------------------------------


def test_inputs_outside_the_plans_format_are_warned_about_in_every_entry_point():
    InputFormatWarning = _category("InputFormatWarning")  # noqa: N806
    q, k, v = _qkv(fmt="fp32")  # fp32 activations fed to a bf16 kernel
    with pytest.warns(InputFormatWarning, match=r"q, k, v hold values that are not bf16 values.*triton-bf16"):
        flash(q, k, v, plan="triton-bf16", block_m=16, block_n=16)
    with pytest.warns(InputFormatWarning, match="pytorch-bf16"):
        baseline(q, k, v, plan="pytorch-bf16")
    do = sf.round(_normal(q.shape, 5), "fp32")
    o, m, l = flash(*(sf.round(x, "bf16") for x in (q, k, v)), plan="triton-bf16", return_stats=True)  # noqa: E741
    lse = lse_from_stats(m, l, plan="triton-bf16")
    with pytest.warns(InputFormatWarning, match="do"):
        flash_backward(*(sf.round(x, "bf16") for x in (q, k, v)), o, do, lse, plan="triton-bf16")
    with pytest.warns(InputFormatWarning, match="k "):
        baseline_backward(sf.round(q, "bf16"), k, sf.round(v, "bf16"), sf.round(do, "bf16"), plan="pytorch-bf16")
    with pytest.warns(InputFormatWarning, match="rounds them into bf16"):
        attribute(q, k, v, "triton-bf16", ops=["p"], tiles=(), block_ns=(), trace=False, block_m=16, block_n=16)
    # values of the format, or a plan without one (fp64): not a word
    with warnings.catch_warnings():
        warnings.simplefilter("error", InputFormatWarning)
        flash(*(sf.round(x, "bf16") for x in (q, k, v)), plan="triton-bf16")
        flash(q, k, v, plan="triton-fp32")
        baseline(q, k, v, plan="fp64")
        flash(q, k, v, plan=plan("triton-bf16").replace(name="mine", input_format=None))  # no input format
        flash(q, k, v, plan=plan("triton-fp32").replace(name="triton-bf16x"))  # the field decides, not the name
    # the input format is plan data: a renamed plan keeps its kernel's
    with pytest.warns(InputFormatWarning, match="not bf16 values.*mine"):
        flash(q, k, v, plan=plan("triton-bf16").replace(name="mine"), block_m=16, block_n=16)
    assert issubclass(InputFormatWarning, UserWarning) and InputFormatWarning is not UserWarning  # filterable


@pytest.mark.parametrize(
    ("name", "fmt"),
    [("flashattn-triton-bf16", "bf16"), ("flashattn-triton-fp16", "fp16"), ("triton-tutorial-fp16", "fp16")]
    + [(f"fa{g}-{f}", f) for g in (3, 4) for f in ("bf16", "fp16", "e4m3")],
)
def test_the_kernel_presets_carry_their_input_format(name, fmt):
    """The presets of one GPU kernel outside the triton-/h200-/all-/pytorch- families warn as those do: their
    kernels read q, k, v (and dO) in ``fmt``; values of it pass in silence, forward and backward."""
    InputFormatWarning = _category("InputFormatWarning")  # noqa: N806
    assert plan(name).input_format == fmt
    q, k, v = _qkv(seq=32, d=16, fmt="fp32", seed=4)
    tiles = {"causal": True} if name.startswith("fa4") else {"causal": True, "block_m": 16, "block_n": 16}
    with pytest.warns(InputFormatWarning, match=f"not {fmt} values.*{name}"):
        flash(q, k, v, plan=name, **tiles)
    qf, kf, vf = (sf.round(x, fmt) for x in (q, k, v))
    with warnings.catch_warnings():
        warnings.simplefilter("error", InputFormatWarning)
        o, m, l = flash(qf, kf, vf, plan=name, return_stats=True, **tiles)  # noqa: E741
    if name.startswith(("flashattn-triton", "triton-tutorial")):  # the presets with a backward plan
        from simfloat.attention import backward_plan

        assert backward_plan(name).input_format == fmt
        lse = lse_from_stats(m, l, plan=name)
        do = sf.round(_normal(q.shape, 6), "fp32")
        with pytest.warns(InputFormatWarning, match="do"):
            flash_backward(qf, kf, vf, o, do, lse, plan=name, **tiles)


def test_torch_attention_warns_for_fp32_tensors_under_a_bf16_plan():
    torch = pytest.importorskip("torch")
    import simfloat.torch as st

    InputFormatWarning = _category("InputFormatWarning")  # noqa: N806
    q, k, v = (torch.from_numpy(x).float() for x in _qkv(fmt=None))
    with pytest.warns(InputFormatWarning, match="not bf16 values"):
        st.attention(q, k, v, plan="triton-bf16", block_m=16, block_n=16)
    with warnings.catch_warnings():
        warnings.simplefilter("error", InputFormatWarning)
        st.attention(*(x.to(torch.bfloat16) for x in (q, k, v)), plan="triton-bf16", block_m=16, block_n=16)


# -- 2. the input rounding is an error source of its own ---------------------------------------------------


def test_input_rounding_is_its_own_row_and_the_total_is_against_the_unrounded_golden():
    InputFormatWarning = _category("InputFormatWarning")  # noqa: N806
    q, k, v = _qkv(seq=48, fmt="fp32", seed=2)
    with pytest.warns(InputFormatWarning, match="rounds them"):
        r = attribute(q, k, v, ["triton-bf16", "all-fp16"], ops=["p"], tiles=(), block_ns=(), trace=False)
    t = r.input_rounding.set_index(["plan", "source"])
    gold = baseline(q, k, v, plan="fp64")
    for name, fmt in (("triton-bf16", "bf16"), ("all-fp16", "fp16")):
        qr, kr, vr = (sf.round(x, fmt) for x in (q, k, v))
        gold_r = baseline(qr, kr, vr, plan="fp64")
        out = flash(qr, kr, vr, plan=name, block_m=64, block_n=64)
        assert t.loc[(name, "input rounding"), "max_abs"] == deviation(gold_r, gold)["max_abs"]
        assert t.loc[(name, "total"), "max_abs"] == deviation(out, gold)["max_abs"]
        assert t.loc[(name, "kernel"), "max_abs"] == deviation(out, gold_r)["max_abs"]
        assert t.loc[(name, "input rounding"), "input_format"] == fmt
        # the other tables keep the kernel's own error on the rounded inputs
        iso = r.isolation.set_index(["plan", "op"])
        assert iso.loc[(name, "all"), "max_abs"] == deviation(out, gold_r)["max_abs"]
    # bf16 rounding of the inputs is about as large as the kernel's own error: leaving it out misleads
    assert t.loc[("triton-bf16", "input rounding"), "max_abs"] > 0.3 * t.loc[("triton-bf16", "kernel"), "max_abs"]
    fvb = r.flash_vs_baseline.set_index(["plan", "kernel"])
    assert fvb.loc[("triton-bf16", "flash"), "max_abs"] == t.loc[("triton-bf16", "kernel"), "max_abs"]
    assert "input rounding" in r.table()
    # inputs already in the format: no such table rows
    qb, kb, vb = (sf.round(x, "bf16") for x in (q, k, v))
    r2 = attribute(qb, kb, vb, "triton-bf16", ops=["p"], tiles=(), block_ns=(), trace=False)
    assert len(r2.input_rounding) == 0 and "input rounding" not in r2.table()


# -- 3. torch modules whose fast paths bypass scaled_dot_product_attention --------------------------------


def test_emulate_sdpa_routes_the_encoder_layer_in_eval_and_names_what_it_cannot_route():
    torch = pytest.importorskip("torch")
    import simfloat.torch as st

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True).double().eval()
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    with torch.no_grad():
        want = layer(x)
        st.timings(reset=True)
        with st.emulate_sdpa(plan="fp64"):
            got = layer(x)  # eval + no_grad: torch's fused fast path, unless the block turns it off
        assert st.timings()["forward_calls"] == 1
    assert float((got - want).abs().max()) < 1e-12
    mha = torch.nn.MultiheadAttention(16, 2, batch_first=True).double()
    with pytest.warns(st.RoutingWarning) as got:
        with st.emulate_sdpa(plan="fp64"):
            mha(x, x, x)  # need_weights=True (torch's default) computes softmax(QK^T) itself
    said = [str(w.message) for w in got]
    assert any(re.search(r"MultiheadAttention 'MultiheadAttention'.*need_weights=False", m) for m in said), said
    assert any("no call" in m for m in said), said
    st.timings(reset=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", st.RoutingWarning)
        with st.emulate_sdpa(plan="fp64"):
            mha(x, x, x, need_weights=False)
    assert st.timings()["forward_calls"] == 1
    with pytest.warns(st.RoutingWarning, match="no call"):
        with st.emulate_sdpa(plan="fp64"):
            torch.softmax(x, -1)


# -- 4. finite inputs that overflow inside the kernel ------------------------------------------------------


def test_an_overflow_inside_the_kernel_is_named():
    KernelOverflowWarning = _category("KernelOverflowWarning")  # noqa: N806
    q, k, v = _qkv(seq=24, d=8)
    # q x 2**60 (finite bf16 values): the float32 max of the scaled scores is off by up to 2**37 from the fused
    # qk * scale - max, whose exp2 then overflows; l_i, acc and the output follow (the GPU's NaN, said out loud)
    with pytest.warns(KernelOverflowWarning, match=r"flash under plan triton-bf16: .* op exp overflowed float32"):
        out = flash(q * 2.0**60, k, v, plan="triton-bf16", block_m=8, block_n=8)
    assert not np.isfinite(out).all()
    big, ones = np.full((1, 1, 4, 8), 2.0**126), np.ones((1, 1, 4, 8))  # q.k = 2**129: beyond bf16 and fp32
    with pytest.warns(KernelOverflowWarning, match=r"baseline under plan pytorch-bf16: .* op qk overflowed bfloat16"):
        baseline(big, ones, v[:, :1, :4], plan="pytorch-bf16")
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelOverflowWarning)
        flash(q, k, v, plan="triton-bf16", block_m=8, block_n=8)


# -- 5. flash-attn's (batch, seq, heads, dim) layout -------------------------------------------------------


def test_layout_bshd_is_the_transposed_bhsd_call():
    q, k, v = _qkv(seq=20, d=8, lead=(2, 3))
    do = sf.round(_normal(q.shape, 3), "bf16")

    def t(x):
        return np.ascontiguousarray(np.swapaxes(x, -3, -2))

    kw = dict(plan="triton-bf16", block_m=8, block_n=8, causal=True)
    o2, m2, l2 = flash(t(q), t(k), t(v), layout="bshd", return_stats=True, **kw)
    o, m, l = flash(q, k, v, return_stats=True, **kw)  # noqa: E741
    assert np.array_equal(t(o), o2) and np.array_equal(m, m2) and np.array_equal(l, l2)  # stats stay (b, h, s)
    assert np.array_equal(
        t(baseline(q, k, v, plan="pytorch-bf16")), baseline(t(q), t(k), t(v), plan="pytorch-bf16", layout="bshd")
    )
    lse = lse_from_stats(m, l, plan="triton-bf16")
    g = flash_backward(q, k, v, o, do, lse, **kw)
    g2 = flash_backward(t(q), t(k), t(v), t(o), t(do), lse, layout="bshd", **kw)
    assert all(np.array_equal(t(a), b) for a, b in zip(g, g2, strict=True))
    gb = baseline_backward(q, k, v, do, plan="pytorch-bf16")
    gb2 = baseline_backward(t(q), t(k), t(v), t(do), plan="pytorch-bf16", layout="bshd")
    assert all(np.array_equal(t(a), b) for a, b in zip(gb, gb2, strict=True))
    kw2 = dict(ops=["p"], tiles=(), block_ns=(), trace=False, block_m=8, block_n=8)
    a = attribute(q, k, v, "triton-bf16", **kw2)
    a2 = attribute(t(q), t(k), t(v), "triton-bf16", layout="bshd", **kw2)
    assert a.isolation.equals(a2.isolation) and a2.meta["layout"] == "bshd"
    with pytest.raises(ValueError, match="layout must be 'bhsd' or 'bshd'"):
        flash(q, k, v, plan="triton-bf16", layout="bsdh")
    with pytest.raises(ValueError, match="bshd.*three"):
        flash(q[0, 0], k[0, 0], v[0, 0], plan="triton-bf16", layout="bshd")


# -- 6. one shape for the entry points ---------------------------------------------------------------------


def test_flash_has_attributes_default_plan_and_takes_float16():
    q, k, v = _qkv(seq=16, d=8, fmt="fp16")
    h = tuple(x.astype(np.float16) for x in (q, k, v))
    got = flash(*h, plan="triton-fp16")
    assert np.array_equal(got, flash(q, k, v, plan="triton-fp16"))  # round() takes float16; so do the kernels
    assert np.array_equal(baseline(*h, plan="pytorch-fp16"), baseline(q, k, v, plan="pytorch-fp16"))
    qb, kb, vb = (sf.round(x, "bf16") for x in (q, k, v))
    assert np.array_equal(flash(qb, kb, vb), flash(qb, kb, vb, plan="triton-bf16"))  # attribute()'s default
    assert np.array_equal(baseline(qb, kb, vb), baseline(qb, kb, vb, plan="pytorch-bf16"))


def test_backward_attribution_returns_the_forwards_result_type(tmp_path):
    pytest.importorskip("pandas")
    from simfloat.attribution import Attribution
    from simfloat.attribution.backward import attribute_backward

    q, k, v, do = (sf.round(_normal((1, 24, 8), s), "bf16") for s in range(4))
    res = attribute_backward(q, k, v, do, plan="triton-bf16", tiles=[(8, 8)], ops=["grad", "dq"])
    assert isinstance(res, Attribution) and res.meta["pass"] == "backward"
    iso = res.isolation.set_index("op")
    assert set(iso.index) == {"grad", "dq"} and iso.loc["grad", "dq_max"] > 0
    assert {"full", "forward"} == set(res.tiles["kind"])
    assert "isolation" in res.table() and "grad" in res.table()
    names = {p.name for p in res.to_csv(tmp_path)}
    assert "backward_attribution.csv" in names
    assert res.plot(tmp_path / "b.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.warns(DeprecationWarning, match="plan_"):
        old = attribute_backward(q, k, v, do, plan_="triton-bf16", tiles=[(8, 8)], ops=["grad"])
    assert old.isolation["dq_max"].item() == iso.loc["grad", "dq_max"]


# -- 7. a long job says how long before it starts ----------------------------------------------------------


def test_a_long_job_is_estimated_before_it_starts_and_rows_are_suggested(tmp_path, capsys):
    pytest.importorskip("pandas")
    from simfloat.cli import main

    argv = ["attribute", "--seq", "65536", "--head-dim", "16", "--estimate", "--out", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    m = re.search(r"estimated (?:about )?(\d+(?:\.\d+)?) (h|min|s)", out)
    assert m, out
    seconds = float(m.group(1)) * {"h": 3600, "min": 60, "s": 1}[m.group(2)]
    assert seconds > 600  # N^2 d for 65536 rows: far beyond a coffee
    assert re.search(r"--rows \d+", out), out
    assert not (tmp_path / "summary.txt").exists()  # --estimate runs nothing


def test_the_estimate_comes_before_the_first_run():
    from simfloat.attribution import Estimate

    q, k, v = _qkv(seq=64, d=8)
    seen = []

    def stop(est):
        seen.append(est)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        attribute(q, k, v, "triton-bf16", ops=["p"], tiles=(), block_ns=(), estimate=stop)
    (est,) = seen
    # golden, flash, traced flash, fp64-reference flash, baseline, isolated p, ablated p
    assert isinstance(est, Estimate) and est.runs == 7 and est.seconds > 0
    assert est.rows_for(est.seconds / 4) < 64  # a quarter of the time: fewer rows


# -- 8. the plot ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def causal_fig():
    """attribute()'s figure for causal inputs, caught before it is saved (the same hook before and after)."""
    pytest.importorskip("matplotlib")
    import simfloat.attribution._extras as extras

    q, k, v = _qkv(seq=64, d=8, lead=(1,))
    res = attribute(q, k, v, "triton-bf16", causal=True, block_m=16, block_n=16, trace_rows=8,
                    ops=["p", "out"], tiles=[(32, 16), (8, 16)], block_ns=[16, 64])  # fmt: skip
    caught = {}
    real = extras.save_figure

    def keep(plt, fig, path, dpi):
        caught["fig"] = fig
        fig.canvas.draw()
        caught["legends"] = [(ax, ax.get_legend().get_window_extent()) for ax in fig.axes if ax.get_legend()]
        return real(plt, fig, path, dpi)

    extras.save_figure = keep
    try:
        import tempfile
        from pathlib import Path

        with tempfile.TemporaryDirectory() as d:
            res.plot(Path(d) / "a.png")
    finally:
        extras.save_figure = real
    return res, caught


def test_causal_state_drift_spans_several_kv_blocks(causal_fig):
    res, caught = causal_fig
    acc = res.state_by_block[(res.state_by_block["state"] == "acc") & (res.state_by_block["kv_block"] >= 0)]
    assert acc["kv_block"].nunique() >= 2  # the traced rows reach more than the first kv block
    drift = next(ax for ax in caught["fig"].axes if "drift" in ax.get_title())
    assert any(len(line.get_xdata()) >= 2 for line in drift.get_lines())


def test_panels_say_how_many_rows_they_trace_and_the_tile_axis_is_sorted_with_the_default(causal_fig):
    res, caught = causal_fig
    axes = caught["fig"].axes
    drift = next(ax for ax in axes if "drift" in ax.get_title())
    n = res.meta["trace_rows"]
    assert re.search(rf"\b{n} (traced )?rows", drift.get_title()), drift.get_title()
    tiles = next(ax for ax in axes if "tile size" in ax.get_title())
    labels = [t.get_text().split()[0] for t in tiles.get_xticklabels()]
    pairs = [tuple(map(int, s.split("x"))) for s in labels]
    assert pairs == sorted(pairs) and (16, 16) in pairs, labels
    assert any("rows" in ax.get_title() for ax in axes if ax is not drift)


def test_no_legend_covers_a_curve(causal_fig):
    _, caught = causal_fig
    for ax, box in caught["legends"]:
        if ax.get_lines():  # a panel of curves: its legend is off the plotting area, so it can cover none
            area = ax.get_window_extent()
            assert box.y1 <= area.y0 or box.y0 >= area.y1 or box.x1 <= area.x0 or box.x0 >= area.x1, ax.get_title()
        for line in ax.get_lines():
            xy = np.column_stack([line.get_xdata(), line.get_ydata()]).astype(float)
            xy = xy[np.isfinite(xy).all(axis=1)]
            if not len(xy):
                continue
            pts = ax.transData.transform(xy)
            inside = (pts[:, 0] > box.x0) & (pts[:, 0] < box.x1) & (pts[:, 1] > box.y0) & (pts[:, 1] < box.y1)
            assert not inside.any(), (ax.get_title(), line.get_label())


def test_a_plans_repr_is_short_and_names_what_differs_from_its_preset():
    p = plan("triton-bf16")
    assert repr(p) == "Plan('triton-bf16')"
    r = repr(p.replace(p="fp32", exp2=False))
    assert len(r) < 200 and "p=" in r and "exp2=False" in r and "qk=" not in r, r
    assert len(repr(plan("fp64").replace(name="mine", out="bf16"))) < 200
