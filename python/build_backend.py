"""PEP 517 / PEP 660 build backend of the sta-attention distribution, in the
standard library alone: no setuptools, no wheel, no network, any CPython >= 3.9.

The wheel holds the package (sta/*.py) and the libsta.so that `make` built
in this checkout (with the CUDA kernels when make had nvcc), as sta/libsta.so,
where the package looks first: `import sta` then needs no environment
variable.  Without a library the build fails and says how to make one; a
wheel without its library would only fail later, at the first call.

The library is taken from, in order:
  1. pip's config setting libsta (pip wheel ./python -C libsta=/path/to/libsta.so);
  2. $STA_LIBRARY (the variable the package itself honours);
  3. libsta.so beside this file (an unpacked sdist of ours carries one);
  4. the checkout's build folder: ../$STA_BUILD (or $BUILD, else build)/libsta.so.

Metadata comes from pyproject.toml's [project] table (read with tomllib,
or on Python < 3.11 with the small reader below, which knows just the TOML
that file uses), the version from sta/__init__.py, the licence from the
repository's LICENSE.

The wheel is tagged py3-none-<platform>: pure Python over a native library
(ctypes, no CPython extension), so one wheel serves every CPython 3 of the
machine it was built on.  libsta.so links the system's libcjson, libopenblas
and libgomp dynamically: the wheel is for machines that have those (Debian:
libcjson1, libopenblas0, libgomp1), not a manylinux wheel.

The sdist carries the package, this backend, pyproject.toml, README.md,
LICENSE and the library it found (so that a wheel built from the sdist is
the one built from the checkout); sta's C sources are not in it: build them
with make in the repository.
"""
import base64
import hashlib
import io
import os
import re
import stat
import sys
import sysconfig
import tarfile
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
GENERATOR = "sta build_backend"


class BuildError(Exception):
    """A build that cannot go on; the message says what to do."""


def _fail(msg):
    # pip shows the hook's stderr; a one-paragraph message, not a traceback
    sys.stderr.write("\n" + msg + "\n\n")
    raise SystemExit(1)


# ---- pyproject.toml ---------------------------------------------------------------
def _toml_value(text, where):
    """One value of the TOML subset pyproject.toml uses: strings, booleans,
    integers, arrays of those, inline tables of strings."""
    text = text.strip()
    if text.startswith('"'):
        m = re.match(r'"((?:[^"\\]|\\.)*)"\s*$', text)
        if not m:
            raise BuildError("pyproject.toml: cannot read %s = %s" % (where, text))
        return m.group(1).encode().decode("unicode_escape")
    if text.startswith("["):
        inner = text[1:-1] if text.endswith("]") else None
        if inner is None:
            raise BuildError("pyproject.toml: cannot read %s = %s" % (where, text))
        items = re.findall(r'"(?:[^"\\]|\\.)*"', inner)
        return [_toml_value(i, where) for i in items]
    if text.startswith("{"):
        out = {}
        for k, v in re.findall(r'([\w-]+)\s*=\s*("(?:[^"\\]|\\.)*")', text):
            out[k] = _toml_value(v, where)
        return out
    if text in ("true", "false"):
        return text == "true"
    if re.match(r"^-?\d+$", text):
        return int(text)
    raise BuildError("pyproject.toml: cannot read %s = %s" % (where, text))


def _strip_comment(line):
    out, in_str = [], False
    for i, ch in enumerate(line):
        if ch == '"' and (i == 0 or line[i - 1] != "\\"):
            in_str = not in_str
        if ch == "#" and not in_str:
            break
        out.append(ch)
    return "".join(out).rstrip()


