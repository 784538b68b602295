"""Strategies, metadata, forward batches, contexts and layers from Python
(STA.md sections 5-7), driving per-(step, layer, head) windows as the Lua
pipeline does."""
import json
import os

import pytest
import torch

import sta
from helpers import randn, rel_err

GEOM = dict(canvas=(4, 8, 12), tile=(2, 4, 4), text_len=3)
V = 4 * 8 * 12
S = V + 5


def test_strategy_json_round_trip(tmp_path, rng):
    s = sta.Strategy()
    entries = {}
    for _ in range(20):
        key = (rng.randrange(5), rng.randrange(4), rng.randrange(3))
        w = (rng.choice([1, 3, 5]), rng.choice([1, 3]), rng.choice([1, 3, 5, 7]))
        s.set(*key, w)
        entries[key] = w
    assert len(s) == len(entries)
    for key, w in entries.items():
        assert s.get(*key) == w
    path = tmp_path / "strategy.json"
    s.save(path)
    on_disk = json.loads(path.read_text())
    assert on_disk == {"%d_%d_%d" % k: list(w) for k, w in entries.items()}
    assert [n for n in os.listdir(tmp_path)] == ["strategy.json"]  # no temporary left
    back = sta.Strategy.load(str(path))
    assert back == s
    assert sta.Strategy.parse(s.to_json()) == s
    assert sta.Strategy.parse(path.read_bytes()) == s


def test_strategy_errors(tmp_path):
    with pytest.raises(sta.ArgumentError) as info:
        sta.Strategy().get(1, 2, 3)
    assert info.value.status_name == "STA_ERR_KEY" and "1_2_3" in str(info.value)
    bad = tmp_path / "bad.json"
    bad.write_text('{"0_0_0": [3, 3, 3], "0_x_1": [1, 1, 1]}')
    with pytest.raises(sta.EnvError) as info:
        sta.Strategy.load(bad)
    assert info.value.status_name == "STA_ERR_FORMAT" and "0_x_1" in str(info.value)
    with pytest.raises(sta.EnvError) as info:
        sta.Strategy.load(tmp_path / "missing.json")
    assert info.value.status_name == "STA_ERR_IO"


