"""The console script: `simfloat attribute --quick` end to end, and clear errors for bad arguments."""

from __future__ import annotations

import numpy as np
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
    for s in (
        "flash vs baseline",
        "triton-bf16",
        "pytorch-bf16",
        "all-bf16",
        "per op",
        "rescaling steps",
        "wall time",
        "wrote",
    ):
        assert s in text, s
    names = {p.name for p in out.iterdir()}
    assert {
        "attribution.png",
        "summary.txt",
        "isolation.csv",
        "ablation.csv",
        "tiles.csv",
        "steps.csv",
        "flash_vs_baseline.csv",
        "by_block.csv",
        "state_by_block.csv",
    } <= names
    assert (out / "attribution.png").read_bytes()[:4] == b"\x89PNG"
    assert "flash vs baseline" in (out / "summary.txt").read_text()


def test_attribute_options(tmp_path, capsys):
    out = tmp_path / "o"
    argv = [
        "attribute",
        "--quick",
        "--seq",
        "40",
        "--seq-k",
        "56",
        "--head-dim",
        "8",
        "--batch",
        "2",
        "--heads",
        "1",
        "--format",
        "fp16",
        "--plan",
        "triton-fp16",
        "--baseline",
        "triton-fp16=all-fp16",
        "--block-m",
        "8",
        "--block-n",
        "16",
        "--tiles",
        "8x8",
        "16x32",
        "--block-ns",
        "8",
        "56",
        "--dist",
        "outlier",
        "--seed",
        "3",
        "--rows",
        "5",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "triton-fp16->all-fp16" in text and "5 of 40 query rows" in text
    import pandas as pd

    steps = pd.read_csv(out / "steps.csv")
    assert list(steps["block_n"]) == [8, 56] and list(steps["steps"]) == [7, 1]
    tiles = pd.read_csv(out / "tiles.csv")
    assert list(zip(tiles["block_m"], tiles["block_n"], strict=True)) == [(8, 8), (16, 32)]
    assert (
        main(
            [
                "attribute",
                "--quick",
                "--causal",
                "--dist",
                "uniform",
                "--seq",
                "24",
                "--tiles",
                "8x8",
                "--block-ns",
                "8",
                "--plan",
                "all-bf16",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert "causal" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--seq", "0"], "positive integer"),
        (["--head-dim", "x"], "positive integer"),
        (["--tiles", "64"], "BLOCK_MxBLOCK_N"),
        (["--tiles", "64x0"], "positive integer"),
        (["--format", "e3m2"], "invalid choice"),
        (["--dist", "cauchy"], "invalid choice"),
        (["--rows", "-3"], "positive integer"),
    ],
)
def test_bad_arguments_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["attribute", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--plan", "nope"], "unknown plan 'nope'"),
        (["--plan", "triton-tf32"], "--baseline triton-tf32=<plan>"),
        (["--plan", "all-bf16", "--plan", "all-bf16"], "distinct"),
        (["--rows", "4", "--causal"], "--rows cannot be combined with --causal"),
        (["--baseline", "=x"], "FLASH_PLAN=BASELINE_PLAN"),
        (["--baseline", "all-bf16", "--baseline", "a=b"], "not both"),
    ],
)
def test_bad_values_give_clear_errors(argv, message, tmp_path, capsys):
    assert main(["attribute", "--quick", "--out", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("simfloat attribute: error:") and message in err


def _no_work(*args, **kwargs):
    raise AssertionError("the job ran although its arguments are wrong")


def _validate_module():
    return pytest.importorskip("simfloat_gpu.campaign.validate")


def gpu_main(argv):
    """``simfloat-gpu ARGV``: the validation campaign's console script."""
    from simfloat_gpu.campaign.cli import main as campaign_main

    return campaign_main(argv)


@pytest.mark.parametrize("where", ["under a file", "a file"])
def test_attribute_checks_out_before_any_work(where, tmp_path, capsys, monkeypatch):
    import simfloat.attribution

    monkeypatch.setattr(simfloat.attribution, "attribute", _no_work)
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    out = blocker / "out" if where == "under a file" else blocker
    assert main(["attribute", "--quick", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("simfloat attribute: error: --out") and str(out) in err and len(err.splitlines()) == 1


def test_attribute_creates_out_first(tmp_path, monkeypatch):
    import simfloat.attribution

    out = tmp_path / "a" / "b"

    def check(*args, **kwargs):
        assert out.is_dir()
        raise ValueError("stop here")

    monkeypatch.setattr(simfloat.attribution, "attribute", check)
    assert main(["attribute", "--quick", "--out", str(out)]) == 2


def test_attribute_speaks_before_the_first_run(tmp_path, capsys, monkeypatch):
    import re

    import simfloat.attribution._runner as core  # where the runs are made

    seen = []
    real = core._baseline_kernel

    def first_run(*args, **kwargs):  # the golden (baseline) run is the first
        if not seen:
            seen.append(capsys.readouterr())
        return real(*args, **kwargs)

    monkeypatch.setattr(core, "_baseline_kernel", first_run)
    assert main(["attribute", "--quick", "--out", str(tmp_path)]) == 0
    out, err = seen[0]
    assert "plans triton-bf16, all-bf16" in out and "triton-bf16->pytorch-bf16" in out
    assert "q (1, 2, 80, 16)" in out and re.search(r"\d+ distinct kernel runs", out), out
    assert re.search(r"\b0/\d+", err), err  # the progress bar is up before the first run


def test_attribute_without_the_analysis_extra_says_what_to_install(tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm -> ModuleNotFoundError
    assert main(["attribute", "--quick", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "tqdm" in err and "pip install 'simfloat-emu[analysis]'" in err, err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--jobs", "-2"], "--jobs: expected a positive integer, got -2"),
        (["--jobs", "0"], "--jobs: expected a positive integer, got 0"),
        (["--budget-s", "0"], "--budget-s: expected a positive number of seconds, got 0"),
        (["--budget-s", "nan"], "--budget-s: expected a positive number of seconds, got nan"),
        (["--max-cost", "-1"], "--max-cost: expected a positive number of seconds, got -1"),
    ],
)
def test_validate_rejects_nonsense_numbers(argv, message, tmp_path, capsys, monkeypatch):
    V = _validate_module()
    monkeypatch.setattr(V, "compare_fixtures", _no_work)
    monkeypatch.setattr(V, "run_grid", _no_work)
    monkeypatch.setattr(V, "resolve_backend", lambda backend: "faithful")
    with pytest.raises(SystemExit) as exc:
        gpu_main(["validate", "--out", str(tmp_path), *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_demo_and_attribute_reject_nonsense_numbers(capsys):
    for argv, message in (
        (["demo", "--k", "-2"], "--k: expected a positive integer"),
        (["demo", "--k", "0"], "--k: expected a positive integer"),
        (["attribute", "--seed", "-1"], "--seed: expected a non-negative integer"),
    ):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        assert message in capsys.readouterr().err, argv


@pytest.mark.parametrize("case", ["out under a file", "record under a file", "no fixtures"])
def test_validate_checks_its_paths_before_any_work(case, tmp_path, capsys, monkeypatch):
    V = _validate_module()
    monkeypatch.setattr(V, "compare_fixtures", _no_work)
    monkeypatch.setattr(V, "run_grid", _no_work)
    monkeypatch.setattr(V, "resolve_backend", lambda backend: "faithful")
    blocker = tmp_path / "file"
    blocker.write_text("")
    fixtures = tmp_path / "fix"
    fixtures.mkdir()
    (fixtures / "h200").mkdir()
    for name in ("env.json", "configs.json", "outputs.npz"):
        (fixtures / "h200" / name).write_text("")
    argv = {
        "out under a file": ["--out", str(blocker / "out"), "--fixtures", str(fixtures / "h200")],
        "record under a file": ["--out", str(tmp_path / "o"), "--record-fixtures", str(blocker / "r")],
        "no fixtures": ["--out", str(tmp_path / "o"), "--fixtures", str(fixtures)],
    }[case]
    assert gpu_main(["validate", *argv]) == 2
    err = capsys.readouterr().err
    want = {"out under a file": "--out", "record under a file": "--record-fixtures", "no fixtures": "--fixtures"}[case]
    assert f"validate: error: {want}" in err, err
    if case == "no fixtures":
        assert "configs.json" in err and str(fixtures / "h200") in err  # the folder it probably meant
    else:
        assert "Not a directory" in err or "not a folder" in err, err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--fixtures", "DIR", "--record-fixtures", "R"], "--record-fixtures cannot be combined with --fixtures"),
        (["--max-cost", "5"], "--max-cost applies only with --fixtures"),
    ],
)
def test_validate_rejects_options_that_would_be_ignored(argv, message, tmp_path, capsys, monkeypatch):
    V = _validate_module()
    monkeypatch.setattr(V, "compare_fixtures", _no_work)
    monkeypatch.setattr(V, "run_grid", _no_work)
    argv = [str(tmp_path / a) if a in ("DIR", "R") else a for a in argv]
    assert gpu_main(["validate", "--out", str(tmp_path / "o"), *argv]) == 2
    assert message in capsys.readouterr().err


class _Stop(RuntimeError):
    pass


def _capture_attribute(monkeypatch):
    """Replace the job by one that records its inputs and stops (no kernel runs)."""
    import simfloat.attribution

    seen = {}

    def record(q, k, v, plans, **kwargs):
        seen.update(q=q, k=k, v=v, plans=plans, baseline=kwargs.get("baseline"))
        raise _Stop

    monkeypatch.setattr(simfloat.attribution, "attribute", record)
    return seen


def test_attribute_fp8_plan_gets_inputs_of_its_format(tmp_path, capsys, monkeypatch):
    import simfloat as sf

    seen = _capture_attribute(monkeypatch)
    with pytest.raises(_Stop):
        main(["attribute", "--quick", "--plan", "triton-e4m3", "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert "rounded to e4m3" in out and "triton-e4m3->pytorch-fp16" in out, out
    assert "warning" not in err, err
    for name in "qkv":
        x = seen[name]
        assert np.array_equal(sf.round(x, "e4m3"), x), name
    assert np.unique(seen["q"]).size > 10  # not all rounded to a few values by mistake


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_attribute_offers_fp8_formats(fmt, tmp_path, capsys, monkeypatch):
    import simfloat as sf

    seen = _capture_attribute(monkeypatch)
    with pytest.raises(_Stop):
        main(["attribute", "--quick", "--format", fmt, "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert f"plans triton-{fmt}, all-{fmt}" in out and f"triton-{fmt}->pytorch-fp16" in out, out
    assert np.array_equal(sf.round(seen["q"], fmt), seen["q"])


def test_attribute_warns_when_inputs_are_not_values_of_the_plans_format(tmp_path, capsys, monkeypatch):
    from simfloat.attribution.cli import not_representable

    seen = _capture_attribute(monkeypatch)
    with pytest.raises(_Stop):
        main(
            [
                "attribute",
                "--quick",
                "--plan",
                "triton-e4m3",
                "--plan",
                "triton-bf16",
                "--format",
                "bf16",
                "--out",
                str(tmp_path),
            ]
        )
    err = capsys.readouterr().err
    bad = sum(not_representable(seen[n], "e4m3") for n in "qkv")
    total = sum(seen[n].size for n in "qkv")
    assert bad > 0
    lines = [ln for ln in err.splitlines() if "warning" in ln]
    assert len(lines) == 1, err  # triton-bf16 takes the bf16 inputs as they are: no warning for it
    assert f"plan triton-e4m3 takes e4m3 inputs, but {bad} of the {total} values" in lines[0], err
    assert "--format e4m3" in lines[0]