def parse_toml(text):
    """A reader for the TOML that pyproject.toml uses (tables, dotted table
    headers, key = value, arrays over several lines); tomllib when present."""
    doc, table, pending, key = {}, None, None, None
    table = doc
    for raw in text.splitlines():
        line = _strip_comment(raw).strip()
        if pending is not None:
            pending += " " + line
            if pending.count("[") == pending.count("]"):
                table[key] = _toml_value(pending, key)
                pending = None
            continue
        if not line:
            continue
        m = re.match(r"^\[([\w.-]+)\]$", line)
        if m:
            table = doc
            for part in m.group(1).split("."):
                table = table.setdefault(part, {})
            continue
        m = re.match(r'^("?)([\w.-]+)\1\s*=\s*(.*)$', line)
        if not m:
            raise BuildError("pyproject.toml: cannot read the line %r" % raw)
        key, value = m.group(2), m.group(3)
        if value.startswith("[") and value.count("[") != value.count("]"):
            pending = value
            continue
        table[key] = _toml_value(value, key)
    return doc


def read_pyproject(path=None):
    path = path or os.path.join(HERE, "pyproject.toml")
    with open(path, "rb") as f:
        data = f.read()
    try:
        import tomllib
    except ImportError:
        return parse_toml(data.decode("utf-8"))
    return tomllib.loads(data.decode("utf-8"))


# ---- metadata ---------------------------------------------------------------------
def version():
    with open(os.path.join(HERE, "sta", "__init__.py"), encoding="utf-8") as f:
        m = re.search(r'^__version__\s*=\s*"([^"]+)"', f.read(), re.M)
    if not m:
        raise BuildError("sta/__init__.py: no __version__ = \"...\" line")
    return m.group(1)


def project():
    p = read_pyproject()["project"]
    p = dict(p)
    if "version" in p.get("dynamic", []):
        p["version"] = version()
    return p


def dist_name(p):
    """The distribution name as wheel and sdist file names spell it."""
    return re.sub(r"[-_.]+", "_", p["name"]).lower()


def license_file():
    for d in (REPO, HERE):
        path = os.path.join(d, "LICENSE")
        if os.path.isfile(path):
            return path
    return None


def readme_text(p):
    readme = p.get("readme")
    if not readme:
        return None
    with open(os.path.join(HERE, readme), encoding="utf-8") as f:
        return f.read()


def metadata_text(p):
    lines = ["Metadata-Version: 2.1", "Name: %s" % p["name"], "Version: %s" % p["version"]]
    if p.get("description"):
        lines.append("Summary: %s" % p["description"])
    lic = p.get("license")
    if isinstance(lic, dict) and lic.get("text"):
        lines.append("License: %s" % lic["text"])
    elif isinstance(lic, str):
        lines.append("License: %s" % lic)
    if license_file():
        lines.append("License-File: LICENSE")
    for url_name, url in sorted(p.get("urls", {}).items()):
        lines.append("Project-URL: %s, %s" % (url_name, url))
    for c in p.get("classifiers", []):
        lines.append("Classifier: %s" % c)
    if p.get("requires-python"):
        lines.append("Requires-Python: %s" % p["requires-python"])
    for dep in p.get("dependencies", []):
        lines.append("Requires-Dist: %s" % dep)
    for extra, deps in sorted(p.get("optional-dependencies", {}).items()):
        lines.append("Provides-Extra: %s" % extra)
        for dep in deps:
            lines.append('Requires-Dist: %s; extra == "%s"' % (dep, extra))
    body = readme_text(p)
    if body is not None:
        lines.append("Description-Content-Type: text/markdown")
    text = "\n".join(lines) + "\n"
    if body is not None:
        text += "\n" + body
    return text


def _platform_tag():
    return re.sub(r"[-.]", "_", sysconfig.get_platform())


