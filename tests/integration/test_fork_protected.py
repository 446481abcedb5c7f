"""A fork of a protected VM, from its backup's committed image (docs/fork.md):
real QEMU under COLO checkpointing, the real backup remusdbd, PostgreSQL
under pgbench. The primary is never asked for anything: the backup's
remusdbd fork()s itself at a commit, its child serves the frozen image,
and its disk replica is frozen by copy-on-write while the epochs go on.

What must hold: the parent stays protected and keeps committing epochs;
the clone becomes a streaming replica of the parent and matches it at an
equal LSN; the backup committed epochs past the fork's while serving it
(so the clone really was served a frozen image, not the live one), and
its commits preserved disk blocks for the snapshot. Once the fork is
released, the backup's image is back in the memfds a takeover maps, page
for page the guest's memory (ram_image.h: the image is kept apart from
them while the fork's child reads them)."""
import json
import os
import time

import pytest

from remusdb import control, fork, image_check, protection
from remusdb.lab import netns, vm, workload
from remusdb.drill.lab import forget_ownership, stop_vm_everywhere
from pgbench_load import PgbenchLoad
from polling import wait_for
from test_fork import CHECKSUM_SQL, guest_sql, in_parallel, replayed_checksum

PARENT = "fprot"
PARENT_IP = f"{netns.SUBNET_PREFIX}.14"


@pytest.fixture(scope="module")
def protected_parent(lab):
    for name in (PARENT, f"{PARENT}c1"):
        stop_vm_everywhere(name)
    forget_ownership(PARENT)
    try:
        vm.start(PARENT, "primary", ip=PARENT_IP, from_saved=True, wait_timeout=400)
        vm.ensure_daemon("backup")
        protection.protect(PARENT, "10.77.0.2:7788", 100)
        protection.wait_protected(PARENT, timeout=900)
        yield {"name": PARENT, "ip": PARENT_IP}
    finally:  # a failed setup too: its VM must not outlive the module
        stop_vm_everywhere(f"{PARENT}c1")
        stop_vm_everywhere(PARENT)


