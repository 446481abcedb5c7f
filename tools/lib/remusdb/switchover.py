"""A planned switchover: the protected VM moves from the host that runs it
to its backup with no acknowledged commit lost and every client
connection kept, and ends protected the other way round. Shared by
`remusdb switchover` and the drill's switchover mode.

The steps (docs/operations.md, "Switchover"), each with a timeout:

1. check: the VM is protected on its host, the backup's replica is ready,
   etcd names the host at the generation its protection knows;
2. stop: the primary's remusdbd (`switchover`) holds the VM paused at its
   next checkpoint and ships it as usual; once the backup acknowledged
   it, that epoch's output goes out (output commit as ever) and the VM
   stays paused;
3. take over: the backup's remusdbd is asked (`failover`, as `remusdb
   failover` does) and resumes exactly that checkpoint after winning etcd
   by compare-and-swap from the primary's generation;
4. the old primary, losing its own compare-and-swap when the backup drops
   the link, fences itself and its remusdbd stops QEMU (quit);
5. protect back: the new primary protects the VM to the old one, which
   resyncs only the changed disk extents (failback.protect_back).

A step that fails before the backup was asked to take over cancels the
switchover: the VM resumes on its host, still protected. Once the
backup was asked, the primary resumes only while the backup has not
won etcd and the link is up (a cancel then); after the backup won, the
primary never resumes (its own compare-and-swap fails, as after any
takeover).
"""
import os
import signal
import time

from . import ownership, protection
from .protection import ProtectionError

POLL_S = 0.01                 # the steps' polls: a step's time is seen to about this
DEFAULT_STEP_TIMEOUT_S = 30
DEFAULT_PROTECT_TIMEOUT_S = 900


class SwitchoverError(ProtectionError):
    """A step failed; the message says where the VM runs now."""


class Steps:
    """Each step's time since the switchover began, told as it happens."""

    def __init__(self, progress=None):
        self.progress = progress
        self.started = time.monotonic()
        self.started_unix = time.time()
        self.done = []

    def note(self, name, text):
        at = time.monotonic() - self.started
        self.done.append({"step": name, "at_s": round(at, 3), "text": text})
        if self.progress:
            self.progress(f"{time.strftime('%H:%M:%S')} +{at:6.3f} s  {text}")


def other_host(host):
    others = [h for h in protection.vm_hosts() if h != host]
    return others[0] if len(others) == 1 else None


def poll_until(what, timeout, poll, every=POLL_S):
    """poll() until it returns something true (returned); SwitchoverError
    naming `what` after `timeout` s. A daemon that does not answer for
    protection.ERROR_GRACE s ends the wait too."""
    deadline = time.monotonic() + timeout
    failing_since = None
    while True:
        try:
            value = poll()
            failing_since = None
        except ProtectionError as e:
            failing_since = failing_since or time.monotonic()
            if time.monotonic() - failing_since > protection.ERROR_GRACE:
                raise SwitchoverError(f"{what}: {e}")
            value = None
        if value:
            return value
        if time.monotonic() >= deadline:
            raise SwitchoverError(f"{what}: not within {timeout:g} s")
        time.sleep(every)


def check(vm, host):
    """Step 1: (the primary's protection, the backup host, etcd's record)."""
    p = protection.primary_protection(host, vm)
    if p is None:
        raise SwitchoverError(f"VM {vm} is not protected on {host}: a switchover moves a "
                              f"protected VM to its backup (`remusdb status` shows where it "
                              f"runs)")
    if p.get("state") != "protected":
        raise SwitchoverError(f"the protection of {vm} on {host} is {p.get('state')}, not "
                              f"protected: {p.get('error') or 'wait for it'}")
    peer = p.get("peer") or ""
    target = protection.host_of(peer)
    if target is None or target == host:
        raise SwitchoverError(f"the backup {peer} is not another host of the cluster file: "
                              f"the switchover asks the backup's remusdbd to take over")
    r = protection.replica(target, vm)
    if (r or {}).get("state") != "ready":
        raise SwitchoverError(f"the replica of {vm} on {target} is "
                              f"{(r or {}).get('state', 'missing')}, not ready")
    try:
        rec = ownership.owner(vm)
    except ownership.OwnershipError as e:
        raise SwitchoverError(f"{e}: a switchover moves the VM's ownership in etcd, which "
                              f"must answer")
    if not rec or rec["owner"] != host or rec["generation"] != p.get("generation"):
        raise SwitchoverError(f"etcd says {rec}, not {host} at generation "
                              f"{p.get('generation')} as the protection knows it: "
                              f"refusing to switch over")
    return p, target, rec


