"""sta.block_sparse_attention and sta.vsa (STA.md section 12) on the CPU:
forward, lse and gradients against float64 torch references written from
the spec (sparse_ref.py), the core's float64 VSA (sta.vsa_reference,
sta.vsa_backward_reference) against the fast path, sta.vsa_coarse's
coarse branch and selection against the forward, the lists in every form, the cube order and cube
sizes against the core's, VSA layers per step from the forward batch, and
misuse with sta's messages."""
import ctypes as C
import math

import pytest
import torch

import sta
from sta import _capi, _op, _sparse
from helpers import assert_lse, randn, rel_err
from sparse_ref import (block_reference, random_lists, random_sizes, vsa_combine,
                        vsa_reference)


def f64(*ts):
    return [t.detach().double().requires_grad_(True) for t in ts]


def grads_of(outs, grads):
    """The gradients of sum(out * grad) with respect to each leaf."""
    return sum((o * g).sum() for o, g in zip(outs, grads))


# ---- block lists -------------------------------------------------------------------------

def block_problem(gen, rng, layout):
    B, H, D, br = rng.choice([1, 2]), rng.choice([1, 2, 3]), rng.choice([8, 16]), rng.choice([4, 8])
    mq, mk = rng.randint(1, 4), rng.randint(1, 5)
    shape_q = (B, mq * br, H, D) if layout == "bshd" else (B, H, mq * br, D)
    shape_k = (B, mk * br, H, D) if layout == "bshd" else (B, H, mk * br, D)
    q, k, v = randn(shape_q, gen), randn(shape_k, gen), randn(shape_k, gen)
    idx, num = random_lists(gen, B, H, mq, mk, L=mk + rng.randint(0, 2))
    kvs = random_sizes(gen, mk, br) if rng.random() < 0.7 else None
    qs = random_sizes(gen, mq, br) if rng.random() < 0.7 else None
    return dict(q=q, k=k, v=v, idx=idx, num=num, kvs=kvs, qs=qs, br=br, layout=layout,
                scale=rng.choice([None, 0.3]))


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_block_sparse_against_float64(gen, rng, layout):
    for _ in range(4):
        p = block_problem(gen, rng, layout)
        out, lse = sta.block_sparse_attention(p["q"], p["k"], p["v"], p["idx"], p["num"],
                                              p["kvs"], p["qs"], p["br"], layout=layout,
                                              scale=p["scale"], return_lse=True)
        q, k, v = f64(p["q"], p["k"], p["v"])
        ro, rl = block_reference(q, k, v, p["idx"], p["num"], p["kvs"], p["qs"], p["br"],
                                 p["scale"], layout)
        assert rel_err(out, ro) < 1e-5
        assert torch.equal(torch.isinf(lse), torch.isinf(rl))
        fin = torch.isfinite(rl)
        assert not fin.any() or (lse[fin].double() - rl[fin]).abs().max() < 1e-4
        # the gradients, also through lse (finite rows)
        qg, kg, vg = (t.clone().requires_grad_(True) for t in (p["q"], p["k"], p["v"]))
        out, lse = sta.block_sparse_attention(qg, kg, vg, p["idx"], p["num"], p["kvs"], p["qs"],
                                              p["br"], layout=layout, scale=p["scale"],
                                              return_lse=True)
        dout, dlse = randn(out.shape, gen), randn(lse.shape, gen)
        fin32 = torch.isfinite(lse)
        loss = (out * dout).sum() + torch.where(fin32, lse * dlse, torch.zeros_like(lse)).sum()
        loss.backward()
        ref = (ro * dout.double()).sum() + torch.where(fin, rl * dlse.double(),
                                                       torch.zeros_like(rl)).sum()
        want = torch.autograd.grad(ref, (q, k, v))
        for got, w in zip((qg.grad, kg.grad, vg.grad), want):
            assert got.shape == w.shape
            assert rel_err(got, w) < 1e-4


