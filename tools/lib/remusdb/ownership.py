"""Who owns a VM, as etcd says: the record remusdbd arbitrates takeovers
with (dom0-daemon/src/witness/witness_proto.c: {"owner": HOST, "generation": N}
under /remusdb/vms/NAME/owner). A host may run a VM only when etcd names
it, or names nobody. An owner outlives its VM (the key has no TTL):
retire() deletes it, by a transaction that holds only while the key is
still the one that was read, so a concurrent takeover is never erased."""
import base64
import json
import subprocess

from . import cluster


class OwnershipError(Exception):
    pass


def key(name):
    return f"/remusdb/vms/{name}/owner"


def _etcdctl(*args, endpoints=None, stdin=None):
    """etcdctl against the cluster file's etcd, run where the cluster's
    default host runs programs (its exec_prefix: nothing on a real host,
    the host's namespace in the lab)."""
    try:
        c = cluster.current()
        prefix = list(c.host(c.the_default_host()).exec_prefix or ())
        endpoints = endpoints or ",".join(c.etcd)
    except cluster.ClusterError as e:
        raise OwnershipError(f"cannot ask etcd: {e}")
    if not endpoints:
        raise OwnershipError(f"cannot ask etcd: the cluster file {c.path} names no etcd")
    cmd = [*prefix, "etcdctl", "--endpoints", endpoints, "--dial-timeout", "3s",
           "--command-timeout", "5s", *args]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=15, input=stdin)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise OwnershipError(f"cannot ask etcd: {e}")
    if r.returncode != 0:
        raise OwnershipError(f"cannot ask etcd: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
    return r.stdout


def _parse(name, text):
    try:
        value = json.loads(text)
        return {"owner": str(value["owner"]), "generation": int(value["generation"])}
    except (ValueError, KeyError, TypeError):
        raise OwnershipError(f"etcd's record for {name} is not remusdbd's: {text[:80]!r}")


def owner(name):
    """{"owner": HOST, "generation": N}, or None when etcd holds no record."""
    out = _etcdctl("get", "--print-value-only", key(name)).strip()
    if not out:
        return None
    return _parse(name, out)


def _record_of(name, kvs):
    if not kvs:
        return None
    try:
        text = base64.b64decode(kvs[0]["value"]).decode("utf-8", "replace")
        revision = int(kvs[0]["mod_revision"])
    except (KeyError, TypeError, ValueError):
        raise OwnershipError(f"etcdctl's answer about {key(name)} is not what etcd 3.4 sends")
    # A record that is not remusdbd's can be retired too: it blocks a claim all the same.
    try:
        rec = _parse(name, text)
    except OwnershipError:
        rec = {"owner": None, "generation": None}
    return dict(rec, raw=text, mod_revision=revision)


def _json(name, out):
    try:
        return json.loads(out)
    except ValueError:
        raise OwnershipError(f"etcdctl's answer about {key(name)} is not JSON: {out[:80]!r}")


def record(name):
    """owner() and the key's etcd mod revision (which a retire compares),
    {"owner", "generation", "raw", "mod_revision"}; None without a key.
    owner and generation are None for a value that is not remusdbd's."""
    return _record_of(name, _json(name, _etcdctl("get", "-w", "json", key(name))).get("kvs"))


def retire(name, mod_revision):
    """Deletes the VM's ownership key if its mod revision is still
    mod_revision (nobody wrote it since it was read). Returns (True, None)
    when it was deleted, else (False, the record etcd holds now or None)."""
    txn = (f'mod("{key(name)}") = "{int(mod_revision)}"\n\n'
           f"del {key(name)}\n\n"
           f"get {key(name)}\n\n")
    reply = _json(name, _etcdctl("txn", "-w", "json", stdin=txn))
    if reply.get("succeeded"):
        return True, None
    for response in reply.get("responses") or []:
        found = (response.get("Response") or {}).get("ResponseRange")
        if found is not None:
            return False, _record_of(name, found.get("kvs"))
    return False, None


def set_owner(name, host, generation):
    """For drills and tests: what a takeover by host would have written."""
    _etcdctl("put", key(name), json.dumps({"owner": host, "generation": generation},
                                          separators=(",", ":")))
