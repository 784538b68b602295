"""sta.attention on CUDA (make test-gpu, an H100/H200 with torch >= 2.4):
forward and backward against a float32 dense attention and FlexAttention,
bf16 and fp16, torch.compile(fullgraph=True), CUDA graph capture, a
non-default stream, strided views without copies.

Runs under pytest (skipped without a CUDA device) or, where pytest is
missing, as a script: python3 python/tests/test_gpu.py (ends "N passed,
N failed").  STA_TEST_SEED fixes the seed."""
import contextlib
import os
import random
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

import torch  # noqa: E402

import sta  # noqa: E402
from sta import _capi  # noqa: E402
from helpers import assert_lse, dense_attention, flex_sta, flush_wraps, random_geometry, rel_err  # noqa: E402

try:
    import pytest
except ImportError:
    pytest = None

CUDA = torch.cuda.is_available() and sta.backend_available("cuda")
WHY = "no CUDA device for torch and sta (%s)" % (
    sta.backend_describe("cuda") if torch.cuda.is_available() else "torch.cuda unavailable")
if pytest is not None:
    pytestmark = pytest.mark.skipif(not CUDA, reason=WHY)

TOL = {torch.bfloat16: 1.2e-2, torch.float16: 5e-3}      # forward, vs float32
GTOL = {torch.bfloat16: 3e-2, torch.float16: 1e-2}       # gradients, vs float32


class Skipped(Exception):
    pass


def skip(why):
    if pytest is not None:
        pytest.skip(why)
    raise Skipped(why)


@contextlib.contextmanager
def raises(cls):
    box = []
    try:
        yield box
    except cls as e:
        box.append(e)
    else:
        raise AssertionError("%s was not raised" % cls.__name__)


def fresh_rng():
    s = int(os.environ.get("STA_TEST_SEED") or random.SystemRandom().randrange(1 << 31))
    print("seed", s)
    torch.manual_seed(s)
    return random.Random(s)


def qkv(shape, dtype, requires_grad=False, scale=1.0):
    ts = [(torch.randn(shape, device="cuda") * scale).to(dtype) for _ in range(3)]
    return [t.requires_grad_(requires_grad) for t in ts]


def gpu_geometry(rng, **kw):
    g = random_geometry(rng, max_tokens=3000, **kw)
    g["D"] = rng.choice([64, 128])
    return g


def kw(g):
    return {k: g[k] for k in ("canvas", "tile", "window", "text_len")}


_backward = {}


def need_cuda_backward():
    """Skip when the CUDA backward is not there yet (it is reported, not hidden)."""
    if "why" not in _backward:
        q, k, v = qkv((1, 64, 1, 64), torch.bfloat16, requires_grad=True)
        try:
            sta.attention(q, k, v, canvas=(1, 8, 8), window=(1, 1, 1)).sum().backward()
            _backward["why"] = None
        except (sta.UnsupportedError, NotImplementedError) as e:
            _backward["why"] = "sta's CUDA backward: %s" % e
    if _backward["why"]:
        skip(_backward["why"])


def grads_of(fn, q, k, v, dout):
    for t in (q, k, v):
        t.grad = None
    out = fn(q, k, v)
    out.backward(dout)
    return out.detach(), [t.grad.detach().clone() for t in (q, k, v)]


def f32_reference(q, k, v, dout, **kwa):
    qf, kf, vf = (t.detach().float().requires_grad_(True) for t in (q, k, v))
    out, lse = dense_attention(qf, kf, vf, **kwa)
    out.backward(dout.float())
    return out.detach(), lse.detach(), [qf.grad, kf.grad, vf.grad]


# ---- forward -------------------------------------------------------------------

