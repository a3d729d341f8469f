"""simfloat.explain and ``simfloat explain``: a kernel's output against a reference, each diagnosis on a
constructed case (simfloat/explanation.py)."""

from __future__ import annotations

import numpy as np
import pytest

import simfloat
from simfloat.attention import flash
from simfloat.cli import main
from simfloat.explanation import Explanation
from simfloat.tolerances import reference64

SHAPE = (1, 2, 97, 16)  # odd length: the last query and key tiles are partial (97 = 3 * 32 + 1)
TILES = dict(block_m=32, block_n=32)
PLAN = "triton-bf16"


@pytest.fixture(scope="module")
def case():
    rng = np.random.default_rng(3)
    q, k, v = (simfloat.round(rng.standard_normal(SHAPE).astype(np.float32), "bf16") for _ in range(3))
    ref = reference64(q, k, v)
    out = flash(q, k, v, plan=PLAN, **TILES)
    return q, k, v, ref, out


def _explain(out, case, **kw) -> Explanation:
    q, k, v, ref, _ = case
    return simfloat.explain(out, ref, q, k, v, plan=PLAN, **TILES, **kw)


def test_emulator_output_is_bitwise(case):
    res = _explain(case[4], case)
    assert res.verdict == "bitwise" and res.explained and not res.findings
    assert res.emulator_max_ratio <= 1.0
    assert "explained" in str(res) and "bit for bit" in str(res)


def test_another_kernel_of_the_same_numerics_is_inside_band(case):
    q, k, v, ref, out = case
    h200 = flash(q, k, v, plan="h200-bf16", **TILES)  # the GPU's ex2.approx and tl.sum order: other bits
    assert not np.array_equal(h200, out)
    res = _explain(h200, case)
    assert res.verdict == "inside-band" and res.explained, str(res)


def test_corrupted_last_query_tile(case):
    bad = case[4].copy()
    bad[:, 1, 96:, :] += 0.05
    res = _explain(bad, case)
    assert res.verdict == "outside-band" and not res.explained
    assert res.kinds()[0] == "last-query-tile", str(res)
    f = res.findings[0]
    assert f.rows == (96,) and f.heads == (1,) and f.tiles == (3,)
    assert res.outside == 16


def test_tile_boundary_rows(case):
    bad = case[4].copy()
    bad[:, 0, [31, 32, 63, 64], :3] *= 1.5
    res = _explain(bad, case)
    assert "tile-boundary" in res.kinds(), str(res)
    assert res.findings[res.kinds().index("tile-boundary")].rows == (31, 32, 63, 64)


def test_last_key_tile_dropped(case):
    out = _without_keys(case, np.arange(97) < 96)  # a kernel that never loads the last, partial key tile (key 96)
    res = _explain(out, case)
    assert res.verdict == "outside-band"
    assert res.kinds()[0] == "key-tile-dropped", str(res)
    assert "96..96" in res.findings[0].message and "partial" in res.findings[0].message


