#!/usr/bin/python3
"""check_layering.py — every #include "dir/..." in the product code goes to a
folder its layer may use (docs/architecture.md states the same table; the
CMake target links enforce it at link time, this catches header-only uses).

Usage: check_layering.py REPO_ROOT. Exit 0 when clean, 1 with one line per
violation (file:line: the include and the rule)."""
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


def layer_of(rel):
    best = None
    for folder in RULES:
        if rel.startswith(folder + "/") and (best is None or len(folder) > len(best)):
            best = folder
    return best


def allowed(target, rule):
    return any(target == r or target.startswith(r + "/") for r in rule)


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
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
