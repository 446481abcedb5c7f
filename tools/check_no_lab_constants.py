#!/usr/bin/env python3
"""The product knows nothing of the lab: product code must not name a lab
namespace (rdb-primary, rdb-backup, rdb-client, rdb-lan, rdb-etcd,
rdb-witness), network namespaces at all (`netns`, `ip netns exec`), a
10.77. address (the lab's subnet), or import the lab's package
(remusdb.lab), directly or through another module: the Python package's
import graph (every import statement, at top level or inside a function,
and importlib.import_module of a literal name) must not lead from a product
module to a lab module. What a product needs to know of a cluster comes from the
cluster file (remusdb.cluster, docs/operations.md); the lab writes its
own (lab/cluster_file.py). Why a check: each such constant once crept in
as a shortcut, and each makes the product work in the lab only.

  check_no_lab_constants.py [ROOT]   check the checkout; exit 1 on a violation
  check_no_lab_constants.py --self-test
                                     the negative controls: each forbidden
                                     string planted in a copy of a product
                                     file is caught; an exempt lab file
                                     with the same strings is not

Product code: dom0-daemon/src, dist/, debian/, tools/lib/remusdb and the
guest's packaged parts (guest-kmod/, guest-clone/, tools/setup/dbms-deb/),
except the lab's own parts listed in EXEMPT, each with its reason.
"""
import ast
import re
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PRODUCT = ["dom0-daemon/src", "dist", "debian", "tools/lib/remusdb",
           "guest-kmod", "guest-clone", "tools/setup/dbms-deb"]

FORBIDDEN = [
    (re.compile(r"\brdb-(primary|backup|client|lan|etcd|witness)\b"), "a lab namespace"),
    (re.compile(r"ip\W+netns\W+exec"), "`ip netns exec` (a lab namespace)"),
    (re.compile(r"netns", re.I), "network namespaces (the lab's hosts)"),
    (re.compile(r"(?<![\d.])10\.77\."), "the lab's subnet 10.77.0.0/24"),
    (re.compile(r"^[ \t]*(from\s+(\.+lab|remusdb\.lab)\b|import\s+remusdb\.lab\b)", re.M),
     "an import of the lab's package"),
]

# Paths under tools/lib/remusdb that are the lab's own, with why.
EXEMPT = {
    "lab/": "the lab itself: namespaces, VMs, witness, sshd, its cluster files",
    "drill/": "failover drills: they cut the lab's links and hosts",
    "bench/": "benchmarks run in the lab's namespaces",
    "failback.py": "the steps of a failback drill shared by test_failback.py and "
                   "remusdb-bench failback (imports drill.inject and lab.vm)",
    "cli/lab.py": "remusdb-lab: brings the lab up and down",
    "cli/drill.py": "remusdb-drill: the failover drill's command",
    "cli/drill_cp.py": "remusdb-drill-cp: the commit-protection drill's command",
    "cli/bench.py": "remusdb-bench: the benchmarks' command",
    "cli/demo.py": "remusdb-demo: `make demo` in the lab",
    "cli/clone_identity_check.py": "a lab check of the guest's clone hook (runs in "
                                   "the client namespace)",
    "cli/vm.py": "remusdb-vm: starts and stops database VMs in the lab's namespaces "
                 "(a real host's VMs are libvirt's or the operator's)",
}
SUFFIXES = {".py", ".c", ".h", ".in", ".example", ".service", ".conf", ".sh", ""}


def exempt_reason(rel):
    """rel: a path relative to the checkout; the exemption's reason or None."""
    prefix = "tools/lib/remusdb/"
    if not rel.startswith(prefix):
        return None
    inner = rel[len(prefix):]
    for path, reason in EXEMPT.items():
        if inner == path or (path.endswith("/") and inner.startswith(path)):
            return reason
    return None


def product_files(root):
    for top in PRODUCT:
        base = Path(root) / top
        if not base.exists():
            continue
        for f in sorted(base.rglob("*")):
            if not f.is_file() or "__pycache__" in f.parts:
                continue
            if f.suffix not in SUFFIXES and f.parent.name != "debian":
                continue
            rel = f.relative_to(root).as_posix()
            if exempt_reason(rel) is None:
                yield rel, f


def check(root):
    """Violations as "PATH:LINE: WHAT: TEXT" lines."""
    found = []
    for rel, f in product_files(root):
        try:
            text = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for pattern, what in FORBIDDEN:
            for m in pattern.finditer(text):
                line_no = text.count("\n", 0, m.start()) + 1
                line = text.splitlines()[line_no - 1].strip()
                found.append(f"{rel}:{line_no}: {what}: {line[:100]}")
    return sorted(set(found))


PACKAGE = "tools/lib/remusdb"


