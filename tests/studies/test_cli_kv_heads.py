"""`simfloat attribute --kv-heads`: grouped-query attention in the main job (k and v drawn with fewer heads),
and a clear exit-2 error when the kv heads do not divide the heads."""

from __future__ import annotations

import pytest

from simfloat.cli import build_parser, main

pytest.importorskip("pandas")
pytest.importorskip("matplotlib")


def test_kv_heads_option_parses():
    assert build_parser().parse_args(["attribute", "--kv-heads", "2"]).kv_heads == 2
    assert build_parser().parse_args(["attribute"]).kv_heads is None


def test_attribute_with_grouped_kv_heads(tmp_path, capsys):
    out = tmp_path / "o"
    argv = [
        "attribute",
        "--quick",
        "--heads",
        "4",
        "--kv-heads",
        "2",
        "--seq",
        "24",
        "--tiles",
        "8x8",
        "--block-ns",
        "8",
        "--plan",
        "triton-bf16",
        "--trace-rows",
        "4",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "q (1, 4, 24, 16), k and v (1, 2, 24, 16)" in text
    assert (out / "summary.txt").exists()


@pytest.mark.parametrize("heads, kv_heads", [("4", "3"), ("2", "4")])
def test_kv_heads_that_do_not_divide_exit_2(tmp_path, capsys, heads, kv_heads):
    assert main(["attribute", "--quick", "--heads", heads, "--kv-heads", kv_heads, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"--kv-heads {kv_heads} with --heads {heads}" in err and "grouped-query attention needs" in err
