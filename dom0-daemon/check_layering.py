#!/usr/bin/env python3
"""The daemon's layering check: every #include "FOLDER/FILE.h" in
dom0-daemon/src must name a folder that the including file's folder may
depend on (layers.txt), and a private header (*_internal.h) serves only
its own folder.  Why a check: the folders show the architecture only as
long as nobody includes upwards, and a cycle between folders creeps in
one include at a time.

  check_layering.py [SRC [LAYERS]]   check the tree; exit 1 on a violation
  check_layering.py --self-test      the negative controls: forbidden
                                     includes planted in a copy of the
                                     tree must each be caught
"""
import re
import shutil
import sys
import tempfile
from pathlib import Path

import check_cli

HERE = Path(__file__).resolve().parent
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def read_layers(path):
    """{folder: set of folders it may include}, checked to be acyclic."""
    allowed = {}
    for line in Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        folder, _, deps = line.partition(":")
        allowed[folder.strip()] = set(deps.split())
    for folder, deps in allowed.items():
        unknown = deps - allowed.keys()
        if unknown:
            raise SystemExit(f"{path}: {folder} names unknown folders {sorted(unknown)}")
    state = {}

    def visit(folder, trail):
        if state.get(folder) == "done":
            return
        if state.get(folder) == "open":
            raise SystemExit(f"{path}: the table has a cycle: {' -> '.join(trail + [folder])}")
        state[folder] = "open"
        for dep in sorted(allowed[folder]):
            visit(dep, trail + [folder])
        state[folder] = "done"

    for folder in allowed:
        visit(folder, [])
    return allowed


def violations(src, allowed):
    """One line per forbidden include, stray file or unknown folder."""
    src = Path(src)
    found = []
    for path in sorted(src.rglob("*")):
        if path.is_dir() or path.suffix not in (".c", ".h"):
            continue
        rel = path.relative_to(src)
        if len(rel.parts) != 2:
            found.append(f"{rel}: every source file lives in one subsystem folder")
            continue
        folder = rel.parts[0]
        if folder not in allowed:
            found.append(f"{rel}: folder {folder}/ is not in the layer table")
            continue
        text = path.read_text(errors="replace")
        for m in INCLUDE.finditer(text):
            target = m.group(1)
            line = text.count("\n", 0, m.start()) + 1
            parts = target.split("/")
            if len(parts) != 2:
                found.append(f"{rel}:{line}: #include \"{target}\" does not name its folder")
                continue
            to = parts[0]
            if to == folder:
                continue
            if to not in allowed:
                found.append(f"{rel}:{line}: #include \"{target}\": no folder {to}/")
            elif to not in allowed[folder]:
                found.append(f"{rel}:{line}: #include \"{target}\": {folder}/ may not "
                             f"depend on {to}/ (layers.txt)")
            elif parts[1].endswith("_internal.h"):
                found.append(f"{rel}:{line}: #include \"{target}\": a private header "
                             f"of {to}/")
    return found


def check(src, layers):
    found = violations(src, read_layers(layers))
    for line in found:
        print(f"layering: {line}", file=sys.stderr)
    if not found:
        print(f"layering: {src}: every include follows {layers}")
    return not found


def self_test():
    """Each planted include must be caught, and the unplanted copy pass:
    a check that passes everything would fail here."""
    src, layers = HERE / "src", HERE / "layers.txt"
    plants = [
        # (folder, include, why it is wrong), from the far bug to the near
        # one; each goes into the folder's first .c file, whatever it is.
        ("base", "control/control.h", "the bottom reaching the top"),
        ("vm", "primary/protection.h", "vm/ naming a feature over it"),
        ("fork", "backup/epoch_stage.h", "a sibling's one-way edge reversed"),
        ("qemu", "nbd/nbd_proto.h", "one bottom folder using another"),
        ("control", "primary/protection_internal.h", "another folder's private header"),
        ("wire", "be.h", "an include without its folder"),
    ]
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "src"
        shutil.copytree(src, copy)
        if violations(copy, read_layers(layers)):
            print("self-test: the unmodified tree fails", file=sys.stderr)
            return False
        for folder, include, why in plants:
            target = sorted((copy / folder).glob("*.c"))[0]
            original = target.read_text()
            target.write_text(original + f'\n#include "{include}"\n')
            caught = violations(copy, read_layers(layers))
            target.write_text(original)
            print(f"self-test: {folder}/{target.name} + {include} ({why}): "
                  f"{'caught' if caught else 'MISSED'}")
            ok = ok and len(caught) == 1
    return ok


if __name__ == "__main__":
    sys.exit(check_cli.run(check, self_test, (HERE / "src", HERE / "layers.txt")))
