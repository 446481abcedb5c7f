"""A restart of the primary's own remusdbd (docs/operations.md, "A restart
of the primary's remusdbd"): `protect` keeps its settings in the state dir
(primary/protect_settings.c), and a restarted daemon protects the VM again
from them, by the re-protection path, once etcd has left the VM with it.

The primary's remusdbd is SIGKILLed under the commit ledger and started
again at once. Both daemons run with an 8 s peer timeout, so the restart
is quicker than the backup's failure detector: the backup, seeing the
connection close, waits for it (backup/failover.c, failover_primary_closed)
instead of taking over, the restarted primary wins etcd's compare-and-swap
and re-protects. The measure is the time from the SIGKILL (and from the
restart) to "protected" again; nothing the ledger saw acknowledged may be
lost. The negative control removes the kept settings before the restart:
the VM then runs on unprotected, with nothing trying the backup.

A restart slower than the detector is a failover (the backup wins etcd)
and the restarted primary fences its copy; test_remus.py's kill drill and
test_host_recovery.py cover that side."""
import json
import os
import signal
import time

import pytest

from remusdb import paths, protection
from remusdb.drill.lab import forget_ownership, stop_vm_everywhere
from remusdb.lab import vm, workload
from polling import acked_count, wait_for, wait_for_acks

NAME = "prestart"
BACKUP = f"10.77.0.2:{vm.REPLICATION_PORT}"
# Longer than a restart of the lab's daemon takes, so that it beats the backup's detector.
TIMINGS = "--peer-timeout-ms 8000"


def start_daemons():
    for host in ("primary", "backup"):
        vm.stop_daemon(host)
    os.environ["REMUSDBD_EXTRA_ARGS"] = TIMINGS
    try:
        for host in ("primary", "backup"):
            vm.ensure_daemon(host)
    finally:
        del os.environ["REMUSDBD_EXTRA_ARGS"]


def restart_primary_daemon():
    os.environ["REMUSDBD_EXTRA_ARGS"] = TIMINGS
    try:
        vm.ensure_daemon("primary")
    finally:
        del os.environ["REMUSDBD_EXTRA_ARGS"]


def log_size(host):
    path = paths.host_run_dir(host) / "remusdbd.log"
    return path.stat().st_size if path.exists() else 0


def log_since(host, offset):
    with open(paths.host_run_dir(host) / "remusdbd.log", "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def settings_file():
    return paths.host_state_dir("primary") / "protect-settings" / f"{NAME}.json"


@pytest.fixture
def protected(lab):
    stop_vm_everywhere(NAME)
    forget_ownership(NAME)
    start_daemons()
    vm.start(NAME, "primary", from_saved=True, wait_timeout=400)
    protection.protect(NAME, BACKUP, 50)
    p = protection.wait_protected(NAME, timeout=900)
    yield p
    stop_vm_everywhere(NAME)
    for host in ("primary", "backup"):
        vm.stop_daemon(host)  # the next module's daemons start with the defaults


def kill_primary_daemon():
    pid = vm.daemon_pid("primary")
    assert pid
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not vm.daemon_running("primary"), 10, "the primary's remusdbd to die")
    return time.monotonic()


def protection_now():
    return protection.primary_protection("primary", NAME) or {}


