#!/usr/bin/python3
"""check_layering.py — the product code's structure rules (docs/architecture.md):

1. Folders: every #include "dir/..." goes to a folder its layer may use
   (RULES below; the CMake target links enforce the same at link time, this
   catches header-only uses).
2. Files, inside each folder of FILE_LEVEL (a module is a .c and its
   same-named .h; A -> B when A.c or A.h includes B.h of the same folder):
   - the module graph has no circle: an owner calls leaves, a leaf reaches
     back only through callbacks;
   - every function a header declares is defined in the .c of the same name
     (a header is one module's interface, not a list of several files'
     functions); a header without a .c declares no functions, except
     `static inline` ones.
3. No header named *_internal.h anywhere in the product.
4. No product .c file over MAX_LINES lines, outside the kernel folders
   (compute/cpu/, compute/cuda/).

Usage: check_layering.py REPO_ROOT. Exit 0 when clean, 1 with one line per
violation (file:line and the rule)."""
import os
import re
import sys

# folder -> folders (or single headers) its files may include. The most
# specific folder wins (coordinator/api before coordinator).
RULES = {
    "common": ["common"],
    "proto": [],
    "model": ["common", "model"],
    "compute": ["common", "compute"],
    "rpc": ["common", "rpc"],
    "ib": ["common", "ib", "proto"],
    "engine": ["common", "model", "compute", "engine"],
    "daemon": ["common", "model", "compute", "engine", "ib", "proto", "rpc", "daemon"],
    "cli": ["common", "model", "compute", "engine", "ib", "proto", "rpc", "cli"],
    "coordinator/config": ["common", "coordinator/config"],
    "coordinator/serve": ["common", "model", "ib", "proto", "coordinator/config", "coordinator/serve"],
    "coordinator/api": ["common", "model", "coordinator/api", "coordinator/serve/engine_api.h"],
    "coordinator/control": ["common", "model", "rpc", "proto", "coordinator/config", "coordinator/serve",
                            "coordinator/control"],
    # main.c: the composition root
    "coordinator": ["common", "model", "coordinator"],
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')

# Folders whose files are checked one by one (rule 2). In CIRCLES_ONLY only
# the circle rule applies: ib/transport.h is one interface with one
# implementation in several files (the UCX transport), as rdma.h is.
FILE_LEVEL = ["coordinator", "coordinator/api", "coordinator/config", "coordinator/serve",
              "coordinator/control", "daemon", "engine", "ib"]
CIRCLES_ONLY = ["engine", "ib"]
# Folders whose files are exempt from the length limit (rule 4): SIMD and CUDA kernels.
KERNEL_DIRS = ["compute/cpu", "compute/cuda"]
MAX_LINES = 900


def layer_of(rel):
    best = None
    for folder in RULES:
        if rel.startswith(folder + "/") and (best is None or len(folder) > len(best)):
            best = folder
    return best


def allowed(target, rule):
    return any(target == r or target.startswith(r + "/") for r in rule)


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


# A function declaration at file scope: a return type, a name, a parameter
# list, then ';' (not a definition, a typedef or a macro).
DECL = re.compile(r"^(?!\s*(?:typedef|return|#|static\b))[A-Za-z_][\w \t\*]*?\b([A-Za-z_]\w*)\s*\(([^;{}]*?)\)\s*"
                  r"(?:__attribute__\s*\(\(.*?\)\)\s*)?;", re.M | re.S)


def top_level(text):
    """text with everything inside braces removed (struct bodies, inline functions)."""
    out, depth = [], 0
    for ch in text:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            continue
        if depth == 0:
            out.append(ch)
        elif ch == "\n":
            out.append(ch)
    return "".join(out)


def declared_functions(header_text):
    body = top_level(strip_comments(header_text))
    names = []
    for m in DECL.finditer(body):
        if "(*" in m.group(0).split(m.group(1))[0]:
            continue
        names.append(m.group(1))
    return names


def defines(c_text, name):
    return re.search(r"^[A-Za-z_][^;{}()]*\b" + re.escape(name) + r"\s*\([^;]*?\)\s*\{", strip_comments(c_text),
                     re.M | re.S) is not None


def find_cycle(graph):
    """One circle of the directed graph {node: set(nodes)} as a list, or None."""
    state, stack = {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if not state.get(m):
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if not state.get(n):
            found = visit(n)
            if found:
                return found
    return None


def check_files(root):
    """Rules 2-4; returns the violations as lines."""
    problems = []
    for folder in FILE_LEVEL:
        path = os.path.join(root, folder)
        if not os.path.isdir(path):
            continue
        files = {f: open(os.path.join(path, f), encoding="utf-8", errors="replace").read()
                 for f in os.listdir(path) if f.endswith((".c", ".h"))}
        stems = {f.rsplit(".", 1)[0] for f in files}
        graph = {s: set() for s in stems}
        for name, text in files.items():
            stem = name.rsplit(".", 1)[0]
            for line in text.splitlines():
                m = INCLUDE.match(line)
                if not m:
                    continue
                target = m.group(1)
                if os.path.dirname(target) == folder:
                    t = os.path.basename(target).rsplit(".", 1)[0]
                    if t != stem and t in stems:
                        graph[stem].add(t)
        cycle = find_cycle(graph)
        if cycle:
            problems.append(f"{folder}/: a circle of files: {' -> '.join(cycle)}")
        for name, text in sorted(files.items()):
            if not name.endswith(".h") or folder in CIRCLES_ONLY:
                continue
            stem = name[:-2]
            own = files.get(stem + ".c")
            for fn in declared_functions(text):
                if own is None:
                    problems.append(f"{folder}/{name}: declares {fn}(), but there is no {stem}.c; "
                                    f"a header declares the functions of its own .c only")
                elif not defines(own, fn):
                    problems.append(f"{folder}/{name}: declares {fn}(), which {stem}.c does not define")
    for dirpath, _, names in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        top = rel_dir.split(os.sep)[0]
        if top not in {r.split("/")[0] for r in RULES}:
            continue
        for name in names:
            rel = os.path.join(rel_dir, name)
            if name.endswith("_internal.h"):
                problems.append(f"{rel}: an *_internal.h header; give each file an interface of its own")
            if name.endswith(".c") and not any(rel.startswith(k + "/") for k in KERNEL_DIRS):
                with open(os.path.join(dirpath, name), encoding="utf-8", errors="replace") as f:
                    n = sum(1 for _ in f)
                if n > MAX_LINES:
                    problems.append(f"{rel}: {n} lines, over {MAX_LINES}; split it by concern")
    return problems


def main():
    root = sys.argv[1]
    bad = checked = 0
    for folder in RULES:
        for dirpath, _, files in os.walk(os.path.join(root, folder)):
            for name in files:
                if not name.endswith((".c", ".h", ".cu")):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)
                layer = layer_of(rel)
                if layer != folder:
                    continue  # a more specific folder's file
                with open(path, encoding="utf-8", errors="replace") as f:
                    for lineno, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m or "/" not in m.group(1):
                            continue
                        checked += 1
                        if not allowed(m.group(1), RULES[layer]):
                            bad += 1
                            print(f"{rel}:{lineno}: includes {m.group(1)}, but {layer}/ may use only "
                                  f"{', '.join(RULES[layer]) or 'nothing of the project'}")
    print(f"{checked} includes checked, {bad} across a layer boundary")
    problems = check_files(root)
    for p in problems:
        print(p)
    print(f"files checked in {', '.join(FILE_LEVEL)}: {len(problems)} structure problem(s)")
    return 1 if bad or problems else 0


if __name__ == "__main__":
    sys.exit(main())
