"""Failback: the steps of a round trip primary -> backup -> back to the
repaired primary, shared by tests/integration/test_failback.py and
`remusdb-bench failback`.

After the backup took a VM over, the old primary is repaired (its network
back, its remusdbd restarted; it still holds the VM's stopped definition
and disk file) and the VM is protected back to it from the host that now
runs it. remusdbd then sends only the 1 MiB extents that may differ (the
new primary's change bitmap since the takeover, the discarded epoch's
writes, the old primary's own activity log) unless it has to fall back to
a full copy; the primary's status says which (`disk_copy`), the replica's
says what its disk started from (`disk_base`).

Whether the resync left out nothing is checked here without trusting the
daemon: disk_compare() holds the protected VM paused at a checkpoint (the
same hold `remusdb check-image` uses), waits until the backup committed
that epoch, and hashes both disk files, the running VM's and the
replica's, 1 MiB extent by extent.
"""
import time
from functools import partial
from pathlib import Path

import xxhash

from . import output, protection
from .lab import vm
from .drill.inject import Injection
from .protection import ProtectionError

EXTENT = 1 << 20               # the resync's unit, and the compare's
TAKEOVER_TIMEOUT_S = 120
PROTECT_TIMEOUT_S = 900        # a full copy of RAM and disk under TCG
HOLD_TIMEOUT_S = 45            # the daemon releases a hold after 60 s
INTERVAL_MS = 100


class FailbackError(Exception):
    """A step of the round trip could not be carried out."""


say = partial(output.say, "failback")


def address(host):
    """The replication address of a lab host, e.g. "10.77.0.1:7788"."""
    return protection.parse_backup(host)


def other(host):
    return {"primary": "backup", "backup": "primary"}[host]


def vm_disk_path(host, name):
    """The disk file remusdbd on `host` serves VM `name` from."""
    v = vm.held_definition(host, name)
    disks = (v or {}).get("disks") or []
    if not disks or not disks[0].get("path"):
        raise FailbackError(f"remusdbd on {host} lists no disk for {name}: {v}")
    return disks[0]["path"]


def replica_disk_path(host, name):
    """The replica's disk file on `host`: disk_base.path (failback), else
    disk_replica."""
    r = protection.replica(host, name) or {}
    path = (r.get("disk_base") or {}).get("path") or r.get("disk_replica")
    if not path:
        raise FailbackError(f"remusdbd on {host} holds no replica disk of {name}: {r}")
    return path


def forget_replica_files(name):
    """A VM name neither host has held a replica of: both daemons' replicas
    of it retired and their files (IMAGE, IMAGE.changes under
    STATE/HOST/replicas) removed, as on hosts that never protected it. A
    file left from an earlier run changes what a failback does (a replica
    whose file existed before behaves unlike a first one), so a test or a
    benchmark starts from none. Call it with the VM stopped everywhere."""
    from . import paths
    for host in protection.vm_hosts():
        try:
            protection.request(host, "forget", vm=name)
        except ProtectionError:
            pass  # none there, or no daemon: nothing holds the files
        d = paths.host_state_dir(host) / "replicas"
        for f in (d / f"{name}.img", d / f"{name}.img.changes"):
            f.unlink(missing_ok=True)


def power_cut(name, host):
    """Cuts `host`'s power while it runs VM `name` (drill/inject.py: no FIN or
    RST gets out, detection comes from heartbeats) and waits until the
    other host took the VM over. Returns (injection, failure unix time,
    the survivor's replica status)."""
    survivor = other(host)
    injection = Injection("power", name, host=host)
    at = injection.inject()
    say(f"power cut of {host} at {at:.3f}; waiting for {survivor} to take {name} over")
    replica = protection.wait_active(name, survivor, TAKEOVER_TIMEOUT_S,
                                     progress=lambda r: say(f"{survivor}: {r.get('state')}"))
    return injection, at, replica


def repair(injection):
    """The host that lost power comes back: the cut's evidence read (no
    frame may have left it), its network restored, its remusdbd started
    again (it reloads the VM's definition, whose QEMU is gone). Returns
    the cut's evidence."""
    evidence = injection.evidence()
    injection.undo()
    vm.ensure_daemon(injection.host)
    say(f"{injection.host} repaired: network back, remusdbd restarted")
    return evidence


def protect_back(name, runs_on, options=None, interval_ms=INTERVAL_MS,
                 timeout=PROTECT_TIMEOUT_S):
    """Protects VM `name`, running on `runs_on`, to the other host (the
    failback when that host ran it before). Returns (seconds from the
    protect call to PROTECTED, the primary's protection status)."""
    target = other(runs_on)
    started = time.monotonic()
    protection.protect(name, address(target), interval_ms, host=runs_on, options=options)
    disk_done_s = wait_disk_copied(name, runs_on, started, timeout)
    p = protection.wait_protected(name, runs_on, timeout,
                                  progress=lambda p: say(protection.describe_progress(p)))
    seconds = time.monotonic() - started
    p["disk_done_s"] = disk_done_s  # ours, not the daemon's: see wait_disk_copied
    say(f"{name} on {runs_on} protected to {target} in {seconds:.1f} s (disk copied after "
        f"{disk_done_s} s): disk_copy {p.get('disk_copy')}")
    return seconds, p


