"""Errors: Python exceptions with sta's exact message, status name and class
(one per status group), raised before any output is returned."""
import pickle

import pytest
import torch

import sta
from helpers import randn

KW = dict(canvas=(8, 8, 8), tile=(2, 4, 4))
S = 8 * 8 * 8 + 3


@pytest.fixture
def qkv(gen):
    return [randn((1, S, 2, 16), gen) for _ in range(3)]


def raises(cls, status_name, message, fn):
    with pytest.raises(cls) as info:
        fn()
    e = info.value
    assert str(e) == message
    assert e.status_name == status_name
    assert isinstance(e, sta.Error)
    return e


def test_core_messages_arrive_verbatim(qkv):
    q, k, v = qkv
    e = raises(sta.UnsupportedError, "STA_ERR_SEQ_LEN",
               "seq_len 259 not supported for STA (canvas 8x8x8 has 512 video rows, q has 259)",
               lambda: sta.attention(q[:, :259], k[:, :259], v[:, :259], window=(1, 1, 1),
                                     **KW))
    assert e.status == 301 and e.group == 300 and isinstance(e, RuntimeError)
    raises(sta.ArgumentError, "STA_ERR_WINDOW", "window: Kt = 0, expected >= 1",
           lambda: sta.attention(q, k, v, window=(0, 1, 1), **KW))
    raises(sta.ArgumentError, "STA_ERR_WINDOW", "n_windows: expected 1 or heads (2), got 3",
           lambda: sta.attention(q, k, v, window=[(1, 1, 1)] * 3, **KW))
    raises(sta.ArgumentError, "STA_ERR_SHAPE",
           "k: shape [B=1, S=514, heads=2, D=16] differs from q's [B=1, S=515, heads=2, D=16]",
           lambda: sta.attention(q, k[:, 1:], v, window=(1, 1, 1), **KW))
    raises(sta.ArgumentError, "STA_ERR_DTYPE", "k: dtype f16 differs from q's f32",
           lambda: sta.attention(q, k.half(), v, window=(1, 1, 1), **KW))
    raises(sta.ArgumentError, "STA_ERR_SHAPE",
           "q: the head dimension must be contiguous (stride 1), got stride 2",
           lambda: sta.attention(randn((1, S, 2, 32), torch.Generator())[..., ::2], k, v,
                                 window=(1, 1, 1), **KW))
    raises(sta.ArgumentError, "STA_ERR_ARGUMENT",
           "text_len: 4 is outside 0..3 (seq_len 515 - 512 video tokens)",
           lambda: sta.attention(q, k, v, window=(1, 1, 1), text_len=4, **KW))
    raises(sta.ArgumentError, "STA_ERR_WINDOW", "tile: t = 0, expected 1..1048576",
           lambda: sta.attention(q, k, v, window=(1, 1, 1), canvas=(8, 8, 8), tile=(0, 4, 4)))


def test_even_window_smaller_than_the_axis(qkv):
    q, k, v = qkv
    with pytest.raises(sta.ArgumentError) as info:
        sta.attention(q, k, v, window=(2, 1, 1), **KW)
    assert info.value.status_name == "STA_ERR_WINDOW"
    assert "Kt" in str(info.value) and "2" in str(info.value)


def test_python_side_checks_name_the_argument(qkv):
    q, k, v = qkv
    cases = [
        ("STA_ERR_DTYPE", "q: dtype torch.float64 is not supported (float32, float16, bfloat16)",
         dict(q=q.double())),
        ("STA_ERR_SHAPE", "q: expected a 4-D tensor, got 3-D [515, 2, 16]", dict(q=q[0])),
        ("STA_ERR_ARGUMENT", "v: expected a torch.Tensor, got list", dict(v=[1.0])),
        ("STA_ERR_ARGUMENT", "layout: expected \"bshd\" or \"bhsd\", got 'bsdh'",
         dict(layout="bsdh")),
        ("STA_ERR_ARGUMENT", "scale: expected a number > 0 that float32 holds (not 0, not Inf, "
         "no NaN), got 0", dict(scale=0)),
        ("STA_ERR_ARGUMENT", "scale: expected a number > 0 that float32 holds (not 0, not Inf, "
         "no NaN), got 1e-50", dict(scale=1e-50)),
        ("STA_ERR_ARGUMENT", "softmax: expected \"exact\" or \"fast\", got 'slow'",
         dict(softmax="slow")),
        ("STA_ERR_ARGUMENT", "text_len: expected a 64-bit integer >= 0, got -1",
         dict(text_len=-1)),
        ("STA_ERR_ARGUMENT", "text_len: expected a 64-bit integer >= 0, got 3.5",
         dict(text_len=3.5)),
        ("STA_ERR_WINDOW", "canvas: expected 3 integers, got 2", dict(canvas=(8, 8))),
        ("STA_ERR_WINDOW", "window[2]: expected 3 integers, got 2",
         dict(window=[(1, 1, 1), (1, 1)])),
        ("STA_ERR_WINDOW", "window: expected 3 integers or a list of them, one per head ({Kt, "
         "Kh, Kw}, 'KtxKhxKw', 'Kt,Kh,Kw', a list of those, '3,3,3:1,5,7' or '1x1x1,3x3x3'), "
         "got '3x3'", dict(window="3x3")),
        ("STA_ERR_ARGUMENT", "options: unknown key 'windows' (known: canvas, tile, text_len, "
         "order, layout, window, scale, softmax, precision, deterministic, return_lse)",
         dict(windows=(1, 1, 1))),
        ("STA_ERR_ARGUMENT", "window: required ({Kt, Kh, Kw} for every head, or a list of them, "
         "one per head)", dict(window=None)),
    ]
    for name, msg, over in cases:
        args = dict(q=q, k=k, v=v, window=(1, 1, 1), **KW)
        args.update(over)
        raises(sta.ArgumentError, name, msg,
               lambda: sta.attention(args.pop("q"), args.pop("k"), args.pop("v"), **args))


