"""``simfloat attribute --pass backward``: per-op isolation and ablation of the gradient error."""

import numpy as np
import pytest

import simfloat as sf
from simfloat.attribution.backward import BWD_ATTRIBUTION_OPS, attribute_backward


def _inputs(seed=0, seq=40, d=16):
    rng = np.random.default_rng(seed)
    return tuple(sf.round(rng.standard_normal((2, seq, d)), "bf16") for _ in range(4))


def test_isolation_and_ablation_of_the_bf16_casts():
    q, k, v, do = _inputs()
    rows = attribute_backward(q, k, v, do, plan_="triton-bf16", tiles=[(16, 16), (32, 16)], causal=True)
    assert len(rows) == 2 * (2 + 2 * len(BWD_ATTRIBUTION_OPS))
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