def wait_disk_copied(name, host, started, timeout, every=0.02):
    """Seconds from `started` (monotonic) until the protection's disk_sync
    says done, polled every `every` s (so to about that much; the memory
    copy runs alongside, and copy_seconds covers both), or None when the
    protection ended first."""
    deadline = started + timeout
    while time.monotonic() < deadline:
        p = protection.primary_protection(host, name) or {}
        if (p.get("disk_sync") or {}).get("done"):
            return round(time.monotonic() - started, 3)
        if p.get("state") in protection.PRIMARY_DONE | protection.PRIMARY_BROKEN:
            return None
        time.sleep(every)
    return None


def wait_acked_epochs(name, host, n, timeout=120):
    """Waits until `n` more epochs were acknowledged on `host`'s protection."""
    start = (protection.primary_protection(host, name) or {}).get("acked_epoch") or 0
    deadline = time.monotonic() + timeout
    while True:
        acked = (protection.primary_protection(host, name) or {}).get("acked_epoch") or 0
        if acked >= start + n:
            return acked
        if time.monotonic() > deadline:
            raise FailbackError(f"{name} on {host}: only {acked - start} of {n} epochs "
                                f"acknowledged in {timeout} s")
        time.sleep(0.1)


def extent_hashes(path, extent=EXTENT):
    """XXH3-64 of every `extent` bytes of a file, and its size."""
    sums = []
    with open(path, "rb", buffering=0) as f:
        while True:
            block = f.read(extent)
            if not block:
                break
            sums.append(xxhash.xxh3_64_intdigest(block))
    return sums, Path(path).stat().st_size


def compare_files(a, b, extent=EXTENT):
    """{"equal", "differing_extents" (indexes), sizes, seconds}."""
    started = time.monotonic()
    sa, size_a = extent_hashes(a, extent)
    sb, size_b = extent_hashes(b, extent)
    differing = [i for i in range(max(len(sa), len(sb)))
                 if i >= len(sa) or i >= len(sb) or sa[i] != sb[i]]
    return {"equal": size_a == size_b and not differing, "differing_extents": differing,
            "size_a": size_a, "size_b": size_b, "extent_bytes": extent,
            "hash": "xxh3-64 per extent", "seconds": round(time.monotonic() - started, 2)}


def disk_compare(name, primary, backup=None, settle_epochs=2):
    """The protected VM's disk against its replica's, byte for byte, at one
    checkpoint: after `settle_epochs` more acknowledged epochs, the primary
    holds the VM paused at its next checkpoint (protection.hold_checkpoint;
    no later epoch can start), the backup commits that epoch (a replica
    writes an epoch's disk blocks to its file before it acknowledges it),
    both files are hashed, and the VM resumes. Returns compare_files()'s
    result with the paths and the epoch."""
    backup = backup or other(primary)
    primary_disk = vm_disk_path(primary, name)
    replica_disk = replica_disk_path(backup, name)
    wait_acked_epochs(name, primary, settle_epochs)
    dump = Path(vm.vm_files(primary, name)["dir"]) / "failback-hold.dump"
    protection.hold_checkpoint(name, dump, 4096, host=primary)
    try:
        deadline = time.monotonic() + HOLD_TIMEOUT_S
        while True:
            p = protection.primary_protection(primary, name) or {}
            h = p.get("checkpoint_hold") or {}
            if h.get("state") in ("failed", "released"):
                raise FailbackError(f"the checkpoint hold ended early: {h}")
            if h.get("state") == "held" and (p.get("acked_epoch") or 0) >= h["epoch"]:
                r = protection.replica(backup, name) or {}
                if (r.get("committed_epoch") or 0) >= h["epoch"]:
                    break
            if time.monotonic() > deadline:
                raise FailbackError(f"the held checkpoint was not acknowledged in "
                                    f"{HOLD_TIMEOUT_S} s: {h}")
            time.sleep(0.05)
        epoch = h["epoch"]
        result = compare_files(primary_disk, replica_disk)
        still = (protection.primary_protection(primary, name) or {}).get("checkpoint_hold")
        if (still or {}).get("state") != "held":
            raise FailbackError("the hold ended while the disks were hashed: "
                                "the comparison is void")
    finally:
        protection.release_checkpoint(name, host=primary)
        dump.unlink(missing_ok=True)
    result.update({"epoch": epoch, "primary": primary, "primary_disk": primary_disk,
                   "backup": backup, "replica_disk": replica_disk})
    say(f"disk compare at epoch {epoch}: {primary_disk} vs {backup}:{replica_disk}: "
        f"{'EQUAL' if result['equal'] else 'DIFFER in extents ' + str(result['differing_extents'][:20])}"
        f" ({result['seconds']} s)")
    return result


def full_copy_bytes(name, host):
    """What a full copy of the VM's disk holds: its size."""
    v = vm.held_definition(host, name) or {}
    return ((v.get("disks") or [{}])[0]).get("size")


__all__ = ["FailbackError", "ProtectionError", "address", "other", "power_cut", "repair",
           "forget_replica_files",
           "protect_back", "disk_compare", "compare_files", "wait_acked_epochs",
           "vm_disk_path", "replica_disk_path", "full_copy_bytes", "EXTENT"]
