"""The lab around a drill: the etcd witness, the VM's ownership record,
and stopping the drill's VM on both hosts before and after a run."""
import subprocess
from functools import partial

from ..lab import netns, vm, witness
from .. import output, paths, protection
from ..protection import ProtectionError


class DrillError(Exception):
    """The drill could not be carried out (as opposed to a failed check)."""


say = partial(output.say, "drill", err=True)


def ensure_witness():
    """Protection arbitrates through the lab's etcd witness: it is started
    here unless it runs."""
    if not witness.endpoints():
        say("starting the etcd witness")
        witness.start()
    say(f"witness: {witness.endpoints()}")


def ownership_key(name):
    """The witness key remusdbd arbitrates a VM's ownership with
    (WITNESS_KEY_PREFIX/SUFFIX in dom0-daemon/src/witness/witness_proto.h)."""
    return f"/remusdb/vms/{name}/owner"


def forget_ownership(name):
    """A drill boots a brand-new VM under a reused name; the witness still
    says which host owned the previous one (the backup, after the last
    drill), and remusdbd rightly refuses to protect a VM another host owns.
    So the record goes, as it would for a VM that was deleted."""
    cmd = ["ip", "netns", "exec", netns.namespace_of("primary"), "etcdctl",
           "--endpoints", witness.client_endpoints(), "--dial-timeout", "3s",
           "--command-timeout", "5s", "del", ownership_key(name)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=15)
    except subprocess.TimeoutExpired:
        raise DrillError("etcdctl timed out clearing the VM's ownership in the witness")
    if r.returncode != 0:
        raise DrillError(f"cannot clear {ownership_key(name)} in the witness: "
                         f"{(r.stdout + r.stderr).strip()}")


def lab_up(need_witness):
    netns.up()
    if need_witness:
        ensure_witness()


def vm_present(host, name):
    """Runs there, or that host's remusdbd still knows it."""
    if protection.qemu_running(host, name):
        return True
    try:
        return any(v.get("name") == name for v in protection.status(host).get("vms", []))
    except ProtectionError:
        return False


def stop_vm_everywhere(name):
    """Stops the VM on both hosts. A primary whose remusdbd was killed gets
    it back first, as the rebooted host would, so that it forgets the VM
    (its definition is persisted and would block the next start)."""
    for host in ("backup", "primary"):
        try:
            if host == "primary":
                vm.ensure_daemon(host)
            if not vm_present(host, name):
                continue
            try:
                protection.unprotect(name, host)
            except ProtectionError:
                pass  # not protected there: the usual case
            vm.stop(name, host)
        except (Exception, SystemExit) as e:  # cleanup goes on with the other host
            say(f"stopping {name} on {host}: {e}")


def check_backup_free(name):
    """remusdbd on the backup refuses a new protection of a VM it is taking
    over, or one that runs there; say so before booting anything. (A
    replica it took over earlier stays listed as "active" after the VM was
    stopped there; the daemon replaces that one, so it is no obstacle.)"""
    try:
        r = protection.replica("backup", name)
    except ProtectionError as e:
        raise DrillError(str(e))
    state = (r or {}).get("state")
    if state in ("failing-over", "arbitrating") or (state == "active"
                                                    and vm_present("backup", name)):
        raise DrillError(f"the backup's remusdbd holds a replica of {name} in state {state} "
                         f"and refuses to protect that name again: use another --vm, or stop "
                         f"{name} on the backup host (tools/remusdb-vm stop {name} --host "
                         f"backup)")


def forget_backup_console(name):
    """The backup's console log of an earlier takeover must not be read as
    this run's (a takeover that never starts QEMU leaves it in place)."""
    try:
        (paths.vm_run_dir("backup", name) / "console.log").unlink()
    except FileNotFoundError:
        pass


def fresh_vm_for_protection(name):
    """The lab with its witness and both daemons up, and a freshly booted
    VM `name` on the primary that etcd lets it protect (a benchmark's
    start); returns the VM's accelerator."""
    lab_up(need_witness=True)
    vm.ensure_daemon("primary")
    vm.ensure_daemon("backup")
    stop_vm_everywhere(name)
    forget_ownership(name)
    vm.start(name, "primary", fresh=True, wait_timeout=400)
    return vm.status(name, "primary")["accel"]
