"""The soak's faults (drill/soak.py): each one injected the way the real
failure happens, its effect waited for, and the host repaired, one kind
per function. Bringing every VM back to protected afterwards is the
soak's own step (soak.converge), the same after every kind.

Each function takes the soak's picture (`where`: {vm: host it runs on})
and a random generator, and returns the fault's record: what was hit and
what the surviving side reported (takeovers, detection), plus "repaired"
(unix time the host was whole again). Those that move a VM update
`where`. A fault whose effect never comes raises SoakError: the soak
stops there, as a failed run.

The kinds, as a real host meets them:
  power          every QEMU, the daemon and its children on the host die
                 behind a cut that lets no frame out (drill/inject.py);
                 detection from heartbeats alone
  cut-link       the host's LAN port goes down; it keeps running, loses
                 etcd, and fences its own copies; the operator discards
                 them when the link is back
  backup-daemon  SIGKILL of the remusdbd of the host that backs a VM (on
                 active/active hosts that daemon also serves the host's
                 own VMs, as a real crash of it would)
  etcd-member    one of the witness's three members is SIGKILLed for a
                 while; nothing may fail over
  primary-qemu   SIGKILL of one VM's QEMU on its primary
  replica-full   the file system holding the replicas on a VM's backup
                 host has no room left (its tmpfs shrunk to what it holds)
                 while the guest writes fresh data
"""
import os
import signal
import subprocess
import time

from .. import failback, paths, protection
from ..lab import vm, witness
from ..protection import ProtectionError
from .inject import Injection
from .lab import say

KINDS = ("power", "cut-link", "backup-daemon", "etcd-member", "primary-qemu", "replica-full")
HOSTS = ("primary", "backup")
TAKEOVER_TIMEOUT_S = 60
NOTICE_TIMEOUT_S = 60          # for a protection to see its backup gone
ETCD_DOWN_S = 10
DAEMON_DOWN_S = 3
CUT_HOLD_S = 5                 # the cut stays this long after the last takeover
FULL_WRITE_TRIES = 4           # rounds of fresh rows (soak.write_fresh_rows)
FULL_NOTICE_S = 10
REPLICA_FS_SIZE = "8g"         # each host's replica tmpfs during the soak
POLL_S = 0.1
PAGE = 4096
DISCARD_SEEN_S = 15


class SoakError(Exception):
    """A fault's expected effect did not come, or its repair failed."""


# ---------------------------------------------------------------- helpers

def replica_dir(host):
    return paths.host_state_dir(host) / "replicas"


def mount_replica_dirs():
    """Each host's replica directory becomes a tmpfs of its own for the
    soak, so that "full" can be made true for it alone without filling the
    machine's disk. Replicas kept there from earlier runs are hidden, not
    touched."""
    for host in HOSTS:
        d = replica_dir(host)
        d.mkdir(parents=True, exist_ok=True)
        if not os.path.ismount(d):
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={REPLICA_FS_SIZE},mode=0700",
                            f"remusdb-soak-{host}", str(d)], check=True)


def unmount_replica_dirs():
    for host in HOSTS:
        d = replica_dir(host)
        if os.path.ismount(d):
            r = subprocess.run(["umount", str(d)], capture_output=True, text=True)
            if r.returncode != 0:  # a daemon still holds a replica file open
                subprocess.run(["umount", "-l", str(d)], check=False)