def test_forward_random_geometries():
    rng = fresh_rng()
    for i in range(12):
        g = gpu_geometry(rng)
        dtype = rng.choice([torch.bfloat16, torch.float16])
        layout = rng.choice(["bshd", "bhsd"])
        B = rng.choice([1, 2])
        shape = (B, g["S"], g["heads"], g["D"])
        if layout == "bhsd":
            shape = (B, g["heads"], g["S"], g["D"])
        q, k, v = qkv(shape, dtype)
        out, lse = sta.attention(q, k, v, layout=layout, return_lse=True, **kw(g))
        want, want_lse = dense_attention(q, k, v, layout=layout, **kw(g))
        assert out.dtype == dtype and out.device == q.device
        assert torch.isfinite(out).all()
        e = rel_err(out, want)
        assert e < TOL[dtype], (i, g, dtype, layout, e)
        assert (lse - want_lse).abs().max().item() < 2e-2, (i, g)


def test_forward_matches_flex_attention():
    rng = fresh_rng()
    canvas, tile, H, D = (12, 16, 24), (6, 8, 8), 3, 128
    wins = [(1, 1, 3), (3, 1, 1), (1, 3, 3)]
    S = 12 * 16 * 24 + 40
    for dtype in (torch.bfloat16, torch.float16):
        q, k, v = qkv((1, S, H, D), dtype, scale=rng.choice([1.0, 2.0]))
        args = dict(canvas=canvas, tile=tile, window=wins, text_len=33)
        out = sta.attention(q, k, v, **args)
        flex = flex_sta(q, k, v, **args)
        want, _ = dense_attention(q, k, v, **args)
        e_sta, e_flex = rel_err(out, want), rel_err(flex, want)
        print("forward %s: sta %.2e, flex %.2e against float32" % (dtype, e_sta, e_flex))
        assert e_sta < TOL[dtype] and e_sta <= 2 * e_flex + 1e-3
        assert rel_err(out, flex) < TOL[dtype]


def test_fast_softmax_is_close():
    rng = fresh_rng()
    g = gpu_geometry(rng)
    q, k, v = qkv((1, g["S"], g["heads"], g["D"]), torch.bfloat16)
    fast = sta.attention(q, k, v, softmax="fast", **kw(g))
    want, _ = dense_attention(q, k, v, **kw(g))
    assert rel_err(fast, want) < 2 * TOL[torch.bfloat16]


class WrapSpy:
    def __init__(self):
        self.lib = _capi.lib()
        self.real = self.lib.sta_tensor_wrap
        self.ptrs = []

    def __enter__(self):
        flush_wraps()  # a cached wrap would not pass through sta_tensor_wrap

        def spy(out, data, *rest):
            self.ptrs.append(data)
            return self.real(out, data, *rest)
        self.lib.sta_tensor_wrap = spy
        return self

    def __exit__(self, *exc):
        self.lib.sta_tensor_wrap = self.real


def test_fastvideo_tiled_order():
    # sta.fastvideo's drop-in on FastVideo's tiled rows, read in place: whole
    # 6x8x8 tiles (the kernels' row maps) and partial ones (gathered, their
    # padding rows NaN: never read, out and gradients 0 there), forward and
    # backward against float32 dense attention on the untiled tokens
    import sta.fastvideo as fv
    rng = fresh_rng()
    for canvas in ((12, 16, 24), (13, 21, 19)):
        H, D, text, text_length = 3, 128, 40, 33
        src = fv.tiled_order(canvas, text_rows=text).cuda()
        pad = src < 0
        keep = torch.nonzero(~pad).view(-1)
        pos = torch.empty_like(keep)
        pos[src[keep]] = keep  # the tiled row of each untiled row
        wins = [(1, 1, 3), (3, 1, 1), (1, 3, 3)]
        shape = "x".join(map(str, canvas))
        for dtype in (torch.bfloat16, torch.float16):
            qu, ku, vu = qkv((1, H, int((~pad).sum()), D), dtype, scale=rng.choice([1.0, 2.0]))
            tiled = []
            for t in (qu, ku, vu):
                x = t.index_select(2, src.clamp(min=0))
                x[:, :, pad] = float("nan")
                tiled.append(x.requires_grad_(True))
            q, k, v = tiled
            out = fv.sliding_tile_attention(q, k, v, wins, text_length, True, shape)
            assert torch.all(out[:, :, pad] == 0)
            args = dict(canvas=canvas, tile=(6, 8, 8), window=wins, text_len=text_length,
                        layout="bhsd")
            dout = torch.randn(out.shape, device="cuda").to(dtype)
            dout[:, :, pad] = float("nan")
            want, _, wgrads = f32_reference(qu, ku, vu, dout[:, :, pos], **args)
            e = rel_err(out[:, :, pos], want)
            assert e < TOL[dtype], (canvas, dtype, e)
            need_cuda_backward()
            out.backward(dout)
            for name, g, w in zip("qkv", (q.grad, k.grad, v.grad), wgrads):
                assert torch.all(g[:, :, pad] == 0), (canvas, dtype, name)
                e = rel_err(g[:, :, pos], w)
                assert e < GTOL[dtype], (canvas, dtype, name, e)


