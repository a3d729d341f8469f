"""Hardware profiles (simfloat.profiles): the shipped H200 profile gives today's h200-<fmt> plans field for
field, its parts re-fit from the committed probes, the fit never calls an inexact part exact, and profiles
reach plans, faithful() and the CLIs."""

import dataclasses
import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from simfloat import hardware
from simfloat.accumulate import BlockFMA, Sequential, fp8_mma_sync, split_k, tensor_core
from simfloat.attention import backward_plan, plan
from simfloat.attention.backward_plan import BackwardPlan, _bwd_triton
from simfloat.attention.plan import Plan
from simfloat.formats import FloatFormat
from simfloat.profiles import (
    LAB,
    PUBLISHED,
    PUBLISHED_GPUS,
    DotPart,
    Exp2Part,
    HardwareProfile,
    SumPart,
    load_profile,
    measured_status,
    model_from_json,
    model_to_json,
    published_profile,
    save_profile,
    shipped_profiles,
)

PROBES = Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "h200" / "probes"
H200_FORMATS = ("bf16", "fp16", "tf32", "e4m3", "e5m2")


def test_shipped_profiles_load_and_round_trip(tmp_path):
    assert set(shipped_profiles()) >= {"h200", "a100", "ada", "blackwell"}
    for name in shipped_profiles():
        prof = load_profile(name)
        assert prof.name == name
        again = load_profile(save_profile(prof, tmp_path / f"{name}.json"))
        assert again == prof
        assert prof.report().startswith(f"profile {name}")


@pytest.mark.parametrize("fmt", H200_FORMATS)
def test_h200_preset_is_triton_with_the_shipped_profile(fmt):
    prof = load_profile("h200")
    got = plan(f"triton-{fmt}", hardware=prof)
    want = plan(f"h200-{fmt}")
    assert got.name == f"triton-{fmt}@h200" and want.name == f"h200-{fmt}"  # the name says the profile
    for f in dataclasses.fields(Plan):
        if f.name != "name":
            assert getattr(got, f.name) == getattr(want, f.name), f.name
    assert dataclasses.replace(got, name=want.name) == want
    # what the profile holds: the measured sm90 model, the H200 ex2 table, the mma-layout tl.sum order
    assert got.qk == got.pv == tensor_core("sm90", fmt)
    assert (got.exp2_impl, got.sum_order, got.contract) == (hardware.h200_ex2(), hardware.SumOrder("h200-mma"), True)
    assert plan(f"triton-{fmt}", hardware="h200") == got  # by shipped name too
    assert plan(got.name) == got and got.kernels() == ("flash",)  # the name parses back


@pytest.mark.parametrize("fmt", ("bf16", "fp16", "tf32"))
def test_h200_backward_preset_is_triton_with_the_shipped_profile(fmt):
    """The backward h200-<fmt> comes from the shipped profile now: field for field the plan it was built as
    before (the backward triton-<fmt> with the H200 ex2 table, now the value hardware.h200_ex2(), the forward
    plans' too), and triton-<fmt>@h200 under its historic name."""
    old = dataclasses.replace(_bwd_triton(fmt), name=f"h200-{fmt}", exp2_impl=hardware.h200_ex2(), profile="h200")
    new = backward_plan(f"h200-{fmt}")
    for f in dataclasses.fields(BackwardPlan):
        assert getattr(new, f.name) == getattr(old, f.name), f.name
    got = backward_plan(f"triton-{fmt}", hardware=load_profile("h200"))
    assert got.name == f"triton-{fmt}@h200" and dataclasses.replace(got, name=new.name) == new
    assert backward_plan(got.name) == got and backward_plan(f"triton-{fmt}", hardware="h200") == got
    # the kernel fuses B4 with tl.fma itself: a profile without FMA contraction leaves it fused
    assert got.contract and got.exp2_impl == plan(f"triton-{fmt}@h200").exp2_impl
    assert got.qk == got.dk == plan(f"triton-{fmt}@h200").qk