def test_primary_daemon_restart_reprotects(protected, tmp_path):
    kept = json.loads(settings_file().read_text())
    assert kept["format"] == "remusdb-protect-settings" and kept["version"] == 1, kept
    assert kept["backup"] == BACKUP and kept["interval_ms"] == 50, kept
    generation = protected["generation"]
    ledger_file = tmp_path / "ledger.txt"
    ledger = workload.start_ledger(vm.DEFAULT_IP, ledger_file, 300)
    try:
        wait_for_acks(ledger_file, 5, what="first commits")
        acked_before = acked_count(ledger_file)
        logs = {host: log_size(host) for host in ("primary", "backup")}
        killed = kill_primary_daemon()
        restart_primary_daemon()
        restarted = time.monotonic()
        # The backup waits for its detector: no takeover, the replica stays.
        r = protection.replica("backup", NAME)
        print("backup right after the restart:", r and {k: r.get(k) for k in
                                                       ("state", "error")})
        wait_for(lambda: protection_now().get("state") == "protected"
                 and protection_now()["reprotect"]["reprotections"] >= 1, 600,
                 "the restarted primary to protect the VM again by itself")
        protected_at = time.monotonic()
        p = protection_now()
        wait_for_acks(ledger_file, acked_count(ledger_file) + 10,
                      what="commits, protected again")
    finally:
        ledger.terminate()
        ledger.wait(timeout=30)
    r = p["reprotect"]
    print(f"re-protection after the primary daemon's SIGKILL: {protected_at - killed:.1f} s "
          f"from the kill, {protected_at - restarted:.1f} s from the restart (the daemon's "
          f"own gap: {r['last_gap_seconds']:.1f} s, {r['attempts']} tries); disk copy "
          f"{json.dumps(p['disk_copy'])}")
    assert r["after_restart"] and r["is_reprotection"] and r["reprotections"] == 1, r
    assert r["state"] == "idle" and r["unprotected_since"] is None, r
    assert 0 < r["last_gap_seconds"] < protected_at - killed + 1, r
    # etcd: the restarted primary's compare-and-swap moved the generation on, and kept it.
    assert p["generation"] == generation + 1, (generation, p)
    replica = protection.replica("backup", NAME)
    assert replica["state"] == "ready", replica
    backup_log = log_since("backup", logs["backup"])
    assert f"vm {NAME}: the primary's connection closed" in backup_log
    assert f"vm {NAME}: TOOK OVER" not in backup_log
    primary_log = log_since("primary", logs["primary"])
    assert "counted from this daemon's restart" in primary_log
    assert settings_file().exists()
    acked = workload.ledger_acked_ids(ledger_file)
    assert len(acked) > acked_before, "no commit was acknowledged after the restart"
    assert workload.missing_acked(vm.DEFAULT_IP, acked) == []
    # unprotect removes the settings: a later restart protects nothing.
    protection.unprotect(NAME)
    assert not settings_file().exists()


def test_without_kept_settings_a_restart_leaves_the_vm_unprotected(protected):
    """The negative control: the same restart with the settings file gone."""
    assert settings_file().exists()
    kill_primary_daemon()
    settings_file().unlink()
    restart_primary_daemon()
    wait_for(lambda: protection_now().get("state") == "unprotected", 60,
             "the restarted primary to win etcd and run the VM unprotected")
    # 8 s hold the first tries (1 + 2 + 4 s) a re-protection would make.
    time.sleep(8)
    p = protection_now()
    r = p["reprotect"]
    print("without settings:", json.dumps(r))
    assert p["state"] == "unprotected", p
    assert r["attempts"] == 0 and r["reprotections"] == 0 and not r["after_restart"], r
    assert r["verdict"] and "settings" in r["verdict"], r


@pytest.fixture
def protected_default_timeout(lab):
    """As `protected`, with the daemons' default 200 ms peer timeout."""
    stop_vm_everywhere(NAME)
    forget_ownership(NAME)
    for host in ("primary", "backup"):
        vm.stop_daemon(host)
        vm.ensure_daemon(host)
    vm.start(NAME, "primary", from_saved=True, wait_timeout=400)
    protection.protect(NAME, BACKUP, 50)
    p = protection.wait_protected(NAME, timeout=900)
    yield p
    stop_vm_everywhere(NAME)
    for host in ("primary", "backup"):
        vm.stop_daemon(host)


def test_restart_slower_than_the_detector_is_a_failover(protected_default_timeout):
    """After the backup's peer timeout the backup takes over; the primary's
    restarted daemon loses etcd, fences its copy and removes the kept
    settings: it never protects a VM it no longer owns."""
    assert settings_file().exists()
    kill_primary_daemon()
    protection.wait_active(NAME, host="backup", timeout=120)
    restart_primary_daemon_with_defaults()
    wait_for(lambda: protection_now().get("state") == "fenced", 60,
             "the restarted primary to find the backup owning the VM and fence")
    time.sleep(4)  # the first tries (1 + 2 s) a wrong re-protection would make
    p = protection_now()
    print("slower restart:", json.dumps({k: p.get(k) for k in ("state", "error")}),
          json.dumps(p["reprotect"]))
    assert p["state"] == "fenced" and "took over" in (p["error"] or ""), p
    assert p["reprotect"]["attempts"] == 0 and "fenced" in p["reprotect"]["verdict"], p
    assert not settings_file().exists()
    assert protection.replica("backup", NAME)["state"] == "active"


def restart_primary_daemon_with_defaults():
    vm.ensure_daemon("primary")