# ---- the library ------------------------------------------------------------------
def library(config_settings=None):
    """(path, where) of the libsta.so to pack; fails with what to do."""
    tried = []
    cfg = (config_settings or {}).get("libsta")
    cands = []
    if cfg:
        cands.append(("config setting libsta", cfg))
    if os.environ.get("STA_LIBRARY"):
        cands.append(("$STA_LIBRARY", os.environ["STA_LIBRARY"]))
    cands.append(("beside the build backend (an sdist)", os.path.join(HERE, "libsta.so")))
    checkout = os.path.isfile(os.path.join(REPO, "core", "sta.h"))
    build = os.environ.get("STA_BUILD") or os.environ.get("BUILD") or "build"
    if checkout:
        cands.append(("the checkout's build folder", os.path.join(REPO, build, "libsta.so")))
    for where, path in cands:
        path = os.path.abspath(path)
        if not os.path.isfile(path):
            tried.append("  %s: %s (no such file)" % (where, path))
            if where.startswith(("config", "$")):
                break  # asked for this one: no silent fallback
            continue
        with open(path, "rb") as f:
            head = f.read(4)
        if head != b"\x7fELF":
            tried.append("  %s: %s (not a shared library)" % (where, path))
            break
        return path, where
    how = ("Build it first, in the repository: make (or make lib), then pip install ./python again."
           if checkout else
           "This folder is not inside an sta checkout: build sta there (make) and install from it.")
    _fail("sta-attention: no libsta.so to put in the wheel; looked in:\n" + "\n".join(tried) +
          "\n" + how + "\nOr name one: pip install ./python -C libsta=/path/to/libsta.so "
          "(or STA_LIBRARY=/path/to/libsta.so).")


def describe_library(path):
    with open(path, "rb") as f:
        data = f.read()
    if b"sta_attention_forward" not in data:
        _fail("sta-attention: %s is not libsta (no sta_attention_forward)" % path)
    cuda = b"__cudaRegisterFatBinary" in data
    return len(data), cuda


def stale_sources(path):
    """Sources of the checkout newer than the library (make would rebuild it)."""
    if not os.path.isfile(os.path.join(REPO, "core", "sta.h")):
        return []
    t = os.path.getmtime(path)
    out = []
    for d in ("core", "kernels"):
        full = os.path.join(REPO, d)
        for name in sorted(os.listdir(full)) if os.path.isdir(full) else []:
            if name.endswith((".c", ".h", ".cu", ".cuh")) and \
                    os.path.getmtime(os.path.join(full, name)) > t:
                out.append("%s/%s" % (d, name))
    return out


def _say(msg):
    sys.stderr.write("sta-attention: " + msg + "\n")


# ---- archives ---------------------------------------------------------------------
def _epoch():
    return max(int(os.environ.get("SOURCE_DATE_EPOCH", "315532800")), 315532800)


def _package_files():
    pkg = os.path.join(HERE, "sta")
    return [("sta/" + n, os.path.join(pkg, n)) for n in sorted(os.listdir(pkg))
            if n.endswith(".py")]


def _record_hash(data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "sha256=" + digest


class _Wheel:
    def __init__(self, path):
        self.zip = zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED)
        self.records = []
        self.when = time.gmtime(_epoch())[:6]

    def add(self, arcname, data, executable=False):
        info = zipfile.ZipInfo(arcname, self.when)
        info.external_attr = ((0o755 if executable else 0o644) | stat.S_IFREG) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        self.zip.writestr(info, data)
        self.records.append("%s,%s,%d" % (arcname, _record_hash(data), len(data)))

    def close(self, record_name):
        self.records.append("%s,," % record_name)
        info = zipfile.ZipInfo(record_name, self.when)
        info.external_attr = (0o644 | stat.S_IFREG) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        self.zip.writestr(info, "\n".join(self.records) + "\n")
        self.zip.close()


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _dist_info_files(p, tag, editable=False):
    """{name: bytes} of the .dist-info folder (RECORD aside)."""
    files = {
        "METADATA": metadata_text(p).encode("utf-8"),
        "WHEEL": ("Wheel-Version: 1.0\nGenerator: %s\nRoot-Is-Purelib: %s\nTag: %s\n"
                  % (GENERATOR, "true" if editable else "false", tag)).encode(),
        "top_level.txt": b"sta\n",
    }
    lic = license_file()
    if lic:
        files["LICENSE"] = _read(lic)
    return files


