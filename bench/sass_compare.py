#!/usr/bin/env python3
"""sass_compare.py -- the forward kernels of libraries side by side in SASS
(cuobjdump -sass), for checking that a restructuring left the machine code
alone.  Each kernel is reduced to its (dtype, head dim, shape, persistent)
whatever its name in that build (sta_fwd_ws / sta_fwd_b192 before issue 17,
sta::sta_fwd<FwdTraits> after); kernels are compared instruction by
instruction with addresses and register numbers kept (identical machine code
reads "identical").  Also prints, per library, each kernel's instruction
count and a few opcode counts.

  sass_compare.py LIB [LIB ...]      (the first is the reference)
"""
import collections
import re
import subprocess
import sys


def demangle(names):
    for tool in ("cu++filt", "c++filt"):
        try:
            out = subprocess.run([tool], input="\n".join(names) + "\n", capture_output=True,
                                 text=True, check=True).stdout.split("\n")
            if len(out) >= len(names) and all(out[:len(names)]):
                return out[:len(names)]
        except (OSError, subprocess.CalledProcessError):
            pass
    return names


def kernels(lib):
    txt = subprocess.run(["cuobjdump", "-sass", lib], capture_output=True, text=True).stdout
    funcs, cur = {}, None
    for line in txt.splitlines():
        m = re.match(r"\s+Function : (\S+)", line)
        if m:
            cur = m.group(1)
            funcs[cur] = []
            continue
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m and cur:
            funcs[cur].append(m.group(2).strip())
    names = list(funcs)
    return {d: funcs[n] for n, d in zip(names, demangle(names))}


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
    # sta_fwd_ws<T, D, STAGES, PP, OVL, PERSIST, KO, LEAN, NWG> (before issue 17 step 1)
    m = re.search(r"sta_fwd_ws<(\w+), (\d+), (\d+), true, true, (\w+), 0, true, (\d)>", name)
    if m:
        return (m.group(1), m.group(2), "tall" if m.group(5) == "3" else "square", m.group(4))
    m = re.search(r"sta_fwd_ws<(\w+), (\d+), (\d+), (\w+), (\d)>", name)
    if m:
        return (m.group(1), m.group(2), "tall" if m.group(5) == "3" else "square", m.group(4))
    return None


def main():
    libs = sys.argv[1:]
    if not libs:
        sys.exit(__doc__)
    per = []
    for lib in libs:
        ks = {}
        for name, code in kernels(lib).items():
            k = key(name)
            if k:
                ks[k] = code
        per.append(ks)
        print("== %s: %d forward kernels" % (lib, len(ks)))
        for k in sorted(ks):
            ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", i).split()[0].split(".")[0]
                                      for i in ks[k])
            print("  %-40s %5d instructions  HGMMA %3d  MUFU %4d  STL %3d  LDL %3d  BAR %3d" % (
                " ".join(k), len(ks[k]), ops["HGMMA"], ops["MUFU"], ops["STL"], ops["LDL"],
                ops["BAR"]))
    ref = per[0]
    for lib, ks in zip(libs[1:], per[1:]):
        print("== %s against %s" % (lib, libs[0]))
        for k in sorted(ks):
            if k not in ref:
                print("  %-40s only here" % " ".join(k))
                continue
            a, b = ref[k], ks[k]
            if a == b:
                print("  %-40s identical (%d instructions)" % (" ".join(k), len(a)))
            else:
                sa = [re.sub(r"R\d+|UR\d+|P\d+|0x[0-9a-f]+", "_", i) for i in a]
                sb = [re.sub(r"R\d+|UR\d+|P\d+|0x[0-9a-f]+", "_", i) for i in b]
                ndiff = sum(1 for x, y in zip(sa, sb) if x != y) + abs(len(sa) - len(sb))
                print("  %-40s differs: %d vs %d instructions, %d differ in shape" % (
                    " ".join(k), len(a), len(b), ndiff))


if __name__ == "__main__":
    main()
