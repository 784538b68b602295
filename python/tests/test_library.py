"""Finding libsta.so: $STA_LIBRARY, next to the package, a checkout's build
folder, the install prefix; the error lists every place tried."""
import os
import shutil
import subprocess
import sys

import pytest

import sta
from sta import _capi

PKG = os.path.dirname(os.path.abspath(sta.__file__))


def test_sta_library_alone_when_set(monkeypatch):
    monkeypatch.setenv("STA_LIBRARY", "/nowhere/libsta.so")
    assert _capi.candidates() == [("$STA_LIBRARY", "/nowhere/libsta.so")]
    with pytest.raises(sta.LibraryNotFound) as info:
        _capi._load()
    assert "$STA_LIBRARY: /nowhere/libsta.so (no such file)" in str(info.value)
    assert isinstance(info.value, ImportError)


def test_checkout_build_folder(monkeypatch):
    monkeypatch.delenv("STA_LIBRARY", raising=False)
    monkeypatch.setenv("STA_BUILD", "build-x")
    repo = os.path.dirname(os.path.dirname(PKG))
    paths = [p for _, p in _capi.candidates()]
    assert paths[0] == os.path.join(PKG, "libsta.so")
    assert os.path.join(repo, "build-x", "libsta.so") in paths
    assert paths[-1] == "libsta.so"


def test_error_lists_every_place_and_why(monkeypatch, tmp_path):
    text = tmp_path / "libsta.so"
    text.write_text("not a library")
    libm = "libm.so.6"
    monkeypatch.setattr(_capi, "candidates", lambda: [
        ("next to the package", str(tmp_path / "missing" / "libsta.so")),
        ("the install prefix", str(text)),
        ("the dynamic loader's search path", libm)])
    with pytest.raises(sta.LibraryNotFound) as info:
        _capi._load()
    lines = str(info.value).split("\n")
    assert lines[0] == "sta: cannot load libsta.so; looked in:"
    assert lines[1] == "  next to the package: %s (no such file)" % (tmp_path / "missing" /
                                                                    "libsta.so")
    assert lines[2].startswith("  the install prefix: %s (" % text)
    assert lines[3] == "  the dynamic loader's search path: libm.so.6 (not libsta: no " \
                       "sta_attention_forward)"
    assert "STA_LIBRARY" in lines[-1]


def run_installed(tmp_path, next_to_package):
    """The package as make install lays it out under a prefix; returns the
    library path it finds, with STA_LIBRARY unset."""
    prefix = tmp_path / "prefix"
    site = prefix / "lib" / "python3" / "dist-packages"
    shutil.copytree(PKG, site / "sta", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    lib = sta.library_path()
    shutil.copy(lib, prefix / "lib" / "libsta.so")
    if next_to_package:
        shutil.copy(lib, site / "sta" / "libsta.so")
    env = {k: v for k, v in os.environ.items() if k not in ("STA_LIBRARY", "PYTHONPATH")}
    env["PYTHONPATH"] = str(site)
    r = subprocess.run([sys.executable, "-c", "import sta; print(sta.library_path())"],
                       cwd=str(tmp_path), env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip(), prefix, site


def test_install_prefix(tmp_path):
    found, prefix, _ = run_installed(tmp_path, False)
    assert found == str(prefix / "lib" / "libsta.so")


def test_next_to_the_package_first(tmp_path):
    found, _, site = run_installed(tmp_path, True)
    assert found == str(site / "sta" / "libsta.so")


def test_pip_install_offline(tmp_path):
    """pip install ./python with no index (Debian's pip, setuptools, wheel)."""
    if subprocess.run([sys.executable, "-m", "pip", "--version"],
                      capture_output=True).returncode != 0:
        pytest.skip("no pip for %s (Debian: python3-pip)" % sys.executable)
    # setuptools builds wheels with the wheel package, or alone from 70.1 on
    probe = ("import importlib.util as u, setuptools as s; v = tuple(int(x) for x in "
             "s.__version__.split('.')[:2]); assert v >= (70, 1) or u.find_spec('wheel')")
    if subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode != 0:
        pytest.skip("%s has no setuptools that builds wheels offline (Debian: "
                    "python3-setuptools, python3-wheel)" % sys.executable)
    src = tmp_path / "src"
    root = os.path.dirname(PKG)
    shutil.copytree(root, src, ignore=shutil.ignore_patterns(
        "__pycache__", "build", "*.egg-info", "tests", "bench"))
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_FIND_LINKS="", PIP_NO_CACHE_DIR="1",
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    target = tmp_path / "target"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target",
                        str(target), str(src)], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    env = dict(os.environ, PYTHONPATH=str(target), STA_LIBRARY=sta.library_path())
    r = subprocess.run([sys.executable, "-c", "import sta; print(sta.__file__, sta.version())"],
                       cwd=str(tmp_path), env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    file, version = r.stdout.split()
    assert file.startswith(str(target)) and version == sta.__version__