def _write_wheel(wheel_directory, p, tag, members, editable=False):
    name = "%s-%s" % (dist_name(p), p["version"])
    filename = "%s-%s.whl" % (name, tag)
    os.makedirs(wheel_directory, exist_ok=True)
    path = os.path.join(wheel_directory, filename)
    tmp = path + ".part"
    w = _Wheel(tmp)
    try:
        for arcname, data, executable in members:
            w.add(arcname, data, executable)
        dist_info = name + ".dist-info"
        for fname, data in sorted(_dist_info_files(p, tag, editable).items()):
            w.add("%s/%s" % (dist_info, fname), data)
        w.close(dist_info + "/RECORD")
        os.replace(tmp, path)
    except BaseException:
        w.zip.close()
        raise
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return filename


# ---- PEP 517 hooks ----------------------------------------------------------------
def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def _prepare_metadata(metadata_directory, editable):
    p = project()
    tag = "py3-none-any" if editable else "py3-none-" + _platform_tag()
    dist_info = "%s-%s.dist-info" % (dist_name(p), p["version"])
    out = os.path.join(metadata_directory, dist_info)
    os.makedirs(out, exist_ok=True)
    for fname, data in _dist_info_files(p, tag, editable).items():
        with open(os.path.join(out, fname), "wb") as f:
            f.write(data)
    return dist_info


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    return _prepare_metadata(metadata_directory, False)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    return _prepare_metadata(metadata_directory, True)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    p = project()
    lib, where = library(config_settings)
    size, cuda = describe_library(lib)
    _say("packing %s (%s, %.1f MB, %s)" % (lib, where, size / 1e6,
         "with the CUDA kernels" if cuda else "CPU only: built without nvcc"))
    stale = stale_sources(lib)
    if stale:
        _say("warning: %s is older than %s%s: run make to rebuild it"
             % (lib, ", ".join(stale[:3]), " and %d more" % (len(stale) - 3) if len(stale) > 3 else ""))
    members = [(arc, _read(src), False) for arc, src in _package_files()]
    members.append(("sta/libsta.so", _read(lib), True))
    return _write_wheel(wheel_directory, p, "py3-none-" + _platform_tag(), members)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """An editable install: a .pth naming this folder; the package then finds
    the library in the checkout's build folder (or $STA_LIBRARY)."""
    p = project()
    pth = ("%s\n" % HERE).encode()
    return _write_wheel(wheel_directory, p, "py3-none-any",
                        [("__editable__.%s.pth" % dist_name(p), pth, False)], editable=True)


def build_sdist(sdist_directory, config_settings=None):
    p = project()
    lib, _ = library(config_settings)
    describe_library(lib)
    base = "%s-%s" % (dist_name(p), p["version"])
    filename = base + ".tar.gz"
    members = [("PKG-INFO", metadata_text(p).encode("utf-8"), False)]
    for n in ("pyproject.toml", "build_backend.py", "README.md"):
        members.append((n, _read(os.path.join(HERE, n)), False))
    if license_file():
        members.append(("LICENSE", _read(license_file()), False))
    members += [(arc, _read(src), False) for arc, src in _package_files()]
    members.append(("libsta.so", _read(lib), True))
    os.makedirs(sdist_directory, exist_ok=True)
    path = os.path.join(sdist_directory, filename)
    tmp = path + ".part"
    try:
        with tarfile.open(tmp, "w:gz", format=tarfile.PAX_FORMAT) as tar:
            for arcname, data, executable in members:
                info = tarfile.TarInfo("%s/%s" % (base, arcname))
                info.size, info.mtime = len(data), _epoch()
                info.mode = 0o755 if executable else 0o644
                tar.addfile(info, io.BytesIO(data))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return filename
