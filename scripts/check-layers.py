#!/usr/bin/env python3
"""Checks the layering rules of the workspace, reading the source as text (no build needed):

1. No import circles between source files. Every `use` and every path written in code that
   starts with `crate::`, `super::` or `self::` (and `edge_*::` paths into another workspace
   crate) is resolved to the file of the module it names; a file that declares a module
   (`mod x;`) does not thereby import it, but a `use x::...` does. Test files (`tests.rs`,
   modules declared under `#[cfg(test)]`, `tests/` folders) are left out. Any strongly connected
   group of two or more files is reported.
2. No source file outside the kernels and tests is longer than MAX_LINES lines.
3. The library crates depend on no command-line, logging-backend or signal crate
   (`cargo tree -e normal`), unless --no-cargo is given.

Exit status 1 with one line per problem; 0 prints a summary. Usage:
    scripts/check-layers.py [--no-cargo] [--verbose]
"""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_LINES = 800
# Files exempt from the length rule: the kernels (CPU and CUDA) and tests.
LENGTH_EXEMPT = ("engine/kernels/", "engine/core/cuda/")
LIBRARY_CRATES = [
    "edge-arena",
    "edge-gguf",
    "edge-kernels",
    "edge-engine",
    "edge-tokenizers",
    "edge-targets",
    "edge-run-capi",
]
# The CLI's crates, and the server's HTTP stack (edge-run serve), stay out of the libraries.
FORBIDDEN_DEPS = ["clap", "env_logger", "signal-hook", "tokio", "axum", "hyper", "tower"]


def crates():
    """(crate name as used in paths, source root directory) of every workspace crate."""
    out = []
    for manifest_dir in [
        "arena",
        "tokenizers",
        "targets",
        "engine/gguf",
        "engine/kernels",
        "engine/core",
        "engine/cli",
        "engine/capi",
        "tests",
    ]:
        toml = open(os.path.join(ROOT, manifest_dir, "Cargo.toml")).read()
        name = re.search(r'^name\s*=\s*"([^"]+)"', toml, re.M).group(1)
        lib = re.search(r'\[lib\][^\[]*?name\s*=\s*"([^"]+)"', toml, re.S)
        ident = (lib.group(1) if lib else name).replace("-", "_")
        src = os.path.join(manifest_dir, "src")
        root = "lib.rs" if os.path.exists(os.path.join(ROOT, src, "lib.rs")) else "main.rs"
        out.append((ident, src, root))
    return out


def strip_comments_and_strings(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r'r#*"(?:.|\n)*?"#*', '""', text)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    text = re.sub(r"//[^\n]*", "", text)
    return text


def module_files(src, root_file):
    """Module path (tuple) -> file, following `mod x;` declarations; test modules left out."""
    mods = {}

    def visit(path, file):
        mods[path] = file
        text = strip_comments_and_strings(open(os.path.join(ROOT, file)).read())
        base = os.path.dirname(file)
        stem = os.path.basename(file)[:-3]
        child_dir = base if stem in ("lib", "main", "mod") else os.path.join(base, stem)
        for m in re.finditer(r"((?:#\[[^\]]*\]\s*)*)(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", text):
            attrs, name = m.group(1), m.group(2)
            if re.search(r"cfg\((?:all\()?test", attrs) or name == "tests":
                continue
            for cand in (os.path.join(child_dir, name + ".rs"), os.path.join(child_dir, name, "mod.rs")):
                if os.path.exists(os.path.join(ROOT, cand)):
                    visit(path + (name,), cand)
                    break

    visit((), os.path.join(src, root_file))
    return mods


def expand_use(tree):
    """`a::{b, c::{d, e}}` -> ['a::b', 'a::c::d', 'a::c::e'] (aliases and globs kept as paths)."""
    tree = tree.strip()
    m = re.match(r"^(.*?)::\s*\{(.*)\}$", tree, re.S)
    if not m:
        return [re.sub(r"\s+as\s+\w+$", "", tree)]
    prefix, inner = m.group(1), m.group(2)
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    out = []
    for p in parts:
        p = p.strip()
        if not p:
            continue
        if p == "self":
            out.append(prefix)
        else:
            out.extend(expand_use(prefix + "::" + p))
    return out


