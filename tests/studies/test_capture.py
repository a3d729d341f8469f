"""simfloat.torch.capture_sdpa: a model's own attention inputs, recorded and attributed (forward and backward).
A small transformer built here: a TransformerEncoderLayer (its MultiheadAttention calls SDPA) and a hand-written
block calling SDPA; seq 12, model dim 16, two heads of 8."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pandas")

import torch.nn.functional as F  # noqa: E402

import simfloat.torch as st  # noqa: E402
from simfloat.attribution import attribute, load_capture  # noqa: E402
from simfloat.attribution.backward import attribute_backward  # noqa: E402

D, H, S = 16, 2, 12


class Hand(torch.nn.Module):
    """q, k, v projections, SDPA (causal, or with a mask), output projection; keeps what SDPA saw."""

    def __init__(self, mask=None, causal=True):
        super().__init__()
        self.qkv, self.o = torch.nn.Linear(D, 3 * D), torch.nn.Linear(D, D)
        self.mask, self.causal = mask, causal

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, H, D // H).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, is_causal=self.causal)
        if y.requires_grad:
            y.retain_grad()
        self.seen = (q, k, v, y)
        return self.o(y.transpose(1, 2).reshape(b, s, D))


class Tiny(torch.nn.Module):
    def __init__(self, dropout=0.0, mask=None, causal=True):
        super().__init__()
        self.enc = torch.nn.TransformerEncoderLayer(D, H, 2 * D, dropout=dropout, batch_first=True)
        self.block = Hand(mask, causal)

    def forward(self, x):
        return self.block(self.enc(x))


def _model(dtype, seed=0, **kw):
    torch.manual_seed(seed)
    return Tiny(**kw).to(dtype), torch.randn(2, S, D).to(dtype)


def _run(model, x):
    model.zero_grad()
    out = model(x)
    out.float().square().sum().backward()
    return out.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    model, x = _model(torch.bfloat16)
    path = tmp_path_factory.mktemp("cap") / "run.npz"
    with st.capture_sdpa(path):
        _run(model, x)
    return path, model


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_capture_records_every_call_and_its_gradient_without_changing_the_model(tmp_path, dtype):
    model, x = _model(dtype)
    want, want_grads = _run(model, x)
    path = tmp_path / "run.npz"
    with st.capture_sdpa(path) as cap:
        got, grads = _run(model, x)
    assert torch.equal(got, want) and all(torch.equal(a, b) for a, b in zip(grads, want_grads, strict=True))
    assert len(cap) == 2
    calls = load_capture(path)
    assert len(calls) == 2
    enc, blk = calls[0], calls[1]
    assert (enc.module, enc.module_type) == ("enc.self_attn", "MultiheadAttention")
    assert (blk.module, blk.module_type) == ("block", "Hand") and blk.is_causal and not enc.is_causal
    name = {torch.bfloat16: "bfloat16", torch.float32: "float32"}[dtype]
    for c in calls:
        assert c.dtype == name and c.q.shape == c.k.shape == c.v.shape == (2, H, S, D // H)
        assert c.attn_mask is None and c.dropout_p == 0.0 and c.scale is None and not c.enable_gqa
        assert c.do is not None and c.do.shape == c.q.shape
    q, k, v, y = model.block.seen
    for a, b in ((blk.q, q), (blk.k, k), (blk.v, v), (blk.do, y.grad)):
        assert np.array_equal(a, b.detach().double().numpy())  # bit for bit what SDPA saw (and got back)
    index = json.loads(str(np.load(path)["index"]))  # a plain npz with a JSON index
    assert [c["module"] for c in index["calls"]] == ["enc.self_attn", "block"]


def test_attribute_takes_a_captured_call_forward_and_backward(captured):
    path, _ = captured
    call = load_capture(path)[1]
    kw = dict(ops=["p", "out"], tiles=(), block_ns=(), trace=False, block_m=8, block_n=8)
    res = attribute(path, call=1, **kw)
    want = attribute(call.q, call.k, call.v, causal=True, **kw)
    assert res.isolation.equals(want.isolation) and res.meta["causal"]
    assert res.meta["call"]["module"] == "block" and "block" in res.table()
    one = attribute(path, call=1, heads=[1], **kw)
    assert one.isolation.equals(attribute(call.q[:, 1:2], call.k[:, 1:2], call.v[:, 1:2], causal=True, **kw).isolation)
    bkw = dict(tiles=[(8, 8)], ops=["grad", "dq"])
    back = attribute_backward(call, **bkw)
    want_b = attribute_backward(call.q, call.k, call.v, call.do, causal=True, **bkw)
    assert back.isolation.equals(want_b.isolation) and back.meta["call"]["module"] == "block"


def test_cli_attributes_a_captured_call(captured, tmp_path, capsys):
    from simfloat.cli import main

    path, _ = captured
    common = ["--inputs", str(path), "--call", "1", "--heads", "0", "--block-m", "8", "--block-n", "8"]
    out = tmp_path / "fwd"
    assert main(["attribute", *common, "--tiles", "8x8", "--block-ns", "8", "--out", str(out)]) == 0
    text = (out / "summary.txt").read_text()
    assert "call 1 of 2" in text and "block" in text and "causal" in text
    back = tmp_path / "bwd"
    argv = ["attribute", *common, "--pass", "backward", "--tiles", "8x8", "--block-ns", "8", "--seqs", "12"]
    assert main([*argv, "--out", str(back)]) == 0
    assert (back / "backward_attribution.csv").stat().st_size > 0
    assert main(["attribute", "--inputs", str(path), "--call", "2", "--out", str(tmp_path / "x")]) == 2
    assert "call 2" in capsys.readouterr().err


def test_options_the_emulator_cannot_model_are_recorded_then_refused_by_name(tmp_path, capsys):
    mask = torch.rand(S, S, generator=torch.Generator().manual_seed(1)) > 0.3
    model, x = _model(torch.float32, dropout=0.1, mask=mask, causal=False)
    path = tmp_path / "run.npz"
    with st.capture_sdpa(path):
        _run(model.train(), x)
    enc, blk = load_capture(path)
    assert enc.dropout_p == pytest.approx(0.1) and blk.attn_mask is not None and blk.attn_mask.shape == (S, S)
    assert np.array_equal(blk.attn_mask, mask.numpy())
    with pytest.raises(NotImplementedError, match="dropout_p"):
        attribute(path, call=0)
    with pytest.raises(NotImplementedError, match="attn_mask"):
        attribute(path, call=1)
    from simfloat.cli import main

    assert main(["attribute", "--inputs", str(path), "--call", "1", "--out", str(tmp_path / "o")]) == 2
    assert "attn_mask" in capsys.readouterr().err
    # a mask that is exactly the causal one is the causal call
    tril = torch.ones(S, S, dtype=torch.bool).tril()
    model, x = _model(torch.float32, mask=tril, causal=False)
    with st.capture_sdpa(path):
        _run(model, x)
    call = load_capture(path)[1]
    kw = dict(ops=["p"], tiles=(), block_ns=(), trace=False, block_m=8, block_n=8)
    assert attribute(call, **kw).meta["causal"]


def test_capture_in_eval_under_no_grad_records_the_fast_path_modules(tmp_path):
    model, x = _model(torch.float32)
    path = tmp_path / "run.npz"
    with torch.no_grad(), st.capture_sdpa(path):
        model.eval()(x)
    calls = load_capture(path)
    assert [c.module for c in calls] == ["enc.self_attn", "block"] and calls[0].do is None
    with pytest.raises(ValueError, match="no dO"):
        attribute_backward(calls[0])
