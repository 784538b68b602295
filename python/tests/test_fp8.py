"""precision="fp8": the CPU reference (core/cpu_fp8.c) against the scheme's
definition in research/fp8_sim.py on the same inputs, the argument's checks,
8-bit operands (sta.attention_fp8), and on CUDA the fp8 kernel against the
CPU (never a silent native run)."""
import os
import sys

import numpy as np
import pytest
import torch

import sta

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "research"))
import fp8_sim  # noqa: E402


def _scheme(d):
    # the CPU's sums are exact; Hopper's are not; at D 64 whole blocks a step
    return dict(fp8_sim.scheme(fp8_sim.CHOSEN_D64 if d == 64 else fp8_sim.CHOSEN), acc="fp32")


def _inputs(kind, rows, heads, d, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, rows, heads, d, generator=g) for _ in range(3))
    if kind == "dit":  # shared per-channel biases, 4 channels of k 10-30x larger
        q += torch.randn(d, generator=g)
        bias = torch.randn(d, generator=g)
        bias[:4] = torch.tensor([12.0, -18.0, 24.0, -30.0])
        k += bias
        v *= torch.exp(0.5 * torch.randn(d, generator=g))
    return q, k, v


@pytest.mark.parametrize("kind", ["randn", "dit"])
def test_cpu_fp8_is_the_simulated_scheme(kind):
    # every query sees every key (the window covers the 1x2x2 tile grid),
    # rows in the tiled order: the simulation's setting
    canvas, text, heads, d = (6, 16, 16), 24, 2, 64
    video = 6 * 16 * 16
    geom = fp8_sim.Geom(canvas, text, (3, 3, 3))
    groups = [(t, np.arange(t * fp8_sim.VOL, (t + 1) * fp8_sim.VOL)) for t in range(geom.ntiles)]
    groups.append((None, np.arange(video, video + text)))
    q, k, v = _inputs(kind, video + text, heads, d, 7)
    out = sta.attention(q, k, v, canvas=canvas, window=(3, 3, 3), order="tiled",
                        precision="fp8")
    native = sta.attention(q, k, v, canvas=canvas, window=(3, 3, 3), order="tiled")
    sc = 1 / np.sqrt(d)
    rows = np.arange(video + text)
    for h in range(heads):
        qn, kn, vn = (t[0, :, h].double().numpy() for t in (q, k, v))
        sim = fp8_sim.fp8_attention(qn, kn, vn, geom, groups, sc, _scheme(d))
        ref = fp8_sim.ref_group(qn, kn, vn, rows, rows, sc)
        got = out[0, :, h].double().numpy()
        diff = np.linalg.norm(got - sim) / np.linalg.norm(sim)
        assert diff < 2e-4, "head %d: the CPU fp8 output is %.3g from the simulation's" % (h, diff)
        err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        assert 1e-2 < err < 5e-2, "head %d: rel L2 %.3g against float64" % (h, err)
        nat = np.linalg.norm(native[0, :, h].double().numpy() - ref) / np.linalg.norm(ref)
        assert nat < 1e-5  # the native forward is float32-exact: fp8 did quantize


def test_fp8_lse_and_dtypes():
    q, k, v = _inputs("randn", 6 * 8 * 16 + 8, 2, 32, 3)
    kw = dict(canvas=(6, 8, 16), window=(1, 1, 1), return_lse=True)
    out, lse = sta.attention(q, k, v, precision="fp8", **kw)
    ref, rlse = sta.reference(q, k, v, **kw)
    assert (lse - rlse).abs().max().item() < 0.03
    rel = ((out - ref).norm() / ref.norm()).item()
    assert 1e-2 < rel < 5e-2
    assert out.dtype == q.dtype


def test_fp8_argument_errors():
    q, k, v = _inputs("randn", 6 * 8 * 8, 1, 16, 1)
    with pytest.raises(sta.ArgumentError) as e:
        sta.attention(q, k, v, canvas=(6, 8, 8), window=(1, 1, 1), precision="fp16")
    assert str(e.value) == "precision: expected \"native\" or \"fp8\", got 'fp16'"
    q.requires_grad_(True)
    out = sta.attention(q, k, v, canvas=(6, 8, 8), window=(1, 1, 1), precision="fp8")
    with pytest.raises(sta.UnsupportedError) as e:
        out.sum().backward()
    assert "the backward has no STA_PRECISION_FP8 mode" in str(e.value)


@pytest.mark.skipif(not (torch.cuda.is_available() and sta.backend_available("cuda")),
                    reason="no CUDA device for torch and sta")
