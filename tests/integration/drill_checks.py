"""The drills as the integration tests run them (tools/remusdb-drill, its
JSON the evidence) and what a passed drill must show: shared by
test_remus.py (failures) and test_switchover.py (the planned switchover)."""
import json
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DRILL = REPO / "tools" / "remusdb-drill"


def run_drill(tmp_path, *args):
    out = tmp_path / "drill.json"
    png = tmp_path / "drill.png"
    # --from-saved: the drill's VM restored, not booted (conftest.py says why).
    # --at 10 --after 2: the failure comes 10 s into the load (one full
    # tps_before window) and the load is planned to end 2 s past the drill's
    # 10 s takeover budget (failover.TAKEOVER_BUDGET_S), so it runs about
    # 11 s past the takeover (under 1 s here, a lazy restore's last page
    # included). That is every client's connections open and committing
    # before the failure, the takeover, the after-snapshot 5 s later, and
    # every client committing again, which is all check_drill judges; the
    # operator's default of 20 s each way only adds minutes to the suite.
    cmd = [str(DRILL), "--json", str(out), "--png", str(png), "--from-saved",
           "--at", "10", "--after", "2", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1500)
    print(r.stdout[-4000:], r.stderr[-4000:])
    assert out.exists(), f"the drill wrote no JSON (exit {r.returncode})"
    result = json.loads(out.read_text())
    assert png.exists() and png.stat().st_size > 10000
    return r.returncode, result


def survival_evidence(result):
    """The survival counts with the backends they come from: each
    pg_stat_activity snapshot's (application, pid, backend_start, port,
    state) rows, so that a failed count shows which backend went."""
    lines = [str(result["survival"])]
    for when in ("before", "after"):
        f = Path(result["workdir"]) / f"pg_stat_activity-{when}.json"
        try:
            rows = json.loads(f.read_text() or "[]") or []
        except (OSError, ValueError) as e:
            lines.append(f"{when}: unreadable ({e})")
            continue
        lines += [f"{when}: {r.get('application_name')} pid {r.get('pid')} "
                  f"{r.get('backend_start')} port {r.get('client_port')} {r.get('state')} "
                  f"at {r.get('taken_at')}" for r in rows]
    return "\n".join(lines)


def check_drill(rc, result):
    """A passed drill, with every figure it is judged by present and exact:
    survival is the server-side measure (drill/survival.py), counted for
    pgbench and the ledger apart."""
    assert result["failed_reason"] is None, result["verdict"]
    assert result["lost_acked_commits"] == 0, result
    assert result["acked_commits"] > 0
    assert result["amcheck_clean"], result
    assert result["takeover"] and result["clients_recovered"], result
    assert result["load_collapsed"] is None, result
    why = survival_evidence(result)
    assert result["pgbench_before"] == result["clients"], why
    assert result["pgbench_survived"] == result["pgbench_before"], why
    assert result["ledger_before"] == result["ledger_connections"] == 4, why
    assert result["ledger_survived"] == result["ledger_before"], why
    assert result["survival"]["pgbench_clients_committed_after_takeover"] == \
        list(range(result["clients"]))
    assert result["epochs"] > 0 and result["pause_ms_p50"] > 0
    # Both parts of every pause lie inside it, so neither part's p99 can exceed the pause's.
    parts = result["primary_status_before_failure"]["pause_parts"]
    assert 0 < parts["bitmap_sync_ms_p99"] <= result["pause_ms_p99"], parts
    assert 0 < parts["stop_ms_p99"] <= result["pause_ms_p99"], parts
    # QEMU's RESUME ends each pause as the guest has it (primary/checkpoint_resume.h):
    # seen for the checkpoints, and after our LOADED by QEMU's own stamp
    assert parts["resumes_seen"] > 0, parts
    assert parts["resumes_missed"] + parts["resumes_unmeasured"] <= \
        max(1, parts["resumes_seen"] // 100), parts
    assert 0 < parts["resume_ms_p99"] <= parts["guest_pause_ms_p99"], parts
    # /metrics' histogram of the guest's pauses counts each measured RESUME
    hist = result["primary_status_before_failure"]["guest_pause_histogram"]
    assert hist["count"] == parts["resumes_seen"], (hist, parts)
    # The primary's memory account: its parts add up, the compression cache
    # (on by default) is allocated, and the pipeline held epochs.
    mem = result["primary_status_before_failure"]["memory"]
    assert mem["held_bytes"] == sum(mem[k] for k in (
        "pipeline_bytes", "held_for_order_bytes", "compress_cache_bytes", "output_held_bytes",
        "send_backlog_bytes")), mem
    assert mem["compress_cache_bytes"] > 0, mem
    assert mem["pipeline_peak_bytes"] >= max(mem["pipeline_bytes"], 1 << 20), mem
    assert result["accel"] in ("kvm", "tcg")
    # the lab runs the daemon's default timeout, which the issue caps at 300 ms
    assert result["peer_timeout_ms"] is not None and result["peer_timeout_ms"] <= 300
    assert result["detection_ms"] is not None and result["downtime_ms"] > 0
    workdir = Path(result["workdir"])
    for name in ("pgbench.out", "ledger.out", "ledger.ids", "pg_stat_activity-before.json",
                 "pg_stat_activity-after.json", "result.json"):
        assert (workdir / name).stat().st_size > 0, name
    assert list(workdir.glob("pgbench_log.*"))
    assert rc == 0
