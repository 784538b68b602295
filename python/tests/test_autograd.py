"""Gradients of sta.attention and sta.Layer against torch autograd of the
masked dense attention (float64) and libsta's double-precision reference."""
import pytest
import torch

import sta
from helpers import dense_attention, kwargs, make_qkv, random_geometry, randn, rel_err


def dense_grads(q, k, v, dout, dlse=None, **kw):
    qd, kd, vd = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    out, lse = dense_attention(qd, kd, vd, dtype=torch.float64, **kw)
    loss = (out * dout.double()).sum()
    if dlse is not None:
        loss = loss + (lse * dlse.double()).sum()
    loss.backward()
    return qd.grad, kd.grad, vd.grad


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_gradients_match_dense_autograd(rng, gen, layout):
    for _ in range(5):
        g = random_geometry(rng)
        scale = rng.choice([None, 0.2])
        q, k, v = make_qkv(g, gen, B=rng.randint(1, 2), layout=layout, requires_grad=True)
        out = sta.attention(q, k, v, layout=layout, scale=scale, **kwargs(g))
        dout = randn(out.shape, gen)
        out.backward(dout)
        want = dense_grads(q, k, v, dout, layout=layout, scale=scale, **kwargs(g))
        ref = sta.reference_backward(q.detach(), k.detach(), v.detach(), dout, layout=layout,
                                     scale=scale, **kwargs(g))
        for name, got, w, r in zip("qkv", (q.grad, k.grad, v.grad), want, ref):
            assert got.shape == w.shape and got.dtype == q.dtype
            assert rel_err(got, w) < 1e-4, (name, g)
            assert rel_err(r, w) < 1e-5, (name, g)


def test_padding_rows_get_no_key_gradient(gen):
    g = dict(canvas=(4, 8, 8), tile=(2, 4, 4), window=(1, 3, 1), text_len=2, S=4 * 8 * 8 + 5,
             heads=2, D=16)
    q, k, v = make_qkv(g, gen, requires_grad=True)
    sta.attention(q, k, v, **kwargs(g)).backward(randn(q.shape, gen))
    V = 4 * 8 * 8
    assert torch.all(k.grad[:, V + 2:] == 0) and torch.all(v.grad[:, V + 2:] == 0)
    assert torch.all(q.grad[:, V + 2:].abs().sum(-1) > 0)  # padding rows still query


def test_gradient_through_lse(rng, gen):
    g = random_geometry(rng, heads=2)
    q, k, v = make_qkv(g, gen, requires_grad=True)
    out, lse = sta.attention(q, k, v, return_lse=True, **kwargs(g))
    dout, dlse = randn(out.shape, gen), randn(lse.shape, gen)
    torch.autograd.backward([out, lse], [dout, dlse])
    want = dense_grads(q, k, v, dout, dlse, **kwargs(g))
    for got, w in zip((q.grad, k.grad, v.grad), want):
        assert rel_err(got, w) < 1e-4
    # lse alone
    q.grad = k.grad = v.grad = None
    _, lse = sta.attention(q, k, v, return_lse=True, **kwargs(g))
    lse.backward(dlse)
    want = dense_grads(q, k, v, torch.zeros_like(out), dlse, **kwargs(g))
    assert rel_err(q.grad, want[0]) < 1e-4 and rel_err(k.grad, want[1]) < 1e-4
    assert torch.all(v.grad == 0)


def test_only_some_inputs_need_grad(rng, gen):
    g = random_geometry(rng)
    q, k, v = make_qkv(g, gen)
    k.requires_grad_(True)
    out = sta.attention(q, k, v, **kwargs(g))
    dout = randn(out.shape, gen)
    out.backward(dout)
    assert q.grad is None and v.grad is None
    assert rel_err(k.grad, dense_grads(q, k, v, dout, **kwargs(g))[1]) < 1e-4