def test_fork_of_a_protected_vm_comes_from_its_backup(protected_parent):
    # The load runs from before the fork until the clone is checked, however
    # long the fork takes, and stops there (pgbench_load.py).
    bench = PgbenchLoad(PARENT_IP, clients=2)
    clones = []
    try:
        bench.wait_connected()  # both pgbench streams are running
        before = protection.primary_protection("primary", PARENT)
        fork_start = time.monotonic()
        report = fork.fork(PARENT, 1, hosts=["primary"], role="replica",
                           connect_via=netns.client_call,
                           on_registered=clones.append)
        fork_end = time.monotonic()
        clones = report["clones"]
        c = clones[0]
        f = report["fork"]
        print(json.dumps({"marks": report["marks"], "fork": {
            k: f.get(k) for k in ("id", "from", "epoch", "backup_fork_call_ms", "capture")},
            "clone": {k: c[k] for k in ("name", "host", "ip", "running_s", "first_query_s")}},
            indent=1))
        # The fork came from the backup: the protected parent was not asked to migrate.
        assert report["source_host"] == "backup"
        assert f["from"] == "backup" and f["epoch"] > 0, f
        # The clone is a hot standby of the parent at its own address.
        assert workload.psql(c["ip"], "SELECT pg_is_in_recovery()") == "t"
        assert workload.psql(c["ip"], "SELECT inet_server_addr()") == c["ip"]
        load = bench.finish()
        print(f"load: {load['runs']} pgbench runs, {load['transactions']} transactions, "
              f"longest idle {load['longest_idle_s']} s")
        # A verdict needs a load, and the parent stayed protected through it.
        assert load["exit_code"] == 0, load["output"][-2000:]
        assert load["transactions"] and load["transactions"] > 0
        assert load["started"] < fork_start and load["ended"] > fork_end, load
        after = protection.primary_protection("primary", PARENT)
        assert after["state"] == "protected", after
        replica = protection.replica("backup", PARENT)
        assert replica["state"] == "ready", replica
        # The backup went on committing while its child served the frozen
        # image of the fork's epoch; its commits preserved the blocks they
        # overwrote for the clone's disk.
        assert replica["committed_epoch"] > f["epoch"] + 10, (replica["committed_epoch"], f)
        live = fork.fork_status("backup", PARENT)
        assert live["disk"]["blocks_preserved"] > 0, live["disk"]
        # the daemon's commits went to its private view, not to the child's memfds
        assert replica["image"]["in_memfd"] is False, replica["image"]
        # The primary's checkpoints went on through the fork.
        assert after["epochs"] > before["epochs"], (before["epochs"], after["epochs"])
        print(f"primary epochs: {before['epochs']} -> {after['epochs']}; backup at epoch "
              f"{replica['committed_epoch']}, fork of epoch {f['epoch']}; "
              f"disk blocks preserved {live['disk']['blocks_preserved']}, "
              f"read by the clone {live['disk']['bytes_read']} bytes")
        # Consistent with the parent at an equal LSN.
        target = workload.psql(PARENT_IP, "SELECT pg_current_wal_lsn()")
        expected, got = in_parallel(lambda: workload.psql(PARENT_IP, CHECKSUM_SQL),
                                    lambda: replayed_checksum(c["ip"], target))
        assert got == expected
        # Negative control: one row changed on the parent while the clone's
        # replay is paused must show as a difference.
        guest_sql(c["host"], c["name"], "SELECT pg_wal_replay_pause()")
        workload.psql(PARENT_IP, "UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = 1")
        behind, changed = in_parallel(lambda: workload.psql(c["ip"], CHECKSUM_SQL),
                                      lambda: workload.psql(PARENT_IP, CHECKSUM_SQL))
        assert behind == expected != changed
        guest_sql(c["host"], c["name"], "SELECT pg_wal_replay_resume()")
    finally:
        bench.finish()
        fork.stop_clones(clones)
        try:
            last = fork.release(PARENT)
            print(f"released: {last.get('id')} ({last.get('state')})")
        except (fork.ForkError, control.ControlError) as e:
            print(f"release: {e}")
    # Released: the commits made meanwhile went back into the memfds, and the
    # image there is the guest's memory at a held checkpoint, page for page.
    # (written back a slice per loop turn: wait for the last)
    wait_for(lambda: protection.replica("backup", PARENT)["image"]["in_memfd"], 30,
             "the image back in its memfds after the fork's release")
    dump = f"/dev/shm/rdb-{PARENT}-itest-memory.dump"
    sums = f"/dev/shm/rdb-{PARENT}-itest-backup.sums"
    try:
        held = image_check.capture(PARENT, dump, sums, 1024 << 20)
        differ = image_check.differing_pages(image_check.page_sums_of_dump(dump),
                                             image_check.page_sums_of_backup(sums))
        print(f"after the release: held checkpoint {held}, {len(differ)} pages differ")
        assert differ == []
    finally:
        for f in (dump, sums):
            if os.path.exists(f):
                os.unlink(f)


def system_identifier(ip):
    return workload.psql(ip, "SELECT system_identifier FROM pg_control_system()")


def test_a_copy_forked_from_the_backup_is_an_independent_writable_database(protected_parent):
    """`remusdb fork --role copy`, end to end, from the backup's image (the
    replica's second fork: the first was released). The copy has the
    parent's data, its own system_identifier, and takes writes the parent
    never sees; the control is the parent's identifier, read the same way."""
    workload.psql(PARENT_IP, "CREATE TABLE IF NOT EXISTS fork_marker (v int)")
    workload.psql(PARENT_IP, "INSERT INTO fork_marker VALUES (42)")
    parent_id = system_identifier(PARENT_IP)
    clones = []
    try:
        report = fork.fork(PARENT, 1, hosts=["backup"], role="copy",
                           connect_via=netns.client_call,
                           on_registered=clones.append)
        clones = report["clones"]
        c = clones[0]
        assert report["source_host"] == "backup" and report["fork"]["from"] == "backup"
        assert workload.psql(c["ip"], "SELECT pg_is_in_recovery()") == "f"
        copy_id = system_identifier(c["ip"])
        print(f"parent system_identifier {parent_id}, copy {copy_id}")
        assert copy_id and parent_id and copy_id != parent_id
        assert system_identifier(PARENT_IP) == parent_id  # the same read gives the same id
        # The parent's committed row came along; the copy's own write stays its own.
        assert workload.psql(c["ip"], "SELECT count(*) FROM fork_marker WHERE v = 42") == "1"
        workload.psql(c["ip"], "INSERT INTO fork_marker VALUES (7)")
        assert workload.psql(c["ip"], "SELECT count(*) FROM fork_marker WHERE v = 7") == "1"
        assert workload.psql(PARENT_IP, "SELECT count(*) FROM fork_marker WHERE v = 7") == "0"
    finally:
        fork.stop_clones(clones)
        try:
            fork.release(PARENT)
        except (fork.ForkError, control.ControlError) as e:
            print(f"release: {e}")
