"""torch.ops.sta.attention and its packed arguments: the spec reaches
sta_attention_desc field for field; with torch >= 2.4, the op's own
registration (kernels, fake, Autograd kernel) passes torch.library.opcheck,
its direct call and its redispatch (under a dispatch mode) agree, gradients
flow through it, double backward is refused, and torch.compile(fullgraph=True)
keeps it whole, forward and backward (aot_eager: no C++ compiler needed)."""
import pytest
import torch

import sta
from sta import _op
from helpers import kwargs, make_qkv, random_geometry, randn, rel_err

needs_op = pytest.mark.skipif(not _op.CUSTOM_OP, reason="torch < 2.4: no torch.ops.sta")


def flat(window):
    ws = [window] if isinstance(window[0], int) else window
    return [int(x) for w in ws for x in w]


def test_spec_reaches_the_descriptor(rng):
    for _ in range(20):
        g = random_geometry(rng)
        scale = rng.choice([None, rng.uniform(0.05, 2.0)])
        layout, order = rng.choice(["bshd", "bhsd"]), rng.choice(["untiled", "tiled"])
        softmax, det = rng.choice(["exact", "fast"]), rng.choice([False, True])
        precision = rng.choice(["native", "fp8"])
        spec = _op._spec("attention", canvas=g["canvas"], window=g["window"], tile=g["tile"],
                         text_len=g["text_len"], layout=layout, scale=scale, softmax=softmax,
                         deterministic=det, order=order, precision=precision)[0]
        d = _op._desc(spec)._obj
        assert list(d.geom.canvas) == list(g["canvas"]) and list(d.geom.tile) == list(g["tile"])
        assert d.geom.text_len == (-1 if g["text_len"] is None else g["text_len"])
        assert d.layout == ("bshd", "bhsd").index(layout)
        assert d.geom.order == ("untiled", "tiled").index(order)
        assert d.softmax == ("exact", "fast").index(softmax) and d.deterministic == int(det)
        assert d.precision == ("native", "fp8").index(precision)
        wins = flat(g["window"])
        assert d.n_windows == len(wins) // 3 and [d.windows[i] for i in range(len(wins))] == wins
        assert d.scale == pytest.approx(0.0 if scale is None else scale, rel=1e-6)
        assert d.mask == 0 and not d.blocks
        assert spec.windows == tuple(wins) and spec.canvas == tuple(g["canvas"])


def test_absent_options_are_the_cores_defaults(gen):
    """No tile, text_len or scale: the descriptor takes sta_geometry_init's
    tile and text_len and scale 0 (the core's 1/sqrt(D)); no canvas: the
    known shape of q's length."""
    spec = _op._spec("attention", canvas="2x4x4", window="1,1,1")[0]
    assert spec.tile == () and spec.text_len == -1 and spec.scale == 0.0
    d = _op._desc(spec)._obj
    from sta import _capi
    g = _capi.Geometry()
    _capi.lib().sta_geometry_init(g, 2, 4, 4)
    assert list(d.geom.tile) == list(g.tile) and d.geom.text_len == g.text_len
    auto = _op._spec("attention", window=(1, 1, 1))[0]
    assert auto.canvas == ()
    d = _op._desc(auto, torch.empty(1, 30 * 48 * 80, 1, 8))._obj
    assert list(d.geom.canvas) == [30, 48, 80]


def test_the_ops_arguments_are_the_specs_fields():
    assert "int[] canvas, int[] tile, int text_len, int layout" in _op._SPEC_ARGS
    assert _op._SPEC_ARGS.endswith("int[] windows, float scale")
    if _op.CUSTOM_OP:
        names = [a.name for a in torch.ops.sta.attention.default._schema.arguments]
        assert names == ["q", "k", "v", *_op.Spec._fields, "lse"]


