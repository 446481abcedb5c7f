"""Remus end to end: real QEMU guests under COLO checkpointing, a real
backup remusdbd, real etcd, PostgreSQL clients in rdb-client.

The drills run through tools/remusdb-drill exactly as an operator would
(its JSON is the evidence); the other tests drive the same pieces to
cover what a drill does not: the backup dying, a partition in which both
hosts still reach etcd, and a backup with the wrong key."""
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from remusdb.lab import netns, vm, workload
from remusdb import failback, paths, protection
from remusdb.drill.lab import forget_ownership, stop_vm_everywhere
from drill_checks import check_drill, run_drill
from polling import acked_count, wait_for, wait_for_acks

REPO = Path(__file__).resolve().parents[2]


def restart_daemon(host, **env):
    """Restarts a host's remusdbd with env added to its environment
    (vm.py reads REMUSDBD_EXTRA_ARGS and REMUSDB_PSK_FILE from there)."""
    vm.stop_daemon(host)
    os.environ.update(env)
    try:
        vm.ensure_daemon(host)
    finally:
        for name in env:
            del os.environ[name]


def restart_backup_daemon(**env):
    restart_daemon("backup", **env)


def test_lazy_takeover_drill(lab, tmp_path):
    """--restore lazy: the backup's QEMU runs from the device state at once
    and pulls the committed image by postcopy; the drill's verdict is the
    same (no acknowledged commit lost, every connection survived), and the
    backup's status shows the image went out lazily, every page of it."""
    try:
        rc, result = run_drill(tmp_path, "--mode", "power", "--vm", "dlazy", "--interval", "50",
                               "--restore", "lazy", "--workdir", str(tmp_path / "drills"))
    finally:
        vm.stop_daemon("backup")  # the next tests get the default restore
    check_drill(rc, result)
    fo = result["failover"]
    assert fo["restore"] == "lazy", fo
    lazy = fo["lazy"]
    assert lazy["complete"], fo
    # The guest asked for pages itself: it ran before the image was all out.
    assert lazy["pages_requested"] > 0, fo
    assert lazy["all_pages_ms"] > fo["restore_ms"], fo


def test_kill_primary_drill(lab, tmp_path):
    """The backup's daemon also runs a --fence-command: it must run once,
    before the takeover, with the VM and the old owner in its environment.
    It restores eagerly (--restore eager), so that the restore which
    streams every page stays under test beside the default shared one."""
    fenced = tmp_path / "fenced.txt"
    fence = tmp_path / "fence.sh"
    fence.write_text(f'#!/bin/sh\necho "$REMUSDB_VM $REMUSDB_PRIMARY" >> {fenced}\n')
    fence.chmod(0o755)
    restart_backup_daemon(REMUSDBD_EXTRA_ARGS=f"--fence-command {fence} --restore eager")
    try:
        rc, result = run_drill(tmp_path, "--mode", "kill", "--vm", "dkill", "--interval", "50",
                               "--workdir", str(tmp_path / "drills"))
        log = (paths.host_run_dir("backup") / "remusdbd.log").read_text()
    finally:
        vm.stop_daemon("backup")
    check_drill(rc, result)
    fo = result["failover"]
    # every page of the guest's RAM in use went through the stream (the
    # shared restore's stream is the small blocks alone, about 0.3 MiB)
    assert fo["restore"] == "eager" and fo["stream_bytes"] > 64 << 20, fo
    assert fenced.read_text() == "dkill primary\n"
    assert f"vm dkill: fencing command '{fence}' succeeded" in log


def test_two_vcpu_power_loss_drill(lab, tmp_path):
    """A guest with two vCPUs (multi-threaded TCG here) checkpoints and
    fails over like a single one: the power-loss drill passes with every
    acknowledged commit kept, and the guest itself counted two vCPUs
    online (the drill refuses to run otherwise)."""
    rc, result = run_drill(tmp_path, "--mode", "power", "--vm", "dsmp", "--cpus", "2",
                           "--interval", "50", "--workdir", str(tmp_path / "drills"))
    check_drill(rc, result)
    assert result["cpus"] == 2 and result["guest_vcpus_online"] == 2, result
    assert result["failover"]["command"].count("-smp") == 1, result["failover"]
    assert result["failover"]["command"][result["failover"]["command"].index("-smp") + 1] == "2"


def test_cut_link_drill_with_three_etcd_members(lab, tmp_path):
    from remusdb.lab import witness
    witness.start(members=3)
    try:
        rc, result = run_drill(tmp_path, "--mode", "cut-link", "--vm", "dcut", "--interval", "100",
                               "--workdir", str(tmp_path / "drills"))
    finally:
        netns.sh("ip", "-n", netns.LAN_NS, "link", "set", "p-primary", "up")
        witness.start(members=1)
    check_drill(rc, result)


