#!/usr/bin/env python3
"""Holds docs/architecture.md's file table of the daemon against the tree:
every .c file under dom0-daemon/src must be named there by its folder path
(`wire/repl_proto.c`), and every daemon path the table names must exist.
Why: the table is the newcomer's map, and a map that has drifted from the
tree misleads more than no map.

  check_file_table.py [SRC [DOC]]   exit 1 on a file missing or stale
  check_file_table.py --self-test   a file added to a copy of the tree, and
                                    a row naming a file that is gone, must
                                    each be caught
"""
import re
import shutil
import sys
import tempfile
from pathlib import Path

import check_cli

HERE = Path(__file__).resolve().parent
DOC = HERE.parent / "docs" / "architecture.md"
# `folder/name.c` or `folder/name.h` inside backquotes, in a table row.
NAMED = re.compile(r"`([a-z]+/[A-Za-z0-9_]+\.[ch])`")


def problems(src, doc):
    src, doc = Path(src), Path(doc)
    rows = [line for line in doc.read_text().splitlines() if line.startswith("|")]
    named = {m.group(1) for row in rows for m in NAMED.finditer(row)}
    folders = {p.name for p in src.iterdir() if p.is_dir()}
    found = []
    for path in sorted(src.glob("*/*.c")):
        rel = path.relative_to(src).as_posix()
        if rel not in named:
            found.append(f"{rel} is in no row of {doc.name}'s file table")
    for rel in sorted(named):
        if rel.split("/")[0] in folders and not (src / rel).exists():
            found.append(f"{doc.name} names {rel}, which does not exist")
    return found


def self_test():
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        src, doc = Path(tmp) / "src", Path(tmp) / "architecture.md"
        shutil.copytree(HERE / "src", src)
        shutil.copy(DOC, doc)
        if problems(src, doc):
            print("self-test: the unmodified tree fails", file=sys.stderr)
            return False
        (src / "base" / "unlisted_file.c").write_text("/* planted */\n")
        caught = problems(src, doc)
        print(f"self-test: an unlisted base/unlisted_file.c: {'caught' if caught else 'MISSED'}")
        ok = ok and len(caught) == 1
        (src / "base" / "unlisted_file.c").unlink()
        victim = sorted(src.glob("*/*.c"))[0]
        victim.rename(victim.with_suffix(".c.gone"))
        caught = problems(src, doc)
        print(f"self-test: a row naming the removed {victim.parent.name}/{victim.name}: "
              f"{'caught' if caught else 'MISSED'}")
        # Exactly the stale row shows: the renamed file is no source file now.
        ok = ok and len(caught) == 1
    return ok


def check(src, doc):
    found = problems(src, doc)
    for line in found:
        print(f"file table: {line}", file=sys.stderr)
    if not found:
        print(f"file table: every daemon source file is in {Path(doc).name}, and nothing else")
    return not found


if __name__ == "__main__":
    sys.exit(check_cli.run(check, self_test, (HERE / "src", DOC)))
