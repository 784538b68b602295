"""sta.fastvideo.video_sparse_attn and block_sparse_attn, the drop-ins for
fastvideo_kernel's, against a torch re-implementation of FastVideo's
semantics (sparse_ref.fastvideo_vsa: [B, heads, S, D], its means, top-k and
broadcast) in float64: equal on valid rows, 0 on padding rows (the
documented difference), gradients equal on valid rows; FastVideo's
argument forms (block_size as an int or a cube, sizes of any integer
dtype, a bool block map, topk above the cubes clamped)."""
import torch

import sta
from sta.fastvideo import block_sparse_attn, block_sparse_attn_from_indices, video_sparse_attn
from helpers import assert_lse, randn, rel_err
from sparse_ref import block_reference, fastvideo_vsa, random_lists


def cube_rows(canvas, cube, B, H, D, gen):
    """[B, H, S, D] in cube order, padding rows 0 (as FastVideo's tile()
    leaves them), and the sizes."""
    n = canvas[0] * canvas[1] * canvas[2]
    x = sta.to_cubes(randn((B, H, n, D), gen), canvas=canvas, cube=cube, layout="bhsd")
    return x, sta.cube_sizes(canvas=canvas, cube=cube)


def valid_rows(sizes, be):
    return (torch.arange(be).view(1, be) < sizes.view(-1, 1)).reshape(-1)


def test_video_sparse_attn_is_fastvideos_on_valid_rows(gen):
    for canvas, cube, bs, B in (((5, 6, 7), (4, 4, 4), 64, 2), ((4, 8, 20), (4, 8, 8), (4, 8, 8), 1)):
        be = cube[0] * cube[1] * cube[2]
        q, sizes = cube_rows(canvas, cube, B, 2, 8, gen)
        k, _ = cube_rows(canvas, cube, B, 2, 8, gen)
        v, _ = cube_rows(canvas, cube, B, 2, 8, gen)
        g = randn(q.shape, gen)
        M = sizes.numel()
        for topk, gate in ((1, None), (M // 2 + 1, g), (M, g)):
            out = video_sparse_attn(q, k, v, sizes.long(), sizes, topk, block_size=bs,
                                    compress_attn_weight=gate)
            want = fastvideo_vsa(q.double(), k.double(), v.double(), sizes, sizes, topk, be,
                                 gate.double() if gate is not None else None)
            ok = valid_rows(sizes, be)
            assert rel_err(out[:, :, ok], want[:, :, ok]) < 1e-5
            assert torch.equal(out[:, :, ~ok], torch.zeros_like(out[:, :, ~ok]))


def test_video_sparse_attn_gradients_on_valid_rows(gen):
    canvas, cube, be = (5, 5, 6), (4, 4, 4), 64
    q, sizes = cube_rows(canvas, cube, 1, 2, 8, gen)
    k, _ = cube_rows(canvas, cube, 1, 2, 8, gen)
    v, _ = cube_rows(canvas, cube, 1, 2, 8, gen)
    g = randn(q.shape, gen)
    ok = valid_rows(sizes, be)
    dout = randn(q.shape, gen) * ok.view(1, 1, -1, 1)  # FastVideo's padding rows are dropped
    ts = [t.clone().requires_grad_(True) for t in (q, k, v, g)]
    out = video_sparse_attn(*ts[:3], sizes, sizes, 3, block_size=(4, 4, 4),
                            compress_attn_weight=ts[3])
    (out * dout).sum().backward()
    r = [t.double().requires_grad_(True) for t in (q, k, v, g)]
    ref = fastvideo_vsa(*r[:3], sizes, sizes, 3, be, r[3])
    want = torch.autograd.grad((ref * dout.double()).sum(), r)
    for got, w in zip(ts, want):
        assert rel_err(got.grad[:, :, ok], w[:, :, ok]) < 1e-4
        assert torch.equal(got.grad[:, :, ~ok], torch.zeros_like(got.grad[:, :, ~ok]))


def test_video_sparse_attn_argument_forms(gen):
    canvas, cube = (5, 6, 7), (4, 4, 4)
    q, sizes = cube_rows(canvas, cube, 1, 2, 8, gen)
    k, _ = cube_rows(canvas, cube, 1, 2, 8, gen)
    want = video_sparse_attn(q, k, k, sizes, sizes, 8)
    for bs in (64, 4, (4, 4, 4), [4, 4, 4]):
        assert torch.equal(video_sparse_attn(q, k, k, sizes.long(), sizes.short(), 8,
                                             block_size=bs), want)
    assert torch.equal(video_sparse_attn(q, k, k, sizes, sizes, 50), want)  # clamped, as FastVideo
    assert torch.equal(want, sta.vsa(q, k, k, canvas=canvas, topk=8, layout="bhsd"))


def test_block_sparse_attn_and_its_forms(gen):
    B, H, D, br, mq, mk = 2, 2, 8, 64, 2, 3
    q = randn((B, H, mq * br, D), gen)
    k, v = randn((B, H, mk * br, D), gen), randn((B, H, mk * br, D), gen)
    idx, num = random_lists(gen, B, H, mq, mk)
    sizes = torch.tensor([64, 17, 40], dtype=torch.int32)
    out, lse = block_sparse_attn(q, k, v, idx, num, sizes)
    ro, rl = block_reference(q.double(), k.double(), v.double(), idx, num, sizes,
                             torch.full((mq,), br), br, layout="bhsd")
    assert rel_err(out, ro) < 1e-5 and lse.shape == (B, H, mq * br)
    fin = assert_lse(lse, rl, 1e-4)
    o2, l2 = block_sparse_attn_from_indices(q, k, v, idx.long(), num.long(), sizes.long())
    assert torch.equal(o2, out) and torch.equal(l2, lse)
    # FastVideo's newer form: a bool block map and the sizes
    bmap = torch.zeros(B, H, mq, mk, dtype=torch.bool)
    for b in range(B):
        for h in range(H):
            for m in range(mq):
                bmap[b, h, m, idx[b, h, m, :num[b, h, m]].long()] = True
    o3, l3 = block_sparse_attn(q, k, v, bmap, sizes)
    assert torch.equal(o3, out) and torch.equal(l3, lse)
    # differentiable, lse too
    ts = [t.clone().requires_grad_(True) for t in (q, k, v)]
    o4, l4 = block_sparse_attn(*ts, idx, num, sizes)
    (o4.sum() + torch.where(torch.isfinite(l4), l4, torch.zeros_like(l4)).sum()).backward()
    r = [t.double().requires_grad_(True) for t in (q, k, v)]
    ro, rl = block_reference(*r, idx, num, sizes, torch.full((mq,), br), br, layout="bhsd")
    want = torch.autograd.grad(ro.sum() + torch.where(fin, rl, torch.zeros_like(rl)).sum(), r)
    for got, w in zip(ts, want):
        assert rel_err(got.grad, w) < 1e-4