def test_lists_in_every_form(gen):
    """int64 tensors, strided views, nested lists, ragged lists with no
    num: the same bits; entries past num are never read."""
    q, k, v = randn((1, 24, 2, 8), gen), randn((1, 32, 2, 8), gen), randn((1, 32, 2, 8), gen)
    ragged = [[[[3, 0], [], [1]], [[2], [0, 1, 2, 3], [3]]]]
    idx = torch.tensor([[[[3, 0, 7, 7], [9, 9, 9, 9], [1, 5, 5, 5]],
                         [[2, 6, 6, 6], [0, 1, 2, 3], [3, 0, 0, 0]]]], dtype=torch.int32)
    num = torch.tensor([[[2, 0, 1], [1, 4, 1]]], dtype=torch.int32)
    kw = dict(kv_sizes=[8, 5, 1, 7], q_sizes=(3, 8, 6), block_rows=8)
    want = sta.block_sparse_attention(q, k, v, idx, num, **kw)
    forms = [(idx.long(), num.long()), (idx.tolist(), num.tolist()), (ragged, None),
             (torch.stack([idx, idx], -1)[..., 0], num),  # a strided view
             (idx.transpose(2, 3).contiguous().transpose(2, 3), num)]
    for i, n in forms:
        assert torch.equal(sta.block_sparse_attention(q, k, v, i, n, **kw), want)
    kw["kv_sizes"] = torch.tensor([8, 5, 1, 7])
    assert torch.equal(sta.block_sparse_attention(q, k, v, idx, num, **kw), want)
    assert torch.equal(want[:, 3:8], torch.zeros(1, 5, 2, 8))  # padding rows of block 0
    assert torch.equal(want[:, 8:16, 0], torch.zeros(1, 8, 8))  # head 0's empty list
    assert want[:, 8:16, 1].abs().sum() > 0


def test_block_errors(gen):
    q, k, v = (randn((1, 16, 2, 8), gen) for _ in range(3))
    idx = torch.zeros(1, 2, 2, 2, dtype=torch.int32)
    num = torch.ones(1, 2, 2, dtype=torch.int32)
    bad = [((idx.float(), num), "q2k_idx: expected an integer tensor, got torch.float32"),
           ((idx, None), "q2k_num: required (how many of each list's entries count: "
                         "[B, heads, Mq]) unless q2k_idx is ragged lists"),
           ((None, num), "q2k_idx: required (the key blocks of each (batch, head, query "
                         "block): [B, heads, Mq, L])"),
           (([[[[0], [1.5]]]], None), "q2k_idx[1][1][2][1]: expected a 32-bit integer >= 0, "
                                      "got 1.5")]
    for (i, n), msg in bad:
        with pytest.raises(sta.ArgumentError) as e:
            sta.block_sparse_attention(q, k, v, i, n, block_rows=8)
        assert str(e.value) == msg
    dup = idx.clone()
    dup[0, 1, 1] = torch.tensor([1, 1])
    num2 = num.clone()
    num2[0, 1, 1] = 2
    with pytest.raises(sta.ArgumentError) as e:
        sta.block_sparse_attention(q, k, v, dup, num2, block_rows=8)
    assert str(e.value) == "blocks.idx[b=0, h=1, m=1]: key block 1 is listed twice (entries 0 and 1)"
    with pytest.raises(sta.ArgumentError) as e:
        sta.block_sparse_attention(q, k, v, idx, num, block_rows=8, kv_sizes=[8, 9])
    assert str(e.value) == "blocks.kv_sizes[1]: 9 is outside 1..8 (block_rows)"


# ---- the cube order -------------------------------------------------------------------

def core_cubes(x, canvas, cube, layout):
    """sta_tensor_to_cubes of x, through the C call."""
    L = _capi.lib()
    n = C.c_int64()
    L.check(L.sta_vsa_cube_count(_capi.ints(canvas), _capi.ints(cube), C.byref(n)))
    shape = list(x.shape)
    shape[1 if layout == "bshd" else 2] = n.value * cube[0] * cube[1] * cube[2]
    out = torch.empty(shape)
    hs = _op._handles(L, (out, x))
    L.check(L.sta_tensor_to_cubes(hs[0], hs[1], _capi.ints(canvas), _capi.ints(cube),
                                  0 if layout == "bshd" else 1))
    return out, n.value


