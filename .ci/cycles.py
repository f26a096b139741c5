#!/usr/bin/env python3
"""Refuses import circles between the files of a crate.

    python3 .ci/cycles.py [CRATE_DIR ...]     # default: every workspace member with a src/
    python3 .ci/cycles.py --self-test         # proves it finds a planted circle

A file imports another when it names a path that resolves into it: `crate::a::b`, `super::x`,
`self::y`, or a path that starts with one of its own child modules (`mod child;` then
`child::T`). A path that lands on a name the target re-exports (`pub use inner::T`) is followed
to the file that defines it, so importing `crate::Stores` from the crate root is an edge to
`store/mod.rs`, not to `lib.rs`; a `pub use` itself is no edge (a facade `mod.rs` hands its
children's names on without using them), nor is a module's use of its own submodules (a module
is made of them; the children's `super::` uses are the edges that count). `#[cfg(test)]` modules are left out: a unit test reaching
back up is not the layering. Edges are read from the text, as `use` lines and inline paths
alike; comments and string literals are skipped.

Exit status: 0 with no circle, 1 naming each circle and the names that tie it.
"""
import os
import re
import sys
import tempfile

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip_comments_and_strings(text):
    """The source with comments and string/char literals blanked (offsets kept)."""
    out = list(text)
    i, n = 0, len(text)

    def blank(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            blank(i, j)
            i = j
        elif c == "r" and re.match(r'r(#*)"', text[i:i + 10]) and (i == 0 or not re.match(r"[A-Za-z0-9_]", text[i - 1])):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            end = text.find('"' + hashes, i + 2 + len(hashes))
            end = n if end < 0 else end + 1 + len(hashes)
            blank(i, end)
            i = end
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            blank(i, j + 1)
            i = j + 1
        elif c == "'":
            # A char literal ('a', '\n', '\u{..}'), not a lifetime ('a).
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", text[i:i + 12])
            if m:
                blank(i, i + m.end())
                i += m.end()
            else:
                i += 1
        else:
            i += 1
    return "".join(out)


def matching_brace(text, open_at):
    depth = 0
    for k in range(open_at, len(text)):
        if text[k] == "{":
            depth += 1
        elif text[k] == "}":
            depth -= 1
            if depth == 0:
                return k
    return len(text) - 1


def drop_test_modules(text):
    """Blanks `#[cfg(test)] mod name { .. }` blocks."""
    while True:
        m = re.search(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+" + IDENT + r"\s*\{", text)
        if not m:
            return text
        end = matching_brace(text, m.end() - 1)
        text = text[:m.start()] + re.sub(r"[^\n]", " ", text[m.start():end + 1]) + text[end + 1:]


def parse_tree(text, i):
    """Parses a path tree at text[i:]: `a::b`, `a::{b, c::d as e}`, `a::*`. Returns
    ([(segments, alias)], end)."""
    segs = []
    while True:
        while i < len(text) and text[i] in " \t\n":
            i += 1
        if text.startswith("{", i):
            results, j = [], i + 1
            while True:
                while j < len(text) and text[j] in " \t\n,":
                    j += 1
                if j >= len(text) or text[j] == "}":
                    break
                sub, j = parse_tree(text, j)
                results += [(segs + s, a) for s, a in sub]
            return results, j + 1
        if text.startswith("*", i):
            return [(segs + ["*"], None)], i + 1
        m = re.match(IDENT, text[i:])
        if not m:
            return ([(segs, None)] if segs else []), i
        segs.append(m.group(0))
        i += m.end()
        k = i
        while k < len(text) and text[k] in " \t\n":
            k += 1
        if text.startswith("::", k) and not text.startswith("::<", k):
            i = k + 2
            continue
        alias = None
        am = re.match(r"\s+as\s+(" + IDENT + ")", text[i:])
        if am:
            alias = am.group(1)
            i += am.end()
        return [(segs, alias)], i


class Crate:
    def __init__(self, src):
        self.src = src
        self.files = {}  # module path tuple -> file path
        root = None
        for name in ("lib.rs", "main.rs"):
            if os.path.exists(os.path.join(src, name)):
                root = os.path.join(src, name)
                break
        if root is None:
            return
        self._walk(root, ())
        self.texts = {}
        self.children = {}
        for mod, path in self.files.items():
            with open(path, encoding="utf-8") as f:
                text = drop_test_modules(strip_comments_and_strings(f.read()))
            self.texts[mod] = text
            self.children[mod] = set(re.findall(r"\bmod\s+(" + IDENT + r")\s*;", text))
        self.reexports = {mod: self._reexports(mod) for mod in self.files}

    def _walk(self, path, mod):
        self.files[mod] = path
        with open(path, encoding="utf-8") as f:
            text = drop_test_modules(strip_comments_and_strings(f.read()))
        base = os.path.dirname(path)
        if os.path.basename(path) not in ("lib.rs", "main.rs", "mod.rs"):
            base = os.path.join(base, os.path.splitext(os.path.basename(path))[0])
        for m in re.finditer(r"(#\[path\s*=[^\]]*\]\s*)?\bmod\s+(" + IDENT + r")\s*;", text):
            if m.group(1):
                continue
            child = m.group(2)
            for cand in (os.path.join(base, child + ".rs"), os.path.join(base, child, "mod.rs")):
                if os.path.exists(cand):
                    self._walk(cand, mod + (child,))
                    break

    def _reexports(self, mod):
        """name -> absolute path tuple of what `pub use` hands on from this module."""
        out = {}
        for m in re.finditer(r"\bpub(\([^)]*\))?\s+use\s+", self.texts[mod]):
            for segs, alias in parse_tree(self.texts[mod], m.end())[0]:
                absolute = self.absolute(mod, segs)
                if absolute and segs[-1] != "*":
                    out[alias or segs[-1]] = absolute
        return out

    def absolute(self, mod, segs):
        """An absolute module path for `segs` written inside `mod`, or None (an outside crate)."""
        if not segs:
            return None
        if segs[0] == "crate":
            return tuple(segs[1:])
        if segs[0] in ("self", "super"):
            here = list(mod)
            rest = list(segs)
            while rest and rest[0] in ("self", "super"):
                if rest.pop(0) == "super":
                    if not here:
                        return None
                    here.pop()
            return tuple(here + rest)
        if segs[0] in self.children.get(mod, ()):
            return tuple(mod) + tuple(segs)
        return None

    def resolve(self, path, seen=0):
        """The file a path lands in: the longest module prefix, through re-exports."""
        for cut in range(len(path), -1, -1):
            mod = tuple(path[:cut])
            if mod in self.files:
                rest = path[cut:]
                if rest and seen < 8 and rest[0] in self.reexports.get(mod, {}):
                    target = self.reexports[mod][rest[0]]
                    return self.resolve(target + tuple(rest[1:]), seen + 1)
                return mod, (rest[0] if rest else "")
        return None

    def edges(self):
        """{(from_file, to_file): set(names)}"""
        out = {}
        starts = r"(?<![A-Za-z0-9_:])(crate|self|super)\s*::"
        for mod, text in self.texts.items():
            # A re-export hands a name on without using it: it is followed by `resolve`, and is
            # no edge of its own (else every facade `mod.rs` would circle with its children).
            text = re.sub(r"\bpub(\([^)]*\))?\s+use\s+[^;]*;", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
            patterns = [starts]
            if self.children[mod]:
                patterns.append(r"(?<![A-Za-z0-9_:])(" + "|".join(sorted(self.children[mod])) + r")\s*::")
            for pattern in patterns:
                for m in re.finditer(pattern, text):
                    for segs, _ in parse_tree(text, m.start())[0]:
                        absolute = self.absolute(mod, segs)
                        if absolute is None:
                            continue
                        landed = self.resolve([s for s in absolute if s != "*"])
                        # A module is made of its children: a `mod.rs` using what its own
                        # submodules define is composition, not an import back up.
                        if landed is None or landed[0][:len(mod)] == mod:
                            continue
                        key = (self.files[mod], self.files[landed[0]])
                        out.setdefault(key, set()).add(landed[1] or absolute[-1])
        return out


def circles(edges):
    """Strongly connected components of more than one file (Tarjan)."""
    graph = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index, low, stack, on, found = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def check(crate_dirs):
    failed = False
    for crate in crate_dirs:
        src = os.path.join(crate, "src")
        if not os.path.isdir(src):
            continue
        c = Crate(src)
        if not c.files:
            continue
        edges = c.edges()
        for comp in circles(edges):
            failed = True
            print(f"import circle in {crate}: {len(comp)} files")
            for a in comp:
                for b in comp:
                    if (a, b) in edges:
                        names = ", ".join(sorted(edges[(a, b)])[:6])
                        print(f"  {a} -> {b}: {names}")
    return failed


def workspace_members(root):
    with open(os.path.join(root, "Cargo.toml"), encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"members\s*=\s*\[([^\]]*)\]", text)
    return [os.path.join(root, p) for p in re.findall(r'"([^"]+)"', m.group(1))] if m else [root]


def self_test():
    """A planted circle is found (and named); the same files without it pass."""
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "src", "store")
        os.makedirs(src)

        def write(rel, text):
            with open(os.path.join(d, "src", rel), "w", encoding="utf-8") as f:
                f.write(text)

        write("lib.rs", "mod job;\nmod store;\npub use store::Stores;\n")
        write("store/mod.rs", "mod memory;\npub use memory::Memory;\npub struct Stores;\n")
        write("store/memory.rs", "use super::Stores;\n// crate::job::Job in a comment\npub struct Memory(Stores);\n")
        write("job.rs", 'use crate::Stores;\npub struct Job;\nconst S: &str = "crate::store::Memory";\n'
              "#[cfg(test)]\nmod tests { use crate::store::memory::Memory; }\n")
        assert not check([d]), "a tree without a circle was refused"
        write("store/memory.rs", "use super::Stores;\nuse crate::{job::{self, Job}};\npub struct Memory(Stores);\n")
        assert not check([d]), "a re-export was taken for an import"
        write("job.rs", "pub struct Job(crate::store::Memory);\n")
        assert check([d]), "a planted circle (job -> store/memory -> job) was not found"
    print("cycles.py self-test: a planted circle is found, the tree without it passes")


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        sys.exit(0)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    dirs = sys.argv[1:] or workspace_members(root)
    sys.exit(1 if check(dirs) else 0)