def op_args(g, gen, lse, requires_grad=False, layout="bshd"):
    q, k, v = make_qkv(g, gen, B=2, layout=layout, requires_grad=requires_grad)
    spec = _op._spec("attention", layout=layout, **kwargs(g))[0]
    return (q, k, v, *spec, lse)


@needs_op
def test_opcheck(rng, gen):
    for lse in (0, 1, 2):
        g = random_geometry(rng, max_tokens=200)
        torch.library.opcheck(torch.ops.sta.attention.default,
                              op_args(g, gen, lse, requires_grad=True))


if _op.CUSTOM_OP:
    from torch.utils._python_dispatch import TorchDispatchMode
else:
    TorchDispatchMode = object


class Recorder(TorchDispatchMode):
    """Records the ops dispatched under it: the op's Autograd kernel then
    redispatches instead of calling its kernel directly."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@needs_op
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_direct_call_and_redispatch_agree(rng, gen, layout):
    g = random_geometry(rng)
    args = op_args(g, gen, 2, layout=layout)
    out, lse = torch.ops.sta.attention.default(*args)
    with Recorder() as rec:
        out2, lse2 = torch.ops.sta.attention.default(*args)
    assert "sta.attention.default" in rec.ops
    assert torch.equal(out, out2) and torch.equal(lse, lse2)
    ref, ref_lse = sta.reference(*args[:3], layout=layout, return_lse=True, **kwargs(g))
    assert rel_err(out, ref) < 1e-5 and (lse - ref_lse).abs().max() < 1e-4
    empty = torch.ops.sta.attention.default(*args[:-1], 0)[1]
    assert empty.shape == (0,) and empty.dtype == torch.float32
    with torch.inference_mode():
        assert torch.equal(torch.ops.sta.attention.default(*args)[0], out)


@needs_op
def test_gradients_through_the_op(rng, gen):
    for direct in (True, False):
        g = random_geometry(rng, heads=2)
        q, k, v, *spec, _ = op_args(g, gen, 2, requires_grad=True)
        rec = Recorder()
        with rec if not direct else torch.enable_grad():
            out, lse = torch.ops.sta.attention.default(q, k, v, *spec, 1)
            assert lse.requires_grad is False and out.requires_grad
            dout = randn(out.shape, gen)
            out.backward(dout)
        if not direct:
            assert rec.ops.count("sta.attention_backward.default") == 1
        want = sta.reference_backward(q.detach(), k.detach(), v.detach(), dout, **kwargs(g))
        for got, w in zip((q.grad, k.grad, v.grad), want):
            assert rel_err(got, w) < 1e-4


@needs_op
def test_double_backward_is_refused(rng, gen):
    g = random_geometry(rng)
    q, k, v = make_qkv(g, gen, requires_grad=True)
    out = sta.attention(q, k, v, **kwargs(g))
    gq, = torch.autograd.grad((out * randn(out.shape, gen)).sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="no double backward through "
                                           "sta::attention_backward"):
        gq.sum().backward()


@needs_op
def test_compile_fullgraph_forward_and_backward(rng, gen):
    import torch._dynamo
    g = random_geometry(rng, heads=2)
    H, D = g["heads"], g["D"]
    lin = torch.nn.Linear(H * D, 3 * H * D)

    def block(x):
        q, k, v = lin(x).view(1, g["S"], 3, H, D).unbind(2)  # strided views
        out, lse = sta.attention(q, k, v, return_lse=True, **kwargs(g))
        return out.square().sum() + lse.sum()

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    x = randn((1, g["S"], H * D), gen)
    grads = []
    for fn in (compiled, block):
        xg = x.clone().requires_grad_(True)
        loss = fn(xg)
        loss.backward()
        grads.append((loss.detach(), xg.grad, lin.weight.grad.clone()))
        lin.zero_grad()
    assert not torch._dynamo.utils.counters["graph_break"]
    for a, b in zip(*grads):
        assert rel_err(a, b) < 1e-5