def _without_keys(case, keep):
    q, k, v, _, _ = case
    s = (q.astype(np.float64) @ np.swapaxes(k, -1, -2)) / 4.0
    s = np.where(keep, s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return simfloat.round(((p / p.sum(axis=-1, keepdims=True)) @ v).astype(np.float32), "bf16")


def test_key_tile_boundary_off_by_one(case):
    keep = np.ones(97, dtype=bool)
    keep[[32, 64, 96]] = False  # a kernel that skips the first key of every key tile after the first
    res = _explain(_without_keys(case, keep), case)
    assert res.kinds()[0] == "key-tile-boundary", str(res)
    assert "first key" in res.findings[0].message and "32, 64, 96" in res.findings[0].message


def test_nan_row(case):
    bad = case[4].copy()
    bad[0, 0, 50] = np.nan
    res = _explain(bad, case)
    assert not res.explained
    f = res.findings[0]
    assert f.kind == "nonfinite" and f.rows == (50,) and f.heads == (0,) and f.share == 1.0
    assert "NaN in out but not in ref" in f.message and "whole rows" in f.message


def test_transposed_layout(case):
    out = case[4]
    res = _explain(np.swapaxes(out, 1, 2), case)  # (b, s, h, d) handed over as the output
    assert not res.explained and res.kinds() == ("layout",), str(res)
    # the same memory read with the other shape: (b, s, h, d) bytes as (b, h, s, d)
    res = _explain(np.ascontiguousarray(np.swapaxes(out, 1, 2)).reshape(out.shape), case)
    assert not res.explained and res.kinds()[0] == "layout", str(res)


def test_heads_swapped(case):
    out = case[4][:, ::-1].copy()
    res = _explain(out, case)
    assert not res.explained and res.kinds()[0] == "heads-permuted", str(res)
    assert "out head 0 = ref head 1" in res.findings[0].message


def test_wrong_mask(case):
    q, k, v, ref, _ = case
    causal_out = flash(q, k, v, plan=PLAN, causal=True, **TILES)
    res = _explain(causal_out, case)  # the kernel masked, the reference did not
    assert res.kinds()[0] == "mask", str(res)


def test_tied_maxima():
    rng = np.random.default_rng(5)
    shape = (1, 1, 40, 16)
    q, k, v = (simfloat.round(rng.standard_normal(shape).astype(np.float32), "bf16") for _ in range(3))
    k[0, 0, 30] = k[0, 0, 3]  # keys 3 and 30 equal: rows whose top score is key 3 have a tie
    rows = [7, 19]
    q[0, 0, rows] = 4 * k[0, 0, 3]  # ... these rows
    ref = reference64(q, k, v)
    out = flash(q, k, v, plan=PLAN, **TILES)
    bad = out.copy()
    bad[0, 0, rows] = v[0, 0, 3]  # a kernel that keeps one of the tied keys only
    res = simfloat.explain(bad, ref, q, k, v, plan=PLAN, **TILES)
    assert "tied-maxima" in res.kinds(), str(res)
    assert res.findings[res.kinds().index("tied-maxima")].rows == tuple(rows)


def test_given_tolerance_and_bad_arguments(case):
    q, k, v, ref, out = case
    res = simfloat.explain(out + 1e-3, ref, q, k, v, plan=PLAN, **TILES, tolerance=(0.0, 1.0))
    assert res.verdict == "inside-band" and res.tolerance == (0.0, 1.0)
    with pytest.raises(ValueError, match="shape"):
        simfloat.explain(out[:, :, :50], ref, q, k, v, plan=PLAN)
    with pytest.raises(ValueError, match="ref has shape"):
        simfloat.explain(out, ref[..., :8], q, k, v, plan=PLAN)
    with pytest.raises(ValueError, match="tolerance"):
        simfloat.explain(out, ref, q, k, v, plan=PLAN, tolerance=(-1.0, 0.0))
    with pytest.raises(ValueError, match="confidence"):
        simfloat.explain(out, ref, q, k, v, plan=PLAN, confidence=2.0)
    with pytest.raises(ValueError, match="layout"):
        simfloat.explain(out, ref, q, k, v, plan=PLAN, layout="sbhd")


# -- the command line -----------------------------------------------------------------------------------------------


def test_cli_explain(case, tmp_path, capsys):
    q, k, v, ref, out = case
    np.savez(tmp_path / "qkv.npz", q=q, k=k, v=v)
    np.save(tmp_path / "ref.npy", ref)
    np.save(tmp_path / "out.npy", out)
    bad = out.copy()
    bad[:, 1, 96:] += 0.05
    np.savez(tmp_path / "bad.npz", out=bad, other=out)
    for name, x in (("q", q), ("k", k), ("v", v)):
        np.save(tmp_path / f"{name}.npy", x)
    common = ["--plan", PLAN, "--block-m", "32", "--block-n", "32"]
    assert (
        main(
            [
                "explain",
                str(tmp_path / "out.npy"),
                str(tmp_path / "ref.npy"),
                "--inputs",
                str(tmp_path / "qkv.npz"),
                *common,
            ]
        )
        == 0
    )
    assert "explained" in capsys.readouterr().out
    argv = ["explain", str(tmp_path / "bad.npz"), str(tmp_path / "ref.npy"), *common]
    assert (
        main(argv + ["--q", str(tmp_path / "q.npy"), "--k", str(tmp_path / "k.npy"), "--v", str(tmp_path / "v.npy")])
        == 1
    )
    printed = capsys.readouterr().out
    assert "NOT explained" in printed and "last-query-tile" in printed
    assert main(argv) == 2  # no inputs
    assert "--inputs" in capsys.readouterr().err
    assert (
        main(
            [
                "explain",
                str(tmp_path / "missing.npy"),
                str(tmp_path / "ref.npy"),
                "--inputs",
                str(tmp_path / "qkv.npz"),
                *common,
            ]
        )
        == 2
    )
    assert "cannot read" in capsys.readouterr().err


def test_bshd_layout_arrays(case):
    q, k, v, ref, out = case
    to = [np.ascontiguousarray(np.swapaxes(x, 1, 2)) for x in (out, ref, q, k, v)]
    res = simfloat.explain(to[0], to[1], *to[2:], plan=PLAN, layout="bshd", **TILES)
    assert res.verdict == "bitwise", str(res)


def test_h200_fixture_outputs_are_explained():
    """The H200's recorded outputs: the bits of their h200-<fmt> plans, inside the band of triton-<fmt>."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "h200"
    if not (root / "configs.json").is_file():
        pytest.skip("no H200 fixtures")
    from simfloat_gpu.campaign.fixtures import load_fixture_dir
    from simfloat_gpu.campaign.grid import make_inputs

    _, items = load_fixture_dir(root)
    picked = [(c, a) for c, _, a in items if c.kind == "flash" and c.seq == 97 and c.block_m == 32][:6]
    assert picked
    verdicts = set()
    for cfg, arrays in picked:
        q, k, v = make_inputs(cfg)
        ref = reference64(q, k, v, causal=cfg.causal)
        for family in ("h200", "triton"):
            pl = simfloat.attention.plan(f"{family}-{cfg.fmt}")
            if cfg.out == "fp32":
                pl = pl.replace(out="float32")
            res = simfloat.explain(
                arrays["out"], ref, q, k, v, plan=pl, causal=cfg.causal, block_m=cfg.block_m, block_n=cfg.block_n
            )
            assert res.explained, (cfg.id, family, str(res))
            if family == "h200":
                assert res.verdict == "bitwise", (cfg.id, str(res))
            verdicts.add(res.verdict)
    assert "inside-band" in verdicts  # the triton plans' bits differ somewhere