def test_cube_order_and_sizes_are_the_cores(gen, rng):
    for _ in range(6):
        cube = rng.choice([(4, 4, 4), (4, 8, 8), (2, 3, 5)])
        canvas = tuple(rng.randint(1, 2 * c + 3) for c in cube)
        layout = rng.choice(["bshd", "bhsd"])
        n = canvas[0] * canvas[1] * canvas[2]
        x = randn((2, n, 3, 4) if layout == "bshd" else (2, 3, n, 4), gen)
        got = sta.to_cubes(x, canvas=canvas, cube=cube, layout=layout)
        want, cubes = core_cubes(x, canvas, cube, layout)
        assert torch.equal(got, want)
        assert torch.equal(sta.from_cubes(got, canvas=canvas, cube=cube, layout=layout), x)
        sizes = sta.cube_sizes(canvas=canvas, cube=cube)
        core = torch.empty(cubes, dtype=torch.int32)
        L = _capi.lib()
        L.check(L.sta_vsa_cube_sizes(_op._handles(L, (core,))[0], _capi.ints(canvas),
                                     _capi.ints(cube)))
        assert sizes.dtype == torch.int32 and torch.equal(sizes, core)
    # gradients of the reorder: the gather's
    x = randn((1, 60, 2, 4), gen).requires_grad_(True)
    y = sta.to_cubes(x, canvas=(3, 4, 5))
    g = randn(y.shape, gen)
    (y * g).sum().backward()
    assert torch.equal(x.grad, sta.from_cubes(g, canvas=(3, 4, 5)))


def test_topk_is_the_cores():
    L = _capi.lib()
    for cubes in (1, 7, 8, 1920, 32400):
        for s in (0.0, 0.1, 0.5, 0.6, 0.875, 0.9, 0.99, 1 - 1 / cubes, 0.9999999):
            t = C.c_int32()
            L.check(L.sta_vsa_topk(s, cubes, C.byref(t)))
            assert _sparse._topk(s, cubes) == t.value, (s, cubes)


# ---- VSA -----------------------------------------------------------------------------

def vsa_problem(gen, canvas, cube=(4, 4, 4), B=1, H=2, D=8, layout="bshd"):
    n = canvas[0] * canvas[1] * canvas[2]
    shape = (B, n, H, D) if layout == "bshd" else (B, H, n, D)
    q, k, v = (sta.to_cubes(randn(shape, gen), canvas=canvas, cube=cube, layout=layout)
               for _ in range(3))
    return q, k, v, randn(q.shape, gen), sta.cube_sizes(canvas=canvas, cube=cube)


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_vsa_against_float64(gen, layout):
    canvas, M, br = (5, 6, 7), 8, 64
    for kw in (dict(sparsity=0.6), dict(topk=2), dict(topk=M), dict(sparsity=0.0)):
        q, k, v, g, sizes = vsa_problem(gen, canvas, layout=layout)
        topk = kw.get("topk") or _sparse._topk(kw["sparsity"], M)
        for gate in (None, g):
            out, lse = sta.vsa(q, k, v, canvas=canvas, gate=gate, layout=layout,
                               return_lse=True, **kw)
            q64, k64, v64, g64 = f64(q, k, v, g)
            ro, rl = vsa_reference(q64, k64, v64, sizes, br, topk,
                                      g64 if gate is not None else None, layout=layout,
                                      return_parts=True)[:2]
            assert rel_err(out, ro) < 1e-5
            assert_lse(lse, rl, 1e-4)


def test_vsa_gradients_against_float64(gen):
    canvas, br = (5, 5, 6), 64
    for gated in (False, True):
        q, k, v, g, sizes = vsa_problem(gen, canvas, B=2)
        ts = [t.clone().requires_grad_(True) for t in (q, k, v, g)]
        out = sta.vsa(*ts[:3], canvas=canvas, topk=3, gate=ts[3] if gated else None)
        dout = randn(out.shape, gen)
        (out * dout).sum().backward()
        r = f64(q, k, v, g)
        ro = vsa_reference(*r[:3], sizes, br, 3, r[3] if gated else None)
        want = torch.autograd.grad((ro * dout.double()).sum(), r if gated else r[:3])
        for got, w in zip(ts, want):
            assert rel_err(got.grad, w) < 1e-4
        if not gated:
            assert ts[3].grad is None


