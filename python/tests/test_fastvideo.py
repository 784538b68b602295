"""sta.fastvideo.sliding_tile_attention: FastVideo's signature and semantics
on inputs in FastVideo's tiled token order ([B, heads, S, D])."""
import math

import pytest
import torch

import sta
import sta.fastvideo as fv
from helpers import dense_attention, randn, rel_err

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


@pytest.fixture
def copies(monkeypatch):
    monkeypatch.setattr(fv, "allow_conversion_copies", True)


@pytest.mark.parametrize("canvas", [(12, 8, 16), (7, 10, 9)])
@pytest.mark.parametrize("has_text", [True, False])
def test_matches_dense_attention_in_tiled_order(gen, rng, copies, canvas, has_text):
    pos, vt = tiled_index(canvas)
    text_rows = 6 if has_text else 0
    B, H, D = 1, 2, 16
    S = vt + text_rows
    q, k, v = (randn((B, H, S, D), gen).requires_grad_(True) for _ in range(3))
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
    pad = torch.ones(vt, dtype=torch.bool)
    pad[pos] = False
    assert torch.all(out[:, :, :vt][:, :, pad] == 0)
    # differentiable through the conversion
    dout = randn(out.shape, gen)
    out.backward(dout)
    if sta.has_backward():
        qd, kd, vd = (t.detach().double().requires_grad_(True) for t in (qu, ku, vu))
        o, _ = dense_attention(qd, kd, vd, canvas, wins, TILE, text_length, "bhsd",
                               dtype=torch.float64)
        (o * to_untiled(dout, pos, vt).double()).sum().backward()
        assert rel_err(to_untiled(q.grad, pos, vt), qd.grad) < 1e-4
        assert rel_err(to_untiled(k.grad, pos, vt), kd.grad) < 1e-4
        assert torch.all(k.grad[:, :, :vt][:, :, pad] == 0)


def test_tiled_layout_missing_is_named(gen, monkeypatch):
    monkeypatch.setattr(fv, "allow_conversion_copies", False)
    q = randn((1, 2, 12 * 16 * 16, 16), gen)
    with pytest.raises(NotImplementedError) as info:
        fv.sliding_tile_attention(q, q, q, [(1, 1, 1)] * 2, 0, False, "12x16x16")
    assert "tiled token layout" in str(info.value) and "STA_BHSD_TILED" in str(info.value)


def test_identical_orders_need_no_copy(gen, monkeypatch):
    # one tile across H and W, whole tiles in T: tiled order == untiled order
    monkeypatch.setattr(fv, "allow_conversion_copies", False)
    q, k, v = (randn((1, 3, 12 * 8 * 8 + 5, 16), gen) for _ in range(3))
    out = fv.sliding_tile_attention(q, k, v, [(1, 1, 1)] * 3, 5, True, "12x8x8")
    want = sta.attention(q, k, v, canvas=(12, 8, 8), window=(1, 1, 1), layout="bhsd")
    assert torch.equal(out, want)


def test_argument_errors(gen, copies):
    q = randn((1, 2, 12 * 16 * 16 + 3, 16), gen)
    with pytest.raises(sta.ArgumentError) as info:
        fv.sliding_tile_attention(q, q, q, [(1, 1, 1)], 3, True, "12x16x16")
    assert str(info.value) == "window_size: expected one window per head (2), got 1"
    with pytest.raises(sta.UnsupportedError) as info:
        fv.sliding_tile_attention(q, q, q, [(1, 1, 1)] * 2, 3, True, "18x16x16")
    assert str(info.value) == "seq_len %d not supported for STA" % q.shape[2]
    with pytest.raises(sta.ArgumentError) as info:
        fv.sliding_tile_attention(q, q, q, [(1, 1, 1)] * 2, 3, True, "12x16")
    assert str(info.value) == "seq_shape: expected 3 integers or 'TxHxW', got '12x16'"
    with pytest.raises(sta.ArgumentError) as info:  # text_length beyond the text rows
        fv.sliding_tile_attention(q, q, q, [(1, 1, 1)] * 2, 4, True, "12x16x16")
    assert info.value.status_name == "STA_ERR_ARGUMENT" and "text_len" in str(info.value)


def test_tiled_order_comes_from_the_core():
    for canvas, tile in (((7, 10, 9), TILE), ((2, 3, 5), (1, 2, 2))):
        pos, vt = tiled_index(canvas, tile)
        src = fv.tiled_order(canvas, tile, text_rows=2)
        assert len(src) == vt + 2
        assert torch.equal(src[pos], torch.arange(len(pos)))
        assert src[vt:].tolist() == [len(pos), len(pos) + 1]
        assert int((src >= 0).sum()) == len(pos) + 2