def test_strided_views_no_copies():
    rng = fresh_rng()
    g = gpu_geometry(rng, heads=2)
    S, H, D = g["S"], g["heads"], g["D"]
    base = torch.randn(1, S, 3 * H, D, device="cuda", dtype=torch.bfloat16)
    q, k, v = base[:, :, :H], base[:, :, H:2 * H], base[:, :, 2 * H:]  # a fused qkv
    with WrapSpy() as spy:
        out = sta.attention(q, k, v, **kw(g))
    assert spy.ptrs[:4] == [q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr()]
    assert torch.equal(out, sta.attention(q.contiguous(), k.contiguous(), v.contiguous(),
                                          **kw(g)))


def test_non_default_stream():
    rng = fresh_rng()
    g = gpu_geometry(rng)
    q, k, v = qkv((1, g["S"], g["heads"], g["D"]), torch.bfloat16)
    want = sta.attention(q, k, v, **kw(g))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        q2 = q * 1  # produced on s: sta must run after it, on s
        out = sta.attention(q2, k, v, **kw(g))
        assert _capi.lib().sta_cuda_get_stream() == s.cuda_stream
    torch.cuda.current_stream().wait_stream(s)
    assert torch.equal(out, want)


def test_cuda_graph_capture_forward():
    rng = fresh_rng()
    g = gpu_geometry(rng)
    q, k, v = qkv((1, g["S"], g["heads"], g["D"]), torch.bfloat16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        sta.attention(q, k, v, **kw(g))  # warm up
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = sta.attention(q, k, v, **kw(g))
    for _ in range(2):
        for t in (q, k, v):
            t.copy_(torch.randn_like(t, dtype=torch.float32).to(t.dtype))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_out, sta.attention(q, k, v, **kw(g)))


def test_errors_keep_sta_message_on_cuda():
    q, k, v = qkv((1, 100, 2, 64), torch.bfloat16, requires_grad=True)
    for grad in (False, True):  # eager call, and through the custom op
        with torch.set_grad_enabled(grad), raises(sta.UnsupportedError) as box:
            sta.attention(q, k, v, canvas=(2, 8, 8), window=(1, 1, 1))
        assert str(box[0]) == ("seq_len 100 not supported for STA "
                               "(canvas 2x8x8 has 128 video rows, q has 100)")
        assert box[0].status_name == "STA_ERR_SEQ_LEN"
    a, b, c = qkv((1, 64, 1, 48), torch.bfloat16)
    with raises(sta.UnsupportedError) as box:
        sta.attention(a, b, c, canvas=(1, 8, 8), window=(1, 1, 1))
    assert str(box[0]) == "attention: head_dim 48 not supported on cuda (64 or 128)"
    a, b, c = qkv((1, 64, 1, 64), torch.float32)
    with raises(sta.ArgumentError) as box:
        sta.attention(a, b, c, canvas=(1, 8, 8), window=(1, 1, 1))
    assert str(box[0]) == "attention: dtype f32 not supported on cuda (use bf16 or f16)"
    assert box[0].status_name == "STA_ERR_DTYPE"


# ---- backward ------------------------------------------------------------------