def test_vsa_options_and_errors(gen):
    q, k, v, g, _ = vsa_problem(gen, (5, 6, 7))
    a = sta.vsa(q, k, v, canvas="5x6x7", sparsity=0.5)
    assert torch.equal(a, sta.vsa(q, k, v, canvas=(5, 6, 7), cube="4,4,4", topk=4))
    msgs = [(dict(canvas=(5, 6, 7)), "sparsity: required (the fraction of key cubes left out: "
                                     "topk = ceil((1 - sparsity) * cubes)), or topk"),
            (dict(canvas=(5, 6, 7), topk=2, sparsity=0.5),
             "sparsity: given with topk (give one of them)"),
            (dict(canvas=(4, 8, 8), cube=(4, 8, 8), topk=1),
             "q: 512 rows, expected 256 (the canvas 4x8x8 in 1 cubes of 256 rows, cube order)"),
            (dict(canvas=(5, 6, 7), topk=9), "topk: expected 1..8 (the key cubes), got 9"),
            (dict(canvas=(4, 8, 16), cube=(2, 2, 2), topk=1),
             "block_rows: expected 64 (4x4x4 cubes) or 256 (4x8x8 cubes), got 8"),
            (dict(canvas=(5, 6, 7), cube=(64, 64, 2), topk=1),
             "cube: 64x64x2 = 8192 tokens, expected at most 4096")]
    for kw, msg in msgs:
        with pytest.raises(sta.ArgumentError) as e:
            sta.vsa(q, k, v, **kw)
        assert str(e.value) == msg, kw


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_vsa_reference_is_the_fast_paths(gen, layout):
    """sta.vsa_reference / sta.vsa_backward_reference (the core's float64
    brute force) against sta.vsa and its autograd, f32 on the CPU; plain
    tensors out (no autograd)."""
    canvas, M = (5, 6, 7), 8
    for kw, gated in ((dict(topk=3), True), (dict(sparsity=0.4), False),
                      (dict(sparsity=0.0), True)):
        q, k, v, g, _ = vsa_problem(gen, canvas, B=2, layout=layout)
        gate = g if gated else None
        ts = [t.clone().requires_grad_(True) for t in (q, k, v, g)]
        out, lse = sta.vsa(*ts[:3], canvas=canvas, gate=ts[3] if gated else None, layout=layout,
                           return_lse=True, **kw)
        rout, rlse = sta.vsa_reference(*ts[:3], canvas=canvas, gate=gate, layout=layout,
                                       return_lse=True, **kw)
        assert not rout.requires_grad and rout.dtype == q.dtype and rout.shape == q.shape
        assert rel_err(out, rout) < 1e-5
        assert not assert_lse(lse, rlse, 1e-4).all()  # padding rows: -inf
        assert isinstance(sta.vsa_reference(q, k, v, canvas=canvas, topk=2, layout=layout),
                          torch.Tensor)
        dout = randn(out.shape, gen)
        (out * dout).sum().backward()
        want = sta.vsa_backward_reference(q, k, v, dout, canvas=canvas, gate=gate,
                                          layout=layout, **kw)
        assert len(want) == (4 if gated else 3)
        for t, w in zip(ts, want):
            assert w.shape == t.shape and rel_err(t.grad, w) < 1e-5


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_vsa_coarse_is_the_forwards_selection(gen, layout):
    """sta.vsa_coarse: out_c and lse_c against the float64 torch VSA, idx the
    forward's selection (ascending), num topk; block_sparse_attention over
    those lists plus gate * out_c is sta.vsa's out."""
    canvas, M, br = (5, 6, 7), 8, 64
    for kw in (dict(topk=3), dict(sparsity=0.6), dict(topk=M)):
        q, k, v, g, sizes = vsa_problem(gen, canvas, layout=layout)
        topk = kw.get("topk") or _sparse._topk(kw["sparsity"], M)
        oc, lc, idx, num = sta.vsa_coarse(q, k, v, canvas=canvas, layout=layout, **kw)
        assert oc.dtype == lc.dtype == torch.float32 and idx.dtype == num.dtype == torch.int32
        assert oc.shape == (1, 2, M, 8) and lc.shape == num.shape == (1, 2, M)
        assert idx.shape == (1, 2, M, topk)
        _, _, sel, roc, rlc = vsa_reference(*f64(q, k, v), sizes, br, topk, layout=layout,
                                            return_parts=True)
        assert torch.equal(idx.long(), sel.sort(-1).values)
        assert torch.equal(num, torch.full_like(num, topk))
        assert rel_err(oc, roc) < 1e-5 and (lc.double() - rlc).abs().max() < 1e-5
        out = sta.vsa(q, k, v, canvas=canvas, gate=g, layout=layout, **kw)
        fine = sta.block_sparse_attention(q, k, v, idx, num, sizes, sizes, br, layout=layout)
        assert rel_err(out, vsa_combine(oc, fine, g, sizes, br, layout)) < 1e-6