def cancel(vm, host, steps, why):
    """The VM resumes on host, still protected; SwitchoverError with why."""
    try:
        protection.request(host, "switchover-cancel", timeout=10.0, vm=vm)
        steps.note("cancelled", f"switchover cancelled: {vm} resumed on {host}, still "
                               f"protected")
        raise SwitchoverError(f"{why}; the switchover was cancelled: {vm} resumed on "
                              f"{host}, still protected")
    except SwitchoverError:
        raise
    except ProtectionError as e:
        # It may have ended by itself (its deadline resumes it while the link is up).
        p = protection.primary_protection(host, vm) or {}
        so = p.get("switchover") or {}
        raise SwitchoverError(f"{why}; cancelling failed ({e}): the primary's switchover is "
                              f"{so.get('state')} ({so.get('error')}), its protection "
                              f"{p.get('state')}: see `remusdb status`")


def switchover_status(host, vm):
    return (protection.primary_protection(host, vm) or {}).get("switchover") or {}


def stop_at_checkpoint(vm, host, steps, timeout, unsafe_release_early):
    """Step 2: the primary's VM held at an acknowledged checkpoint; returns its switchover."""
    # The daemon's own deadline covers steps 2 and 3: should this tool die
    # meanwhile, the VM resumes there by itself (while the link is up).
    fields = {"timeout_ms": max(1000, min(600000, int(timeout * 2000)))}
    if unsafe_release_early:
        fields["unsafe_release_early"] = True
    protection.request(host, "switchover", timeout=10.0, vm=vm, **fields)
    seen = set()

    def poll():
        so = switchover_status(host, vm)
        state = so.get("state")
        if state in ("stopped", "ready") and "stopped" not in seen:
            seen.add("stopped")
            steps.note("stopped", f"{host} holds {vm} paused at checkpoint "
                                  f"{so.get('held_epoch')}")
        if state == "ready":
            return so
        if state not in ("stopping", "stopped"):
            raise SwitchoverError(f"the primary's switchover ended {state}: {so.get('error')}")
        return None
    try:
        so = poll_until(f"{host} to stop {vm} at a checkpoint the backup acknowledged",
                        timeout, poll)
    except SwitchoverError as e:
        if switchover_status(host, vm).get("state") in ("stopping", "stopped", "ready"):
            cancel(vm, host, steps, str(e))
        raise
    steps.note("acknowledged", f"the backup acknowledged epoch {so.get('epoch')}: its output "
                               f"released; {vm} stays paused on {host}"
               + (" (UNSAFE: checkpoint %s never left, its output did)" % so.get("held_epoch")
                  if unsafe_release_early else ""))
    return so


def take_over(vm, host, target, steps, timeout, epoch):
    """Step 3: the backup resumes the VM; returns its replica status."""
    try:
        protection.failover(vm, target)
    except ProtectionError as e:
        cancel(vm, host, steps, f"the backup refused to take over: {e}")
    steps.note("asked", f"{target} asked to take {vm} over")

    def poll():
        r = protection.replica(target, vm) or {}
        if r.get("state") == "active":
            return r
        if r.get("state") in protection.REPLICA_BROKEN:
            raise SwitchoverError(f"the takeover on {target} ended {r.get('state')}: "
                                  f"{r.get('error')}")
        return None
    try:
        r = poll_until(f"{target} to run {vm}", timeout, poll)
    except SwitchoverError as e:
        r = protection.replica(target, vm) or {}
        if r.get("state") == "arbitrating" and switchover_status(host, vm).get("state") == "ready":
            # etcd has not answered the backup: the link is up, the VM may resume here.
            cancel(vm, host, steps, f"{e} ({target} is still asking etcd, and takes the VM "
                                    f"over from the latest acknowledged epoch if etcd "
                                    f"answers later)")
        raise SwitchoverError(f"{e}. etcd may name {target} already: {vm} stays stopped on "
                              f"{host} (fenced), as after any takeover; `remusdb status` "
                              f"and {target}'s remusdbd log say more")
    fo = r.get("failover") or {}
    steps.note("resumed", f"{target} runs {vm} from epoch {r.get('committed_epoch')} "
                          f"(takeover {fo.get('total_ms') or 0:.0f} ms)")
    if r.get("committed_epoch") != epoch:
        raise SwitchoverError(f"{target} resumed epoch {r.get('committed_epoch')}, not the "
                              f"stopped checkpoint's epoch {epoch}")
    return r