def test_backward_against_float32_and_flex():
    need_cuda_backward()
    rng = fresh_rng()
    canvas, tile, H, D = (12, 16, 16), (6, 8, 8), 2, 128
    wins = [(1, 1, 1), (3, 1, 3)]
    S = 12 * 16 * 16 + 24
    args = dict(canvas=canvas, tile=tile, window=wins, text_len=20)
    for dtype in (torch.bfloat16, torch.float16):
        q, k, v = qkv((1, S, H, D), dtype, requires_grad=True, scale=rng.choice([1.0, 1.5]))
        dout = torch.randn(q.shape, device="cuda").to(dtype)
        _, g_sta = grads_of(lambda a, b, c: sta.attention(a, b, c, **args), q, k, v, dout)
        _, g_flex = grads_of(lambda a, b, c: flex_sta(a, b, c, **args), q, k, v, dout)
        _, _, g_ref = f32_reference(q, k, v, dout, **args)
        for name, a, f, r in zip("qkv", g_sta, g_flex, g_ref):
            e_sta, e_flex = rel_err(a, r), rel_err(f, r)
            print("d%s %s: sta %.2e, flex %.2e against float32" % (name, dtype, e_sta, e_flex))
            assert e_sta < GTOL[dtype] and e_sta <= 2 * e_flex + 2e-3, name


def test_backward_random_geometries():
    need_cuda_backward()
    rng = fresh_rng()
    for i in range(8):
        g = gpu_geometry(rng)
        dtype = rng.choice([torch.bfloat16, torch.float16])
        layout = rng.choice(["bshd", "bhsd"])
        shape = (1, g["S"], g["heads"], g["D"])
        if layout == "bhsd":
            shape = (1, g["heads"], g["S"], g["D"])
        q, k, v = qkv(shape, dtype, requires_grad=True)
        dout = torch.randn(shape, device="cuda").to(dtype)
        _, got = grads_of(lambda a, b, c: sta.attention(a, b, c, layout=layout, **kw(g)),
                          q, k, v, dout)
        _, _, want = f32_reference(q, k, v, dout, layout=layout, **kw(g))
        for name, a, r in zip("qkv", got, want):
            assert torch.isfinite(a).all(), (i, g, name)
            assert rel_err(a, r) < GTOL[dtype], (i, g, name, dtype, layout, rel_err(a, r))


def test_gradient_through_lse():
    need_cuda_backward()
    rng = fresh_rng()
    g = gpu_geometry(rng)
    dtype = torch.bfloat16
    q, k, v = qkv((1, g["S"], g["heads"], g["D"]), dtype, requires_grad=True)
    out, lse = sta.attention(q, k, v, return_lse=True, **kw(g))
    dout = torch.randn(out.shape, device="cuda").to(dtype)
    dlse = torch.randn(lse.shape, device="cuda")
    torch.autograd.backward([out, lse], [dout, dlse])
    qf, kf, vf = (t.detach().float().requires_grad_(True) for t in (q, k, v))
    o, l = dense_attention(qf, kf, vf, **kw(g))
    torch.autograd.backward([o, l], [dout.float(), dlse])
    for a, r in zip((q.grad, k.grad, v.grad), (qf.grad, kf.grad, vf.grad)):
        assert rel_err(a, r) < GTOL[dtype]


def test_deterministic_backward():
    need_cuda_backward()
    rng = fresh_rng()
    g = gpu_geometry(rng)
    q, k, v = qkv((1, g["S"], g["heads"], g["D"]), torch.bfloat16, requires_grad=True)
    dout = torch.randn(q.shape, device="cuda").to(torch.bfloat16)
    fn = lambda a, b, c: sta.attention(a, b, c, deterministic=True, **kw(g))  # noqa: E731
    try:
        _, first = grads_of(fn, q, k, v, dout)
    except sta.UnsupportedError as e:
        if "deterministic" not in str(e):
            raise
        skip("sta's CUDA backward: %s" % e)
    for _ in range(2):
        _, again = grads_of(fn, q, k, v, dout)
        assert all(torch.equal(a, b) for a, b in zip(first, again))