def test_fp8_on_cuda_matches_the_reference():
    q, k, v = (t.to("cuda", torch.bfloat16) for t in _inputs("randn", 6 * 16 * 16 + 8, 2, 64, 5))
    kw = dict(canvas=(6, 16, 16), window=(3, 3, 3))
    out = sta.attention(q, k, v, precision="fp8", **kw)
    cpu = sta.attention(*(t.cpu() for t in (q, k, v)), precision="fp8", **kw)
    native = sta.attention(q, k, v, **kw)
    rel = ((out.float().cpu() - cpu.float()).norm() / cpu.float().norm()).item()
    assert rel < 5e-3  # order and width of the sums only (spec/test_gpu_fp8.c: FP8_REL)
    dn = ((out.float() - native.float()).norm() / native.float().norm()).item()
    assert dn > 2 * rel and dn > 1e-2  # not a native run


def _e4m3_values(codes):
    """float32 values of e4m3 codes (uint8; no NaN codes given)."""
    c = codes.to(torch.int32)
    e, m = (c >> 3) & 15, (c & 7).to(torch.float32)
    mag = torch.where(e == 0, m / 8 * 2.0 ** -6, (1 + m / 8) * torch.pow(2.0, (e - 7).float()))
    return torch.where((c >> 7) == 1, -mag, mag)


def test_attention_fp8_prequantized_operands():
    # raw e4m3 codes in uint8 (torch 1.13 has no float8 dtype), scales per
    # row (k: one per head, a stride-0 view) and per channel of v: the same
    # output and lse, bit for bit, as precision "fp8" on the dequantized values
    g = torch.Generator().manual_seed(11)
    canvas, text, heads, d = (6, 8, 16), 5, 2, 32
    S = 6 * 8 * 16 + text
    codes = [torch.randint(0, 256, (1, S, heads, d), generator=g, dtype=torch.int32) for _ in range(3)]
    codes = [torch.where((c & 127) == 127, c - 1, c).to(torch.uint8) for c in codes]  # no NaN
    q_scale = 0.01 + 0.02 * torch.rand(1, heads, S, generator=g)
    k_scale = (0.02 + 0.02 * torch.rand(1, heads, 1, generator=g)).expand(1, heads, S)
    v_scale = 0.005 + 0.01 * torch.rand(1, heads, d, generator=g)
    deq = [_e4m3_values(c) for c in codes]
    deq[0] = deq[0] * q_scale.transpose(1, 2).unsqueeze(-1)
    deq[1] = deq[1] * k_scale.transpose(1, 2).unsqueeze(-1)
    deq[2] = deq[2] * v_scale.unsqueeze(1)
    kw = dict(canvas=canvas, window=(3, 1, 3), text_len=text, return_lse=True)
    out, lse = sta.attention_fp8(*codes, q_scale, k_scale, v_scale, **kw)
    want, want_lse = sta.attention(*deq, precision="fp8", **kw)
    assert out.dtype == torch.float32
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    ob = sta.attention_fp8(*codes, q_scale, k_scale, v_scale, out_dtype=torch.bfloat16,
                           canvas=canvas, window=(3, 1, 3), text_len=text)
    assert torch.equal(ob, want.to(torch.bfloat16))


def test_attention_fp8_errors():
    q = torch.randn(1, 6 * 8 * 8, 1, 16)
    c = torch.zeros(1, 6 * 8 * 8, 1, 16, dtype=torch.uint8)
    s = torch.ones(1, 1, 6 * 8 * 8)
    kw = dict(canvas=(6, 8, 8), window=(1, 1, 1))
    with pytest.raises(sta.Error) as e:
        sta.attention_fp8(q, c, c, s, s, s, **kw)
    assert str(e.value).startswith("q8: expected an 8-bit e4m3 torch.Tensor")
    with pytest.raises(sta.Error) as e:
        sta.attention_fp8(c, c, c, s, None, s, **kw)
    assert str(e.value) == "k_scale: expected a torch.Tensor, got NoneType"
    with pytest.raises(sta.Error) as e:
        sta.attention_fp8(c, c, c, s, s, s, out_dtype=torch.int32, **kw)
    assert str(e.value) == "out_dtype: expected a torch.dtype (float32, float16 or bfloat16), " \
        "got torch.int32"
    with pytest.raises(sta.Error) as e:  # v_scale's shape: the core's check
        sta.attention_fp8(c, c, c, s, s, s, **kw)
    assert "v_scale" in str(e.value)
