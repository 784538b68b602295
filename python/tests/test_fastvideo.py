"""sta.fastvideo.sliding_tile_attention: FastVideo's signature and semantics
on inputs in FastVideo's tiled token order ([B, heads, S, D]), read in
place (no conversion copies), and sta.attention(order="tiled")."""
import math

import pytest
import torch

import sta
import sta.fastvideo as fv
from helpers import WrapSpy, dense_attention, randn, rel_err

TILE = (6, 8, 8)


def tiled_index(canvas, tile=TILE):
    """From STA.md section 1: tiled row of every untiled video token, and the
    tiled video length (partial tiles padded)."""
    T, H, W = canvas
    grid = [math.ceil(c / t) for c, t in zip(canvas, tile)]
    vol = tile[0] * tile[1] * tile[2]
    pos = []
    for t in range(T):
        for h in range(H):
            for w in range(W):
                tid = ((t // tile[0]) * grid[1] + h // tile[1]) * grid[2] + w // tile[2]
                inner = ((t % tile[0]) * tile[1] + h % tile[1]) * tile[2] + w % tile[2]
                pos.append(tid * vol + inner)
    return torch.tensor(pos), grid[0] * grid[1] * grid[2] * vol


def to_untiled(x, pos, vt):
    return torch.cat([x[:, :, pos], x[:, :, vt:]], dim=2)


def pad_mask(pos, vt):
    pad = torch.ones(vt, dtype=torch.bool)
    pad[pos] = False
    return pad


def tiled_inputs(gen, shape, pos, vt, n=3):
    """n random [B, heads, S, D] tensors in the tiled order whose padding rows
    hold NaN (they must never be read), leaves requiring grad."""
    pad = pad_mask(pos, vt)
    out = []
    for _ in range(n):
        t = randn(shape, gen)
        t[:, :, :vt][:, :, pad] = float("nan")
        out.append(t.requires_grad_(True))
    return out


@pytest.mark.parametrize("canvas", [(12, 8, 16), (7, 10, 9)])
@pytest.mark.parametrize("has_text", [True, False])
def test_matches_dense_attention_in_tiled_order(gen, rng, canvas, has_text):
    pos, vt = tiled_index(canvas)
    text_rows = 6 if has_text else 0
    B, H, D = 1, 2, 16
    S = vt + text_rows
    q, k, v = tiled_inputs(gen, (B, H, S, D), pos, vt)
    grid = [math.ceil(c / t) for c, t in zip(canvas, TILE)]
    wins = [tuple(rng.choice([k for k in range(1, g + 1) if k % 2 or k >= g]) for g in grid)
            for _ in range(H)]
    text_length = 4 if has_text else 0
    shape = "x".join(map(str, canvas))
    out = fv.sliding_tile_attention(q, k, v, wins, text_length, has_text, shape)
    assert out.shape == q.shape
    qu, ku, vu = (to_untiled(t, pos, vt) for t in (q, k, v))
    want, _ = dense_attention(qu, ku, vu, canvas, wins, TILE, text_length, "bhsd",
                              dtype=torch.float64)
    assert rel_err(to_untiled(out, pos, vt), want) < 1e-5
    pad = pad_mask(pos, vt)
    assert torch.all(out[:, :, :vt][:, :, pad] == 0)
    dout = randn(out.shape, gen)
    out.backward(dout)
    qd, kd, vd = (t.detach().double().requires_grad_(True) for t in (qu, ku, vu))
    o, _ = dense_attention(qd, kd, vd, canvas, wins, TILE, text_length, "bhsd",
                           dtype=torch.float64)
    (o * to_untiled(dout, pos, vt).double()).sum().backward()
    for g, want_g in ((q.grad, qd.grad), (k.grad, kd.grad), (v.grad, vd.grad)):
        assert rel_err(to_untiled(g, pos, vt), want_g) < 1e-4
        assert torch.all(g[:, :, :vt][:, :, pad] == 0)  # padding rows: exactly 0


def test_reads_the_tiled_rows_in_place(gen, monkeypatch):
    # partial tiles (7x10x9: 2x2x2 tiles), q a strided view: the library gets
    # q's, k's and v's own memory, and torch's output, nothing else
    canvas = (7, 10, 9)
    pos, vt = tiled_index(canvas)
    S = vt + 5
    big = randn((1, 2, S, 24), gen)
    q = big[..., 4:20]
    k, v = randn((1, 2, S, 16), gen), randn((1, S, 2, 16), gen).transpose(1, 2)
    assert not q.is_contiguous() and not v.is_contiguous()
    spy = WrapSpy(monkeypatch)
    out = fv.sliding_tile_attention(q, k, v, [(1, 1, 1), (3, 1, 1)], 5, True, "7x10x9")
    assert spy.ptrs == [q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr()]
    # and the same as the op in the tiled order, and as the untiled computation
    want = sta.attention(q, k, v, canvas=canvas, window=[(1, 1, 1), (3, 1, 1)], layout="bhsd",
                         order="tiled")
    assert torch.equal(out, want)
    untiled = sta.attention(*(to_untiled(t, pos, vt) for t in (q, k, v)), canvas=canvas,
                            window=[(1, 1, 1), (3, 1, 1)], layout="bhsd")
    assert torch.equal(to_untiled(out, pos, vt), untiled)


def test_the_op_takes_order(gen):
    # sta.attention(order="tiled") with lse, bshd, against sta.reference
    canvas, tile = (3, 5, 7), (2, 3, 4)
    pos, vt = tiled_index(canvas, tile)
    q, k, v = (randn((2, vt + 3, 2, 8), gen) for _ in range(3))
    kw = dict(canvas=canvas, tile=tile, window=(1, 1, 3), text_len=2, order="tiled")
    out, lse = sta.attention(q, k, v, return_lse=True, **kw)
    ref, ref_lse = sta.reference(q, k, v, return_lse=True, **kw)
    assert rel_err(out, ref) < 1e-5
    pad = pad_mask(pos, vt)
    assert torch.all(torch.isneginf(lse[:, :, :vt][:, :, pad]))
    ok = torch.isfinite(ref_lse)
    assert torch.allclose(lse[ok], ref_lse[ok], atol=1e-5)
    with pytest.raises(sta.ArgumentError) as info:
        sta.attention(q, k, v, canvas=canvas, tile=tile, window=(1, 1, 3), order="fastvideo")
    assert str(info.value) == "order: expected \"untiled\" or \"tiled\", got 'fastvideo'"
    with pytest.raises(sta.UnsupportedError) as info:  # the untiled length
        sta.attention(q[:, :108], k[:, :108], v[:, :108], **kw)
    assert str(info.value).startswith("seq_len 108 not supported for STA (the tiled order of "
                                      "canvas 3x5x7 has 192 video rows")


def test_argument_errors(gen):
    q = randn((1, 2, 12 * 16 * 16 + 3, 16), gen)
    with pytest.raises(sta.ArgumentError) as info:
        fv.sliding_tile_attention(q, q, q, [(1, 1, 1)], 3, True, "12x16x16")
    assert str(info.value) == "window_size: expected one window per head (2), got 1"
    with pytest.raises(sta.UnsupportedError) as info:  # 18x16x16 tiles need 4608 rows
        fv.sliding_tile_attention(q, q, q, [(1, 1, 1)] * 2, 3, True, "18x16x16")
    assert str(info.value) == ("seq_len %d not supported for STA (the tiled order of canvas "
                               "18x16x16 has 4608 video rows: 3x2x2 tiles of 6x8x8, partial "
                               "ones padded; then the text)" % q.shape[2])
    assert info.value.status_name == "STA_ERR_SEQ_LEN"
    with pytest.raises(sta.ArgumentError) as info:
        fv.sliding_tile_attention(q, q, q, [(1, 1, 1)] * 2, 3, True, "12x16")
    assert str(info.value) == "seq_shape: expected 3 integers ({a, b, c}, 'axbxc' or 'a,b,c'), " \
                              "got '12x16'"
    with pytest.raises(sta.ArgumentError) as info:  # text_length beyond the text rows
        fv.sliding_tile_attention(q, q, q, [(1, 1, 1)] * 2, 4, True, "12x16x16")
    assert info.value.status_name == "STA_ERR_ARGUMENT" and "text_len" in str(info.value)
    with pytest.raises(sta.ArgumentError) as info:
        fv.sliding_tile_attention(q[0], q, q, [(1, 1, 1)] * 2, 3, True, "12x16x16")
    assert str(info.value) == "q: expected a 4-D [B, heads, S, D] tensor, got 3-D"


def test_tiled_order_comes_from_the_core():
    for canvas, tile in (((7, 10, 9), TILE), ((2, 3, 5), (1, 2, 2))):
        pos, vt = tiled_index(canvas, tile)
        src = fv.tiled_order(canvas, tile, text_rows=2)
        assert len(src) == vt + 2
        assert torch.equal(src[pos], torch.arange(len(pos)))
        assert src[vt:].tolist() == [len(pos), len(pos) + 1]
        assert int((src >= 0).sum()) == len(pos) + 2


def test_example_swaps_the_drop_in(capsys):
    # examples/fastvideo_dropin.py: a FastVideo-style attention module, sta's
    # drop-in against a dense masked kernel with the same signature
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "fastvideo_dropin.py")
    spec = importlib.util.spec_from_file_location("fastvideo_dropin", path)
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    out_rel, grad_rel = ex.main(["--canvas", "7x10x9", "--text", "5", "--heads", "2",
                                 "--device", "cpu"])
    assert out_rel < 1e-5 and grad_rel < 1e-5
    assert "sta vs dense, canvas 7x10x9 (3077 rows, 2442 padding)" in capsys.readouterr().out