def test_default_strategy_needs_the_environment(monkeypatch, tmp_path):
    for var in ("STA_ATTENTION_CONFIG", "SGLANG_DIFFUSION_ATTENTION_CONFIG",
                "FASTVIDEO_ATTENTION_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(sta.EnvError) as info:
        sta.Strategy.default()
    assert str(info.value) == "STA_ATTENTION_CONFIG is not set"
    assert info.value.status_name == "STA_ERR_ENV"
    path = tmp_path / "s.json"
    sta.Strategy.uniform(2, 1, 1, window=(1, 1, 1)).save(path)
    monkeypatch.setenv("FASTVIDEO_ATTENTION_CONFIG", str(path))
    assert len(sta.Strategy.default()) == 2


def test_uniform_and_sparsity():
    s = sta.Strategy.uniform(steps=4, layers=2, heads=3, window=(1, 1, 1), full=(2, 2, 3),
                             full_steps=1)
    assert s.extent == (4, 2, 3) and len(s) == 24
    assert s.get(0, 1, 2) == (2, 2, 3) and s.get(3, 0, 0) == (1, 1, 1)
    s.check(4, 2, 3)
    with pytest.raises(sta.ArgumentError):
        s.check(5, 2, 3)
    assert s.sparsity((2, 2, 3)) == pytest.approx(1 - (6 * 12 + 18 * 1) / (24 * 12))


def test_metadata_rows():
    s = sta.Strategy.uniform(steps=2, layers=3, heads=2, window=(3, 1, 1))
    md = sta.Metadata.from_strategy(s, 1, layers=3, heads=2)
    assert md.layers == 3 and md.row(2) == [(3, 1, 1), (3, 1, 1)]
    md.set_row(1, [(1, 1, 1), (3, 3, 3)])
    assert md.row(1) == [(1, 1, 1), (3, 3, 3)]
    search = sta.Metadata.search(2, [(1, 1, 1), (3, 3, 3)])
    assert search.row(0) == [(1, 1, 1), (3, 3, 3)]
    with pytest.raises(sta.StateError) as info:
        sta.Metadata.from_strategy(None, 0, 1, 1)
    assert str(info.value) == "mask_strategy cannot be None for SlidingTileAttention"
    with pytest.raises(sta.StateError) as info:
        sta.Metadata.from_strategy(sta.Strategy().set(1, 0, 0, (1, 1, 1)), 1, 1, 1)
    assert str(info.value) == "mask_strategy[0] cannot be None for SlidingTileAttention"


def test_context_stack():
    fb = sta.ForwardBatch(batch_size=2)
    assert fb.size == 2 and not fb.negative
    assert sta.context_depth() == 0 and sta.current_context() is None
    with sta.forward_context(step=3, batch=fb) as outer:
        assert sta.in_forward_pass() and sta.current_context() is outer
        with sta.forward_context(step=4) as inner:
            assert sta.context_depth() == 2 and sta.current_context() is inner
            assert not sta.in_forward_pass()
            with pytest.raises(sta.StateError) as info:
                outer.pop()
            assert "not the innermost" in str(info.value)
            assert sta.context_depth() == 2  # unchanged
        assert sta.current_context() is outer
    assert sta.context_depth() == 0 and not outer.live


def test_context_pops_when_an_exception_unwinds():
    with pytest.raises(KeyError):
        with sta.forward_context(step=1, batch=sta.ForwardBatch()):
            raise KeyError("boom")
    assert sta.context_depth() == 0


def layer_qkv(gen, heads=3, D=16, requires_grad=False):
    ts = [randn((1, S, heads, D), gen) for _ in range(3)]
    return [t.requires_grad_(requires_grad) for t in ts]


def test_layer_runs_the_windows_of_step_layer_head(gen, rng):
    L, H, steps = 3, 3, 3
    strat = sta.Strategy()
    for st in range(steps):
        for layer in range(L):
            for h in range(H):
                strat.set(st, layer, h, (rng.choice([1, 3]), rng.choice([1, 3]),
                                          rng.choice([1, 3])))
    layers = [sta.Layer(prefix="transformer.blocks.%d.attn.impl" % i, heads=H, head_dim=16,
                        **GEOM) for i in range(L)]
    assert [ly.index for ly in layers] == [0, 1, 2]
    q, k, v = layer_qkv(gen, H)
    batch = sta.ForwardBatch()
    for st in range(steps):
        md = sta.Metadata.from_strategy(strat, st, L, H)
        with sta.forward_context(step=st, metadata=md, batch=batch):
            for i, ly in enumerate(layers):
                out = ly(q, k, v)
                wins = [strat.get(st, i, h) for h in range(H)]
                ref = sta.attention(q, k, v, window=wins, **GEOM)
                assert torch.equal(out, ref)
    # the layer's own strategy when the context has no metadata
    ly = sta.Layer(layer=2, heads=H, head_dim=16, strategy=strat, **GEOM)
    with sta.forward_context(step=1, batch=batch):
        out = ly(q, k, v)
    assert torch.equal(out, sta.attention(q, k, v, window=[strat.get(1, 2, h) for h in range(H)],
                                          **GEOM))


def test_layer_errors_are_the_cores(gen):
    q, k, v = layer_qkv(gen)
    ly = sta.Layer(layer=1, heads=3, head_dim=16, **GEOM)
    cases = [
        (sta.StateError, "STA forward called outside a forward context (no context is live)",
         dict()),
        (sta.StateError, "forward_batch cannot be None", dict(step=0)),
        (sta.StateError, "mask_strategy cannot be None for SlidingTileAttention",
         dict(step=0, batch=sta.ForwardBatch())),
        (sta.StateError, "Invalid STA_param",
         dict(step=0, batch=sta.ForwardBatch(), metadata=sta.Metadata(1))),
    ]
    for grad in (False, True):
        for t in (q, k, v):
            t.requires_grad_(grad)
        for cls, msg, ctx in cases:
            with pytest.raises(cls) as info:
                if ctx:
                    with sta.forward_context(**ctx):
                        ly(q, k, v)
                else:
                    ly(q, k, v)
            assert str(info.value) == msg
            assert sta.context_depth() == 0
        ly.strategy = sta.Strategy().set(1, 1, 0, (1, 1, 1))
        with pytest.raises(sta.StateError) as info:
            with sta.forward_context(step=1, batch=sta.ForwardBatch()):
                ly(q, k, v)
        assert str(info.value) == "mask_strategy[0] cannot be None for SlidingTileAttention"
        ly.strategy = None
        with pytest.raises(sta.ArgumentError) as info:
            with sta.forward_context(step=0, batch=sta.ForwardBatch(),
                                     metadata=sta.Metadata.from_strategy(
                                         sta.Strategy.uniform(1, 2, 3, (3, 3, 3)), 0, 2, 3)):
                ly(q[:, :, :2], k[:, :, :2], v[:, :, :2])
        assert str(info.value) == "q: expected 3 heads (local_heads), got 2"


def test_search_mode_records_and_tune(gen, tmp_path):
    H, L = 4, 2  # a row with fewer windows than heads is a search row
    cands = [(1, 1, 1), (1, 3, 1), (1, 2, 3)]  # the full window last
    q, k, v = layer_qkv(gen, H)
    layers = [sta.Layer(layer=i, heads=H, head_dim=16, **GEOM) for i in range(L)]
    batch = sta.ForwardBatch()
    for step in range(2):
        md = sta.Metadata.search(L, cands)
        with sta.forward_context(step=step, metadata=md, batch=batch):
            for ly in layers:
                out = ly(q, k, v)
                assert torch.equal(out, sta.attention(q, k, v, window=cands[-1], **GEOM))
    assert batch.records() == 2 * L
    path = tmp_path / "search.json"
    batch.save_search(path)
    data = json.loads(path.read_text())
    assert set(data) == {"L2_loss", "L1_loss"} and len(data["L2_loss"]) == 2
    strat, report = sta.tune([path], skip_steps=1, full=cands[-1])
    assert strat.extent == (2, L, H)
    assert strat.get(0, 0, 0) == cands[-1]
    assert sum(report["counts"]) == 2 * L * H and 0 <= report["sparsity"] < 1


def test_search_forward_has_no_backward(gen):
    q, k, v = layer_qkv(gen, requires_grad=True)
    ly = sta.Layer(layer=0, heads=3, head_dim=16, **GEOM)
    with sta.forward_context(step=0, metadata=sta.Metadata.search(1, [(1, 1, 1), (1, 2, 3)]),
                             batch=sta.ForwardBatch()):
        out = ly(q, k, v)
    assert out.requires_grad
    assert torch.equal(out, sta.attention(q, k, v, window=(1, 2, 3), **GEOM))
    with pytest.raises(sta.UnsupportedError) as info:
        out.sum().backward()
    assert str(info.value) == "backward: layer 0 runs a mask search at step 0 (2 candidate " \
                              "windows); a search-mode forward has no backward"
    assert sta.context_depth() == 0


def test_layer_scale_and_auto_canvas(gen):
    s = sta.Strategy.uniform(1, 1, 2, window=(3, 3, 3))
    ly = sta.Layer(layer=0, heads=2, head_dim=16, strategy=s, scale=0.3, **GEOM)
    q, k, v = layer_qkv(gen, heads=2)
    with sta.forward_context(step=0, batch=sta.ForwardBatch()):
        out = ly(q, k, v)
    assert rel_err(out, sta.attention(q, k, v, window=(3, 3, 3), scale=0.3, **GEOM)) == 0
    auto = sta.Layer(layer=0, heads=2, head_dim=16, strategy=s)
    with pytest.raises(sta.UnsupportedError) as info:
        with sta.forward_context(step=0, batch=sta.ForwardBatch()):
            auto(q, k, v)
    assert str(info.value) == "seq_len %d not supported for STA" % S


def test_layer_index_from_prefix():
    assert sta.layer_index_from_prefix("transformer.double_blocks.7.attn.impl") == 7
    with pytest.raises(sta.ArgumentError):
        sta.layer_index_from_prefix("attn")


def test_handles_release_once():
    s = sta.Strategy.uniform(1, 1, 1, (3, 3, 3))
    s.close()
    s.close()
    assert repr(s) == "sta.Strategy(released)"
    with pytest.raises(sta.StateError):
        len(s)


def test_uniform_needs_a_window():
    with pytest.raises(sta.ArgumentError) as info:
        sta.Strategy.uniform(1, 1, 1)  # no default window, as in C, Lua and the FFI
    assert str(info.value) == "window: required ({Kt, Kh, Kw} for every head, or a list of " \
                              "them, one per head)"


def test_a_context_collected_while_pushed_is_named_by_the_next_forward(gen):
    """STA.md section 6, as the Lua module: push() without pop(), the context
    forgotten: the next forward that would have used it raises naming it
    (step, level), and later forwards see the stack without it."""
    import gc
    H = 3
    ly = sta.Layer(layer=0, heads=H, head_dim=16, strategy=sta.Strategy.uniform(2, 1, H, (1, 3, 1)),
                   **GEOM)
    q, k, v = layer_qkv(gen, H)
    with sta.forward_context(step=0, batch=sta.ForwardBatch()):
        for grad in (False, True):
            for t in (q, k, v):
                t.requires_grad_(grad)
            sta.forward_context(step=1, batch=sta.ForwardBatch()).push()  # and forgotten
            gc.collect()
            assert sta.context_depth() == 1
            with pytest.raises(sta.StateError) as info:
                ly(q, k, v)
            assert str(info.value) == (
                "forward context: the context of step 1 (level 2) was garbage-collected without "
                "being popped; it has been popped (open contexts with `with "
                "sta.forward_context(...):`)")
            out = ly(q, k, v)  # step 0's context again
            assert torch.equal(out.detach(), sta.attention(q.detach(), k.detach(), v.detach(),
                                                           window=(1, 3, 1), **GEOM))
    assert sta.context_depth() == 0


def test_a_context_holds_its_metadata_and_batch(gen):
    H = 3
    ly = sta.Layer(layer=0, heads=H, head_dim=16, **GEOM)
    q, k, v = layer_qkv(gen, H)
    md = sta.Metadata.from_strategy(sta.Strategy.uniform(1, 1, H, (3, 1, 1)), 0, 1, H)
    fb = sta.ForwardBatch()
    with sta.forward_context(step=0, metadata=md, batch=fb):
        md.close()
        fb.close()  # the context's own references keep them
        out = ly(q, k, v)
    assert torch.equal(out, sta.attention(q, k, v, window=(3, 1, 1), **GEOM))


def test_contexts_are_per_thread():
    import threading
    seen = []
    with sta.forward_context(step=2, batch=sta.ForwardBatch()) as ctx:
        t = threading.Thread(target=lambda: seen.append((sta.context_depth(),
                                                         sta.current_context())))
        t.start()
        t.join()
        errors = []

        def pop_elsewhere():
            try:
                ctx.pop()
            except sta.StateError as e:
                errors.append(str(e))
        t = threading.Thread(target=pop_elsewhere)
        t.start()
        t.join()
        assert ctx.live and sta.context_depth() == 1
    assert seen == [(0, None)]
    assert errors == ["forward context: pop of a context of another thread or task (step 2)"]
