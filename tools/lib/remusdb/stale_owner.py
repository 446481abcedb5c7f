"""Retiring a VM's owner in etcd that outlived the VM.

The ownership key (ownership.py) has no TTL: after a takeover it names
the backup for good, and when that VM is stopped and a new VM of the same
name is booted on another host, remusdbd there refuses to protect it.
Deleting the key lets the next `protect` claim it afresh, which is safe
only when no host that etcd could have meant still runs the VM: every VM
host's remusdbd is asked whether it holds the VM (a definition, running
or not: a restarted daemon would bring it back) or a live replica of it
(one that receives checkpoints or is taking over). The host named as
the one to keep (the new VM's) is not counted for its definition. A host
whose remusdbd cannot be asked stops the retire, unless the operator
says that host is down. The delete holds only while the key is the one
read before the hosts were asked (its mod revision): a takeover that
commits meanwhile is never erased."""
from . import ownership, protection
from .ownership import OwnershipError
from .protection import ProtectionError

# Replica states in which the backup may still take the VM over or is
# being fed by a primary (replica.c): such a replica is the VM's.
LIVE_REPLICA_STATES = {"receiving", "ready", "arbitrating", "failing-over"}


class StaleOwnerError(Exception):
    """Nothing was retired; the message says why and what to do."""


def holdings(vm, host):
    """What host's remusdbd holds of vm, as short phrases (empty: nothing).
    Raises ProtectionError when it cannot be asked."""
    st = protection.status(host)
    found = [f"VM {vm} (state {v.get('run_state') or '?'})"
             for v in st.get("vms", []) if v.get("name") == vm]
    found += [f"a {r.get('state')} replica of {vm}" for r in st.get("replicas", [])
              if r.get("vm") == vm and r.get("state") in LIVE_REPLICA_STATES]
    return found


def survey(vm, hosts, down=()):
    """{host: holdings} for every host that answered, and the hosts that
    could not be asked, {host: why}. A host in `down` that answers is
    counted all the same: its answer beats the operator's belief."""
    answered, unasked = {}, {}
    for host in hosts:
        try:
            answered[host] = holdings(vm, host)
        except ProtectionError as e:
            unasked[host] = str(e)
    return answered, unasked


def describe(rec):
    if rec is None:
        return "etcd names no owner"
    if rec["owner"] is None:
        return f"etcd holds a value that is not remusdbd's ({rec['raw'][:60]!r})"
    return f"owned by {rec['owner']} (generation {rec['generation']})"


def retire(vm, keep=None, down=(), hosts=None):
    """Deletes vm's ownership key after the checks above; returns the
    record it deleted, or None when there was none. keep: the host whose
    copy of vm is the one to protect now. Raises StaleOwnerError."""
    hosts = list(hosts or protection.vm_hosts())
    try:
        protection.check_vm_name(vm)  # it goes into etcdctl's transaction text
    except ProtectionError as e:
        raise StaleOwnerError(str(e))
    try:
        rec = ownership.record(vm)
    except OwnershipError as e:
        raise StaleOwnerError(f"{vm}: {e}; nothing retired")
    if rec is None:
        return None
    if keep is not None and rec["owner"] == keep:
        raise StaleOwnerError(f"{vm}: etcd names {keep} as its owner, the host given by "
                              f"--host: that owner is not stale, and `remusdb protect {vm} "
                              f"--host {keep}` claims it as it is")
    answered, unasked = survey(vm, hosts, down)
    not_down = {h: why for h, why in unasked.items() if h not in down}
    if not_down:
        raise StaleOwnerError(
            f"{vm}: nothing retired: cannot ask " + "; ".join(
                f"{h} whether it runs {vm} ({why})" for h, why in not_down.items()) +
            "; if that host is down for good, say so with " +
            " ".join(f"--host-is-down {h}" for h in not_down))
    held = {h: what for h, what in answered.items() if what}
    if keep in held:
        # Its definition is the new VM; a live replica there is another
        # primary's, which is still running it.
        held[keep] = [w for w in held[keep] if not w.startswith(f"VM {vm} ")]
        if not held[keep]:
            del held[keep]
    if held:
        first = next(iter(held))
        raise StaleOwnerError(
            f"{vm} is {describe(rec)} and still held: " + "; ".join(
                f"{h} has {', '.join(what)}" for h, what in held.items()) +
            f"; nothing retired: stop it there first (`tools/remusdb-vm stop {vm} --host "
            f"{first}`), or, if that is the copy to keep, give --host {first}")
    try:
        retired, now = ownership.retire(vm, rec["mod_revision"])
    except OwnershipError as e:
        raise StaleOwnerError(f"{vm}: {e}; nothing retired")
    if not retired:
        raise StaleOwnerError(f"{vm}: etcd's record changed while the hosts were asked "
                              f"(was {describe(rec)}, now {describe(now)}): nothing retired; "
                              f"look again with `remusdb owner show {vm}`")
    return rec
