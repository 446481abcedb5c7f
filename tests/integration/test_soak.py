"""The 5-minute chaos soak (tools/remusdb-drill --soak, drill/soak.py):
a VM on each host, each protected to the other, under pgbench and the
commit ledger; faults at random moments, one at a time, of kinds drawn
from a shuffled deck (every kind once before any repeats), each repaired
and every VM protected again (and switched back home) before the next.

What must hold comes from the far side, and the soak's own verdict checks
it (its pure parts and their small-bug controls: test_soak_parsing.py):
no acknowledged commit lost, at any fault or at the end; no interval in
which a VM's frames reached the LAN from both hosts; every client
recovered; pg_amcheck clean at the end. Here: that verdict, that faults
of several kinds really came, and that the lab is left as it was found
(the other tests' one-member witness, no soak mount, no soak VM)."""
import json
import os
import subprocess
from pathlib import Path

from remusdb.drill import soak, soak_faults
from remusdb.lab import witness

REPO = Path(__file__).resolve().parents[2]
MINUTES = 5


def test_five_minute_soak_loses_nothing(lab, tmp_path):
    out, png = tmp_path / "soak.json", tmp_path / "soak.png"
    try:
        r = subprocess.run([str(REPO / "tools" / "remusdb-drill"), "--soak", str(MINUTES),
                            "--json", str(out), "--png", str(png),
                            "--workdir", str(tmp_path / "drills")],
                           capture_output=True, text=True, timeout=MINUTES * 60 + 1200)
    finally:
        soak.leftovers()  # a killed soak's too
    print(r.stdout[-6000:], r.stderr[-6000:])
    result = json.loads(out.read_text())
    for i, f in enumerate(result["faults"], 1):
        vms = {n: (v.get("downtime_ms"), v.get("lost"), v.get("how"),
                   (v.get("disk_copy") or {}).get("mode"), (v.get("disk_copy") or {}).get("bytes_sent"))
               for n, v in f.get("vms", {}).items()}
        print(f"fault {i} at {f.get('at_s')} s: {f['kind']} {f.get('host', '')}: "
              f"protected again after {f.get('protected_again_s')} s, home after "
              f"{f.get('home_again_s')} s; (downtime ms, lost, how, copy, bytes) {vms}"
              + (f" FAILED {f['failed']}" if "failed" in f else ""))
    assert result["passed"], result["problems"]
    assert r.returncode == 0
    kinds = [f["kind"] for f in result["faults"]]
    assert len(kinds) >= 3 and len(set(kinds)) == min(len(kinds), len(soak_faults.KINDS)), kinds
    assert all(v["acked"] > 0 for v in result["final"].values()), result["final"]
    assert png.exists() and png.stat().st_size > 10000
    assert not any(os.path.ismount(soak_faults.replica_dir(h)) for h in soak_faults.HOSTS)
    assert witness.configured_members() == 1
