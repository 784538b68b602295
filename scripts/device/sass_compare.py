#!/usr/bin/env python3
"""sass_compare.py -- the kernels of CUDA libraries side by side, for checking
that a restructuring left the machine code alone.

  sass_compare.py [--elf] LIB [LIB ...]      (the first is the reference)

LIB: a shared library or executable holding CUDA code (its .nv_fatbin), or a
.cubin.  Each kernel's code comes from `cuobjdump -sass` (function headers
`Function : NAME`, `Function NAME:` or nvdisasm's `.text.NAME:`, names
mangled or demangled) or, where cuobjdump is missing, prints no function
for a library, or --elf is given, from the machine code itself: the
.text.NAME section of every cubin in the library (zstd-packed cubins
unpacked through python's zstandard or the system's libzstd).  Forward
kernels are matched across libraries by (dtype, head dim, shape,
persistent), whatever their name in that build (sta_fwd_ws / sta_fwd_b192
in the single-file kernels, sta::sta_fwd<FwdTraits> since the traits);
every other kernel by its demangled name (the anonymous namespace's
per-file tag dropped; names are demangled here, no c++filt needed).
"identical": the same instructions, addresses and register numbers
included (SASS), or the same bytes (ELF).  Per library, each kernel's
instruction count (from SASS also a few opcode counts); per comparison a
line "-- LIB, forward kernels: N identical, N differ, ...".
"""
import collections
import ctypes
import ctypes.util
import re
import shutil
import struct
import subprocess
import sys

# ---- names ------------------------------------------------------------------

BUILTIN = {"v": "void", "b": "bool", "c": "char", "a": "signed char", "h": "unsigned char",
           "s": "short", "t": "unsigned short", "i": "int", "j": "unsigned int", "l": "long",
           "m": "unsigned long", "x": "long long", "y": "unsigned long long", "f": "float",
           "d": "double"}
LITERAL_SUFFIX = {"int": "", "unsigned int": "u", "long": "l", "unsigned long": "ul",
                  "long long": "ll", "unsigned long long": "ull"}


class Mangled:
    """The name part of an Itanium-mangled symbol (namespaces, classes,
    template arguments: what kernel names use), as c++filt prints it."""

    def __init__(self, s):
        self.s, self.i, self.subs = s, 0, []

    def peek(self):
        return self.s[self.i] if self.i < len(self.s) else ""

    def take(self, n=1):
        if self.i + n > len(self.s):
            raise ValueError("truncated")
        r = self.s[self.i:self.i + n]
        self.i += n
        return r

    def source_name(self):
        m = re.match(r"\d+", self.s[self.i:])
        if not m:
            raise ValueError("name expected at %d" % self.i)
        self.i += len(m.group(0))
        name = self.take(int(m.group(0)))
        return "(anonymous namespace)" if name.startswith("_GLOBAL__N") else name

    def substitution(self):
        self.take()  # S
        if self.peek() == "t":
            self.take()
            return "std"
        seq = ""
        while self.peek() != "_":
            seq += self.take()
        self.take()
        k = 0 if seq == "" else int(seq, 36) + 1
        if k >= len(self.subs):
            raise ValueError("substitution S%s_ unknown" % seq)
        return self.subs[k]

    def template_args(self):
        self.take()  # I
        args = []
        while self.peek() != "E":
            args.append(self.template_arg())
        self.take()
        return "<" + ", ".join(args) + ">"

    def template_arg(self):
        if self.peek() != "L":
            return self.type_()
        self.take()
        t = self.type_()
        neg = self.peek() == "n"
        if neg:
            self.take()
        m = re.match(r"\d+", self.s[self.i:])
        if not m:
            raise ValueError("literal expected at %d" % self.i)
        self.i += len(m.group(0))
        self.take()  # E
        if t == "bool":
            return "true" if m.group(0) == "1" else "false"
        return ("-" if neg else "") + m.group(0) + LITERAL_SUFFIX.get(t, "")

    def type_(self):
        c = self.peek()
        if c in BUILTIN:
            self.take()
            return BUILTIN[c]
        if c in "KPR":
            self.take()
            t = self.type_()
            r = t + (" const" if c == "K" else "*" if c == "P" else "&")
            self.subs.append(r)
            return r
        return self.name(is_type=True)

    def name(self, is_type=False):
        """A nested (N...E) or unscoped name; each new prefix, template
        name and type is a substitution candidate, in order."""
        if self.peek() != "N":
            fresh = self.peek() != "S"
            out = self.substitution() if not fresh else self.source_name()
            if self.peek() == "I":
                if fresh:
                    self.subs.append(out)
                out += self.template_args()
                fresh = True
            if is_type and fresh:
                self.subs.append(out)
            return out
        self.take()
        while self.peek() in ("K", "V", "r"):  # cv-qualified member function
            self.take()
        out, fresh = "", False
        while self.peek() != "E":
            if out and fresh:
                self.subs.append(out)
            c = self.peek()
            if c == "S":
                out, fresh = self.substitution(), False
            elif c == "I":
                out, fresh = out + self.template_args(), True
            else:
                part = self.source_name()
                out, fresh = (out + "::" + part if out else part), True
        self.take()
        if is_type and fresh:
            self.subs.append(out)
        return out


