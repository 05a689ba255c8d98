#!/usr/bin/env python3
"""Module cycles in the workspace's crates.

For each crate (every folder with a Cargo.toml and a src/), reads every
`crate::…`, `super::…` and `self::…` path in its source files (grouped `use`
lists included), resolves it to the module it names, and draws an edge
between the two sibling modules under their lowest common ancestor (a child
naming its parent's items draws none). Prints each cycle among siblings and
exits 1 if there is one; prints the module graph with --graph.

Usage: scripts/module-cycles.py [--graph] [CRATE_DIR ...]
"""

import os
import re
import sys

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def module_of(src, path):
    rel = os.path.relpath(path, src)[:-3].split(os.sep)
    if rel[-1] in ("lib", "main", "mod"):
        rel = rel[:-1]
    if rel and rel[0] == "bin":
        return None
    return tuple(rel)


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r'"(?:\\.|[^"\\])*"', '""', text)


def paths_after(text, i):
    """Paths written at text[i:] (after `crate::`, `super::`, `self::`):
    a list of segment lists, braces expanded."""
    out = []

    def parse(i, prefix):
        segs = list(prefix)
        while True:
            m = re.match(r"\s*(" + IDENT + r"|\{)", text[i:])
            if not m:
                out.append(segs)
                return i
            if m.group(1) == "{":
                i += m.end()
                while True:
                    i = parse(i, segs)
                    m2 = re.match(r"\s*([,}])", text[i:])
                    if not m2:
                        return i
                    i += m2.end()
                    if m2.group(1) == "}":
                        return i
            segs.append(m.group(1))
            i += m.end()
            m2 = re.match(r"\s*::", text[i:])
            if not m2:
                out.append(segs)
                return i
            i += m2.end()

    parse(i, [])
    return out


def crate_graph(crate):
    src = os.path.join(crate, "src")
    files = {}
    for root, _, names in os.walk(src):
        for n in names:
            if n.endswith(".rs"):
                p = os.path.join(root, n)
                m = module_of(src, p)
                if m is not None:
                    files[p] = m
    modules = set(files.values())
    edges = {}
    for path, mod in files.items():
        text = strip_comments(open(path, encoding="utf-8").read())
        for m in re.finditer(r"\b(crate|super|self)\s*::", text):
            base = {"crate": (), "self": mod, "super": mod[:-1]}[m.group(1)]
            for segs in paths_after(text, m.end()):
                target = base
                for s in segs:
                    if s == "super":
                        target = target[:-1]
                    elif target + (s,) in modules:
                        target = target + (s,)
                    else:
                        break
                k = 0
                while k < min(len(mod), len(target)) and mod[k] == target[k]:
                    k += 1
                if k == len(mod) or k == len(target):
                    continue  # one is an ancestor of the other
                a, b = mod[: k + 1], target[: k + 1]
                edges.setdefault(a, set()).add(b)
    return modules, edges


def cycles(edges):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
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
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(set(edges) | {w for ws in edges.values() for w in ws}):
        if v not in index:
            visit(v)
    return out


def main(argv):
    graph = "--graph" in argv
    crates = [a for a in argv if not a.startswith("--")]
    if not crates:
        root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
        crates = sorted(
            os.path.join(root, d)
            for d in os.listdir(root)
            if os.path.isfile(os.path.join(root, d, "Cargo.toml"))
            and os.path.isdir(os.path.join(root, d, "src"))
        )
    found = 0
    for crate in crates:
        _, edges = crate_graph(crate)
        name = os.path.basename(os.path.normpath(crate))
        if graph:
            for a in sorted(edges):
                for b in sorted(edges[a]):
                    print(f"{name}: {'::'.join(a)} -> {'::'.join(b)}")
        for c in cycles(edges):
            found += 1
            print(f"{name}: cycle: " + " <-> ".join("::".join(m) for m in c))
    if found == 0:
        print(f"no module cycles in {len(crates)} crates")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