# ---- torch.compile and CUDA graphs --------------------------------------------------

class Block(torch.nn.Module):
    """A DiT-style attention block: fused qkv projection, STA, output projection."""

    def __init__(self, heads, D, args):
        super().__init__()
        self.heads, self.D, self.args = heads, D, args
        self.qkv = torch.nn.Linear(heads * D, 3 * heads * D, dtype=torch.bfloat16, device="cuda")
        self.proj = torch.nn.Linear(heads * D, heads * D, dtype=torch.bfloat16, device="cuda")

    def forward(self, x):
        B, S, _ = x.shape
        q, k, v = self.qkv(x).view(B, S, 3, self.heads, self.D).unbind(2)
        o = sta.attention(q, k, v, **self.args)
        return self.proj(o.reshape(B, S, self.heads * self.D))


def test_compile_fullgraph():
    from sta._op import CUSTOM_OP
    if not CUSTOM_OP:
        skip("torch < 2.4: no torch.ops.sta")
    import torch._dynamo
    fresh_rng()
    H, D = 2, 64
    args = dict(canvas=(6, 16, 16), tile=(6, 8, 8), window=[(1, 1, 1), (1, 3, 1)], text_len=7)
    S = 6 * 16 * 16 + 9
    block = Block(H, D, args)
    x = torch.randn(1, S, H * D, device="cuda").to(torch.bfloat16)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(block, fullgraph=True)
    got = compiled(x)
    want = block(x)
    assert rel_err(got, want) < 2e-2
    assert not torch._dynamo.utils.counters["graph_break"]
    need_cuda_backward()
    xg = x.clone().requires_grad_(True)
    compiled(xg).float().square().mean().backward()
    g_comp = [xg.grad.clone()] + [p.grad.clone() for p in block.parameters()]
    block.zero_grad()
    xe = x.clone().requires_grad_(True)
    block(xe).float().square().mean().backward()
    g_eager = [xe.grad] + [p.grad for p in block.parameters()]
    for a, b in zip(g_comp, g_eager):
        assert rel_err(a, b) < 3e-2


def test_compile_cuda_graphs():
    from sta._op import CUSTOM_OP
    if not CUSTOM_OP:
        skip("torch < 2.4: no torch.ops.sta")
    import torch._dynamo
    H, D = 2, 128
    args = dict(canvas=(6, 8, 16), window=(1, 1, 1))
    block = Block(H, D, args)
    torch._dynamo.reset()
    compiled = torch.compile(block, mode="reduce-overhead", fullgraph=True)
    x = torch.randn(1, 6 * 8 * 16, H * D, device="cuda").to(torch.bfloat16)
    with torch.no_grad():
        for _ in range(3):  # the third call replays the captured graph
            got = compiled(x)
        assert rel_err(got, block(x)) < 2e-2


def test_graphed_forward_and_backward():
    need_cuda_backward()
    fresh_rng()
    H, D = 2, 64
    args = dict(canvas=(6, 8, 16), tile=(6, 8, 8), window=(1, 1, 1), text_len=5)
    S = 6 * 8 * 16 + 8
    q, k, v = qkv((1, S, H, D), torch.bfloat16, requires_grad=True)

    def fn(a, b, c):
        return sta.attention(a, b, c, **args)

    graphed = torch.cuda.make_graphed_callables(fn, (q, k, v))
    dout = torch.randn(q.shape, device="cuda").to(torch.bfloat16)
    for _ in range(2):
        with torch.no_grad():
            for t in (q, k, v):
                t.copy_(torch.randn(t.shape, device="cuda").to(t.dtype))
        out_g, g_g = grads_of(graphed, q, k, v, dout)
        out_e, g_e = grads_of(fn, q, k, v, dout)
        assert torch.equal(out_g, out_e)
        for a, b in zip(g_g, g_e):
            assert rel_err(a, b) < 1e-2  # equal unless the backward accumulates atomically