def pretty(name):
    """A kernel's name without return type and parameters, demangled."""
    if name.startswith("_Z"):
        m = Mangled(name[2:])
        try:
            return m.name()
        except (ValueError, IndexError):
            return re.sub(r"_GLOBAL__N__\w+?_[0-9a-f]{8}(?=\d)", "(anonymous namespace)", name)
    name = re.sub(r"^void\s+", "", name.strip())
    depth = 0
    for k, ch in enumerate(name):  # cut the parameter list at depth 0
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "(" and depth == 0 and not name.startswith("(anonymous", k):
            return name[:k]
    return name


SHAPE = {("128", "128", "128"): "square", ("64", "128", "128"): "square",
         ("128", "128", "192"): "wide", ("64", "192", "128"): "tall"}


def key(name):
    """(dtype, D, shape, persistent) of a forward kernel's demangled name."""
    name = name.replace("(anonymous namespace)::", "").replace("sta::", "")
    m = re.search(r"sta_fwd<FwdTraits<(\w+), (\d+), (\d+), (\d+), \d+, \w+, \d+, \d+, \w+>, (\w+)>",
                  name)
    if m:
        return (m.group(1), m.group(2), SHAPE[(m.group(2), m.group(3), m.group(4))], m.group(5))
    m = re.search(r"sta_fwd_b192<(\w+), (\w+)>", name)
    if m:
        return (m.group(1), "128", "wide", m.group(2))
    # sta_fwd_ws<T, D, STAGES, PP, OVL, PERSIST, KO, LEAN, NWG>, then <T, D, STAGES, PERSIST, NWG>
    m = re.search(r"sta_fwd_ws<(\w+), (\d+), (\d+), true, true, (\w+), 0, true, (\d)>", name)
    if m:
        return (m.group(1), m.group(2), "tall" if m.group(5) == "3" else "square", m.group(4))
    m = re.search(r"sta_fwd_ws<(\w+), (\d+), (\d+), (\w+), (\d)>", name)
    if m:
        return (m.group(1), m.group(2), "tall" if m.group(5) == "3" else "square", m.group(4))
    return None


# ---- SASS from cuobjdump -------------------------------------------------------

HEADER = [re.compile(r"^\s*Function\s*:\s*(\S.*?)\s*$"),   # cuobjdump -sass
          re.compile(r"^\s*Function\s+(\S+?)\s*:\s*$"),      # its resource-usage style
          re.compile(r"^\s*\.text\.(\S+?):\s*$")]           # nvdisasm
INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")


def parse_sass(text):
    """{name: [instruction, ...]} of cuobjdump's or nvdisasm's output."""
    funcs, cur = {}, None
    for line in text.splitlines():
        for h in HEADER:
            m = h.match(line)
            if m:
                cur = m.group(1)
                funcs[cur] = []
                break
        else:
            m = INSTR.match(line)
            if m and cur is not None:
                funcs[cur].append(m.group(2).strip())
    return {n: c for n, c in funcs.items() if c}


