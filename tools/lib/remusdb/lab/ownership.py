"""Who owns a VM, as etcd says: the record remusdbd arbitrates takeovers
with (dom0-daemon/src/witness/witness_proto.c: {"owner": HOST, "generation": N}
under /remusdb/vms/NAME/owner). A host may run a VM only when etcd names
it, or names nobody."""
import json
import subprocess

from . import netns, witness


class OwnershipError(Exception):
    pass


def key(name):
    return f"/remusdb/vms/{name}/owner"


def _etcdctl(*args, endpoints=None):
    cmd = ["ip", "netns", "exec", netns.namespace_of("primary"), "etcdctl",
           "--endpoints", endpoints or witness.client_endpoints(), "--dial-timeout", "3s",
           "--command-timeout", "5s", *args]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise OwnershipError(f"cannot ask etcd: {e}")
    if r.returncode != 0:
        raise OwnershipError(f"cannot ask etcd: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
    return r.stdout


def owner(name):
    """{"owner": HOST, "generation": N}, or None when etcd holds no record."""
    out = _etcdctl("get", "--print-value-only", key(name)).strip()
    if not out:
        return None
    try:
        value = json.loads(out)
        return {"owner": str(value["owner"]), "generation": int(value["generation"])}
    except (ValueError, KeyError, TypeError):
        raise OwnershipError(f"etcd's record for {name} is not remusdbd's: {out[:80]!r}")


def set_owner(name, host, generation):
    """For drills and tests: what a takeover by host would have written."""
    _etcdctl("put", key(name), json.dumps({"owner": host, "generation": generation},
                                          separators=(",", ":")))