def test_vsa_reference_and_coarse_errors(gen):
    """The schema's and the core's messages, as sta.vsa's; host tensors
    only for the references."""
    q, k, v, g, _ = vsa_problem(gen, (5, 6, 7))
    calls = (sta.vsa, sta.vsa_reference, sta.vsa_coarse,
             lambda *a, **o: sta.vsa_backward_reference(*a, g, **o))
    for kw, msg in [(dict(canvas=(5, 6, 7), topk=2, sparsity=0.5),
                     "sparsity: given with topk (give one of them)"),
                    (dict(canvas=(5, 6, 7), topk=9), "topk: expected 1..8 (the key cubes), got 9"),
                    (dict(canvas=(4, 8, 8), cube=(4, 8, 8), topk=1),
                     "q: 512 rows, expected 256 (the canvas 4x8x8 in 1 cubes of 256 rows, "
                     "cube order)")]:
        for f in calls:
            with pytest.raises(sta.ArgumentError) as e:
                f(q, k, v, **kw)
            assert str(e.value) == msg, (f, kw)
    with pytest.raises(sta.ArgumentError) as e:
        sta.vsa_coarse(q, k, v, canvas=(5, 6, 7), topk=2, gate=g)
    assert str(e.value) == ("options: unknown key 'gate' (known: canvas, cube, sparsity, topk, "
                            "layout, scale)")
    with pytest.raises(sta.ArgumentError) as e:
        sta.vsa_backward_reference(q, k, v, None, canvas=(5, 6, 7), topk=2)
    assert str(e.value) == "dout: expected a torch.Tensor, got NoneType"


def test_vsa_double_backward_is_refused(gen):
    q, k, v, _, _ = vsa_problem(gen, (4, 4, 8))
    q.requires_grad_(True)
    out = sta.vsa(q, k, v, canvas=(4, 4, 8), topk=1)
    gq, = torch.autograd.grad((out * randn(out.shape, gen)).sum(), q, create_graph=True)
    with pytest.raises(RuntimeError):
        gq.sum().backward()


# ---- VSA layers -------------------------------------------------------------------------

def test_vsa_layer_takes_the_batchs_sparsity_per_step(gen):
    canvas = (5, 6, 7)
    layer = sta.Layer(mode="vsa", canvas=canvas, heads=2, head_dim=8, dense_steps=2, layer=3)
    fb = sta.ForwardBatch(vsa_sparsity=0.7)
    assert fb.vsa_sparsity == 0.7
    q, k, v, g, _ = vsa_problem(gen, canvas)
    for step in range(4):
        if step == 3:
            fb.vsa_sparsity = 0.3
        topk = 8 if step < 2 else _sparse._topk(fb.vsa_sparsity, 8)
        ts = [t.clone().requires_grad_(True) for t in (q, k, v, g)]
        with sta.forward_context(step=step, batch=fb):
            out = layer(*ts)
            assert torch.equal(layer(q, k, v), sta.vsa(q, k, v, canvas=canvas, topk=topk))
        want = sta.vsa(q, k, v, canvas=canvas, topk=topk, gate=g)
        assert torch.equal(out, want)
        dout = randn(out.shape, gen)
        (out * dout).sum().backward()  # after the context: the forward's topk
        ref = [t.clone().requires_grad_(True) for t in (q, k, v, g)]
        (sta.vsa(*ref[:3], canvas=canvas, topk=topk, gate=ref[3]) * dout).sum().backward()
        for a, b in zip(ts, ref):
            assert torch.equal(a.grad, b.grad)