def test_error_classes_by_group():
    from sta.errors import error_class
    assert error_class(101) is sta.ArgumentError and issubclass(sta.ArgumentError, ValueError)
    assert error_class(201) is sta.StateError
    assert error_class(302) is sta.UnsupportedError
    assert error_class(401) is sta.OutOfMemoryError and issubclass(sta.OutOfMemoryError,
                                                                  MemoryError)
    assert error_class(500) is sta.DeviceError
    assert error_class(602) is sta.EnvError and issubclass(sta.EnvError, OSError)
    e = sta.EnvError("STA_ATTENTION_CONFIG is not set", 602, "STA_ERR_ENV")
    back = pickle.loads(pickle.dumps(e))
    assert (str(back), back.status, back.status_name) == (str(e), 602, "STA_ERR_ENV")


def test_failed_call_leaves_no_error_state_behind(qkv):
    q, k, v = qkv
    with pytest.raises(sta.ArgumentError):
        sta.attention(q, k, v, window=(0, 1, 1), **KW)
    out = sta.attention(q, k, v, window=(1, 1, 1), **KW)  # the next call is unaffected
    assert torch.isfinite(out).all()


def test_positional_integers_are_refused_not_wrapped():
    """Integer arguments outside int32 raise ArgumentError naming them
    (ctypes would wrap 2**32 + 1 to 1), wrong types too (never a ctypes or
    TypeError)."""
    s = sta.Strategy.uniform(2, 1, 1, window=(1, 1, 1))
    md = sta.Metadata(1)
    fb = sta.ForwardBatch()
    cases = [
        (lambda: s.get(2 ** 32, 0, 0), "step: expected a 32-bit integer, got 4294967296"),
        (lambda: s.set(0, 2 ** 32 + 1, 0, (1, 1, 1)),
         "layer: expected a 32-bit integer, got 4294967297"),
        (lambda: s.get(0, 0, "0"), "head: expected a 32-bit integer, got '0'"),
        (lambda: s.check(1.5, 1, 1), "steps: expected a 32-bit integer, got 1.5"),
        (lambda: sta.Metadata(-2 ** 31 - 1), "layers: expected a 32-bit integer, got -2147483649"),
        (lambda: md.row(True), "layer: expected a 32-bit integer, got true"),
        (lambda: md.set_row(2 ** 40, [(1, 1, 1)]),
         "layer: expected a 32-bit integer, got 1099511627776"),
        (lambda: sta.Metadata.from_strategy(s, 0, 2 ** 31, 1),
         "layers: expected a 32-bit integer, got 2147483648"),
        (lambda: sta.Metadata.from_strategy("s", 0, 1, 1),
         "strategy: expected a sta.Strategy, got 's'"),
        (lambda: fb.record(2 ** 33, 0, [(1, 1, 1)], [[0.5]], [[0.5]]),
         "step: expected a 32-bit integer, got 8589934592"),
        (lambda: fb.record(0, 0, [(1, 1, 1)], [["x"]], [[0.5]]), "l1: expected numbers, got 'x'"),
        (lambda: sta.Strategy.parse(5), "text: expected JSON as str or bytes, got 5"),
        (lambda: sta.set_num_threads(2 ** 32), "n: expected a 32-bit integer, got 4294967296"),
    ]
    for fn, msg in cases:
        with pytest.raises(sta.ArgumentError) as info:
            fn()
        assert str(info.value) == msg
    assert s.get(1, 0, 0) == (1, 1, 1) and fb.records() == 0
