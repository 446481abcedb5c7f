"""Records page traces from a real guest for `remusdb-bench compress
--record-guest`: the VM is protected with compression on and the daemon
asked to append every dirty page that has a cached previous version, with
that version, to a trace file (asc_encoder.h), while one workload runs;
then protection ends. One trace per workload: OLTP (pgbench) and a
scan-heavy DSS script (overhead.py's)."""
import json
import tempfile
import time
from pathlib import Path
from functools import partial

from ..lab import vm, workload
from .. import output, protection
from .overhead import DSS_SCRIPT, create_scan_table, guest_free_space
from ..drill.lab import fresh_vm_for_protection, stop_vm_everywhere
from . import harness

VM_NAME = "benchtr"
say = partial(output.say, "bench compress")


def record(trace_dir, seconds=40, interval_ms=50, clients=8, scan_mb=384):
    """Returns the trace paths; each has a JSON sidecar saying what it is."""
    trace_dir = Path(trace_dir)
    trace_dir.mkdir(parents=True, exist_ok=True)
    fresh_vm_for_protection(VM_NAME)
    traces = []
    try:
        create_scan_table(scan_mb, VM_NAME)
        with tempfile.NamedTemporaryFile("w", suffix=".sql", prefix="rdb-dss-") as f:
            f.write(DSS_SCRIPT)
            f.flush()
            runs = {
                "pgbench": ("pgbench TPC-B-like", clients, ()),
                "scan": ("DSS scan script over a table 3x the buffer pool", 2,
                         ("-n", "-f", f.name)),
            }
            for name, (what, n, extra) in runs.items():
                path = trace_dir / f"guest-{name}.trace"
                # No reset-stats: pages_traced counts the whole protection,
                # as the trace file holds every pair since it began.
                with harness.protected(VM_NAME, interval_ms,
                                       options={"trace_pages": str(path)}):
                    r = workload.pgbench(vm.DEFAULT_IP, seconds=seconds, clients=n,
                                         threads=min(n, 2), extra=extra)
                    p = protection.primary_protection("primary", VM_NAME)
                traced = ((p.get("pipeline") or {}).get("compression") or {}).get("pages_traced", 0)
                say(f"{name}: {traced} page pairs recorded into {path} "
                    f"({r['tps']} tx/s); guest: "
                    f"{guest_free_space(vm.vm_files('primary', VM_NAME)['qga'])}")
                if not traced:
                    raise SystemExit(f"no page pairs recorded for {name}")
                Path(str(path) + ".json").write_text(json.dumps({
                    "synthetic": False, "workload": what, "clients": n,
                    "seconds": seconds, "interval_ms": interval_ms,
                    "pairs": traced, "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
                }, indent=1))
                traces.append(path)
    finally:
        stop_vm_everywhere(VM_NAME)
    return traces
