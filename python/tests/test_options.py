"""The generated binding tests: every case spec/option_cases.lua draws from
the option schema (lua/sta/options.lua) -- every option of every call x
missing, wrong type, out of range, boundary -- through sta's Python calls,
with the schema's exact message (the Lua module and the LuaJIT FFI run the
same cases: spec/options_spec.lua, spec/ffi_spec.lua).  Every refusal is an
sta.ArgumentError, never a TypeError, KeyError or ctypes error."""
import re

import pytest
import torch

import sta
from helpers import randn
from option_cases import CASES, PROBLEM

from sta import _args


@pytest.fixture
def run(gen):
    P = PROBLEM
    shape = (1, P["S"], P["heads"], P["D"])
    q, k, v, dout = (randn(shape, gen) for _ in range(4))
    f8 = [t.to(torch.float8_e4m3fn) if hasattr(torch, "float8_e4m3fn") else
          torch.randint(0, 100, shape, dtype=torch.uint8) for t in (q, k, v)]
    rs = torch.full((1, P["heads"], P["S"]), 0.5)
    cs = torch.full((1, P["heads"], P["D"]), 0.5)

    def context(**o):
        sta.forward_context(**o)

    cshape = (1, P["vsa_rows"], P["heads"], P["D"])  # the cube order of the vsa base's canvas
    qc, kc, vc, dc = (randn(cshape, gen) for _ in range(4))
    x = randn((1, 2 * 4 * 4, P["heads"], P["D"]), gen)
    idx = P["block_idx"]  # Python takes the lists positionally

    return {
        "block_sparse": lambda **o: sta.block_sparse_attention(q, k, v, idx, None, **o),
        "vsa": lambda **o: sta.vsa(qc, kc, vc, **o),
        "vsa_reference": lambda **o: sta.vsa_reference(qc, kc, vc, **o),
        "vsa_backward_reference": lambda **o: sta.vsa_backward_reference(qc, kc, vc, dc, **o),
        "vsa_coarse": lambda **o: sta.vsa_coarse(qc, kc, vc, **o),
        "cubes": lambda **o: sta.to_cubes(x, **o),
        "cube_sizes": lambda **o: sta.cube_sizes(**o),
        "attention": lambda **o: sta.attention(q, k, v, **o),
        "reference": lambda **o: sta.reference(q, k, v, **o),
        "attention_backward": lambda **o: sta.reference_backward(q, k, v, dout, **o),
        "attention_fp8": lambda **o: sta.attention_fp8(*f8, rs, rs, cs, **o),
        "layer": lambda **o: sta.Layer(**o),
        "forward_batch": lambda **o: sta.ForwardBatch(**o),
        "forward_context": context,
        "uniform": lambda **o: sta.Strategy.uniform(**o),
        "tune": lambda **o: sta.tune(**o),
    }


def schema_error(option, msg):
    """Whether msg is one the schema gives about option (option_cases.agrees)."""
    if msg.startswith("options: "):
        return True
    m = re.match(r"^%s[\[\]\d]*: (.*)$" % re.escape(option), msg)
    if not m:
        return False
    rest = m.group(1)
    if rest.startswith("required (") or rest.startswith("given "):
        return True
    d = _args.OPTIONS.get(option, {"kind": "enum", "values": ()})
    return any(rest.startswith("expected " + p) for p in
               (_args.expected(d), "3 integers", "a 32-bit integer", "a 64-bit integer"))


def test_every_generated_case(run):
    n = refused = ran = 0
    for call, option, what, value, opts, expect in CASES:
        try:
            run[call](**opts)
            msg = None
        except sta.Error as e:
            msg = str(e)
            if expect is not None:
                assert isinstance(e, sta.ArgumentError), (call, option, what, value, msg)
        where = (call, option, what, value)
        if expect is not None:
            assert msg == expect, where
            refused += 1
        else:
            assert msg is None or not schema_error(option, msg), (where, msg)
            ran += msg is None
        n += 1
    assert n > 400 and refused > 300 and ran > 50, (n, refused, ran)


def test_the_schema_copy_is_what_python_checks():
    """Every call's known options are the schema's (Python's share), every
    enum maps to sta.h's numbers in order."""
    for call in _args.CALLS:
        names = _args._known(call)[0]
        assert all(n in _args.OPTIONS for n in names)
    assert _args.enum("layout", "bhsd") == sta._capi.STA_BHSD
    assert _args.enum("order", "tiled") == sta._capi.STA_ORDER_TILED
    assert _args.enum("precision", "fp8") == sta._capi.STA_PRECISION_FP8
    assert _args.enum("device", "cuda") == sta._capi.STA_CUDA
    assert _args.enum("softmax", None) == 0


def test_checks_never_depend_on_earlier_calls(gen):
    """The eager cache of checked arguments is type-exact: a value equal to
    a cached good one but of another type is still refused."""
    P = PROBLEM
    q, k, v = (randn((1, P["S"], P["heads"], P["D"]), gen) for _ in range(3))
    kw = dict(canvas=P["canvas"], tile=P["tile"])
    sta.attention(q, k, v, window=(1, 1, 1), text_len=2, **kw)
    for bad, msg in [(dict(window=(True, 1, 1)), "window[1]: expected a 32-bit integer, got true"),
                     (dict(window=(1.0, 1, 1)), "window[1]: expected a 32-bit integer, got 1"),
                     (dict(window=(1, 1, 1), text_len=2.0),
                      "text_len: expected a 64-bit integer >= 0, got 2"),
                     (dict(window=(1, 1, 1), deterministic=0),
                      "deterministic: expected a boolean, got 0")]:
        with pytest.raises(sta.ArgumentError) as info:
            sta.attention(q, k, v, **bad, **kw)
        assert str(info.value) == msg
    sta.attention(q, k, v, window=(1, 1, 1), text_len=2, **kw)  # still good


def test_spellings_of_triples_and_windows(gen):
    """Both spellings: 'TxHxW' and 'T,H,W'; '3,3,3:1,5,7' and '1x1x1,3x3x3'."""
    P = PROBLEM
    q, k, v = (randn((1, P["S"], P["heads"], P["D"]), gen) for _ in range(3))
    want = sta.attention(q, k, v, canvas=(2, 4, 4), tile=(1, 2, 2), window=[(1, 1, 1), (1, 3, 1)])
    for canvas in ("2x4x4", "2,4,4", "2X4X4", [2, 4, 4]):
        for window in ("1,1,1:1,3,1", "1x1x1,1x3x1", ["1x1x1", "1,3,1"]):
            got = sta.attention(q, k, v, canvas=canvas, tile="1,2,2", window=window)
            assert torch.equal(got, want)