def test_layer_on_cuda():
    fresh_rng()
    H, D = 3, 64
    geom = dict(canvas=(6, 16, 16), tile=(6, 8, 8), text_len=4)
    strat = sta.Strategy.uniform(2, 1, H, window=(1, 1, 1), full=(1, 2, 2), full_steps=1)
    layer = sta.Layer(layer=0, heads=H, head_dim=D, device="cuda", strategy=strat, **geom)
    S = 6 * 16 * 16 + 4
    q, k, v = qkv((1, S, H, D), torch.bfloat16)
    for step in range(2):
        with sta.forward_context(step=step, batch=sta.ForwardBatch()):
            out = layer(q, k, v)
        want = sta.attention(q, k, v, window=strat.get(step, 0, 0), **geom)
        assert torch.equal(out, want)
    # the backward uses the forward's windows (the layer's strategy swapped
    # in between changes nothing), as sta.attention's backward with them
    dout = torch.randn(q.shape, device="cuda").to(torch.bfloat16)
    got = []
    for run in ("layer", "attention"):
        qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
        if run == "layer":
            with sta.forward_context(step=1, batch=sta.ForwardBatch()):
                out = layer(qg, kg, vg)
            layer.strategy = sta.Strategy.uniform(2, 1, H, window=(1, 2, 2))
        else:
            out = sta.attention(qg, kg, vg, window=strat.get(1, 0, 0), **geom)
        out.backward(dout)
        got.append((qg.grad, kg.grad, vg.grad))
    for a, b in zip(*got):
        assert rel_err(a, b) < 1e-2  # equal unless the backward accumulates atomically


# ---- block lists and VSA (STA.md section 12) ---------------------------------------

def _ref32(fn, tensors, dout):
    """fn's out (and lse) in float32 with the gradients of sum(out * dout)."""
    ts = [t.detach().float().requires_grad_(True) if t is not None else None for t in tensors]
    res = fn(*ts)
    out = res[0] if isinstance(res, tuple) else res
    grads = torch.autograd.grad((out * dout.float()).sum(), [t for t in ts if t is not None])
    return res, grads


def test_block_sparse_cuda():
    from sparse_ref import block_reference, random_lists, random_sizes
    rng = fresh_rng()
    gen = torch.Generator().manual_seed(rng.randrange(1 << 31))
    for i in range(8):
        dtype = rng.choice([torch.bfloat16, torch.float16])
        D, br, layout = rng.choice([64, 128]), rng.choice([64, 128]), rng.choice(["bshd", "bhsd"])
        B, H, mq, mk = rng.choice([1, 2]), rng.choice([1, 3]), rng.randint(1, 5), rng.randint(1, 6)
        sq = (B, mq * br, H, D) if layout == "bshd" else (B, H, mq * br, D)
        sk = (B, mk * br, H, D) if layout == "bshd" else (B, H, mk * br, D)
        q, = qkv(sq, dtype, True)[:1]
        k, v = qkv(sk, dtype, True)[:2]
        idx, num = random_lists(gen, B, H, mq, mk)
        kvs, qs = random_sizes(gen, mk, br, 16), random_sizes(gen, mq, br, 16)
        dev = [t.cuda() for t in (idx, num, kvs, qs)]
        out, lse = sta.block_sparse_attention(q, k, v, *dev, br, layout=layout, return_lse=True)
        dout = torch.randn(out.shape, device="cuda").to(dtype)
        out.backward(dout)
        (ro, rl), rg = _ref32(lambda a, b, c: block_reference(a, b, c, idx, num, kvs, qs, br,
                                                              layout=layout), (q, k, v), dout)
        assert rel_err(out, ro) < TOL[dtype], (i, dtype, D, br, layout)
        assert_lse(lse, rl, 2e-2)
        for got, want in zip((q.grad, k.grad, v.grad), rg):
            assert rel_err(got, want) < GTOL[dtype], (i, dtype, D, br, layout)