# ---------------------------------------------------------------- the rest

@pytest.fixture
def primary_without_reprotect(lab):
    """The primary's remusdbd runs with automatic re-protection off for the
    test (requested before protected_vm, so the VM starts under it), and is
    stopped afterwards so that the next test's starts with the defaults."""
    stop_vm_everywhere("rtest")
    restart_daemon("primary", REMUSDBD_EXTRA_ARGS="--reprotect off")
    yield
    stop_vm_everywhere("rtest")
    vm.stop_daemon("primary")


@pytest.fixture
def protected_vm(lab):
    name = "rtest"
    stop_vm_everywhere(name)
    forget_ownership(name)
    files = vm.start(name, "primary", from_saved=True, wait_timeout=400)
    vm.ensure_daemon("backup")
    protection.protect(name, "10.77.0.2:7788", 50)
    protection.wait_protected(name, timeout=900)
    yield {"name": name, "files": files}
    for ns, peer in (("rdb-primary", "10.77.0.2"), ("rdb-backup", "10.77.0.1")):
        netns.in_ns(ns, "ip", "route", "del", "blackhole", f"{peer}/32", check=False,
                    capture=True)
    stop_vm_everywhere(name)



def primary_state(name):
    p = protection.primary_protection("primary", name)
    return p["state"] if p else None


def kill_backup_daemon():
    """SIGKILL of the backup host's remusdbd: no goodbye, no flush; the
    replica's file and change log stay as its page cache holds them."""
    pid = int((paths.host_run_dir("backup") / "remusdbd.pid").read_text())
    os.kill(pid, 9)
    wait_for(lambda: not vm.daemon_running("backup"), 10, "the backup's remusdbd to die")
    return time.monotonic()


def end_ledger(ledger):
    """The ledger's planned end, now (SIGUSR1, ledger.py): it finishes the
    commit in flight and exits 0."""
    ledger.send_signal(signal.SIGUSR1)
    ledger.wait(timeout=60)


def test_backup_death_leaves_primary_running_unprotected(primary_without_reprotect,
                                                         protected_vm, tmp_path):
    """With --reprotect off (the negative control of automatic
    re-protection), a primary that lost its backup runs on unprotected and
    stays so when the backup's daemon comes back."""
    name = protected_vm["name"]
    ledger_file = tmp_path / "ledger.txt"
    # Planned for long enough, and ended once commits are seen after the
    # backup's death (the 8 s below among them).
    ledger = workload.start_ledger(vm.DEFAULT_IP, ledger_file, 60)
    wait_for_acks(ledger_file, 5, what="commits before the backup dies")
    # The backup host's daemon dies.
    pid = int((paths.host_run_dir("backup") / "remusdbd.pid").read_text())
    os.kill(pid, 9)
    wait_for(lambda: primary_state(name) == "unprotected", 30, "the primary to go unprotected")
    p = protection.primary_protection("primary", name)
    assert "UNPROTECTED" in (p["error"] or ""), p
    log = (paths.host_run_dir("primary") / "remusdbd.log").read_text()
    assert "RUNNING UNPROTECTED" in log
    assert p["reprotect"]["enabled"] is False and "off" in p["reprotect"]["verdict"], p
    assert p["reprotect"]["next_attempt_in_ms"] is None, p
    before = acked_count(ledger_file)
    # The backup comes back: nothing protects the VM again by itself. 8 s
    # hold the first four tries (1 + 2 + 4 s) re-protection would make.
    vm.ensure_daemon("backup")
    time.sleep(8)
    p = protection.primary_protection("primary", name)
    assert p["state"] == "unprotected", p
    assert p["reprotect"]["attempts"] == 0, p
    assert protection.replica("backup", name) is None
    wait_for(lambda: acked_count(ledger_file) > before + 20, 60,
             "the load to go on after the backup died")
    end_ledger(ledger)
    acked = workload.ledger_acked_ids(ledger_file)
    assert ledger.returncode == 0 and len(acked) > before + 20
    assert workload.missing_acked(vm.DEFAULT_IP, acked) == []


def reprotect_status(name):
    p = protection.primary_protection("primary", name) or {}
    return p.get("state"), p.get("reprotect") or {}


