"""The ctypes mirror of core/sta.h: struct layouts checked against a C helper
compiled with the header, field names and function signatures against the
header's text."""
import ctypes
import os
import re
import shutil
import subprocess

import pytest

from sta import _capi

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def header_path():
    for p in (os.environ.get("STA_HEADER"), os.path.join(REPO, "core", "sta.h"),
              "/usr/local/include/sta.h", "/usr/include/sta.h"):
        if p and os.path.isfile(p):
            return p
    pytest.skip("sta.h not found (set STA_HEADER)")


def declarations():
    text = open(header_path()).read()
    block = text.split("/* STA_DECLS_BEGIN */")[1].split("/* STA_DECLS_END */")[0]
    return re.sub(r"/\*.*?\*/", " ", block, flags=re.S)


def struct_fields(decls, name):
    m = re.search(r"typedef struct %s \{(.*?)\} %s;" % (name, name), decls, re.S)
    assert m, "struct %s not in sta.h" % name
    names = []
    for member in m.group(1).split(";"):
        member = member.strip()
        if not member:
            continue
        ids = re.findall(r"[A-Za-z_]\w*", re.sub(r"\[.*?\]", "", member.split(",")[0]))
        names.append(ids[-1])
        for extra in member.split(",")[1:]:  # int32_t sp_rank, sp_size;
            names.append(re.findall(r"[A-Za-z_]\w*", extra)[0])
    return names


def test_struct_field_names_match_the_header():
    decls = declarations()
    for cname, cls in _capi.STRUCTS.items():
        assert [f[0] for f in cls._fields_] == struct_fields(decls, cname), cname


def test_struct_layouts_match_the_compiler(tmp_path):
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "sta.h"',
             "int main(void) {"]
    for cname, cls in _capi.STRUCTS.items():
        lines.append('  printf("%s sizeof %%zu\\n", sizeof(%s));' % (cname, cname))
        for f in cls._fields_:
            lines.append('  printf("%s %s %%zu %%zu\\n", offsetof(%s, %s), '
                         'sizeof(((%s *)0)->%s));' % (cname, f[0], cname, f[0], cname, f[0]))
    lines += ["  return 0;", "}"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines) + "\n")
    exe = tmp_path / "layout"
    subprocess.run([cc, "-std=c11", "-I", os.path.dirname(header_path()), str(src), "-o",
                    str(exe)], check=True)
    got = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    want = []
    for cname, cls in _capi.STRUCTS.items():
        want.append("%s sizeof %d" % (cname, ctypes.sizeof(cls)))
        for f in cls._fields_:
            d = getattr(cls, f[0])
            want.append("%s %s %d %d" % (cname, f[0], d.offset, d.size))
    assert got.split("\n")[:-1] == want


def c_kind(ctype):
    """(pointer) or (bytes, float) of a C type as sta.h spells it."""
    ctype = ctype.strip()
    if "*" in ctype or "[" in ctype:
        return "pointer"
    base = ctype.replace("const ", "").split()[0]
    sizes = {"int32_t": (4, False), "int64_t": (8, False), "uint64_t": (8, False),
             "size_t": (8, False), "float": (4, True), "double": (8, True),
             "uint32_t": (4, False), "void": None}
    if base in sizes:
        return sizes[base]
    if base in ("sta_status", "sta_dtype", "sta_device", "sta_layout", "sta_softmax",
                "sta_precision"):
        return (4, False)
    if base == "sta_rank_fn":
        return "pointer"
    raise AssertionError("unknown C type %r" % ctype)


def py_kind(t):
    if t is None:
        return None
    if t in (ctypes.c_void_p, ctypes.c_char_p) or issubclass(t, ctypes._Pointer):
        return "pointer"
    return (ctypes.sizeof(t), t in (ctypes.c_float, ctypes.c_double))


def prototypes(decls):
    protos = {}
    for stmt in decls.split(";"):
        stmt = " ".join(stmt.split())
        m = re.match(r"^(?:.*\})?\s*([\w\s\*]+?)\s*\b(sta_\w+)\s*\((.*)\)$", stmt)
        if not m or stmt.startswith("typedef") or "(*" in stmt:
            continue
        ret, name, args = m.groups()
        args = [] if args.strip() == "void" else [a for a in args.split(",")]
        protos[name] = (ret, args)
    return protos


def test_function_declarations_match_the_header():
    protos = prototypes(declarations())
    assert len(protos) > 100
    for name, (res, args) in _capi.FUNCS.items():
        assert name in protos, "%s is not declared in sta.h" % name
        ret, cargs = protos[name]
        assert py_kind(res) == c_kind(ret), name
        assert len(args) == len(cargs), name
        for i, (a, c) in enumerate(zip(args, cargs)):
            # a parameter is its type and a name; arrays are pointers
            ctype = c if "*" in c or "[" in c else c.strip().rsplit(" ", 1)[0]
            assert py_kind(a) == c_kind(ctype), "%s argument %d" % (name, i)


def test_every_declared_function_is_in_the_library():
    lib = _capi.lib()  # raises LibraryNotFound naming a missing one
    for name in _capi.FUNCS:
        assert callable(getattr(lib, name)), name
