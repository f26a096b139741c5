#!/usr/bin/env python3
"""Where a redis-server's instructions go, from one callgrind dump: its Lua (the interpreter,
the Lua side of redis.call and the libraries scripts use: Lua 5.1, cjson, cmsgpack, bit,
struct) against Redis itself, jemalloc and libc; and, inclusive, how much of the scripts'
share the commands they call take (`scriptCall`).

Debian's redis-server is stripped, but its dynamic symbols mark where the bundled Lua starts
(`lua_checkstack`, the first function of lapi.c) and ends (`hdr_*`, HdrHistogram, follows
cjson's `fpconv_*`): an address callgrind cannot name is counted by the region it falls in.

    python3 benches/regions.py /tmp/palisade-split/cg.<pid>.3   # benches/split.sh's settle phase
"""
import bisect
import re
import shutil
import subprocess
import sys

dump = sys.argv[1]
server = shutil.which("redis-server")
symbols = {}
for line in subprocess.run(["nm", "-D", "--defined-only", server], capture_output=True,
                           text=True, check=True).stdout.splitlines():
    address, _, name = line.split()
    symbols[name] = int(address, 16)
lua_from = symbols["lua_checkstack"]
lua_to = min(a for n, a in symbols.items() if n.startswith("hdr_") and a > lua_from)


def annotate(inclusive):
    return subprocess.run(["callgrind_annotate", f"--inclusive={inclusive}", "--threshold=100",
                           dump], capture_output=True, text=True, check=True).stdout


row = re.compile(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+(\S+) \[(\S+)\]")
total = int(re.search(r"^summary: (\d+)", open(dump).read(), re.M).group(1))
regions = {}
for line in annotate("no").splitlines():
    m = row.match(line)
    if not m:
        continue
    ir, function, obj = int(m.group(1).replace(",", "")), m.group(2), m.group(3)
    # (A stripped binary leaves callgrind a few frames it charges everything to: the
    # program's start, below main and main.)
    if ir >= total or "below main" in function or function.endswith(":main"):
        continue
    if "redis" not in obj:
        region = obj.rsplit("/", 1)[-1].split(".so")[0]
    else:
        name = function.split(":", 1)[1].split("'")[0]
        address = int(name, 16) if name.startswith("0x") else symbols.get(name)
        region = "lua" if address is not None and lua_from <= address < lua_to else "redis"
    regions[region] = regions.get(region, 0) + ir
print(f"instructions: {total:,}")
for region, ir in sorted(regions.items(), key=lambda r: -r[1]):
    if ir * 1000 >= total:
        print(f"  {region:<12} {ir:>14,} {100 * ir / total:5.1f} %  (self)")
for line in annotate("yes").splitlines():
    m = row.match(line)
    if m and m.group(2) in ("???:luaCallFunction", "???:scriptCall"):
        what = {"???:luaCallFunction": "scripts, all they do", "???:scriptCall":
                "  of it, the commands they call"}[m.group(2)]
        ir = int(m.group(1).replace(",", ""))
        print(f"  {what:<32} {ir:>14,} {100 * ir / total:5.1f} %  (inclusive)")
