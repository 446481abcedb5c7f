"""An operator's `unprotect` under load ends protection on both sides and
nothing else: the backup drops its replica and stays passive, the VM
keeps running on the primary alone, and its clients notice nothing.

Why it needs a test: the primary's BYE travels behind whatever epoch data
is still queued. A primary that closed its socket with the backup's acks
unread sent an RST, which throws away unsent data, so the backup saw a
reset instead of the BYE, took it for a dead primary, won etcd and
started a second copy of the VM (split brain). The primary now sends a
FIN after the BYE and waits for the backup's close (repl_conn_finish).
The unprotects land while pgbench runs and the guest's rdb-dirty rewrites
256 MiB at up to 1 GiB/s, protected at 25 ms with output commit and both
memory optimizations off: megabytes per epoch, so the connection's
queue is long and checkpoints are in flight when the unprotect arrives.
Honest limit: on this machine the old close() did not lose the BYE in 8
such rounds (the veth drains megabytes fast), so this test guards the
outcome; the mechanism and its control are in tests/unit/test_repl_conn.c,
where a plain close loses the BYE to an RST every time."""
import threading
import time

import pytest
from conftest import fresh_guest

from remusdb import guest_agent, protection
from remusdb.lab import vm, workload
from remusdb.drill.lab import forget_ownership

NAME = "unprot"
BACKUP = "10.77.0.2:7788"
ROUNDS = 3
RDB_DIRTY = "/usr/local/bin/rdb-dirty"
RAW = {"compress": False, "read_tracking": False}


@pytest.fixture(scope="module")
def guest(lab):
    with fresh_guest(NAME) as name:
        yield name


def settled_replica_state():
    """The backup's replica state once it stops changing (5 s at most)."""
    last, since = None, time.monotonic()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        r = protection.replica("backup", NAME)
        state = r.get("state") if r else None
        if state != last:
            last, since = state, time.monotonic()
        elif time.monotonic() - since > 1.0:
            break
        time.sleep(0.1)
    return last


def test_unprotect_under_load_leaves_the_backup_passive(guest):
    outcomes = []
    for round_no in range(ROUNDS):
        forget_ownership(NAME)
        protection.protect(NAME, BACKUP, 25, output_commit=False, options=RAW)
        protection.wait_protected(NAME, timeout=900)
        qga = vm.vm_files("primary", NAME)["qga"]
        # Both loads run on for seconds after the unprotect lands (at 5 s).
        writer = guest_agent.start(qga, [RDB_DIRTY, "--buffer-mb", "256", "--rate-mb", "1024",
                                         "--seconds", "10", "--mode", "dense"])
        load = {}
        runner = threading.Thread(target=lambda: load.update(
            workload.pgbench(vm.DEFAULT_IP, seconds=9, clients=4)))
        runner.start()
        time.sleep(5)
        before = protection.primary_protection("primary", NAME)
        protection.unprotect(NAME)
        state = settled_replica_state()
        runner.join()
        dirty = guest_agent.finish(qga, writer, timeout=60)
        after = protection.primary_protection("primary", NAME)
        outcome = {
            "round": round_no, "epoch_before": before.get("epoch"),
            "backlog_bytes_before": (before.get("pipeline") or {}).get("held_for_order_bytes"),
            "backup_state": state, "primary_state": after.get("state"),
            "qemu_on_backup": protection.qemu_running("backup", NAME),
            "pgbench_exit": load.get("exit_code"), "transactions": load.get("transactions"),
            "rdb_dirty_exit": dirty.get("exitcode"),
            "mb_per_epoch_before": round((before.get("bytes_per_epoch_mean") or 0) / 2**20, 1),
        }
        print(outcome)
        outcomes.append(outcome)
        if outcome["qemu_on_backup"]:
            vm.stop(NAME, "backup")  # the next round needs a clean backup
    for o in outcomes:
        assert o["backup_state"] == "passive", outcomes
        assert not o["qemu_on_backup"], outcomes
        assert o["primary_state"] == "unprotected", outcomes
        # A non-empty load ran across the unprotect and finished cleanly.
        assert o["pgbench_exit"] == 0 and o["transactions"], outcomes
        assert o["rdb_dirty_exit"] == 0, outcomes
