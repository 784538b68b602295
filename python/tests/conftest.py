"""Fixtures of sta's pytest suite: the package from this checkout, fresh
random seeds.  Helpers live in helpers.py."""
import os
import random
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]  # python/ (the package) before any installed one

torch = pytest.importorskip("torch")


@pytest.fixture
def seed(request):
    """A fresh seed per test, shown when it fails (rerun with STA_TEST_SEED)."""
    s = int(os.environ.get("STA_TEST_SEED") or random.SystemRandom().randrange(1 << 31))
    request.node.user_properties.append(("seed", s))
    print("seed", s)
    return s


@pytest.fixture
def gen(seed):
    return torch.Generator().manual_seed(seed)


@pytest.fixture
def rng(seed):
    return random.Random(seed)
