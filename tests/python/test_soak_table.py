"""remusdb-drill --soak-table: the per-kind table of a recorded soak
(drill/soak_table.py), against the 50-minute soak committed in
docs/bench/ and against small made-up soaks. No lab."""
import json
from pathlib import Path

from remusdb.drill import soak_table

SOAK_50 = Path(__file__).resolve().parents[2] / "docs/bench/soak-50.json"


def rows(result):
    return {line.split(" | ")[0].lstrip("| "): line for line in soak_table.markdown(result)[2:]}


def test_the_50_minute_soak_gives_the_published_rows():
    r = rows(json.loads(SOAK_50.read_text()))
    assert sorted(r) == ["backup-daemon", "cut-link", "etcd-member", "power", "primary-qemu",
                         "replica-full"]
    assert r["power"] == ("| power | 18 | 0 | 202, 204 | 148 | 808, 911 | 237, 315 | 7.5, 12.7 "
                          "| 13.4 | 3.8, 9.3; 0 |")
    assert r["replica-full"] == ("| replica-full | 18 | 0 | - | - | - | 100, 275 | 8.1, 9.4 | - "
                                 "| -; 18 |")


def fault(kind, lost=0, moved=None, how="protect", copy=None):
    vms = {"a": {"downtime_ms": 500.0, "lost": lost, "how": how, "disk_copy": copy or {}},
           "b": {"downtime_ms": 100.0, "lost": 0, "how": "already", "disk_copy": {}}}
    takeovers = [{"vm": moved, "detection_ms": 201, "takeover_ms": 120.0}] if moved else []
    return {"kind": kind, "vms": vms, "takeovers": takeovers, "protected_again_s": 6.0,
            "home_again_s": 9.0}


def test_one_lost_commit_and_who_moved_show():
    r = rows({"faults": [fault("power", lost=1, moved="a",
                               copy={"mode": "resync", "bytes_sent": 3 << 20}),
                         fault("power", moved="a", copy={"mode": "full", "bytes_sent": 1 << 30})]})
    cells = r["power"].strip("| ").split(" | ")
    assert cells[1:3] == ["2", "1"]              # two faults, one commit lost
    assert cells[5] == "500, 500"                # the VM taken over is "moved"
    assert cells[6] == "100, 100"                # the other one
    assert cells[9] == "3.0, 3.0; 1"             # one resync, one full copy apart


def test_a_vm_still_protected_copies_nothing():
    r = rows({"faults": [fault("etcd-member", how="already",
                               copy={"mode": "full", "bytes_sent": 1 << 30})]})
    assert r["etcd-member"].endswith("| -; 0 |")