def test_deterministic_gradients(rng, gen):
    g = random_geometry(rng)
    q, k, v = make_qkv(g, gen, requires_grad=True)
    dout = randn(q.shape, gen)
    runs = []
    for _ in range(2):
        q.grad = k.grad = v.grad = None
        sta.attention(q, k, v, deterministic=True, **kwargs(g)).backward(dout)
        runs.append([t.grad.clone() for t in (q, k, v)])
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_strided_dout_and_views(rng, gen):
    g = random_geometry(rng, heads=2)
    base = randn((1, g["S"], g["heads"] + 1, g["D"]), gen).requires_grad_(True)
    q = base[:, :, 1:]
    k, v = (randn((1, g["heads"], g["S"], g["D"]), gen).transpose(1, 2).requires_grad_(True)
            for _ in range(2))
    out = sta.attention(q, k, v, **kwargs(g))
    dout = randn((1, g["S"], g["heads"], 2 * g["D"]), gen)[..., ::2]  # last dim strided
    out.backward(dout)
    want = dense_grads(q, k, v, dout, **kwargs(g))
    assert rel_err(base.grad[:, :, 1:], want[0]) < 1e-4
    assert torch.all(base.grad[:, :, 0] == 0)
    assert rel_err(k.grad, want[1]) < 1e-4 and rel_err(v.grad, want[2]) < 1e-4


def test_layer_backward_after_the_context_is_gone(gen, rng):
    H = 3
    geom = dict(canvas=(4, 8, 12), tile=(2, 4, 4), text_len=3)
    strat = sta.Strategy()
    for h in range(H):
        strat.set(0, 0, h, (1, 1, 1)).set(1, 0, h, (rng.choice([1, 3]), 1, 3))
    layer = sta.Layer(layer=0, heads=H, head_dim=16, strategy=strat, **geom)
    S = 4 * 8 * 12 + 5
    q, k, v = (randn((1, S, H, 16), gen).requires_grad_(True) for _ in range(3))
    with sta.forward_context(step=1, batch=sta.ForwardBatch()):
        out = layer(q, k, v)
    assert sta.context_depth() == 0
    dout = randn(out.shape, gen)
    out.backward(dout)  # the forward's context is pushed again for the backward
    assert sta.context_depth() == 0
    wins = [strat.get(1, 0, h) for h in range(H)]
    want = dense_grads(q, k, v, dout, window=wins, **geom)
    for got, w in zip((q.grad, k.grad, v.grad), want):
        assert rel_err(got, w) < 1e-4


def _layer_grads(layer, q, k, v, dout, ctx, between):
    """q, k, v grads of layer's forward under ctx (forward_context kwargs),
    with between() run after the forward and before the backward."""
    for t in (q, k, v):
        t.grad = None
    with sta.forward_context(**ctx):
        out = layer(q, k, v)
        between()
    out.backward(dout)
    return q.grad.clone(), k.grad.clone(), v.grad.clone()


def test_layer_backward_uses_the_windows_of_its_forward(gen):
    """The backward must not look the windows up again (it once did: a strategy
    swapped or a metadata row changed after the forward gave a wrong dq)."""
    H = 3
    geom = dict(canvas=(4, 8, 12), tile=(2, 4, 4), text_len=3)
    S = 4 * 8 * 12 + 5
    a = sta.Strategy.uniform(1, 1, H, (1, 1, 1))
    b = sta.Strategy.uniform(1, 1, H, (3, 1, 3))
    q, k, v = (randn((1, S, H, 16), gen).requires_grad_(True) for _ in range(3))
    dout = randn((1, S, H, 16), gen)
    want = dense_grads(q, k, v, dout, window=(1, 1, 1), **geom)
    layer = sta.Layer(layer=0, heads=H, head_dim=16, strategy=a, **geom)

    def swap():
        layer.strategy = b
    got = _layer_grads(layer, q, k, v, dout, dict(step=0, batch=sta.ForwardBatch()), swap)
    for g, w in zip(got, want):
        assert rel_err(g, w) < 1e-4
    # a metadata row changed, or the metadata released, after the forward
    layer.strategy = None
    md = sta.Metadata.from_strategy(a, 0, 1, H)
    got = _layer_grads(layer, q, k, v, dout, dict(step=0, metadata=md, batch=sta.ForwardBatch()),
                       lambda: md.set_row(0, [(3, 3, 3)] * H))
    for g, w in zip(got, want):
        assert rel_err(g, w) < 1e-4
    md = sta.Metadata.from_strategy(a, 0, 1, H)
    got = _layer_grads(layer, q, k, v, dout, dict(step=0, metadata=md, batch=sta.ForwardBatch()),
                       md.close)
    for g, w in zip(got, want):
        assert rel_err(g, w) < 1e-4