def test_backward_plan_kernel_fields_follow_the_forward():
    """A BackwardPlan says its GPU kernel and hardware profile in fields, as the forward Plan does (every backward
    preset: the forward preset's values), and carries its exp2 as a value: a table's name becomes the table."""
    from simfloat.attention import backward_presets

    for name, bp in backward_presets().items():
        fwd = plan(name)
        assert (bp.gpu_kernel, bp.profile) == (fwd.gpu_kernel, fwd.profile), name
    assert backward_plan("triton-bf16@h200").profile == "h200"
    assert backward_plan("triton-bf16").replace(exp2_impl="h200").exp2_impl == hardware.h200_ex2()
    with pytest.raises(ValueError, match="gpu_kernel"):
        backward_plan("triton-bf16").replace(gpu_kernel="cuda")
    with pytest.raises(TypeError, match="profile"):
        backward_plan("triton-bf16").replace(profile=3)
    # a hardware profile applies by the fields: a plan of the Triton kernel that carries a profile takes no other
    with pytest.raises(ValueError, match="triton-<fmt>"):
        backward_plan("h200-bf16", hardware="h200")


def test_backward_plan_hardware_errors():
    with pytest.raises(ValueError, match="triton-<fmt>"):
        backward_plan("pytorch-bf16", hardware="h200")
    with pytest.raises(ValueError, match="triton-<fmt>"):
        backward_plan("h200-bf16@h200")
    with pytest.raises(ValueError, match="no hardware profile after"):
        backward_plan("triton-bf16@")
    assert backward_plan("triton-fp32@h200").dq == backward_plan("triton-fp32").dq  # FMA loops: no tensor core


def test_h200_profile_parts_are_measured_exact():
    prof = load_profile("h200")
    assert prof.arch == "sm90" and prof.environment["gpu"] == "NVIDIA H200"
    exact = prof.exact()
    assert all(ok for label, ok in exact.items() if label != "tl.sum blocked"), prof.report()
    assert prof.exp2.sha256 == hardware.H200_EX2_SHA256
    assert hardware.ex2_table_sha256(prof.ex2_table()) == hardware.H200_EX2_SHA256
    assert prof.dot("e4m3", "mma.sync").model == fp8_mma_sync()  # fp8 with small M: fp16 mma.sync
    blocked = prof.sum("blocked")  # a loaded tile's order: no plan rule reproduces it, kept as a tree
    assert blocked.rule is None and blocked.tree and blocked.status.startswith("measured: inexact")


def test_published_profiles():
    """The shipped a100 / ada / blackwell files are the published presets of their arch; the parts an
    independent lab's data cover (tests/fixtures/tensor_cores) say "measured by an independent lab: N/N", the
    counts recomputed here from the data."""
    from tensor_core_data import lab_counts

    for name, (arch, _) in PUBLISHED_GPUS.items():
        prof = load_profile(name)
        lab = lab_counts(arch)
        assert lab and all(n == total for n, total in lab.values())
        want = published_profile(name, lab)
        assert prof == want, f"{name}.json differs from tensor_core({arch!r}, ...) and the lab's counts: regenerate it"
        assert prof.tensor_cores and all(d.status.startswith(LAB) for d in prof.tensor_cores if d.mma != "tcgen05")
        assert all(
            prof.exact()[f"tensor core {d.input_format} {d.mma}"] for d in prof.tensor_cores if d.mma != "tcgen05"
        )
        assert prof.exp2 is None and prof.exp is None and not prof.sums
        p = plan("triton-bf16", hardware=prof)
        assert p.name == f"triton-bf16@{name}" and p.qk == p.pv == tensor_core(arch, "bf16")
        assert (p.exp2_impl, p.sum_order) == ("correctly_rounded", hardware.SumOrder())  # absent parts: triton defaults
    assert [d.input_format for d in load_profile("a100").tensor_cores] == ["bf16", "fp16", "tf32"]  # no fp8
    with pytest.raises(ValueError, match="no published profile"):
        published_profile("h200")


