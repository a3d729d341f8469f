"""The console script: `simfloat attribute --quick` end to end, and clear errors for bad arguments."""

from __future__ import annotations

import pytest

from simfloat.cli import build_parser, main

pytest.importorskip("pandas")
pytest.importorskip("matplotlib")


def test_help_lists_subcommands(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "demo" in out and "attribute" in out


def test_attribute_defaults_are_the_main_job():
    args = build_parser().parse_args(["attribute"])
    assert args.out == "simfloat-out" and args.dist == "normal" and args.seed == 0 and not args.quick
    from simfloat.attribution.cli import DEFAULTS

    assert DEFAULTS["seq"] == 2048 and DEFAULTS["head_dim"] == 128 and DEFAULTS["format"] == "bf16"


def test_attribute_quick_end_to_end(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["attribute", "--quick", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    for s in ("flash vs baseline", "triton-bf16", "pytorch-bf16", "all-bf16", "per op",
              "rescaling steps", "wall time", "wrote"):
        assert s in text, s
    names = {p.name for p in out.iterdir()}
    assert {"attribution.png", "summary.txt", "isolation.csv", "ablation.csv", "tiles.csv", "steps.csv",
            "flash_vs_baseline.csv", "by_block.csv", "state_by_block.csv"} <= names
    assert (out / "attribution.png").read_bytes()[:4] == b"\x89PNG"
    assert "flash vs baseline" in (out / "summary.txt").read_text()


def test_attribute_options(tmp_path, capsys):
    out = tmp_path / "o"
    argv = ["attribute", "--quick", "--seq", "40", "--seq-k", "56", "--head-dim", "8", "--batch", "2",
            "--heads", "1", "--format", "fp16", "--plan", "triton-fp16", "--baseline", "triton-fp16=all-fp16",
            "--block-m", "8", "--block-n", "16", "--tiles", "8x8", "16x32", "--block-ns", "8", "56",
            "--dist", "outlier", "--seed", "3", "--rows", "5", "--out", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "triton-fp16->all-fp16" in text and "5 of 40 query rows" in text
    import pandas as pd

    steps = pd.read_csv(out / "steps.csv")
    assert list(steps["block_n"]) == [8, 56] and list(steps["steps"]) == [7, 1]
    tiles = pd.read_csv(out / "tiles.csv")
    assert list(zip(tiles["block_m"], tiles["block_n"], strict=True)) == [(8, 8), (16, 32)]
    assert main(["attribute", "--quick", "--causal", "--dist", "uniform", "--seq", "24", "--tiles", "8x8",
                 "--block-ns", "8", "--plan", "all-bf16", "--out", str(out)]) == 0
    assert "causal" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--seq", "0"], "positive integer"),
    (["--head-dim", "x"], "positive integer"),
    (["--tiles", "64"], "BLOCK_MxBLOCK_N"),
    (["--tiles", "64x0"], "positive integer"),
    (["--format", "e4m3"], "invalid choice"),
    (["--dist", "cauchy"], "invalid choice"),
    (["--rows", "-3"], "positive integer"),
])
def test_bad_arguments_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["attribute", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--plan", "nope"], "unknown plan 'nope'"),
    (["--plan", "triton-e4m3"], "--baseline triton-e4m3=<plan>"),
    (["--plan", "all-bf16", "--plan", "all-bf16"], "distinct"),
    (["--rows", "4", "--causal"], "--rows cannot be combined with --causal"),
    (["--baseline", "=x"], "FLASH_PLAN=BASELINE_PLAN"),
    (["--baseline", "all-bf16", "--baseline", "a=b"], "not both"),
])
def test_bad_values_give_clear_errors(argv, message, tmp_path, capsys):
    assert main(["attribute", "--quick", "--out", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("simfloat attribute: error:") and message in err