def references(text):
    """Paths a file names: every `use` tree, expanded, and every qualified path in code."""
    refs = []
    for m in re.finditer(r"\buse\s+([^;]+);", text):
        refs.extend(expand_use(m.group(1)))
    for m in re.finditer(r"(?<![\w:])((?:crate|super|self|\w+)(?:::\w+)+)", text):
        refs.append(m.group(1))
    return refs


def resolve(ref, here, crate_ident, all_mods):
    """The (crate, module path) file a path reference lands in, or None."""
    segs = [s.strip() for s in ref.split("::") if s.strip()]
    if not segs:
        return None
    if segs[0] == "crate":
        krate, path = crate_ident, []
        segs = segs[1:]
    elif segs[0] in ("super", "self"):
        krate, path = crate_ident, list(here)
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super" and path:
                path.pop()
            segs = segs[1:]
    elif tuple(here) + (segs[0],) in all_mods[crate_ident]:
        # A path relative to this module: one of its child modules (`use exec::Executor`).
        krate, path = crate_ident, list(here)
    elif segs[0] in all_mods:
        krate, path = segs[0], []
        segs = segs[1:]
    else:
        return None
    mods = all_mods[krate]
    path = tuple(path)
    best = path if path in mods else None
    for s in segs:
        if s == "*":
            break
        nxt = path + (s,)
        if nxt in mods:
            path = nxt
            best = nxt
        else:
            break
    return (krate, best) if best is not None else None


def circles(edges, nodes):
    """Strongly connected components of two or more nodes (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                strong(w)
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
    for v in nodes:
        if v not in index:
            strong(v)
    return out


def main():
    verbose = "--verbose" in sys.argv
    problems = []
    all_mods, files = {}, []
    for ident, src, root_file in crates():
        mods = module_files(src, root_file)
        all_mods[ident] = mods
        files.extend((ident, path, f) for path, f in mods.items())
    edges, why = {}, {}
    for ident, path, f in files:
        text = strip_comments_and_strings(open(os.path.join(ROOT, f)).read())
        # Inline test modules read whatever they like; `pub(in path)` is a visibility, not an import.
        text = re.sub(
            r"#\[cfg\((?:all\()?test[^\]]*\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{.*",
            "",
            text,
            flags=re.S,
        )
        text = re.sub(r"pub\(in [^)]*\)", "pub", text)
        for ref in references(text):
            target = resolve(ref, path, ident, all_mods)
            if target is None:
                continue
            tf = all_mods[target[0]][target[1]]
            if tf != f:
                edges.setdefault(f, set()).add(tf)
                why.setdefault((f, tf), set()).add(ref)
    for comp in circles(edges, [f for _, _, f in files]):
        inside = set(comp)
        ties = [
            f"{a} -> {b} ({', '.join(sorted(why[(a, b)])[:3])})"
            for a in comp
            for b in sorted(edges.get(a, ()))
            if b in inside
        ]
        problems.append(f"import circle among {', '.join(comp)}: " + "; ".join(ties))
    n_edges = sum(len(v) for v in edges.values())
    for _, _, f in files:
        if f.startswith(LENGTH_EXEMPT):
            continue
        n = sum(1 for _ in open(os.path.join(ROOT, f)))
        if n > MAX_LINES:
            problems.append(f"{f} has {n} lines (more than {MAX_LINES}): split it along its seams")
    if "--no-cargo" not in sys.argv:
        for krate in LIBRARY_CRATES:
            tree = subprocess.run(
                ["cargo", "tree", "-e", "normal", "--prefix", "none", "-p", krate],
                cwd=ROOT,
                capture_output=True,
                text=True,
            )
            if tree.returncode != 0:
                problems.append(f"cargo tree -p {krate} failed: {tree.stderr.strip()[:200]}")
                continue
            names = {line.split()[0] for line in tree.stdout.splitlines() if line.strip()}
            for dep in FORBIDDEN_DEPS:
                if dep in names:
                    problems.append(f"library crate {krate} depends on {dep} (cargo tree -e normal -p {krate})")
    if verbose:
        for a in sorted(edges):
            for b in sorted(edges[a]):
                print(f"{a} -> {b}")
    for p in problems:
        print(f"check-layers: {p}")
    if problems:
        return 1
    print(
        f"check-layers: {len(files)} source files, {n_edges} imports between them, no circle; "
        f"none over {MAX_LINES} lines outside the kernels; library crates free of "
        f"{', '.join(FORBIDDEN_DEPS)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
