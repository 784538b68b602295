"""sta.attention's forward on the CPU: against libsta's reference (double)
and against a masked dense attention written in torch from the spec."""
import pytest
import torch

import sta
from helpers import (WrapSpy, dense_attention, flush_wraps, kwargs, make_qkv, random_geometry,
                     randn, rel_err)


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_forward_matches_reference_and_dense(rng, gen, layout):
    for _ in range(6):
        g = random_geometry(rng)
        B = rng.randint(1, 2)
        q, k, v = make_qkv(g, gen, B=B, layout=layout)
        out, lse = sta.attention(q, k, v, layout=layout, return_lse=True, **kwargs(g))
        ref, ref_lse = sta.reference(q, k, v, layout=layout, return_lse=True, **kwargs(g))
        dense, dense_lse = dense_attention(q, k, v, layout=layout, dtype=torch.float64,
                                           **kwargs(g))
        assert out.shape == q.shape and out.dtype == q.dtype
        assert lse.shape == (B, g["heads"], g["S"]) and lse.dtype == torch.float32
        assert rel_err(out, ref) < 1e-5, g
        assert rel_err(out, dense) < 1e-5, g
        assert rel_err(ref, dense) < 1e-6, g
        assert (lse.double() - dense_lse).abs().max() < 1e-4, g
        assert (ref_lse.double() - dense_lse).abs().max() < 1e-4, g


def test_scale_text_len_and_peaked_rows(rng, gen):
    g = random_geometry(rng, heads=2, per_head=True)
    g["S"] += 6
    g["text_len"] = 4
    q, k, v = make_qkv(g, gen, scale=4.0)  # sharply peaked softmax rows
    out = sta.attention(q, k, v, scale=0.37, **kwargs(g))
    dense, _ = dense_attention(q, k, v, scale=0.37, dtype=torch.float64, **kwargs(g))
    assert rel_err(out, dense) < 1e-5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_storage_on_cpu(rng, gen, dtype):
    g = random_geometry(rng)
    q, k, v = make_qkv(g, gen, dtype=dtype)
    out = sta.attention(q, k, v, **kwargs(g))
    assert out.dtype == dtype
    dense, _ = dense_attention(q, k, v, dtype=torch.float64, **kwargs(g))
    assert rel_err(out, dense) < (2e-2 if dtype == torch.bfloat16 else 3e-3)


def test_per_head_windows_differ_from_shared(gen):
    g = dict(canvas=(6, 8, 8), tile=(2, 4, 4), window=[(1, 1, 1), (3, 3, 3)], text_len=None,
             S=6 * 8 * 8 + 3, heads=2, D=16)
    q, k, v = make_qkv(g, gen)
    both = sta.attention(q, k, v, **kwargs(g))
    for h, w in enumerate(g["window"]):
        one = sta.attention(q, k, v, canvas=g["canvas"], tile=g["tile"], window=w)
        assert torch.equal(both[:, :, h], one[:, :, h])
    assert not torch.allclose(both[:, :, 0], sta.attention(
        q, k, v, canvas=g["canvas"], tile=g["tile"], window=(3, 3, 3))[:, :, 0])


def test_canvas_as_string_and_default_tile(gen):
    S = 6 * 8 * 16 + 2
    q, k, v = (randn((1, S, 1, 8), gen) for _ in range(3))
    a = sta.attention(q, k, v, canvas="6x8x16", window=(1, 1, 1))
    b = sta.attention(q, k, v, canvas=(6, 8, 16), tile=(6, 8, 8), window=(1, 1, 1))
    assert torch.equal(a, b)


def test_strided_views_are_read_in_place(rng, gen, monkeypatch):
    g = random_geometry(rng, heads=2)
    S, H, D = g["S"], g["heads"], g["D"]
    # q: a narrowed view of a wider tensor; k: BHSD memory seen as BSHD;
    # v: every other batch of a bigger batch
    big = randn((1, S, H + 3, D), gen)
    q = big[:, :, 1:1 + H]
    k = randn((1, H, S, D), gen).transpose(1, 2)
    v = randn((3, S, H, D), gen)[::2][:1]
    assert not q.is_contiguous() and not k.is_contiguous()
    spy = WrapSpy(monkeypatch)
    out = sta.attention(q, k, v, **kwargs(g))
    assert spy.ptrs[:3] == [q.data_ptr(), k.data_ptr(), v.data_ptr()]
    assert spy.ptrs[3] == out.data_ptr()  # torch allocated the output
    ref = sta.attention(q.contiguous(), k.contiguous(), v.contiguous(), **kwargs(g))
    assert torch.equal(out, ref)


def test_expanded_heads_need_no_copy(gen, monkeypatch):
    # grouped-query style: one k/v head broadcast over 3 query heads (stride 0)
    S = 4 * 8 * 8
    q = randn((1, S, 3, 16), gen)
    k1, v1 = randn((1, S, 1, 16), gen), randn((1, S, 1, 16), gen)
    k, v = k1.expand(1, S, 3, 16), v1.expand(1, S, 3, 16)
    spy = WrapSpy(monkeypatch)
    out = sta.attention(q, k, v, canvas=(4, 8, 8), tile=(2, 4, 4), window=(1, 1, 1))
    assert spy.ptrs[1:3] == [k.data_ptr(), v.data_ptr()]
    ref = sta.attention(q, k.contiguous(), v.contiguous(), canvas=(4, 8, 8), tile=(2, 4, 4),
                        window=(1, 1, 1))
    assert torch.equal(out, ref)


def test_no_grad_inputs_give_plain_output(rng, gen):
    g = random_geometry(rng)
    q, k, v = make_qkv(g, gen)
    out = sta.attention(q, k, v, **kwargs(g))
    assert out.grad_fn is None and not out.requires_grad
    with torch.no_grad():
        q.requires_grad_(True)
        assert sta.attention(q, k, v, **kwargs(g)).grad_fn is None


def test_backends_and_threads():
    assert "cpu" in sta.backends()
    n = sta.get_num_threads()
    sta.set_num_threads(1)
    try:
        assert sta.get_num_threads() == 1
    finally:
        sta.set_num_threads(0)
    assert sta.get_num_threads() == n
    assert sta.version() == sta.__version__


def test_wrap_cache_overflow_mid_call(gen):
    # the cache of wraps fills up during a call: the call's own handles stay valid
    from sta import _capi, _op
    lib = _capi.lib()
    g = dict(canvas=(4, 8, 8), tile=(2, 4, 4), window=(1, 3, 1), text_len=None,
             S=4 * 8 * 8 + 2, heads=2, D=8)
    for fill in range(58, 66):
        flush_wraps()
        keep = [randn((1, 1, 1, 1 + i), gen) for i in range(fill)]
        _op._handles(lib, keep)
        q, k, v = make_qkv(g, gen)
        out, lse = sta.attention(q, k, v, return_lse=True, **kwargs(g))
        ref, ref_lse = sta.reference(q, k, v, return_lse=True, **kwargs(g))
        assert rel_err(out, ref) < 1e-5 and (lse - ref_lse).abs().max() < 1e-4, fill