def test_vsa_cuda():
    from sparse_ref import vsa_combine, vsa_reference
    rng = fresh_rng()
    for canvas, cube in (((8, 12, 20), (4, 4, 4)), ((7, 16, 20), (4, 8, 8))):
        for dtype in (torch.bfloat16, torch.float16):
            D, layout = rng.choice([64, 128]), rng.choice(["bshd", "bhsd"])
            n = canvas[0] * canvas[1] * canvas[2]
            shape = (1, n, 2, D) if layout == "bshd" else (1, 2, n, D)
            q, k, v, g = (sta.to_cubes(torch.randn(shape, device="cuda").to(dtype), canvas=canvas,
                                       cube=cube, layout=layout).requires_grad_(True)
                          for _ in range(4))
            sizes = sta.cube_sizes(canvas=canvas, cube=cube)
            topk = sta._sparse._topk(0.5, sizes.numel())
            out = sta.vsa(q, k, v, canvas=canvas, cube=cube, sparsity=0.5, gate=g, layout=layout)
            dout = torch.randn(out.shape, device="cuda").to(dtype)
            out.backward(dout)
            br = cube[0] * cube[1] * cube[2]
            ro, rg = _ref32(lambda a, b, c, d: vsa_reference(a, b, c, sizes, br, topk, d,
                                                             layout=layout), (q, k, v, g), dout)
            assert rel_err(out, ro) < TOL[dtype], (canvas, dtype, D, layout)
            for got, want in zip((q.grad, k.grad, v.grad, g.grad), rg):
                assert rel_err(got, want) < GTOL[dtype], (canvas, dtype, D, layout)
            # the coarse branch and the selection on CUDA: the CPU's out_c, lse_c and
            # lists (scores within rounding of a tie may choose apart: STA.md section 12),
            # and the lists the forward used (the fine branch over them plus gate * out_c)
            qd, kd, vd, gd = (t.detach() for t in (q, k, v, g))
            o = dict(canvas=canvas, cube=cube, sparsity=0.5, layout=layout)
            oc, lc, idx, num = sta.vsa_coarse(qd, kd, vd, **o)
            assert all(t.device.type == "cuda" for t in (oc, lc, idx, num))
            coc, clc, cidx, _ = sta.vsa_coarse(*(t.cpu() for t in (qd, kd, vd)), **o)
            assert rel_err(oc.cpu(), coc) < 1e-5 and (lc.cpu() - clc).abs().max().item() < 1e-4
            assert (idx.cpu() != cidx).any(-1).float().mean().item() < 0.02, (canvas, dtype)
            fine = sta.block_sparse_attention(qd, kd, vd, idx, num, sizes.cuda(), sizes.cuda(),
                                              br, layout=layout)
            want = vsa_combine(oc, fine, gd, sizes, br, layout)
            assert rel_err(out.detach(), want) < TOL[dtype], (canvas, dtype, D, layout)
            # the drop-in, [B, heads, S, D]: the same op
            if layout == "bhsd":
                from sta.fastvideo import video_sparse_attn
                o2 = video_sparse_attn(q.detach(), k.detach(), v.detach(), sizes, sizes, topk,
                                       block_size=cube, compress_attn_weight=g.detach())
                assert torch.equal(o2, out.detach())


class SparseBlock(torch.nn.Module):
    """Projections around VSA and block-sparse attention (cube order rows)."""

    def __init__(self, heads, D, canvas, idx, num):
        super().__init__()
        self.heads, self.D, self.canvas, self.idx, self.num = heads, D, canvas, idx, num
        self.qkvg = torch.nn.Linear(heads * D, 4 * heads * D, dtype=torch.bfloat16,
                                    device="cuda")

    def forward(self, x):
        B, S, _ = x.shape
        q, k, v, g = self.qkvg(x).view(B, S, 4, self.heads, self.D).unbind(2)
        a = sta.vsa(q, k, v, canvas=self.canvas, sparsity=0.5, gate=g)
        b = sta.block_sparse_attention(q, k, v, self.idx, self.num)
        return a.float().square().mean() + b.float().square().mean()