def test_model_json_round_trip():
    models = [
        tensor_core("sm90", "e4m3"),  # a FloatFormat out_fmt
        tensor_core("sm90", "tf32"),
        fp8_mma_sync(),
        split_k(3, BlockFMA(16, 25, out_mode="nearest_even")),
        Sequential("bfloat16", product_fmt="float32"),
        BlockFMA(8, 24, out_fmt=FloatFormat("e8m10", 8, 10)),
    ]
    for m in models:
        back = model_from_json(json.loads(json.dumps(model_to_json(m))))
        assert back == m and type(back) is type(m)
    with pytest.raises(ValueError, match="unknown accumulation model"):
        model_from_json({"model": "Wide"})
    with pytest.raises(ValueError, match="unknown fields"):
        model_from_json({"model": "BlockFMA", "block": 8, "fraction_bits": 24, "blok": 3})


def test_status_never_calls_inexact_exact():
    assert measured_status(10, 10) == "measured: 10/10 probes bit-exact"
    assert measured_status(9999, 10000) == "measured: inexact (99.9900%)"
    with pytest.raises(ValueError):
        measured_status(3, 2)
    with pytest.raises(ValueError, match="status"):
        DotPart("bf16", "wgmma", tensor_core("sm90", "bf16"), status="exact, trust me")


