#!/usr/bin/env python3
"""The crate's import graph, checked: the rules of docs/architecture.md ("The pipeline").

1. The top-level modules of src/ (src/NAME.rs or src/NAME/) form a directed acyclic graph
   of imports: no cycle between them.
2. The pipeline's stages import only earlier stages:
       matrix -> run -> baseline, history -> judge -> report -> ingest, bisect, commands, site -> cli
   (a stage may import any stage of a lower rank, or a module outside the pipeline; an
   import from a stage into one of a higher rank fails).
3. Inside a module, no file imports a file that imports it back (a cycle between the files
   of one top-level module); e.g. a trait and the function that picks its implementation
   live apart from the implementations.

Read as text, without building the crate (cargo-modules would cost minutes of a two-core
CI machine): each file with its comments and its `#[cfg(test)]` items removed (the item
the attribute marks, up to its `;` or its balanced `{...}` block: test code may import
anything, and the code after it still counts), as ../shared/tools/module_cycles.py reads
it; an import is a path through `crate::`, `super::` or `self::`, in a `use` line or inline
in code (`crate::run::launch::check(cell)`), or a child module's name used as a path in the
file that declares it. A path resolves to the longest
module prefix that is a file; `super::Item` of an item (not a module) is an import of the
parent module's own file.

Usage: scripts/module-graph.py [SRC]   (prints every violation; exit 1 if any)
"""
import os
import re
import sys

# The pipeline's stages and their rank (docs/architecture.md). Modules not listed are
# vocabulary or components outside the pipeline: only rule 1 applies to them.
STAGES = {
    "matrix": 1,
    "run": 2,
    "baseline": 3,
    "history": 3,
    "judge": 4,
    "triage": 5,
    "report": 6,
    "ingest": 7,
    "bisect": 7,
    "commands": 7,
    "site": 7,
    "cli": 8,
}


def module_files(root):
    """Module path (`history::store`) -> file, for every module of the crate."""
    mods = {}
    for dp, _, fs in os.walk(root):
        for f in fs:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(dp, f)
            rel = os.path.relpath(path, root)[:-3].split(os.sep)
            if rel[-1] == "mod":
                rel = rel[:-1]
            if rel in (["lib"], ["main"]):
                continue
            mods["::".join(rel)] = path
    return mods


def strip_test_items(src):
    """`src` without the items marked `#[cfg(test)]`: each from the attribute up to its `;`
    or the end of its balanced `{...}` block (a `mod tests { .. }`, a test-only `use`, `fn`
    or `impl`), so the code after a test-only item still counts. The same reading as
    ../shared/tools/module_cycles.py."""
    out, i = [], 0
    while True:
        j = src.find("#[cfg(test)]", i)
        if j < 0:
            return "".join(out) + src[i:]
        out.append(src[i:j])
        k, depth = j + len("#[cfg(test)]"), 0
        while k < len(src):
            ch = src[k]
            k += 1
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    break
            elif ch == ";" and depth == 0:
                break
        i = k


def code_of(path):
    """The code of `path` the graph reads: comments and `#[cfg(test)]` items removed."""
    src = open(path, encoding="utf-8", errors="replace").read()
    # Comments and doc comments name modules without importing them; they go first, so a
    # brace in a comment does not end a test item early.
    return strip_test_items(re.sub(r"//[^\n]*", "", src))


def imports(mods):
    """Module -> the modules whose files it imports."""
    def resolve(parts):
        for i in range(len(parts), 0, -1):
            key = "::".join(parts[:i])
            if key in mods:
                return key
        return None

    edges = {}
    for mod, path in mods.items():
        src = code_of(path)
        me = mod.split("::")
        found = set()
        for m in re.finditer(r"\bcrate::((?:[a-z_0-9]+::)*[a-z_0-9]+)", src):
            found.add(resolve(m.group(1).split("::")))
        for m in re.finditer(r"use crate::\{([^}]*)\}", src):
            for name in re.findall(r"(?:^|,)\s*([a-z_][a-z0-9_]*)", m.group(1)):
                found.add(resolve([name]))
        for m in re.finditer(r"\b((?:super::)+)(\{[^}]*\}|(?:[a-z_0-9]+::)*[A-Za-z_0-9]+)", src):
            base = me[: len(me) - m.group(1).count("super::")]
            tail = m.group(2)
            names = re.findall(r"(?:^|[{,])\s*([A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_0-9]+)*)", tail) if tail.startswith("{") else [tail]
            for name in names:
                target = resolve(base + name.split("::"))
                # An item of the parent (not a module) is an import of the parent's file.
                found.add(target if target is not None and len(target.split("::")) > len(base) else ("::".join(base) if "::".join(base) in mods else None))
        for m in re.finditer(r"\bself::([a-z_0-9]+)", src):
            found.add(resolve(me + [m.group(1)]))
        for child in re.findall(r"^\s*(?:pub(?:\([a-z]+\))? )?mod ([a-z_0-9]+);", src, re.M):
            if re.search(r"(?<![:\w])" + child + r"::", src):
                found.add(resolve(me + [child]))
        found.discard(None)
        found.discard(mod)
        edges[mod] = found
    return edges


def cycles(nodes, edges):
    """The strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

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

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "src"
    mods = module_files(root)
    edges = imports(mods)
    problems = []

    top = {}
    for mod, targets in edges.items():
        a = mod.split("::")[0]
        for t in targets:
            b = t.split("::")[0]
            if a != b:
                top.setdefault(a, set()).add(b)
    for comp in cycles(set(top) | {b for bs in top.values() for b in bs}, top):
        inner = [f"{a}->{b}" for a in comp for b in sorted(top.get(a, ())) if b in comp]
        problems.append(f"cycle between top-level modules {' '.join(comp)}: {', '.join(inner)}")
    for a, bs in sorted(top.items()):
        for b in sorted(bs):
            if a in STAGES and b in STAGES and STAGES[b] > STAGES[a]:
                problems.append(f"stage `{a}` imports the later stage `{b}`")

    for name in sorted({m.split("::")[0] for m in mods}):
        inner = {m: {t for t in ts if t.split("::")[0] == name} for m, ts in edges.items() if m.split("::")[0] == name}
        for comp in cycles(set(inner), inner):
            pairs = [f"{a}->{b}" for a in comp for b in sorted(inner.get(a, ())) if b in comp]
            problems.append(f"files of `{name}` import each other in a circle: {', '.join(pairs)}")

    for p in problems:
        print(p)
    n_edges = sum(len(v) for v in top.values())
    print(f"{len(mods)} files, {len(top)} top-level modules importing others ({n_edges} edges), {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