def test_vsa_layer_errors(gen):
    q, k, v, g, _ = vsa_problem(gen, (5, 6, 7))
    layer = sta.Layer(mode="vsa", canvas=(5, 6, 7), heads=2, head_dim=8)
    with pytest.raises(sta.StateError) as e:
        layer(q, k, v)
    assert str(e.value) == "VSA forward called outside a forward context (no context is live)"
    cases = [(dict(mode="vsa", canvas=(5, 6, 7), heads=2, head_dim=8, text_len=3),
              sta.UnsupportedError, "text_len: a VSA layer has no text rows, got 3"),
             (dict(canvas=(5, 6, 7), heads=2, head_dim=8, cube=(4, 4, 4)), sta.ArgumentError,
              "cube: a layer in STA mode has no cubes (VSA mode: STA_LAYER_VSA)"),
             (dict(mode="VSA", canvas=(5, 6, 7), heads=2, head_dim=8), sta.ArgumentError,
              'mode: expected "sta" or "vsa", got \'VSA\'')]
    for kw, cls, msg in cases:
        with pytest.raises(cls) as e:
            sta.Layer(**kw)
        assert str(e.value) == msg
    st = sta.Layer(canvas=(2, 4, 4), tile=(1, 2, 2), heads=2, head_dim=8)
    x = randn((1, 32, 2, 8), gen)
    with pytest.raises(sta.ArgumentError) as e:
        st(x, x, x, x)
    assert str(e.value) == 'gate: an STA layer takes no gate (a layer of mode "vsa" does)'
    fb = sta.ForwardBatch()
    assert fb.vsa_sparsity == 0.0
    with pytest.raises(sta.ArgumentError) as e:
        fb.vsa_sparsity = 1.0
    assert str(e.value) == "vsa_sparsity: expected a number in [0, 1), got 1"
    assert math.isclose(fb.vsa_sparsity, 0.0)


# ---- the custom ops (torch >= 2.4) ---------------------------------------------------------

needs_op = pytest.mark.skipif(not _op.CUSTOM_OP, reason="torch < 2.4: no torch.ops.sta")


def op_args(gen, lse, requires_grad=True):
    """(block_sparse's, vsa's) arguments: tensors, spec fields, lse mode."""
    q, k, v, g, sizes = vsa_problem(gen, (4, 4, 8))
    for t in (q, k, v, g):
        t.requires_grad_(requires_grad)
    idx, num = random_lists(gen, 1, 2, 2, 2)
    bs = (q, k, v, idx, num, sizes, None) + tuple(_sparse.BlockSpec(64, 0, 0, 0.0)) + (lse,)
    vs = (q, k, v, g, sizes, None) + tuple(_sparse.VsaSpec(64, 1, 0, 0, 0.0)) + (lse,)
    return bs, vs


@needs_op
def test_opcheck(gen):
    for lse in (0, 1, 2):
        bs, vs = op_args(gen, lse)
        torch.library.opcheck(torch.ops.sta.block_sparse.default, bs)
        torch.library.opcheck(torch.ops.sta.vsa.default, vs)


@needs_op
def test_the_ops_arguments_are_the_specs_fields():
    names = [a.name for a in torch.ops.sta.vsa.default._schema.arguments]
    assert names == ["q", "k", "v", "gate", "kv_sizes", "q_sizes", *_sparse.VsaSpec._fields, "lse"]
    names = [a.name for a in torch.ops.sta.block_sparse.default._schema.arguments]
    assert names == ["q", "k", "v", "idx", "num", "kv_sizes", "q_sizes",
                     *_sparse.BlockSpec._fields, "lse"]


@needs_op
def test_compile_fullgraph_forward_and_backward(gen):
    import torch._dynamo
    canvas, H, D = (4, 4, 8), 2, 8
    lin = torch.nn.Linear(H * D, 4 * H * D)
    idx, num = random_lists(gen, 1, H, 2, 2)

    def block(x):
        q, k, v, g = lin(x).view(1, 128, 4, H, D).unbind(2)  # strided views
        a = sta.vsa(q, k, v, canvas=canvas, sparsity=0.5, gate=g)
        b, lse = sta.block_sparse_attention(q, k, v, idx, num, return_lse=True)
        return a.square().sum() + b.square().sum() + torch.where(
            torch.isfinite(lse), lse, torch.zeros_like(lse)).sum()

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    x = randn((1, 128, H * D), gen)
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