def _sparse_block():
    from sparse_ref import random_lists
    canvas, H, D = (8, 8, 12), 2, 64
    gen = torch.Generator().manual_seed(fresh_rng().randrange(1 << 31))
    S = 2 * 2 * 3 * 64
    idx, num = random_lists(gen, 1, H, S // 64, S // 64)
    block = SparseBlock(H, D, canvas, idx.cuda(), num.cuda())
    x = torch.randn(1, S, H * D, device="cuda").to(torch.bfloat16)
    return block, x


def test_sparse_compile_fullgraph():
    from sta._op import CUSTOM_OP
    if not CUSTOM_OP:
        skip("torch < 2.4: no torch.ops.sta")
    import torch._dynamo
    block, x = _sparse_block()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(block, fullgraph=True)
    grads = []
    for fn in (compiled, block):
        xg = x.clone().requires_grad_(True)
        loss = fn(xg)
        loss.backward()
        grads.append([loss.detach(), xg.grad] + [p.grad.clone() for p in block.parameters()])
        block.zero_grad()
    assert not torch._dynamo.utils.counters["graph_break"]
    for a, b in zip(*grads):
        assert rel_err(a, b) < 3e-2


def test_sparse_cuda_graphs():
    from sta._op import CUSTOM_OP
    if not CUSTOM_OP:
        skip("torch < 2.4: no torch.ops.sta")
    import torch._dynamo
    block, x = _sparse_block()
    torch._dynamo.reset()
    compiled = torch.compile(block, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        want = block(x)
        for _ in range(3):  # warm-up, record, replay
            got = compiled(x)
    assert rel_err(got, want) < 1e-2


def test_block_sparse_graph_bad_list():
    """Lists on the device are checked at every replay of a CUDA graph (no
    read-back is possible there): a list made invalid after the capture
    stops the replay before the attention reads it, printing which entry
    (core/mask.c's message) and losing the CUDA context, as a device-side
    assertion does: hence a process of its own."""
    import subprocess
    import textwrap
    code = textwrap.dedent("""
        import sys, torch
        sys.path[:0] = [%r, %r]
        import sta
        from sparse_ref import random_lists
        gen = torch.Generator().manual_seed(%d)
        H, D, M = 2, 64, 6
        idx, num = (t.cuda() for t in random_lists(gen, 1, H, M, M, empty=False))
        q, k, v = (torch.randn(1, M * 64, H, D, device="cuda").to(torch.bfloat16)
                   for _ in range(3))
        want = sta.block_sparse_attention(q, k, v, idx, num)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            sta.block_sparse_attention(q, k, v, idx, num)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = sta.block_sparse_attention(q, k, v, idx, num)
        g.replay()
        torch.cuda.synchronize()
        print("replay equal:", torch.equal(out, want), flush=True)
        num[0, 1, 2] = 2
        idx[0, 1, 2, 0] = 4
        idx[0, 1, 2, 1] = 4
        g.replay()
        torch.cuda.synchronize()
        print("second replay returned", flush=True)
        """ % (os.path.dirname(HERE), HERE, fresh_rng().randrange(1 << 31)))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert "replay equal: True" in out, out
    assert ("sta: blocks.idx[b=0, h=1, m=2]: key block 4 is listed twice (entries 0 and 1) "
            "(a CUDA graph's replay)") in out, out
    assert "second replay returned" not in out and r.returncode != 0, out


# ---- script mode -------------------------------------------------------------------

def main():
    if not CUDA:
        print("-- " + WHY)
        print("0 passed, 0 failed")
        return 0
    tests = [(n, f) for n, f in list(globals().items())
             if n.startswith("test_") and callable(f)]
    passed = failed = skipped = 0
    for name, fn in tests:
        try:
            fn()
            print("ok   %s" % name)
            passed += 1
        except Skipped as e:
            print("skip %s: %s" % (name, e))
            skipped += 1
        except Exception:
            print("FAIL %s" % name)
            traceback.print_exc()
            failed += 1
    print("%d passed, %d failed, %d skipped" % (passed, failed, skipped))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