def module_name(rel_inside_package):
    """lab/vm.py -> remusdb.lab.vm; cli/__init__.py -> remusdb.cli"""
    parts = ["remusdb"] + list(Path(rel_inside_package).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_names(tree, name, is_package):
    """The absolute module names one module's source imports."""
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            yield base
            for alias in node.names:  # `from . import lab` imports a module
                yield f"{base}.{alias.name}"
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            yield node.args[0].value


def import_graph(root):
    """{module: set of remusdb modules it imports}, and {module: path}."""
    base = Path(root) / PACKAGE
    paths, graph = {}, {}
    for f in sorted(base.rglob("*.py")):
        if "__pycache__" not in f.parts:
            paths[module_name(f.relative_to(base).as_posix())] = f
    for name, f in paths.items():
        try:
            tree = ast.parse(f.read_text(encoding="utf-8"), str(f))
        except (SyntaxError, UnicodeDecodeError) as e:
            raise SystemExit(f"check_no_lab_constants: cannot parse {f}: {e}")
        edges = set()
        for target in imported_names(tree, name, f.name == "__init__.py"):
            # Importing a.b.c runs a and a.b first: each is an edge.
            pieces = target.split(".")
            for i in range(1, len(pieces) + 1):
                prefix = ".".join(pieces[:i])
                if prefix in paths and prefix != name:
                    edges.add(prefix)
        graph[name] = edges
    return graph, paths


def lab_import_chains(root):
    """Violations as "PATH: imports the lab: A -> B -> C" lines, one per product
    module whose imports reach a lab module (the shortest chain)."""
    graph, paths = import_graph(root)
    base = Path(root)

    def is_lab(module):
        return exempt_reason(paths[module].relative_to(base).as_posix()) is not None

    found = []
    for start in sorted(graph):
        if is_lab(start):
            continue
        previous, queue = {start: None}, [start]
        while queue:
            here = queue.pop(0)
            if is_lab(here):
                chain = [here]
                while previous[chain[-1]]:
                    chain.append(previous[chain[-1]])
                rel = paths[start].relative_to(base).as_posix()
                found.append(f"{rel}: imports the lab: {' -> '.join(reversed(chain))}")
                break
            for nxt in sorted(graph[here]):
                if nxt not in previous:
                    previous[nxt] = here
                    queue.append(nxt)
    return found


def self_test_imports():
    """Imports the text patterns miss, planted in a copy of the package:
    each must be caught through the graph; the unplanted copy passes."""
    plants = ["from . import lab", "from remusdb import lab as the_lab",
              "def later():\n    from . import failback",
              "import importlib\nimportlib.import_module('remusdb.drill.inject')"]
    product = f"{PACKAGE}/control.py"
    failures = []
    with tempfile.TemporaryDirectory(prefix="check-lab-imports-") as tmp:
        shutil.copytree(REPO / PACKAGE, Path(tmp) / PACKAGE,
                        ignore=shutil.ignore_patterns("__pycache__"))
        if lab_import_chains(tmp):
            failures.append(f"the unplanted copy is flagged: {lab_import_chains(tmp)}")
        original = (Path(tmp) / product).read_text()
        for plant in plants:
            (Path(tmp) / product).write_text(original + plant + "\n")
            if not any(h.startswith(f"{product}: ") for h in lab_import_chains(tmp)):
                failures.append(f"{plant!r} planted in {product} was not caught")
        (Path(tmp) / product).write_text(original)
    return plants, failures


def self_test():
    """Each forbidden string, planted in a copy of one product file, is
    caught at its line; the same strings in an exempt lab file are not;
    the unplanted copy passes."""
    plants = ['NS = "rdb-backup"', 'cmd = ["ip", "netns", "exec", ns]',
              "# runs in a netns", 'ADDRESS = "10.77.0.2"', "from .lab import vm",
              "    from ..lab import netns"]
    product = "tools/lib/remusdb/control.py"
    lab = "tools/lib/remusdb/lab/netns.py"
    failures = []
    with tempfile.TemporaryDirectory(prefix="check-lab-constants-") as tmp:
        for rel in (product, lab):
            (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO / rel, Path(tmp) / rel)
        if check(tmp):
            failures.append(f"the unplanted copy is flagged: {check(tmp)}")
        original = (Path(tmp) / product).read_text()
        lines = len(original.splitlines())
        for plant in plants:
            (Path(tmp) / product).write_text(original + plant + "\n")
            hits = check(tmp)
            if not any(h.startswith(f"{product}:{lines + 1}: ") for h in hits):
                failures.append(f"{plant!r} planted in {product} was not caught: {hits}")
            (Path(tmp) / lab).write_text((REPO / lab).read_text() + plant + "\n")
            if any(h.startswith(lab) for h in check(tmp)):
                failures.append(f"the exempt {lab} was flagged")
        # The address check must not flag another subnet that merely ends alike.
        (Path(tmp) / product).write_text(original + 'ADDRESS = "110.77.0.2"\n')
        if check(tmp):
            failures.append(f"110.77.0.2 was taken for the lab's subnet: {check(tmp)}")
    import_plants, import_failures = self_test_imports()
    failures += import_failures
    for f in failures:
        print(f"check_no_lab_constants self-test: FAILED: {f}", file=sys.stderr)
    if not failures:
        print(f"check_no_lab_constants self-test: {len(plants)} planted strings caught, "
              f"the exempt lab file not flagged; {len(import_plants)} planted imports "
              f"caught through the import graph")
    return 1 if failures else 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    root = Path(argv[1]) if len(argv) > 1 else REPO
    found = check(root) + lab_import_chains(root)
    for line in found:
        print(f"lab constant in product code: {line}", file=sys.stderr)
    if found:
        print(f"check_no_lab_constants: {len(found)} violation(s); take what the product "
              f"needs from the cluster file (remusdb.cluster) or move the code to the lab "
              f"(tools/lib/remusdb/lab)", file=sys.stderr)
        return 1
    print(f"check_no_lab_constants: product code names no lab constant "
          f"({len(EXEMPT)} lab parts exempt)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
