"""python/build_backend.py, the in-tree PEP 517 backend (standard library
only): the wheel it writes (the package, the checkout's libsta.so, metadata,
a RECORD that verifies), the sdist, the editable wheel, its refusal without
a library, and the licence the metadata names.  The pip installs into fresh
venvs are scripts/test/first-use's (.ci/run)."""
import base64
import hashlib
import importlib.util
import os
import re
import tarfile
import zipfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.dirname(HERE)
REPO = os.path.dirname(PYDIR)


def load_backend(path=os.path.join(PYDIR, "build_backend.py"), name="sta_build_backend"):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


bb = load_backend()


@pytest.fixture
def libsta(monkeypatch):
    """The library the checkout built, named the way pip's -C libsta= does."""
    path = os.environ.get("STA_LIBRARY") or os.path.join(
        REPO, os.environ.get("STA_BUILD") or os.environ.get("BUILD") or "build", "libsta.so")
    if not os.path.isfile(path):
        pytest.skip("no libsta.so built (make lib)")
    monkeypatch.delenv("STA_LIBRARY", raising=False)
    return path


def read_zip(path):
    with zipfile.ZipFile(path) as z:
        return {i.filename: (z.read(i), i.external_attr >> 16) for i in z.infolist()}


def check_record(files):
    """Every entry is in RECORD with its sha256 and size, RECORD itself without."""
    record = [n for n in files if n.endswith(".dist-info/RECORD")]
    assert len(record) == 1
    rows = [r.rsplit(",", 2) for r in files[record[0]][0].decode().splitlines()]
    assert sorted(r[0] for r in rows) == sorted(files)
    for name, digest, size in rows:
        if name == record[0]:
            assert (digest, size) == ("", "")
            continue
        data = files[name][0]
        want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert digest == "sha256=" + want, name
        assert int(size) == len(data), name


def test_toml_reader_matches_tomllib():
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(PYDIR, "pyproject.toml")) as f:
        text = f.read()
    assert bb.parse_toml(text) == tomllib.loads(text)
    sample = ('# c\n[a]\nx = "1 # not a comment"  # one\ny = [\n  "p",  # q\n  "r",\n]\n'
              'z = {text = "MIT"}\nflag = true\nn = -3\n[a.b-c]\nw = []\n')
    assert bb.parse_toml(sample) == tomllib.loads(sample)


def test_wheel_holds_package_library_and_metadata(tmp_path, libsta):
    name = bb.build_wheel(str(tmp_path), {"libsta": libsta})
    m = re.match(r"^sta_attention-(\d+\.\d+\.\d+)-py3-none-(\w+)\.whl$", name)
    assert m, name
    files = read_zip(tmp_path / name)
    check_record(files)
    pkg = sorted(n for n in os.listdir(os.path.join(PYDIR, "sta")) if n.endswith(".py"))
    assert sorted(n[4:] for n in files if n.startswith("sta/") and n.endswith(".py")) == pkg
    with open(libsta, "rb") as f:
        assert files["sta/libsta.so"][0] == f.read()
    assert files["sta/libsta.so"][1] & 0o111  # executable, as shared libraries are
    info = "sta_attention-%s.dist-info/" % m.group(1)
    meta = files[info + "METADATA"][0].decode()
    import sta
    assert m.group(1) == sta.__version__
    for line in ("Name: sta-attention", "Version: " + sta.__version__, "License: MIT",
                 "License-File: LICENSE", "Requires-Python: >=3.9",
                 'Requires-Dist: torch; extra == "torch"'):
        assert line + "\n" in meta, line
    with open(os.path.join(PYDIR, "README.md"), encoding="utf-8") as f:
        assert meta.endswith("\n\n" + f.read())  # the README is the description
    wheel = files[info + "WHEEL"][0].decode()
    assert "Root-Is-Purelib: false\n" in wheel and "Tag: py3-none-%s\n" % m.group(2) in wheel
    assert files[info + "top_level.txt"][0] == b"sta\n"
    with open(os.path.join(REPO, "LICENSE"), "rb") as f:
        assert files[info + "LICENSE"][0] == f.read()
    # prepare_metadata_for_build_wheel (pip asks first) writes the same METADATA
    d = bb.prepare_metadata_for_build_wheel(str(tmp_path / "md"))
    assert (tmp_path / "md" / d / "METADATA").read_text() == meta


def test_no_library_fails_saying_what_to_do(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("STA_LIBRARY", raising=False)
    missing = str(tmp_path / "nowhere" / "libsta.so")
    with pytest.raises(SystemExit):
        bb.build_wheel(str(tmp_path), {"libsta": missing})
    err = capsys.readouterr().err
    assert "sta-attention: no libsta.so to put in the wheel; looked in:\n" \
           "  config setting libsta: %s (no such file)\n" % missing in err
    assert "make" in err and "-C libsta=" in err
    assert not list(tmp_path.glob("*.whl*"))  # nothing half-written
    text = tmp_path / "libsta.so"
    text.write_text("not a library")
    monkeypatch.setenv("STA_LIBRARY", str(text))
    with pytest.raises(SystemExit):
        bb.build_wheel(str(tmp_path))
    assert "$STA_LIBRARY: %s (not a shared library)" % text in capsys.readouterr().err


def test_sdist_builds_the_same_wheel(tmp_path, libsta, monkeypatch):
    name = bb.build_sdist(str(tmp_path), {"libsta": libsta})
    assert re.match(r"^sta_attention-[\d.]+\.tar\.gz$", name)
    with tarfile.open(tmp_path / name) as tar:
        names = tar.getnames()
        tar.extractall(tmp_path / "x")
    base = name[:-len(".tar.gz")]
    for n in ("PKG-INFO", "pyproject.toml", "build_backend.py", "README.md", "LICENSE",
              "sta/__init__.py", "libsta.so"):
        assert base + "/" + n in names, n
    # the unpacked sdist is not in a checkout: its own libsta.so goes in the wheel
    sdist_bb = load_backend(str(tmp_path / "x" / base / "build_backend.py"), "sdist_backend")
    monkeypatch.setenv("STA_BUILD", "no-such-build")
    whl = sdist_bb.build_wheel(str(tmp_path / "w"))
    files = read_zip(tmp_path / "w" / whl)
    check_record(files)
    with open(libsta, "rb") as f:
        assert files["sta/libsta.so"][0] == f.read()


def test_editable_wheel_points_at_the_checkout(tmp_path):
    name = bb.build_editable(str(tmp_path))
    files = read_zip(tmp_path / name)
    check_record(files)
    assert files["__editable__.sta_attention.pth"][0].decode().strip() == PYDIR


def test_licence_agrees_everywhere():
    with open(os.path.join(REPO, "sta-0.1.0-1.rockspec")) as f:
        rock = re.search(r'license = "([^"]+)"', f.read()).group(1)
    with open(os.path.join(REPO, "LICENSE")) as f:
        first = f.readline().strip()
    assert first == "%s License" % rock
    assert bb.project()["license"] == {"text": rock}
    assert "License :: OSI Approved :: %s License" % rock in bb.project()["classifiers"]
    assert bb.project()["name"] != "sta"  # the name sta on PyPI is another project's