def sass_kernels(lib):
    r = subprocess.run(["cuobjdump", "-sass", lib], capture_output=True, text=True)
    funcs = parse_sass(r.stdout)
    why = "" if funcs else "cuobjdump -sass: rc %d, %d lines, no function with code%s" % (
        r.returncode, len(r.stdout.splitlines()),
        ("; " + r.stderr.strip().splitlines()[0]) if r.stderr.strip() else "")
    return funcs, why


# ---- machine code from the ELF -------------------------------------------------

def elf_sections(data):
    """{name: bytes} of a little-endian ELF64 image."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a little-endian ELF64 file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    secs = [struct.unpack_from("<IIQQQQ", data, shoff + k * shentsize) for k in range(shnum)]
    stroff = secs[shstrndx][4]

    def name(o):
        return data[stroff + o:data.index(b"\0", stroff + o)].decode()
    return {name(s[0]): data[s[4]:s[4] + s[5]] if s[1] != 8 else b"" for s in secs}  # 8: NOBITS


def unzstd(buf, size):
    """buf, a zstd frame, decompressed to its size bytes (python's zstandard
    or the system's libzstd); None when neither is there or it fails."""
    try:
        import zstandard
        return zstandard.ZstdDecompressor().decompress(buf, max_output_size=size)
    except ImportError:
        pass
    except Exception:  # zstandard.ZstdError
        return None
    try:
        z = ctypes.CDLL(ctypes.util.find_library("zstd") or "libzstd.so.1")
    except OSError:
        return None
    z.ZSTD_decompress.restype = ctypes.c_size_t
    z.ZSTD_isError.argtypes = [ctypes.c_size_t]
    out = ctypes.create_string_buffer(size)
    n = z.ZSTD_decompress(out, ctypes.c_size_t(size), buf, ctypes.c_size_t(len(buf)))
    return None if z.ZSTD_isError(n) else out.raw[:n]


def cubins(data):
    """The cubins of a .cubin or of a host ELF's .nv_fatbin, and how many
    of its ELF entries could not be read.  An entry: kind (2: ELF) u16,
    version u16, header size u32, payload size u64; in the header, at 16 the
    compressed size u32, at 40 the flags u64 (0x8000: zstd, as nvcc 13 packs
    large cubins), at 56 the size decompressed u64."""
    if data[:4] == b"\x7fELF" and struct.unpack_from("<H", data, 0x12)[0] == 190:  # EM_CUDA
        return [data], 0
    fb = elf_sections(data).get(".nv_fatbin", b"")
    out, unread, pos = [], 0, 0
    while pos + 16 <= len(fb):
        magic, _, hsz, size = struct.unpack_from("<IHHQ", fb, pos)
        if magic != 0xBA55ED50:
            break
        e, end = pos + hsz, pos + hsz + size
        while e + 16 <= end:
            kind, _, ehsz, psz = struct.unpack_from("<HHIQ", fb, e)
            payload = fb[e + ehsz:e + ehsz + psz]
            if kind == 2 and payload[:4] != b"\x7fELF" and ehsz >= 64:
                csize, = struct.unpack_from("<I", fb, e + 16)
                flags, _, dsize = struct.unpack_from("<QQQ", fb, e + 40)
                payload = unzstd(payload[:csize or psz], dsize) if flags & 0x8000 else None
            if kind == 2:
                if payload and payload[:4] == b"\x7fELF":
                    out.append(payload)
                else:
                    unread += 1
            e += ehsz + psz
        pos = (end + 7) & ~7
    return out, unread


def elf_kernels(lib):
    with open(lib, "rb") as f:
        data = f.read()
    funcs = {}
    try:
        bins, unread = cubins(data)
    except (ValueError, struct.error) as e:
        return {}, "%s: %s" % (lib, e)
    for b in bins:
        for sec, code in elf_sections(b).items():
            if sec.startswith(".text.") and code:
                funcs.setdefault(sec[6:], code)
    why = "%d cubins" % len(bins)
    if unread:
        why += ", %d not read (compressed, and no zstandard or libzstd here)" % unread
    return funcs, why


# ---- comparison -----------------------------------------------------------------

def ninstr(code):
    return len(code) // 16 if isinstance(code, bytes) else len(code)


def ndiffer(a, b):
    if isinstance(a, bytes):
        a = [a[k:k + 16] for k in range(0, len(a), 16)]
        b = [b[k:k + 16] for k in range(0, len(b), 16)]
    else:
        a = [re.sub(r"R\d+|UR\d+|P\d+|0x[0-9a-f]+", "_", i) for i in a]
        b = [re.sub(r"R\d+|UR\d+|P\d+|0x[0-9a-f]+", "_", i) for i in b]
    return sum(1 for x, y in zip(a, b) if x != y) + abs(len(a) - len(b))


def opcounts(code):
    if isinstance(code, bytes):
        return ""
    ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", i).split()[0].split(".")[0]
                              for i in code)
    return "  HGMMA %3d  MUFU %4d  STL %3d  LDL %3d  BAR %3d" % (
        ops["HGMMA"], ops["MUFU"], ops["STL"], ops["LDL"], ops["BAR"])


