"""README.md's CPU snippet (section "From PyTorch") runs as written, with the
torch this interpreter has (make test's: Debian's 1.13)."""
import os
import re

import torch

import sta

README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "README.md")


def test_readme_cpu_snippet_runs_as_written(seed):
    with open(README, encoding="utf-8") as f:
        text = f.read()
    section = text[text.index("## From PyTorch"):text.index("On a Hopper GPU")]
    code = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(code) == 1, "one CPU snippet before the GPU one"
    assert "cuda" not in code[0]
    torch.manual_seed(seed)
    env = {}
    exec(compile(code[0], "README.md (From PyTorch, CPU)", "exec"), env)
    q, k, v, out, lse = (env[n] for n in ("q", "k", "v", "out", "lse"))
    assert q.device.type == "cpu" and q.dtype == torch.float32
    assert out.shape == q.shape and lse.shape == (q.shape[0], q.shape[2], q.shape[1])
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))
    assert all(t.grad.abs().max() > 0 for t in (q, k, v))
    # the gradients are the first call's (the CPU backward is deterministic);
    # the op's agreement with the reference is test_autograd's
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    sta.attention(*leaves, canvas=(12, 16, 16), window=(1, 1, 1)).square().mean().backward()
    for t, u in zip((q, k, v), leaves):
        assert torch.equal(t.grad, u.grad)


def test_readme_vsa_snippet_runs_as_written(seed):
    """The Python snippet of "Video Sparse Attention" runs on the CPU: the
    gradients reach q, k, v and the gate, and the cube order round-trips."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    section = text[text.index("## Video Sparse Attention"):text.index("## Sequence parallelism")]
    code = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(code) == 1
    torch.manual_seed(seed)
    env = {}
    exec(compile(code[0], "README.md (Video Sparse Attention)", "exec"), env)
    q, k, v, gate, out, tokens, x = (env[n] for n in ("q", "k", "v", "gate", "out", "tokens", "x"))
    assert out.shape == q.shape and tokens.shape == x[0].shape
    assert all(t.grad is not None and t.grad.abs().max() > 0 for t in (q, k, v, gate))
    assert torch.equal(sta.from_cubes(q.detach(), canvas=(8, 12, 16)), x[0])