def fs_used_bytes(path):
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def resize_tmpfs(path, size):
    r = subprocess.run(["mount", "-o", f"remount,size={size}", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SoakError(f"cannot resize the tmpfs on {path} to {size}: {r.stderr.strip()}")


def vms_on(where, host):
    return sorted(n for n, h in where.items() if h == host)


def state_of(name, host):
    try:
        return (protection.primary_protection(host, name) or {}).get("state")
    except ProtectionError:
        return None


def wait_until(check, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(POLL_S)
    raise SoakError(f"{what}: not within {timeout} s")


def takeover_record(name, survivor, at):
    """Waits until `survivor` took `name` over; what its replica reported."""
    try:
        r = protection.wait_active(name, survivor, TAKEOVER_TIMEOUT_S)
    except ProtectionError as e:
        raise SoakError(f"{survivor} did not take {name} over: {e}")
    fo = r.get("failover") or {}
    resumed = fo.get("resumed_at_unix")
    return {"vm": name, "to": survivor, "detection_ms": fo.get("detected_ms_after_last_heard"),
            "takeover_ms": fo.get("total_ms"), "restore": fo.get("restore"),
            "resumed_ms_after_fault": round((resumed - at) * 1000, 1) if resumed else None}


def backup_lost_record(name, host, at):
    """Waits until the protection of `name` on `host` says its backup is
    gone; the time from the fault, as seen by polling (to about POLL_S)."""
    wait_until(lambda: state_of(name, host) not in ("protected", None), NOTICE_TIMEOUT_S,
               f"{name} on {host} to notice its backup gone")
    p = protection.primary_protection(host, name) or {}
    return {"vm": name, "on": host, "noticed_ms_after_fault": round((time.time() - at) * 1000),
            "state": p.get("state"), "error": p.get("error")}


def discard_fenced_copy(name, host):
    """The old primary's copy that etcd fenced (paused) is killed, as an
    operator discards it; its remusdbd keeps the VM's definition and disk,
    which the failback resyncs."""
    pid = protection.qemu_pid(host, name)
    if not (pid and protection.qemu_running(host, name)):
        return False
    os.kill(pid, signal.SIGKILL)
    say(f"soak: discarded the fenced copy of {name} on {host} (pid {pid})")
    # The daemon refuses to back up a VM whose QEMU it still sees (its
    # status poll runs every second): wait until it saw this one go.
    wait_until(lambda: run_state(name, host) == "no-qemu", DISCARD_SEEN_S,
               f"remusdbd on {host} to see {name}'s discarded QEMU gone")
    return True


def run_state(name, host):
    try:
        return protection.daemon_run_state(host, name)
    except ProtectionError:
        return None


def host_gone(where, host, at, record):
    """`host` went away at `at`: the other host takes over every VM it ran
    (`where` follows) and each VM the other host runs notices it lost its
    backup; both go into the record."""
    survivor = failback.other(host)
    moved, lost_backup = vms_on(where, host), vms_on(where, survivor)
    for name in moved:
        record["takeovers"].append(takeover_record(name, survivor, at))
        where[name] = survivor
    for name in lost_backup:
        record["backup_lost"].append(backup_lost_record(name, survivor, at))


# ---------------------------------------------------------------- the kinds

def power(where, rng):
    host = rng.choice(HOSTS)
    moved = vms_on(where, host)
    injection = Injection("power", moved[0] if moved else None, host=host)
    at = injection.inject()
    say(f"soak: power cut of {host} (runs {moved or 'nothing'})")
    record = {"host": host, "at": at, "takeovers": [], "backup_lost": []}
    try:
        host_gone(where, host, at, record)
    finally:
        evidence = failback.repair(injection)
    record["lan_frames_after_cut"] = evidence["lan_frames_from_primary_after_cut"]
    if record["lan_frames_after_cut"]:
        raise SoakError(f"{record['lan_frames_after_cut']} frames left {host} after its "
                        f"power cut: {evidence}")
    record["repaired"] = time.time()
    return record


def cut_link(where, rng):
    host = rng.choice(HOSTS)
    moved = vms_on(where, host)
    injection = Injection("cut-link", None, host=host)
    at = injection.inject()
    say(f"soak: cut the LAN link of {host} (runs {moved or 'nothing'})")
    record = {"host": host, "at": at, "takeovers": [], "backup_lost": []}
    try:
        host_gone(where, host, at, record)
        # the cut host loses etcd too: its copies end fenced before the link returns
        for name in moved:
            wait_until(lambda: state_of(name, host) in ("fenced", "failed")
                       or not protection.qemu_running(host, name), NOTICE_TIMEOUT_S,
                       f"{name} on the cut {host} to fence itself")
        time.sleep(CUT_HOLD_S)
    finally:
        for name in moved:
            discard_fenced_copy(name, host)
        injection.undo()
    record["repaired"] = time.time()
    return record


def backup_daemon(where, rng):
    name = rng.choice(sorted(where))
    host = failback.other(where[name])  # the host backing it
    own = vms_on(where, host)
    daemon = vm.daemon_pid(host)
    if not daemon:
        raise SoakError(f"no remusdbd runs on {host}")
    at = time.time()
    os.kill(daemon, signal.SIGKILL)
    say(f"soak: SIGKILL of remusdbd on {host} (backs {name}, runs {own or 'nothing'})")
    record = {"host": host, "at": at, "backup_lost": [], "takeovers": []}
    lost = [n for n, h in where.items() if h != host]
    for n in lost:
        record["backup_lost"].append(backup_lost_record(n, where[n], at))
    time.sleep(DAEMON_DOWN_S)
    vm.ensure_daemon(host)
    record["repaired"] = time.time()
    # Its own VMs: the other host may have taken them over (its connection
    # closed with no word), or they stayed here; the restarted daemon knows.
    for n in own:
        survivor = failback.other(host)
        r = wait_until(lambda: _settled_after_restart(n, host, survivor), TAKEOVER_TIMEOUT_S,
                       f"{n} to settle after {host}'s remusdbd restarted")
        if r == "moved":
            record["takeovers"].append(takeover_record(n, survivor, at))
            where[n] = survivor
            discard_fenced_copy(n, host)
    return record


def _settled_after_restart(name, host, other):
    try:
        r = protection.replica(other, name) or {}
    except ProtectionError:
        r = {}
    if r.get("state") == "active" and (r.get("failover") or {}).get("resumed_at_unix", 0) \
            > time.time() - TAKEOVER_TIMEOUT_S * 2:
        return "moved"
    if state_of(name, host) in ("protected", "unprotected", "syncing"):
        return "stayed"
    return None


def etcd_member(where, rng):
    member = rng.choice(witness.running_members())
    at = time.time()
    witness.kill_member(member)
    say(f"soak: SIGKILL of etcd member {member}")
    record = {"member": member, "at": at, "takeovers": [], "backup_lost": []}
    deadline = time.monotonic() + ETCD_DOWN_S
    while time.monotonic() < deadline:
        for name, host in where.items():
            if state_of(name, host) != "protected":
                record["backup_lost"].append({"vm": name, "on": host,
                                              "state": state_of(name, host)})
        time.sleep(0.5)
    witness.start(members=3)
    record["repaired"] = time.time()
    if record["backup_lost"]:
        raise SoakError(f"one etcd member of three lost, and a protection changed: "
                        f"{record['backup_lost'][:3]}")
    return record


def primary_qemu(where, rng):
    name = rng.choice(sorted(where))
    host = where[name]
    pid = protection.qemu_pid(host, name)
    if not pid or not protection.qemu_running(host, name):
        raise SoakError(f"{name}'s QEMU does not run on {host}")
    at = time.time()
    os.kill(pid, signal.SIGKILL)
    say(f"soak: SIGKILL of {name}'s QEMU on {host}")
    survivor = failback.other(host)
    record = {"host": host, "vm": name, "at": at,
              "takeovers": [takeover_record(name, survivor, at)], "backup_lost": []}
    where[name] = survivor
    record["repaired"] = time.time()
    return record


def replica_full(where, rng, write_fresh_rows):
    """write_fresh_rows(vm): makes the guest write new blocks (the soak
    creates a table), so that its backup must allocate."""
    name = rng.choice(sorted(where))
    primary = where[name]
    host = failback.other(primary)
    d = replica_dir(host)
    if not os.path.ismount(d):
        raise SoakError(f"{d} is not the soak's tmpfs")
    held = failback.replica_disk_path(host, name)
    if os.path.dirname(held) != str(d) or not os.path.exists(held):
        raise SoakError(f"{host} keeps {name}'s replica disk at {held}, not in its replica "
                        f"directory {d}: the soak brings every VM home first (soak.switch_home)")
    # tmpfs takes size=0 for "no limit": one page is the least that is full
    used = max(fs_used_bytes(d), PAGE)
    at = time.time()
    resize_tmpfs(d, used)
    say(f"soak: {host}'s replica file system full ({used >> 20} MiB), {name} writes")
    record = {"host": host, "vm": name, "at": at, "fs_used_bytes": used, "takeovers": [],
              "backup_lost": []}
    try:
        # until the backup needs a block it has no room for (rows that land
        # in blocks the replica holds already need none)
        for _ in range(FULL_WRITE_TRIES):
            write_fresh_rows(name)
            try:
                wait_until(lambda: state_of(name, primary) not in ("protected", None),
                           FULL_NOTICE_S, "")
                break
            except SoakError:
                continue
        record["backup_lost"].append(backup_lost_record(name, primary, at))
    finally:
        resize_tmpfs(d, REPLICA_FS_SIZE)
    record["repaired"] = time.time()
    return record


def inject(kind, where, rng, write_fresh_rows):
    if kind == "replica-full":
        return replica_full(where, rng, write_fresh_rows)
    return {"power": power, "cut-link": cut_link, "backup-daemon": backup_daemon,
            "etcd-member": etcd_member, "primary-qemu": primary_qemu}[kind](where, rng)

