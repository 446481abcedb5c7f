"""Active/active hosts: each host runs a VM protected to the other, one
remusdbd per host serving its own VM's protection and the other's
replica. The primary host loses power (drill/inject.py: every QEMU it
runs, its remusdbd and that daemon's children die behind a cut that lets
no frame out):

- its VM fails over to the backup host, from heartbeats alone, with no
  acknowledged commit lost;
- the backup host's own VM loses its backup: it runs on, unprotected,
  still committing, and its status says so;
- when the primary host comes back, that VM is protected again by
  itself (automatic re-protection), by a changed-block resync of the copy
  the returning host kept.

Every count comes from the far side: commits from the ledger's
acknowledgements checked against each database afterwards, the takeover
from the survivor's replica status, the cut from the LAN's counters."""
import signal
import time

from remusdb import failback, protection
from remusdb.drill.inject import remove_leftover_cut
from remusdb.drill.lab import forget_ownership, stop_vm_everywhere
from remusdb.lab import netns, vm, workload
from polling import acked_count, wait_for, wait_for_acks

ON_PRIMARY, ON_BACKUP = "aap", "aab"
IP_PRIMARY, IP_BACKUP = f"{netns.SUBNET_PREFIX}.21", f"{netns.SUBNET_PREFIX}.22"
INTERVAL_MS = 50


def end_ledger(ledger):
    """The ledger's planned end, now (SIGUSR1, ledger.py)."""
    ledger.send_signal(signal.SIGUSR1)
    ledger.wait(timeout=60)


def protect(name, host):
    protection.protect(name, failback.address(failback.other(host)), INTERVAL_MS, host=host)
    protection.wait_protected(name, host, 300)


def protection_of(name, host):
    return protection.primary_protection(host, name) or {}


def test_power_loss_of_one_host_of_two_protecting_each_other(lab, tmp_path):
    for host in ("primary", "backup"):
        remove_leftover_cut(host=host)
    for name in (ON_PRIMARY, ON_BACKUP):
        stop_vm_everywhere(name)
        forget_ownership(name)
        failback.forget_replica_files(name)
    vm.start(ON_PRIMARY, "primary", ip=IP_PRIMARY, from_saved=True, wait_timeout=400)
    vm.start(ON_BACKUP, "backup", ip=IP_BACKUP, from_saved=True, wait_timeout=400)
    injection, ledgers = None, {}
    try:
        protect(ON_PRIMARY, "primary")
        protect(ON_BACKUP, "backup")
        # each daemon serves one protection and one replica
        for host, mine, theirs in (("primary", ON_PRIMARY, ON_BACKUP),
                                   ("backup", ON_BACKUP, ON_PRIMARY)):
            assert protection_of(mine, host)["state"] == "protected"
            assert protection.replica(host, theirs)["state"] == "ready"
        files = {n: tmp_path / f"{n}.ledger" for n in (ON_PRIMARY, ON_BACKUP)}
        for name, ip in ((ON_PRIMARY, IP_PRIMARY), (ON_BACKUP, IP_BACKUP)):
            ledgers[name] = workload.start_ledger(ip, files[name], 600, connections=2)
        for name in ledgers:
            wait_for_acks(files[name], 10, what=f"commits on {name}")

        injection, cut_at, replica = failback.power_cut(ON_PRIMARY, "primary")
        fo = replica.get("failover") or {}
        print("takeover of", ON_PRIMARY, "on backup:", {k: fo.get(k) for k in (
            "detected_ms_after_last_heard", "arbitration_ms", "restore_ms", "total_ms",
            "restore")})
        assert replica["state"] == "active"
        assert fo["detected_ms_after_last_heard"] >= 200, fo  # silence told it, not a reset

        # the backup host's own VM lost its backup: unprotected, still committing
        wait_for(lambda: protection_of(ON_BACKUP, "backup").get("state") == "unprotected",
                 30, f"{ON_BACKUP} to run unprotected")
        gap = protection_of(ON_BACKUP, "backup")
        print(f"{ON_BACKUP} after the cut:", gap["state"], gap.get("error"),
              gap.get("reprotect"))
        for name in ledgers:
            wait_for_acks(files[name], acked_count(files[name]) + 10,
                          what=f"commits on {name} after the cut")

        evidence = failback.repair(injection)
        injection = None
        assert evidence["lan_frames_from_primary_after_cut"] == 0, evidence
        began = time.monotonic()
        wait_for(lambda: protection_of(ON_BACKUP, "backup").get("state") == "protected", 120,
                 f"{ON_BACKUP} to be protected again by itself")
        back = protection_of(ON_BACKUP, "backup")
        copy = back.get("disk_copy") or {}
        print(f"{ON_BACKUP} protected again {time.monotonic() - began:.1f} s after the "
              f"primary host's daemon came back: {copy}; reprotect {back.get('reprotect')}")
        assert back["reprotect"]["reprotections"] >= 1, back["reprotect"]
        assert copy.get("mode") == "resync", copy
        for name in ledgers:
            wait_for_acks(files[name], acked_count(files[name]) + 5,
                          what=f"commits on {name} after the repair")
    finally:
        for ledger in ledgers.values():
            end_ledger(ledger)
        if injection is not None:
            try:
                injection.evidence()
            finally:
                injection.undo()
                vm.ensure_daemon("primary")
    for name, ip in ((ON_PRIMARY, IP_PRIMARY), (ON_BACKUP, IP_BACKUP)):
        acked = workload.ledger_acked_ids(files[name])
        missing = workload.missing_acked(ip, acked)
        print(f"{name}: {len(acked)} commits acknowledged, {len(missing)} missing")
        assert acked and missing == [], (name, missing[:10])
    for name in (ON_PRIMARY, ON_BACKUP):
        stop_vm_everywhere(name)
        forget_ownership(name)