def test_layer_backward_keeps_the_layers_scale_and_geometry(gen):
    H = 2
    geom = dict(canvas=(4, 8, 12), tile=(2, 4, 4), text_len=3)
    S = 4 * 8 * 12 + 5
    s = sta.Strategy.uniform(1, 1, H, (1, 3, 1))
    layer = sta.Layer(layer=0, heads=H, head_dim=16, strategy=s, scale=0.3, **geom)
    q, k, v = (randn((1, S, H, 16), gen).requires_grad_(True) for _ in range(3))
    dout = randn((1, S, H, 16), gen)
    got = _layer_grads(layer, q, k, v, dout, dict(step=0, batch=sta.ForwardBatch()), layer.close)
    want = dense_grads(q, k, v, dout, window=(1, 3, 1), scale=0.3, **geom)
    for g, w in zip(got, want):
        assert rel_err(g, w) < 1e-4


def _second_order(out_fn, q):
    """loss + ||d loss / dq||^2, the gradient taken with create_graph."""
    loss = out_fn().square().sum()
    gq, = torch.autograd.grad(loss, q, create_graph=True)
    return loss + gq.square().sum()


def test_double_backward_raises(rng, gen):
    """A gradient of the gradient is refused, never a silently detached one
    (the op's own refusal on torch >= 2.4, torch's once_differentiable error
    on older torch)."""
    g = random_geometry(rng, heads=2)
    q, k, v = make_qkv(g, gen, requires_grad=True)
    layer = sta.Layer(layer=0, heads=2, head_dim=g["D"], canvas=g["canvas"], tile=g["tile"],
                      text_len=g["text_len"],
                      strategy=sta.Strategy.uniform(1, 1, 2, g["window"] if isinstance(
                          g["window"][0], int) else g["window"][0]))

    def layer_out():
        with sta.forward_context(step=0, batch=sta.ForwardBatch()):
            return layer(q, k, v)

    for fn in (lambda: sta.attention(q, k, v, **kwargs(g)), layer_out):
        total = _second_order(fn, q)
        with pytest.raises(RuntimeError, match="differentiate twice|no double backward"):
            total.backward()


def test_layer_gradients_are_the_forwards_whatever_changes_after_it(rng, gen):
    """The class behind test_layer_backward_uses_the_windows_of_its_forward,
    by property: random geometries, per-head windows from a strategy or a
    metadata row, and a random change between forward and backward (the
    strategy swapped or edited, the row rewritten, the metadata, strategy or
    layer closed, another context pushed): the gradients are always those of
    the forward's windows and scale."""
    for _ in range(8):
        g = random_geometry(rng, per_head=True)
        H, D = g["heads"], g["D"]
        geom = dict(canvas=g["canvas"], tile=g["tile"], text_len=g["text_len"])
        wins = [tuple(w) for w in g["window"]]
        other = [tuple(rng.choice([1, 3]) for _ in range(3)) for _ in range(H)]
        strat = sta.Strategy()
        for h, w in enumerate(wins):
            strat.set(0, 0, h, w)
        scale = rng.choice([None, 0.25])
        use_md = rng.random() < 0.5
        md = sta.Metadata(1).set_row(0, wins) if use_md else None
        layer = sta.Layer(layer=0, heads=H, head_dim=D, strategy=None if use_md else strat,
                          scale=scale, **geom)
        q, k, v = make_qkv(g, gen, requires_grad=True)
        dout = randn(q.shape, gen)
        changes = {
            "swap": lambda: setattr(layer, "strategy", sta.Strategy.uniform(1, 1, H, (1, 1, 1))),
            "edit": lambda: strat.set(0, 0, 0, other[0]),
            "row": lambda: md.set_row(0, other) if md else None,
            "close metadata": lambda: md.close() if md else None,
            "close layer": layer.close,
            "push": lambda: sta.forward_context(step=0, batch=sta.ForwardBatch(),
                                                metadata=sta.Metadata(1).set_row(0, other)).push(),
        }
        change = rng.choice(sorted(changes))
        with sta.forward_context(step=0, batch=sta.ForwardBatch(), metadata=md):
            out = layer(q, k, v)
            changes[change]()
        depth = sta.context_depth()
        out.backward(dout)
        want = dense_grads(q, k, v, dout, window=wins, scale=scale, **geom)
        for name, got, w in zip("qkv", (q.grad, k.grad, v.grad), want):
            assert rel_err(got, w) < 1e-4, (name, change, g)
        assert depth == sta.context_depth()