def by_key(funcs):
    """Forward kernels by key, the others by name."""
    fwd, other = {}, {}
    for name, code in funcs.items():
        p = pretty(name)
        k = key(p)
        if k:
            fwd[k] = code
        else:
            other[p] = code
    return fwd, other


def compare(title, libs, per):
    ref = per[0]
    for lib, ks in zip(libs[1:], per[1:]):
        print("== %s against %s: %s" % (lib, libs[0], title))
        n = collections.Counter()
        for k in sorted(set(ks) | set(ref), key=str):
            label = " ".join(k) if isinstance(k, tuple) else k
            if k not in ref or k not in ks:
                verdict = "only here" if k in ks else "only in the reference"
                print("  %-40s %s" % (label, verdict))
            elif ref[k] == ks[k]:
                verdict = "identical"
                print("  %-40s identical (%d instructions)" % (label, ninstr(ref[k])))
            else:
                a, b = ref[k], ks[k]
                verdict = "differ"
                print("  %-40s differs: %d vs %d instructions, %d differ%s" % (
                    label, ninstr(a), ninstr(b), ndiffer(a, b),
                    "" if isinstance(a, bytes) else " in shape (registers, constants aside)"))
            n[verdict] += 1
        print("-- %s, %s: %s" % (lib, title, ", ".join(
            "%d %s" % (n[v], v) for v in ("identical", "differ", "only here", "only in the reference")
            if n[v])))


def main():
    args = sys.argv[1:]
    elf = "--elf" in args
    libs = [a for a in args if a != "--elf"]
    if not libs:
        sys.exit(__doc__)
    source = "ELF"
    if not elf and shutil.which("cuobjdump"):
        read = [sass_kernels(lib) for lib in libs]
        if all(f for f, _ in read):
            source = "SASS"
        else:
            for lib, (_, why) in zip(libs, read):
                if why:
                    print("# %s: %s; reading the ELF instead" % (lib, why))
    if source == "ELF":
        read = [elf_kernels(lib) for lib in libs]
    print("# kernels from the %s (%s)" % (source, "cuobjdump -sass" if source == "SASS" else
                                          "the .text sections of each cubin, bytes"))
    fwd, other = [], []
    for lib, (funcs, why) in zip(libs, read):
        f, o = by_key(funcs)
        fwd.append(f)
        other.append(o)
        print("== %s: %d forward kernels, %d others%s" % (lib, len(f), len(o),
                                                          ("  (" + why + ")") if why else ""))
        for k in sorted(f):
            print("  %-40s %5d instructions%s" % (" ".join(k), ninstr(f[k]), opcounts(f[k])))
        if not f and funcs:
            print("  no forward kernel among: %s" % ", ".join(sorted(pretty(n) for n in funcs)[:4]))
    compare("forward kernels", libs, fwd)
    compare("other kernels", libs, other)


if __name__ == "__main__":
    main()