def stop_old_primary(vm, host, target, steps, timeout):
    """Step 4: the old primary fenced and its QEMU gone; etcd names the target."""
    def handed_over():
        so = switchover_status(host, vm)
        if so.get("state") == "handed-over":
            return so
        if so.get("state") in ("failed", "cancelled"):
            raise SwitchoverError(f"the old primary's switchover ended {so.get('state')}: "
                                  f"{so.get('error')}")
        return None
    so = poll_until(f"{host} to see etcd name {target}", timeout, handed_over)
    try:
        poll_until(f"{host}'s QEMU to quit", min(timeout, 10),
                   lambda: not protection.qemu_running(host, vm))
        how = "QEMU quit"
    except SwitchoverError:
        pid = protection.qemu_pid(host, vm)
        if pid and protection.qemu_running(host, vm):
            os.kill(pid, signal.SIGKILL)
        how = "QEMU did not quit: killed"
    # Step 5 protects back to this host, whose remusdbd refuses while it
    # still sees the QEMU ("runs on this host"): it must have seen it go.
    poll_until(f"{host}'s remusdbd to see its QEMU gone", min(timeout, 10),
               lambda: protection.daemon_run_state(host, vm) in ("no-qemu", None))
    try:
        rec = ownership.owner(vm) or {"owner": None, "generation": None}
    except ownership.OwnershipError as e:
        raise SwitchoverError(f"{host} fenced itself, but etcd cannot be read back: {e}")
    steps.note("fenced", f"etcd names {rec['owner']} (generation {rec['generation']}); "
                         f"{host} stays stopped for good ({how})")
    if rec["owner"] != target:
        raise SwitchoverError(f"etcd names {rec['owner']}, not {target}")
    return so


def handover(vm, host="primary", timeout=DEFAULT_STEP_TIMEOUT_S, unsafe_release_early=False,
             steps=None):
    """Steps 1-4, told to `steps` (a Steps). Returns {"from", "to", "epoch", "steps", "replica",
    "requested_at_unix", "stopped_at_unix", "resumed_at_unix", "interval_ms",
    "commit_protection"}; SwitchoverError says where the VM runs when a
    step fails."""
    steps = steps or Steps()
    p, target, rec = check(vm, host)
    steps.note("checked", f"{vm} protected on {host} (epoch {p.get('epoch')}), replica ready "
                          f"on {target}, etcd names {host} (generation {rec['generation']})")
    so = stop_at_checkpoint(vm, host, steps, timeout, unsafe_release_early)
    r = take_over(vm, host, target, steps, timeout, so.get("epoch"))
    final = stop_old_primary(vm, host, target, steps, timeout)
    fo = r.get("failover") or {}
    requested = final.get("requested_at_unix")
    return {"from": host, "to": target, "epoch": so.get("epoch"),
            "held_epoch": so.get("held_epoch"), "steps": steps.done,
            "started_at_unix": steps.started_unix, "requested_at_unix": requested,
            "stopped_at_unix": (requested + final["stopped_ms"] / 1000
                                if requested and final.get("stopped_ms") is not None else None),
            "resumed_at_unix": fo.get("resumed_at_unix"), "replica": r,
            "primary_switchover": final, "interval_ms": p.get("interval_ms"),
            "commit_protection": p.get("commit_protection") is not None,
            "cp_dscp": (p.get("commit_protection") or {}).get("dscp")}


def protect_back(vm, result, timeout=DEFAULT_PROTECT_TIMEOUT_S, steps=None):
    """Step 5: the new primary protects the VM to the old one, as a failback
    does (changed-block resync). Returns (seconds, its protection status)."""
    options = {}
    if result.get("commit_protection"):
        options = {"commit_protection": True, "cp_dscp": result.get("cp_dscp") or 47}
    steps = steps or Steps()
    # The old primary's replication address, as the cluster file names it:
    # the same protect a failback sends (changed-block resync).
    started = time.monotonic()
    protection.protect(vm, protection.parse_backup(result["from"]),
                       result.get("interval_ms") or 100, host=result["to"], options=options)
    p = protection.wait_protected(vm, result["to"], timeout)
    seconds = time.monotonic() - started
    copy = p.get("disk_copy") or {}
    steps.note("protected", f"{vm} on {result['to']} protected to {result['from']} in "
                            f"{seconds:.1f} s: disk {copy.get('mode')} copy, "
                            f"{(copy.get('bytes_sent') or 0) / 2**20:.1f} MiB of "
                            f"{copy.get('extents')} extents ({copy.get('reason')})")
    return seconds, p
