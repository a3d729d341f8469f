"""The tile-boundary sweep (simfloat.attribution.residues, ``simfloat attribute --tile-sweep``): one row per key
length residue, each measured against float64, the reported residue classes named, an outlier marked."""

import numpy as np
import pytest

from simfloat.attribution.residues import REPORTED_RESIDUES, format_tile_sweep, tile_sweep
from simfloat.cli import main


def test_rows_per_residue_and_report_classes():
    rows = tile_sweep("triton-bf16", block_n=16, base=96, residues=[0, 1, 15, 32], heads=2, kv_heads=1, head_dim=16)
    assert [r["kv_len"] for r in rows] == [96, 97, 111, 128]
    assert rows[1]["reports"] == "pytorch#191937"  # 97 % 32 == 1
    assert rows[3]["reports"] == "flash-attention#2577"  # 128
    assert all(0 < r["max_abs"] < 2e-2 and r["cos_sim"] > 0.999 for r in rows)
    paged = tile_sweep(
        "triton-bf16", block_n=16, base=96, residues=[0, 1, 15, 32], heads=2, kv_heads=1, head_dim=16, page_size=7
    )
    assert [r["max_abs"] for r in paged] == [r["max_abs"] for r in rows]  # paging never changes the bits
    assert {name for name, _, _ in REPORTED_RESIDUES} == {"flash-attention#2577", "pytorch#196678", "pytorch#191937"}


def test_outlier_marked():
    rows = [
        {"residue": r, "kv_len": 64 + r, "max_abs": 1e-3, "rmse": 1e-4, "cos_sim": 1.0, "reports": ""} for r in range(4)
    ]
    rows[2]["max_abs"] = 5e-3
    text = format_tile_sweep(rows).splitlines()
    assert text[3].endswith("<<") and not any(line.endswith("<<") for i, line in enumerate(text) if i != 3)


def test_cli(capsys):
    rc = main(
        [
            "attribute",
            "--tile-sweep",
            "--block-n",
            "16",
            "--head-dim",
            "16",
            "--seq-k",
            "64",
            "--residues",
            "0",
            "1",
            "--num-splits",
            "2",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0 and "2 splits (flash-attn)" in out and "kv_len" in out
    assert len([line for line in out.splitlines() if line.strip().startswith(("0 ", "1 "))]) == 2


def test_bad_residues():
    with pytest.raises(ValueError, match="residues"):
        tile_sweep(residues=[-1])
    with pytest.raises(ValueError, match="block_n"):
        tile_sweep(block_n=0)
    assert main(["attribute", "--tile-sweep", "--plan", "no-such-plan"]) == 2
    np.testing.assert_equal(len(tile_sweep(block_n=4, base=8, head_dim=8)), 4)


def test_sweep_kind():
    from simfloat.sweep.spec import SpecError, resolve_kind
    from simfloat.sweep.tile_kind import tile_sweep_run, validate

    target, fn, check = resolve_kind("tile-sweep")
    assert fn is tile_sweep_run and check is validate
    cfg = {"residue": 1, "base": 96, "block_n": 16, "heads": 2, "kv_heads": 1, "head_dim": 16}
    row = fn(cfg)
    # the same bits as the sweep over several residues in one call: the keys are prefixes of one draw
    (same,) = [
        r
        for r in tile_sweep(block_n=16, base=96, residues=list(range(16)), heads=2, kv_heads=1, head_dim=16)
        if r["residue"] == 1
    ]
    assert row["kv_len"] == 97 and row["reports"] == "pytorch#191937" and row["max_abs"] == same["max_abs"]
    for bad, match in (
        ({}, "required"),
        ({"residue": -1}, "residue"),
        ({"residue": 0, "x": 1}, "unknown"),
        ({"residue": 0, "plan": "nope"}, "plan"),
        ({"residue": 0, "combine": "tree"}, "combine"),
    ):
        with pytest.raises(ValueError, match=match):
            validate(bad)
    with pytest.raises(SpecError):
        resolve_kind("no-such-kind")