def test_bad_profiles_say_what_is_wrong(tmp_path):
    with pytest.raises(ValueError, match="not a shipped profile"):
        load_profile(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    obj = load_profile("h200").to_json()
    obj["version"] = 99
    bad.write_text(json.dumps(obj))
    with pytest.raises(ValueError, match="version 99"):
        load_profile(bad)
    obj = load_profile("h200").to_json()
    obj["tensor_cores"][0]["model"]["block"] = 0
    bad.write_text(json.dumps(obj))
    with pytest.raises(ValueError, match=r"tensor_cores\[0\].*block"):
        load_profile(bad)
    # a table that is not the one the profile names
    prof = HardwareProfile("x", "sm90", exp2=Exp2Part("table", "t.bin.xz", "0" * 64), directory=tmp_path)
    (tmp_path / "t.bin.xz").write_bytes(hardware.pack_ex2_table(np.zeros(2 * hardware.TWO23, dtype=np.int8)))
    with pytest.raises(ValueError, match="sha256"):
        prof.exp2_impl()


def test_plan_hardware_errors():
    with pytest.raises(ValueError, match="triton-<fmt>"):
        plan("pytorch-bf16", hardware="h200")
    with pytest.raises(ValueError, match="triton-<fmt>"):
        plan("h200-bf16", hardware="h200")
    no_rule = HardwareProfile("odd", "sm90", sums=(SumPart("mma", None, ("64x64",), "", "measured: inexact (50.0%)"),))
    with pytest.raises(ValueError, match="tl.sum order of the mma layout"):
        plan("triton-bf16", hardware=no_rule)
    mma_only = HardwareProfile("small", "sm90", tensor_cores=(DotPart("e4m3", "mma.sync", fp8_mma_sync()),))
    with pytest.raises(ValueError, match="Interleaved"):
        plan("triton-e4m3", hardware=mma_only)


def test_user_table_profile(tmp_path, monkeypatch):
    """A profile with its own ex2 table: saved next to the JSON, carried by the plan as a value (an Ex2Table,
    equal by sha256; a pickled plan is complete in another process), used by the plan's exp2."""
    table = np.array(hardware.ex2_table("h200"))
    table[: hardware.TWO23] = 0  # T- correctly rounded: another unit
    sha = hardware.ex2_table_sha256(table)
    prof = HardwareProfile("mine", "sm90", exp2=Exp2Part("table", "ex2_mine.bin.xz", sha, True, PUBLISHED))
    path = save_profile(prof, tmp_path / "mine.json", table=table)
    loaded = load_profile(path)
    p = plan("triton-bf16", hardware=loaded)
    assert isinstance(p.exp2_impl, hardware.Ex2Table) and p.name == "triton-bf16@mine"
    assert (p.exp2_impl.name, p.exp2_impl.sha256) == (f"table-{sha[:16]}", sha)
    assert np.array_equal(p.params(0.25).ex2_tab, table)
    blob = pickle.dumps(p)  # what a sweep's worker process gets
    monkeypatch.setattr(hardware, "_TABLES", {})  # a process that never loaded the profile
    again = pickle.loads(blob)
    assert again == p and np.array_equal(again.params(0.25).ex2_tab, table)
    x = np.float32([-1.5, -0.25, -3.75])
    mine = hardware.ex2_approx(x, table=p.exp2_impl)
    cr = np.exp2(x.astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal(mine, cr)  # T-(f) with zero offsets: 2^-f rounded once, scaled exactly
    with pytest.raises(ValueError, match="sha256"):
        save_profile(prof, tmp_path / "other.json", table=np.zeros(2 * hardware.TWO23, dtype=np.int8))


# -- the fit ---------------------------------------------------------------------------------------------------


def test_ex2_table_from_binades_recovers_the_table():
    from simfloat_gpu.campaign.fit_profile import ex2_table_from_binades

    mags = np.arange(0x3F800000, 0x40000000, dtype=np.uint32)
    neg, pos = (mags | np.uint32(0x80000000)).view(np.float32), mags.view(np.float32)
    table = ex2_table_from_binades((neg, hardware.ex2_approx(neg)), (pos, hardware.ex2_approx(pos)))
    assert hardware.ex2_table_sha256(table) == hardware.H200_EX2_SHA256
    y = hardware.ex2_approx(neg)
    y[7] = np.float32(y[7] * np.float32(1.0000005))  # 4 ulp off: outside the table format
    with pytest.raises(ValueError, match="outside -2..\\+1"):
        ex2_table_from_binades((neg, y), (pos, hardware.ex2_approx(pos)))


def test_tl_sum_rejects_bad_arguments():
    from simfloat.profiles import tl_sum

    x = np.ones((2, 8), dtype=np.float32)
    with pytest.raises(ValueError, match="rule"):
        tl_sum(x, "pairwise")
    with pytest.raises(ValueError, match="warps_n"):
        tl_sum(x, "h200-mma", 3)
    with pytest.raises(ValueError, match="shape"):
        tl_sum(np.ones(8, dtype=np.float32), "sequential")


def test_sum_rule_matches_the_engine_and_the_probes():
    from simfloat.attention._kernels import row_sum
    from simfloat.attention.plan import OpParams
    from simfloat.formats import format as fmt
    from simfloat_gpu.campaign import fit as F
    from simfloat_gpu.campaign.fit_profile import sum_rule_outputs
    from simfloat_gpu.campaign.probes import sum_design

    o = OpParams(fmt("float32").params, 0)
    rng = np.random.default_rng(3)
    for n, w in ((1, 1), (97, 2), (64, 4), (257, 1)):
        x = (rng.standard_normal((5, n)) * rng.choice([1e-3, 1.0, 1e4], size=(5, n))).astype(np.float32)
        got = sum_rule_outputs(x, "h200-mma", w)
        want = np.array([row_sum(r.astype(np.float64), n, o, 1, w) for r in x], dtype=np.float32)
        np.testing.assert_array_equal(got, want)
    z = np.load(PROBES / "probes.npz")
    for name in ("16_16", "32_32"):
        v = F.probe_variants(z, "sum")[name]
        _, x = sum_design(int(v["shape"][1]))
        y = v["y_mma"].astype(np.float32)
        assert any(np.array_equal(sum_rule_outputs(x, "h200-mma", w), y) for w in (1, 2, 4))
        assert not np.array_equal(sum_rule_outputs(x, "sequential"), y)


def test_dot_fit_refuses_to_call_a_wrong_model_exact():
    """The shipped model scores every output of a probe; the published sm80 model (alignment by the product's
    exponent) does not, and its status says so."""
    from simfloat_gpu.campaign import fit as F

    z = np.load(PROBES / "probes.npz")
    v = F.probe_variants(z, "dot")["bf16_16_16_16"]
    prob = F.dot_problem("bf16_16_16_16", v)
    prof = load_profile("h200")
    s, e = F.score_dot(prof.dot("bf16", "mma.sync").model, prob)
    assert s == 1.0 and measured_status(int(e.sum()), e.size).endswith("bit-exact")
    s80, e80 = F.score_dot(BlockFMA(16, 25), prob)  # the same block and F, aligned by the product's exponent
    assert s80 < 1.0 and measured_status(int(e80.sum()), e80.size).startswith("measured: inexact")


def _one_probe(tmp_path, variant, corrupt=False):
    """probes.npz with one dot variant of the committed H200 probes (and the run's environment); ``corrupt``:
    one GPU output one ulp off."""
    z = np.load(PROBES / "probes.npz")
    keep = {k: z[k] for k in z.files if k.startswith(f"dot_{variant}__") or k == "meta"}
    if corrupt:
        c = keep[f"dot_{variant}__c"].copy()
        c[1, 2, 3, 4] = np.nextafter(c[1, 2, 3, 4], np.float32(np.inf))
        keep[f"dot_{variant}__c"] = c
    path = tmp_path / ("corrupt.npz" if corrupt else "probes.npz")
    np.savez(path, **keep)
    return path


def test_fit_searches_the_model_of_one_part():
    """The search over dot_space (block, F, alignment, output rounding, split-k) on the committed fp16
    mma.sync probe finds the shipped part: its model, shapes and status; one model reproduces every output."""
    from simfloat_gpu.campaign import fit as F
    from simfloat_gpu.campaign.fit_profile import dot_space, search_dot

    z = np.load(PROBES / "probes.npz")
    variants = [("fp16_16_16_64", F.probe_variants(z, "dot")["fp16_16_16_64"])]
    shipped = load_profile("h200").dot("fp16", "mma.sync")
    space = dot_space("fp16", "mma.sync")
    assert shipped.model in space and len(space) > 100
    model, exact, total, rows, ties = search_dot("fp16", "mma.sync", variants, log=lambda _s: None)
    assert model == shipped.model and not ties
    assert measured_status(exact, total) == shipped.status
    assert {r["family"] for r in rows} >= {"cancel", "subnormal", "random"}
    assert all(r["exact"] == r["n"] for r in rows)


def test_fit_calls_a_corrupted_probe_not_exact(tmp_path, capsys):
    """One GPU output moved by one ulp: the fit (simfloat-gpu fit --profile) still picks the best model, but
    calls the part inexact, says so when it writes the profile, and the report shows which family missed."""
    from simfloat_gpu.campaign import fit_cli

    path = _one_probe(tmp_path, "fp16_16_16_64", corrupt=True)
    out = tmp_path / "mine.json"
    report = tmp_path / "fit.json"
    assert fit_cli.main([str(path), "--profile", str(out), "--name", "corrupt", "--report", str(report)]) == 0
    printed = capsys.readouterr().out
    assert "wrote" in printed and "not bit-exact: tensor core fp16 mma.sync" in printed
    prof = load_profile(out)
    part = prof.dot("fp16", "mma.sync")
    assert part.status.startswith("measured: inexact") and not prof.exact()["tensor core fp16 mma.sync"]
    assert part.model == load_profile("h200").dot("fp16", "mma.sync").model  # still the best model
    rows = json.loads(report.read_text())["probes"]
    missed = [r for r in rows if r["exact"] < r["n"]]
    assert len(missed) == 1 and missed[0]["n"] - missed[0]["exact"] == 1


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("SIMFLOAT_REFIT"),
    reason="re-fits the shipped h200 profile from the probes, search included (3-12 min, 2 cores): SIMFLOAT_REFIT=1",
)
def test_refit_h200_profile_from_the_committed_probes():
    """The whole fit, the dot-model search included: equal to the shipped profile, part for part."""
    from simfloat_gpu.campaign.fit_profile import fit_profile

    shipped = load_profile("h200")
    prof, table, rows = fit_profile(
        [PROBES / "probes.npz", PROBES / "exp2.npz", PROBES / "isa.tar.xz"], log=lambda _s: None
    )
    assert hardware.ex2_table_sha256(table) == hardware.H200_EX2_SHA256
    assert prof == shipped
    assert rows and all(r["exact"] <= r["n"] for r in rows)


# -- faithful() and the CLIs -----------------------------------------------------------------------------------


def test_faithful_hardware_settings():
    from simfloat_gpu.interpreter import _hardware_settings

    dot, arch, exp2, order = _hardware_settings("h200", None, "sm80", "correctly_rounded")
    assert order == "h200-mma" and _hardware_settings("h200", None, "sm80", "correctly_rounded", "numpy")[3] == "numpy"
    assert arch == "sm90" and dot["bf16"] == tensor_core("sm90", "bf16") and dot["fp8"] == tensor_core("sm90", "e4m3")
    x = np.float32([-1.3, -7.1, 2.0**-130])
    np.testing.assert_array_equal(exp2(x), hardware.ex2_approx(x))
    mine = Sequential("float32")
    dot, _, exp2, order = _hardware_settings("a100", {"bf16": mine}, "sm90", "correctly_rounded")
    assert order is None  # no tl.sum part: faithful() keeps its sequential default
    assert arch == "sm90" and dot["bf16"] == mine and dot["fp16"] == tensor_core("sm80", "fp16")
    assert exp2 == "correctly_rounded"


def test_validate_hardware_family(tmp_path):
    import argparse
    import types

    from simfloat_gpu.campaign import validate as V
    from simfloat_gpu.campaign.report import family_of

    p = argparse.ArgumentParser()
    V.add_arguments(p)
    args = p.parse_args(["--out", str(tmp_path), "--hardware", "h200"])
    with pytest.raises(ValueError, match="--hardware applies only with --fixtures"):
        V.check_args(args)
    prof = dataclasses.replace(load_profile("h200"), name="myh200")
    assert V.use_hardware(prof) == "myh200"
    cfg = V.Config(kind="flash", fmt="bf16", seq=64, head_dim=16, block_m=64, block_n=64, causal=False, out="fp32")
    assert V.emulator_plan(cfg, "myh200") == "triton-bf16@myh200"
    row = types.SimpleNamespace  # family_of reads a record's kind and plan
    assert family_of(row(kind="flash", plan="triton-bf16@myh200")) == "myh200"  # type: ignore[arg-type]
    assert family_of(row(kind="flash", plan="h200-bf16")) == "h200"  # type: ignore[arg-type]


def test_profile_plan_names_round_trip(tmp_path):
    """triton-<fmt>@<profile>: the name a profile's plan gets parses back (shipped name, a profile loaded in this
    process, a file), is the flash kernel's, pairs with triton-<fmt>'s baseline, and sweep specs and the
    attribution CLI take it; a name that could mean two profiles is refused."""
    from simfloat.attribution import baseline_plan_for
    from simfloat.attribution.cli import input_format
    from simfloat.sweep import kinds

    mine = dataclasses.replace(load_profile("h200"), name="mineplans", notes=("a copy",))
    path = save_profile(mine, tmp_path / "mine.json")
    by_file = plan(f"triton-fp16@{path}")  # a file: loaded, named by the profile's own name
    assert by_file.name == "triton-fp16@mineplans" and plan("triton-fp16@mineplans") == by_file
    assert by_file.qk == tensor_core("sm90", "fp16") and by_file.sum_order.rule == "h200-mma"
    assert by_file.kernels() == ("flash",) and input_format(by_file.name) == "fp16"
    assert baseline_plan_for(by_file).name == "pytorch-fp16"
    assert baseline_plan_for("triton-bf16@h200").name == "pytorch-bf16"
    settings = kinds._settings({"plan": "triton-bf16@h200"})
    assert settings["plan"] == plan("triton-bf16", hardware="h200") and settings["baseline"].name == "pytorch-bf16"
    from simfloat.attribution.cli import _with_hardware

    runs, _, pairs = _with_hardware(
        ["triton-bf16", "all-bf16"], {"triton-bf16": "pytorch-bf16", "all-bf16": "all-bf16"}, None, "h200"
    )
    assert [getattr(r, "name", r) for r in runs] == ["triton-bf16@h200", "all-bf16"]
    assert pairs == {"triton-bf16@h200": "pytorch-bf16", "all-bf16": "all-bf16"}
    with pytest.raises(ValueError, match="not a profile loaded"):
        plan("triton-bf16@nosuchprofile")
    with pytest.raises(ValueError, match="names its hardware profile"):
        plan("triton-bf16@h200", hardware="h200")
    with pytest.raises(ValueError, match="ambiguous"):  # another profile under the shipped name
        plan("triton-bf16", hardware=dataclasses.replace(load_profile("h200"), notes=("edited",)))
    with pytest.raises(ValueError, match="ambiguous"):  # another profile under a name used in this process
        plan("triton-bf16", hardware=dataclasses.replace(mine, notes=("edited again",)))
