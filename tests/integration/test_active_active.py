"""Active/active hosts: the primary host runs two VMs protected to the
backup host, and the backup host runs one protected to the primary host;
one remusdbd per host serves all of its protections and replicas. The
primary host loses power (drill/inject.py: every QEMU it runs, its
remusdbd and that daemon's children die behind a cut that lets no frame
out):

- both of its VMs fail over to the backup host at once, from heartbeats
  alone, with no acknowledged commit lost; each one's detection, takeover
  and client-visible gap is printed (a measurement, not an assertion);
- the backup host's own VM loses its backup: it runs on, unprotected,
  still committing, and its status says so;
- when the primary host comes back, that VM is protected again by
  itself (automatic re-protection), by a changed-block resync of the copy
  the returning host kept.

Every count comes from the far side: commits from the ledgers'
acknowledgements checked against each database afterwards, the takeovers
from the survivor's replica status, the cut from the LAN's counters."""
import os
import signal
import time
from pathlib import Path

from remusdb import failback, paths, protection
from remusdb.drill.failover import AckWatcher
from remusdb.drill.inject import remove_leftover_cut
from remusdb.drill.lab import forget_ownership, stop_vm_everywhere
from remusdb.lab import netns, vm, workload
from remusdb.lab.sched_groups import autogroup_in_use, autogroup_nice
from polling import acked_count, wait_for, wait_for_acks

# name: (the host it starts on, its address)
VMS = {"aap": ("primary", f"{netns.SUBNET_PREFIX}.21"),
       "aap2": ("primary", f"{netns.SUBNET_PREFIX}.23"),
       "aab": ("backup", f"{netns.SUBNET_PREFIX}.22")}
ON_PRIMARY = [n for n, (h, _) in VMS.items() if h == "primary"]
ON_BACKUP = "aab"
INTERVAL_MS = 50
TAKEOVER_TIMEOUT_S = 60
DAEMON_OOM_SCORE = "300"


def end_ledger(ledger):
    """The ledger's planned end, now (SIGUSR1, ledger.py)."""
    ledger.send_signal(signal.SIGUSR1)
    ledger.wait(timeout=60)


def protection_of(name, host):
    return protection.primary_protection(host, name) or {}


def longest_gap_around(acks, at):
    """The longest wait between two acknowledged commits that spans `at`
    (the clients' view of the outage), in ms."""
    times = sorted(t for t, _ in acks)
    before = [t for t in times if t <= at]
    after = [t for t in times if t > at]
    if not before or not after:
        return None
    gap, last = after[0] - before[-1], after[0]
    for t in after[1:]:
        if t - last > gap and t < at + TAKEOVER_TIMEOUT_S:
            gap = t - last
        last = t
    return round(gap * 1000, 1)


