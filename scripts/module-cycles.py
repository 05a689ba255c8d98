#!/usr/bin/env python3
"""Module cycles in the workspace's crates.

For each crate (every folder with a Cargo.toml and a src/), reads every
`crate::…`, `super::…` and `self::…` path in its source files (grouped `use`
lists included) and every `use` of a child module by its bare name,
resolves it to the module it names, and draws an edge between the two
sibling modules under their lowest common ancestor (a child naming its
parent's items draws none). Inline modules (`mod name { … }`) are modules
of their own, and a path's code is the innermost module around it. A name
a module re-exports (`pub use other::Name`, `pub use other::*`) resolves to
the module that defines it too, so a dependency through a re-export is
seen. Prints each cycle among siblings and exits 1 if there is one; prints
the module graph with --graph.

Usage: scripts/module-cycles.py [--graph] [--self-test] [CRATE_DIR ...]
(--self-test: first checks that it finds a cycle made through an inline
module and one made through a parent's re-export.)
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
    # Char literals first: a '"' would pair with the next string's quote.
    text = re.sub(r"'(?:\\.|[^'\\\n])'", "' '", text)
    return re.sub(r'"(?:\\.|[^"\\])*"', '""', text)


def paths_after(text, i):
    """Paths written at text[i:] (after `crate::`, `super::`, `self::`):
    a list of segment lists, braces expanded."""
    out = []

    def parse(i, prefix):
        segs = list(prefix)
        while True:
            m = re.match(r"\s*(" + IDENT + r"|\{|\*)", text[i:])
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


def inline_modules(text, mod):
    """The inline modules of a file whose module is `mod`: a list of
    (start, end, module) for each `mod name { … }` body, nested ones
    included (innermost last among those that hold a position)."""
    out = []
    for m in re.finditer(r"\bmod\s+(" + IDENT + r")\s*\{", text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        out.append((m.start(), i, m.group(1)))
    spans = []
    for start, end, name in out:
        outer = [sp for sp in spans if sp[0] < start and end <= sp[1]]
        parent = max(outer, key=lambda sp: sp[0])[2] if outer else mod
        spans.append((start, end, parent + (name,)))
    return spans


def module_at(spans, mod, pos):
    inner = [sp for sp in spans if sp[0] <= pos < sp[1]]
    return max(inner, key=lambda sp: sp[0])[2] if inner else mod


def uses(text, modules, mod_at):
    """Every path of the text: (position, its module, the module the path
    starts from, its segments, whether it is a `pub use`)."""
    out = []
    for m in re.finditer(r"\b(crate|super|self)\s*::", text):
        mod = mod_at(m.start())
        base = {"crate": (), "self": mod, "super": mod[:-1]}[m.group(1)]
        line = text[text.rfind("\n", 0, m.start()) + 1 : m.start()]
        public = re.search(r"\bpub(\([^)]*\))?\s+use\s*$", line) is not None
        for segs in paths_after(text, m.end()):
            out.append((mod, base, segs, public))
    # `use child::…` (a child module named bare, as the 2018 edition allows)
    for m in re.finditer(r"\b(pub(\([^)]*\))?\s+)?use\s+(" + IDENT + r")\s*::", text):
        mod = mod_at(m.start())
        if mod + (m.group(3),) not in modules:
            continue
        for segs in paths_after(text, m.end()):
            out.append((mod, mod + (m.group(3),), segs, m.group(1) is not None))
    return out


def resolve(base, segs, modules):
    """The module a path from `base` names, and the segments after it."""
    target, rest = base, list(segs)
    while rest:
        s = rest[0]
        if s == "super":
            target = target[:-1]
        elif target + (s,) in modules:
            target = target + (s,)
        else:
            break
        rest.pop(0)
    return target, rest


def crate_graph(crate):
    src = os.path.join(crate, "src")
    texts = {}
    for root, _, names in os.walk(src):
        for n in names:
            if n.endswith(".rs"):
                p = os.path.join(root, n)
                m = module_of(src, p)
                if m is not None:
                    texts[p] = (m, strip_comments(open(p, encoding="utf-8").read()))
    modules = {m for m, _ in texts.values()}
    spans = {}
    for p, (mod, text) in texts.items():
        spans[p] = inline_modules(text, mod)
        modules |= {sp[2] for sp in spans[p]}
    items, globs, named, paths = {}, {}, {}, []
    for p, (mod, text) in texts.items():
        at = lambda pos, p=p, mod=mod: module_at(spans[p], mod, pos)
        for m in re.finditer(
            r"\bpub(\([^)]*\))?\s+(?:async\s+|unsafe\s+|const\s+)*(?:fn|struct|enum|const|static|type|trait)\s+("
            + IDENT
            + ")",
            text,
        ):
            items.setdefault(at(m.start()), set()).add(m.group(2))
        for mod_, base, segs, public in uses(text, modules, at):
            target, rest = resolve(base, segs, modules)
            paths.append((mod_, target, rest))
            if public and len(rest) == 1 and target != mod_:
                if rest[0] == "*":
                    globs.setdefault(mod_, set()).add(target)
                else:
                    named.setdefault(mod_, {})[rest[0]] = target

    def origins(target, name, seen):
        """The modules that define `name` as module `target` exports it."""
        if (target, name) in seen:
            return set()
        seen.add((target, name))
        out = set()
        if name in named.get(target, {}):
            out.add(named[target][name])
            out |= origins(named[target][name], name, seen)
        for g in globs.get(target, ()):
            if name in items.get(g, ()) or name in named.get(g, {}):
                out.add(g)
                out |= origins(g, name, seen)
        return out

    edges = {}
    for mod, target, rest in paths:
        targets = {target}
        if rest and rest[0] != "*":
            targets |= origins(target, rest[0], set())
        for target in targets:
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


SELF_TEST = {
    # A cycle through an inline module.
    "inline": {
        "lib.rs": "mod n;\nmod m {\n    use crate::n::Z;\n    pub struct W;\n}\n",
        "n.rs": "use crate::m::W;\npub struct Z;\n",
    },
    # A cycle through a glob re-export of a sibling's items.
    "glob": {
        "lib.rs": "mod p;\n",
        "p/mod.rs": "mod q;\nmod r;\npub use self::q::*;\n",
        "p/q.rs": "use crate::p::r::R;\npub struct Q;\n",
        # (a char literal '"' before the path: not the start of a string)
        "p/r.rs": "const C: char = '\"';\nuse crate::p::Q;\nconst S: &str = \"x\";\npub struct R;\n",
    },
    # A cycle through the parent's re-export of a sibling's item.
    "reexport": {
        "lib.rs": "mod p;\n",
        "p/mod.rs": "mod q;\nmod r;\npub use self::q::Q;\n",
        "p/q.rs": "use crate::p::r::R;\npub struct Q;\n",
        "p/r.rs": "use crate::p::Q;\npub struct R;\n",
    },
}


def self_test():
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for name, files in SELF_TEST.items():
            for rel, text in files.items():
                path = os.path.join(tmp, name, "src", rel)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
            _, edges = crate_graph(os.path.join(tmp, name))
            if not cycles(edges):
                print(f"self-test: the cycle of case {name!r} was not found")
                return False
    return True


def main(argv):
    graph = "--graph" in argv
    if "--self-test" in argv and not self_test():
        return 2
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