def test_backup_death_and_return_reprotects_by_itself(protected_vm, tmp_path):
    """Automatic re-protection: the backup's remusdbd is SIGKILLed under
    the commit ledger; the primary runs on unprotected and tries the
    backup, 1 s doubling; the backup's daemon is restarted and the VM is
    protected again by itself, its disk resynced by changed extents (the
    replica's file is still the generation it protected to: the daemon
    died, not the host's page cache; both disks then hash the same at a
    held checkpoint), the etcd ownership unchanged, and no acknowledged
    commit lost. Then the backup dies again and the operator's
    `unprotect` during the gap ends the tries: the returning backup gets
    nothing."""
    name = protected_vm["name"]
    first_copy = protection.primary_protection("primary", name)["disk_copy"]
    ledger_file = tmp_path / "ledger.txt"
    # Long enough for any re-protection here; stopped once it is seen.
    ledger = workload.start_ledger(vm.DEFAULT_IP, ledger_file, 300)
    try:
        wait_for_acks(ledger_file, 5, what="commits before the backup dies")
        died = kill_backup_daemon()
        wait_for(lambda: reprotect_status(name)[0] == "unprotected", 30,
                 "the primary to go unprotected")
        gap = protection.primary_protection("primary", name)
        generation = gap["generation"]
        # The tries while nobody answers: refused connects, 1 s then 2 s apart.
        wait_for(lambda: reprotect_status(name)[1].get("attempts", 0) >= 2, 15,
                 "two tries of the dead backup")  # the gap's own: none before it
        state, r = reprotect_status(name)
        print("during the gap:", json.dumps(r))
        assert state == "unprotected" and r["state"] in ("waiting", "probing"), r
        assert r["unprotected_since"] and r["unprotected_seconds"] > 0, r
        assert "refused" in (r["last_error"] or ""), r
        assert r["verdict"] is None, r

        vm.ensure_daemon("backup")
        restarted = time.monotonic()
        wait_for(lambda: reprotect_status(name)[0] == "protected", 300,
                 "the primary to protect the VM again by itself")
        protected_at = time.monotonic()
        p = protection.primary_protection("primary", name)
        wait_for_acks(ledger_file, acked_count(ledger_file) + 10, what="commits, protected again")
    finally:
        ledger.terminate()
        ledger.wait(timeout=30)
    r = p["reprotect"]
    print(f"re-protection: {protected_at - restarted:.1f} s from the backup daemon's restart, "
          f"{protected_at - died:.1f} s from its death (the primary's own gap: "
          f"{r['last_gap_seconds']:.1f} s, {r['attempts']} tries)")
    print("disk copies: first", json.dumps(first_copy), "then", json.dumps(p["disk_copy"]))
    assert r["reprotections"] == 1 and r["is_reprotection"], r
    assert r["state"] == "idle" and r["unprotected_since"] is None, r
    assert r["unprotected_seconds"] == 0 and r["next_attempt_in_ms"] is None, r
    assert 0 < r["last_gap_seconds"] < protected_at - died + 1, r
    assert r["attempts"] >= 3, r  # two refused, at least one that got through
    # etcd: the primary kept the VM throughout; re-protection changed nothing.
    assert p["generation"] == generation, (generation, p)
    # The disk: only changed extents, not a full copy.
    copy = p["disk_copy"]
    assert copy["mode"] == "resync", copy
    assert "both of generation" in copy["reason"], copy
    assert copy["bytes_sent"] < first_copy["bytes_sent"] / 4, (first_copy, copy)
    replica = protection.replica("backup", name)
    assert replica["state"] == "ready" and replica["disk_base"]["mode"] == "resync", replica
    acked = workload.ledger_acked_ids(ledger_file)
    assert acked, "no commit was acknowledged"
    assert workload.missing_acked(vm.DEFAULT_IP, acked) == []
    # The resync left nothing out: both files hashed at a held checkpoint
    # (test_failback.py's omitted-extent control shows this catches one extent).
    compare = failback.disk_compare(name, "primary")
    assert compare["equal"], compare["differing_extents"][:20]

    # The operator ends a gap's tries: `remusdb unprotect` while unprotected.
    kill_backup_daemon()

    def gap_with_a_try():
        # attempts alone would still count the closed gap's tries
        state, r = reprotect_status(name)
        return state == "unprotected" and r.get("unprotected_since") and r.get("attempts", 0) >= 1
    wait_for(gap_with_a_try, 30, "the primary unprotected again, and a try of the dead backup")
    out = subprocess.run([str(REPO / "tools" / "remusdb"), "unprotect", name],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    state, r = reprotect_status(name)
    print("after unprotect:", json.dumps(r))
    assert state == "unprotected" and r["state"] == "idle", r
    assert r["next_attempt_in_ms"] is None and "operator" in r["verdict"], r
    vm.ensure_daemon("backup")
    time.sleep(8)  # longer than the next two tries would have waited
    state, r = reprotect_status(name)
    assert state == "unprotected" and r["reprotections"] == 1, r
    assert protection.replica("backup", name) is None


# Which side falls silent first decides, most of the time, who asks etcd
# first and wins: the backup's packets stop first -> the primary notices
# first (and its goodbye never reaches the backup, whose link merely goes
# quiet); the primary's stop first -> the backup notices first.
SILENCE_ORDERS = {"backup-first": ["rdb-backup", "rdb-primary"],
                  "primary-first": ["rdb-primary", "rdb-backup"]}
PEER_OF = {"rdb-primary": "10.77.0.2", "rdb-backup": "10.77.0.1"}


@pytest.mark.parametrize("order", sorted(SILENCE_ORDERS))
def test_partition_with_both_sides_reaching_etcd_has_one_winner(protected_vm, tmp_path, order):
    """Only the replication link breaks; both hosts still reach etcd.
    Whoever wins the compare-and-swap serves; the other must not, and the
    loser settles (the backup goes passive rather than asking forever)."""
    name = protected_vm["name"]
    ledger_file = tmp_path / "ledger.txt"
    # Planned for long enough; ended once the winner has acknowledged
    # commits of its own after the decision.
    ledger = workload.start_ledger(vm.DEFAULT_IP, ledger_file, 60)
    wait_for_acks(ledger_file, 5, what="commits before the partition")
    first, second = SILENCE_ORDERS[order]
    partition_began = time.time()
    netns.in_ns(first, "ip", "route", "add", "blackhole", f"{PEER_OF[first]}/32")
    time.sleep(0.1)  # half the lab's peer timeout: the other side still hears
    netns.in_ns(second, "ip", "route", "add", "blackhole", f"{PEER_OF[second]}/32")

    def decided():
        p = primary_state(name)
        r = protection.replica("backup", name)
        r = r["state"] if r else None
        if (p, r) in (("unprotected", "passive"), ("fenced", "active")):
            return p, r
        return None
    outcome = wait_for(decided, 60, "exactly one side to win")
    print(f"partition ({order} silenced) outcome (primary, backup):", outcome)
    serving = "primary" if outcome[0] == "unprotected" else "backup"
    idle = "backup" if serving == "primary" else "primary"
    if idle == "primary":
        assert protection.qemu_running("primary", name)  # paused, not gone
        status = protection.request("primary", "status")
        vm_status = next(v for v in status["vms"] if v["name"] == name)
        wait_for(lambda: next(v for v in protection.request("primary", "status")["vms"]
                              if v["name"] == name)["run_state"] == "paused", 10,
                 "the fenced primary's VM to pause")
        assert vm_status["protection"]["held_frames"] == 0
    else:
        # The backup started no QEMU: none runs there, and no pidfile was
        # written since the partition (one from an earlier run's takeover
        # whose QEMU crashed may lie in the lab's /run, as on 2026-11-27).
        assert not protection.qemu_running("backup", name)
        pidfile = paths.vm_run_dir("backup", name) / "qemu.pid"
        assert not pidfile.exists() or pidfile.stat().st_mtime < partition_began, pidfile
    wait_for_acks(ledger_file, acked_count(ledger_file) + 10,
                  what=f"commits served by the {serving}")
    end_ledger(ledger)
    acked = workload.ledger_acked_ids(ledger_file)
    assert acked, "no commit was acknowledged"
    assert workload.missing_acked(vm.DEFAULT_IP, acked) == []


def test_wrong_preshared_key_is_refused(lab, tmp_path):
    name = "wrongkey"
    stop_vm_everywhere(name)
    forget_ownership(name)
    # A backup daemon with another key: restart it with REMUSDB_PSK_FILE.
    other = tmp_path / "other.psk"
    fd = os.open(other, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, os.urandom(32).hex().encode())
    os.close(fd)
    restart_backup_daemon(REMUSDB_PSK_FILE=str(other))
    try:
        vm.start(name, "primary", from_saved=True, wait=False)
        protection.protect(name, "10.77.0.2:7788", 50)
        with pytest.raises(protection.ProtectionError) as e:
            protection.wait_protected(name, timeout=60)
        text = str(e.value)
        print(text)
        assert "pre-shared keys differ" in text
        log = (paths.host_run_dir("backup") / "remusdbd.log").read_text()
        assert "authentication failed" in log
    finally:
        vm.stop(name, "primary")
        vm.stop_daemon("backup")