def test_power_loss_of_a_host_with_two_vms_while_it_backs_up_the_other(lab, tmp_path):
    for host in ("primary", "backup"):
        remove_leftover_cut(host=host)
    for name in VMS:
        stop_vm_everywhere(name)
        forget_ownership(name)
        failback.forget_replica_files(name)
    injection, ledgers, watchers, daemon = None, {}, {}, None
    files = {n: tmp_path / f"{n}.ledger" for n in VMS}
    try:
        for name, (host, ip) in VMS.items():
            vm.start(name, host, ip=ip, from_saved=True, wait_timeout=400)
        # The backup's daemon with its own OOM score and, as its unit runs
        # it, above the guests (nice -10); a takeover's QEMU must inherit
        # neither. The unit's -900 needs CAP_SYS_RESOURCE, which this
        # machine's root lacks; any score the daemon has is what the QEMU
        # must not keep.
        daemon = int((paths.host_run_dir("backup") / "remusdbd.pid").read_text())
        Path(f"/proc/{daemon}/oom_score_adj").write_text(f"{DAEMON_OOM_SCORE}\n")
        os.setpriority(os.PRIO_PROCESS, daemon, -10)
        for name, (host, _) in VMS.items():
            protection.protect(name, failback.address(failback.other(host)), INTERVAL_MS,
                               host=host)
        for name, (host, _) in VMS.items():
            protection.wait_protected(name, host, 300)
        # each daemon serves its own VMs' protections and the other's replicas
        for name, (host, _) in VMS.items():
            assert protection_of(name, host)["state"] == "protected"
            assert protection.replica(failback.other(host), name)["state"] == "ready"
        for name, (_, ip) in VMS.items():
            ledgers[name] = workload.start_ledger(ip, files[name], 600, connections=2)
            watchers[name] = AckWatcher(files[name])
            watchers[name].start()
        for name in VMS:
            wait_for_acks(files[name], 10, what=f"commits on {name}")
        if autogroup_in_use():
            # every protected VM's QEMU is raised in its own pauses
            # (primary/pause_boost.h): a daemonized QEMU is alone in its session
            for name, (host, _) in VMS.items():
                boost = protection_of(name, host).get("pause_boost") or {}
                assert boost.get("state") == "ready" and boost.get("boosts", 0) > 0, (name, boost)

        injection, cut_at, _ = failback.power_cut(ON_PRIMARY[0], "primary")
        for name in ON_PRIMARY:
            replica = protection.wait_active(name, "backup", TAKEOVER_TIMEOUT_S)
            fo = replica.get("failover") or {}
            assert replica["state"] == "active"
            # silence told the backup, not a reset: at least the peer timeout
            assert fo["detected_ms_after_last_heard"] >= 200, fo
            # the restore waited until QEMU had the NIC's client (qemu/hmp_network.h)
            assert fo["nic_wait_ms"] is not None and 0 <= fo["nic_wait_ms"] < fo["restore_ms"], fo
            qemu = int((paths.vm_run_dir("backup", name) / "qemu.pid").read_text())
            assert Path(f"/proc/{daemon}/oom_score_adj").read_text().strip() == DAEMON_OOM_SCORE
            assert Path(f"/proc/{qemu}/oom_score_adj").read_text().strip() == "0"
            assert os.getpriority(os.PRIO_PROCESS, qemu) == 0
            if autogroup_in_use():
                # the daemon's nice weighs against the guests' sessions only
                # through its own session's group (base/sched_group.h); the
                # takeover's QEMU has a session, so a group, of its own
                assert autogroup_nice(daemon) == -10, Path(f"/proc/{daemon}/autogroup").read_text()
                assert autogroup_nice(qemu) == 0, Path(f"/proc/{qemu}/autogroup").read_text()
            print(f"{name} taken over by backup: detection {fo['detected_ms_after_last_heard']} "
                  f"ms, takeover {fo['total_ms']} ms (etcd {fo['arbitration_ms']}, restore "
                  f"{fo['restore_ms']}, of which the NIC's wait {fo['nic_wait_ms']}, "
                  f"{fo['restore']}), resumed "
                  f"{(fo['resumed_at_unix'] - cut_at) * 1000:.0f} ms after the cut")

        # the backup host's own VM lost its backup: unprotected, still committing
        wait_for(lambda: protection_of(ON_BACKUP, "backup").get("state") == "unprotected",
                 30, f"{ON_BACKUP} to run unprotected")
        gap = protection_of(ON_BACKUP, "backup")
        print(f"{ON_BACKUP} after the cut: {gap['state']}: {gap.get('error')}; "
              f"unprotected for {gap['reprotect']['unprotected_seconds']} s so far")
        for name in VMS:
            wait_for_acks(files[name], acked_count(files[name]) + 10,
                          what=f"commits on {name} after the cut")
        for name in VMS:
            print(f"{name}: clients' longest gap around the cut "
                  f"{longest_gap_around(watchers[name].acks, cut_at)} ms")

        evidence = failback.repair(injection)
        injection = None
        assert evidence["lan_frames_from_primary_after_cut"] == 0, evidence
        began = time.monotonic()
        wait_for(lambda: protection_of(ON_BACKUP, "backup").get("state") == "protected", 120,
                 f"{ON_BACKUP} to be protected again by itself")
        back = protection_of(ON_BACKUP, "backup")
        copy = back.get("disk_copy") or {}
        print(f"{ON_BACKUP} protected again {time.monotonic() - began:.1f} s after the "
              f"primary host's daemon came back: {copy}")
        assert back["reprotect"]["reprotections"] >= 1, back["reprotect"]
        assert copy.get("mode") == "resync", copy
        for name in VMS:
            wait_for_acks(files[name], acked_count(files[name]) + 5,
                          what=f"commits on {name} after the repair")
        for ledger in ledgers.values():
            end_ledger(ledger)
        ledgers = {}
        for name, (_, ip) in VMS.items():
            acked = workload.ledger_acked_ids(files[name])
            missing = workload.missing_acked(ip, acked)
            print(f"{name}: {len(acked)} commits acknowledged, {len(missing)} missing")
            assert acked and missing == [], (name, missing[:10])
    finally:
        for ledger in ledgers.values():
            end_ledger(ledger)
        for w in watchers.values():
            w.stopping.set()
        if injection is not None:
            try:
                injection.evidence()
            finally:
                injection.undo()
                vm.ensure_daemon("primary")
        if daemon is not None:
            try:  # back to as it was for the next tests (a raise is allowed)
                Path(f"/proc/{daemon}/oom_score_adj").write_text("0\n")
                os.setpriority(os.PRIO_PROCESS, daemon, 0)
            except OSError:
                pass  # the daemon is gone
        for name in VMS:
            stop_vm_everywhere(name)
            forget_ownership(name)
