"""Protection from the operator's side: the control-socket calls that start
and stop Remus protection of a VM and take it over on the backup, and the
waiting that turns remusdbd's asynchronous answers into a result.

remusdbd answers `protect` at once and then works on its own (connect,
arbitrate, copy the disk, checkpoint), so everything here polls `status`
with short timeouts: a daemon that vanishes mid-call (the very thing a
failover drill does to the primary) costs one timeout, never a hang.
States this module does not know (a newer daemon may add some) count as
"still in progress"; only the terminal ones end a wait.
"""
import json
import subprocess
import time
from pathlib import Path

from . import cluster, control, paths

DEFAULT_PORT = cluster.DEFAULT_REPLICATION_PORT  # the port remusdbd listens on
INTERVAL_MS_RANGE = (25, 500)  # the checkpoint intervals the daemon accepts
STATUS_TIMEOUT = 3.0           # one status call; a healthy daemon answers in ms
POLL_SECONDS = 0.25
PROGRESS_EVERY = 2.0       # seconds between progress lines within one state
ERROR_GRACE = 10.0         # seconds a wait tolerates a daemon that does not answer

PRIMARY_DONE = {"protected"}
PRIMARY_BROKEN = {"failed", "fenced", "unprotected"}
REPLICA_DONE = {"active"}
REPLICA_BROKEN = {"failed", "passive"}


class ProtectionError(Exception):
    """Something the operator has to act on; the message says what."""


def vm_hosts():
    """The hosts of the cluster file (every one runs a remusdbd)."""
    return cluster.current().names()


def host_of(address):
    """The cluster host whose replication address is `address` ("IP" or
    "IP:PORT", as remusdbd names a peer), or None."""
    h = cluster.current().host_at(address)
    return h.name if h else None


def backup_syntax_problem(spec):
    """None when `spec` could name a backup (HOST or HOST:PORT, HOST a
    cluster host's name, an IP address or a DNS name), else why not;
    nothing is looked up."""
    host, sep, port_text = spec.strip().rpartition(":") if isinstance(spec, str) else ("", "", "")
    if not isinstance(spec, str) or not spec.strip():
        return f"must be HOST[:PORT], not {spec!r}"
    if sep and spec.count(":") == 1 and (not port_text.isdigit()
                                         or not 1 <= int(port_text) <= 65535):
        return (f"bad backup port in {spec!r}: give HOST or HOST:PORT "
                f"with a port between 1 and 65535 (default {DEFAULT_PORT})")
    parsed = cluster.split_address(spec, DEFAULT_PORT)
    if isinstance(parsed, str):
        return f"bad backup {spec!r}: {parsed}"
    return None


def parse_backup(spec):
    """A cluster host's name ("db2", "db2:7799"), an IP address or a DNS
    name, optionally with :PORT -> "IP:PORT" for remusdbd, which takes
    IPv4 addresses only: a name is resolved here. A host of the cluster
    without a port gets its replication address's port."""
    problem = backup_syntax_problem(spec)
    if problem:
        raise ProtectionError(problem)
    name, port = cluster.split_address(spec, None) if ":" in spec else (spec.strip(), None)
    try:
        known = cluster.current()
    except cluster.ClusterError:
        known = None   # no cluster file: an address or a DNS name still works
    if known and name in known.hosts:
        address, default_port = known.hosts[name].replication
    else:
        address, default_port = name, DEFAULT_PORT
    try:
        ip = cluster.resolve_ipv4(address)
    except cluster.ClusterError:
        hosts = f" (hosts of {known.path}: {', '.join(known.hosts)})" if known else ""
        raise ProtectionError(f"bad backup {spec!r}: {address!r} is not a host of the "
                              f"cluster{hosts}, an IPv4 address or a DNS name that resolves "
                              f"to one")
    return f"{ip}:{port or default_port}"


def access(host):
    """The control access of cluster host `host` (ProtectionError if the
    cluster file has no such host, or no file can be read)."""
    try:
        return cluster.current().host(host).control
    except cluster.ClusterError as e:
        raise ProtectionError(" ".join(e.problems))


def check_interval(ms):
    lo, hi = INTERVAL_MS_RANGE
    if not lo <= ms <= hi:
        raise ProtectionError(f"checkpoint interval {ms} ms is out of range: use {lo}..{hi} ms")
    return ms


def check_vm_name(name):
    from .vm_layout import check_name  # its naming rule, not a copy of it
    try:
        check_name(name)
    except SystemExit as e:
        raise ProtectionError(str(e))


def taken_over_meta(host, vm):
    """After a takeover the VM runs on `host` with no vm.json there: its
    remusdbd's replica names the command it runs (a failback protects from
    here). None when the host took nothing over."""
    try:
        r = replica(host, vm)
    except ProtectionError:
        return None
    command = ((r or {}).get("failover") or {}).get("command")
    if (r or {}).get("state") != "active" or not command:
        return None
    return {"command": command, "taken_over": True}


def vm_dir_state(host, vm):
    """What this machine's files say of VM `vm` of host `host`: its run
    directory, its vm.json's text (None if none) and whether its QEMU
    runs. `remusdb vm-meta` prints it for a CLI on another host."""
    run_dir = paths.vm_run_dir(host, vm)
    try:
        text = (run_dir / "vm.json").read_text()
    except FileNotFoundError:
        text = None
    except OSError as e:
        text = json.dumps({"unreadable": str(e)})
    return {"run_dir": str(run_dir), "vm_json": text, "qemu_running": qemu_running(host, vm)}


def host_vm_dir_state(host, vm):
    """vm_dir_state on `host`: read here for a host whose files this
    machine shares (control via local), else through ssh (`remusdb
    vm-meta` there, as control-relay is run)."""
    how = access(host)
    if how.via == "local":
        return vm_dir_state(host, vm)
    argv = how.ssh_argv("vm-meta", "--host", host, vm)
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ProtectionError(f"ssh {how.target}: {e}")
    err = r.stderr.strip().splitlines()
    if r.returncode != 0:
        raise ProtectionError(f"ssh {how.target} remusdb vm-meta: "
                              f"{err[-1] if err else f'exit {r.returncode}'}")
    try:
        return json.loads(r.stdout)
    except ValueError as e:
        raise ProtectionError(f"remusdb vm-meta on {how.target} sent no JSON ({e})")


def vm_meta(host, vm):
    """The VM's vm.json on `host` (written by remusdb-vm start), read
    there (host_vm_dir_state); it holds the QEMU command line the backup
    needs to rebuild the VM. Its "run_dir" is the VM's run directory on
    that host."""
    check_vm_name(vm)
    state = host_vm_dir_state(host, vm)
    meta_file = f"{state['run_dir']}/vm.json"
    if state["vm_json"] is None:
        taken = taken_over_meta(host, vm)
        if taken:
            return dict(taken, run_dir=state["run_dir"])
        raise ProtectionError(f"no VM named {vm!r} on {host} (no {meta_file}): start it with "
                              f"`tools/remusdb-vm start {vm} --host {host}`")
    try:
        meta = json.loads(state["vm_json"])
    except ValueError as e:
        raise ProtectionError(f"{meta_file} is not valid JSON ({e}); restart the VM with "
                              f"`tools/remusdb-vm stop {vm}` and `start`")
    if not isinstance(meta.get("command"), list) or not meta["command"]:
        raise ProtectionError(f"{meta_file} has no QEMU command line; restart the VM "
                              f"with `tools/remusdb-vm start {vm} --host {host}`")
    if not state["qemu_running"]:
        raise ProtectionError(f"VM {vm} on {host} is not running (its QEMU is gone); start it "
                              f"again with `tools/remusdb-vm start {vm} --host {host}`")
    return dict(meta, run_dir=state["run_dir"])


def libvirt_meta(host, vm, uri, backup_uri):
    """A libvirt domain's stand-in for vm.json: the command the backup runs
    at takeover is the libvirt launcher with the domain's XML."""
    import xml.etree.ElementTree as ET
    from . import libvirt
    from .libvirt_hook import wired_to_remusdbd
    check_vm_name(vm)
    try:
        state = libvirt.domain_state(uri, vm)
        if state != "running":
            raise ProtectionError(f"libvirt domain {vm} is {state or 'not defined'} at {uri}: "
                                  f"wire it (`tools/remusdb libvirt-wire {vm}`) and "
                                  f"`virsh start {vm}` first")
        # Wired is what libvirt's own definition says (the NBD disk, the
        # daemon's monitor), not a file under /run: that is gone after a
        # reboot, and the host that took the domain over never had one.
        xml = libvirt.migratable_xml(uri, vm)
        if not wired_to_remusdbd(ET.fromstring(xml), vm):
            raise ProtectionError(f"libvirt domain {vm} is not wired to remusdbd on {host}: "
                                  f"`tools/remusdb libvirt-wire {vm}`, then restart it")
        return {"command": libvirt.protect_argv(vm, uri, backup_uri, xml)}
    except libvirt.LibvirtError as e:
        raise ProtectionError(f"libvirt: {e}")


def qemu_pid(host, vm):
    try:
        return int((paths.vm_run_dir(host, vm) / "qemu.pid").read_text())
    except (OSError, ValueError):
        return None


def qemu_running(host, vm):
    pid = qemu_pid(host, vm)
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"qemu" in f.read()
    except OSError:
        return False


def request(host, cmd, timeout=STATUS_TIMEOUT, **fields):
    """control.request to cluster host `host`'s remusdbd, through its
    control access, with the host named in every error."""
    how = access(host)
    if how.via == "local" and not Path(how.socket).exists():
        raise ProtectionError(f"remusdbd is not running on {host} (no control socket at "
                              f"{how.socket})")
    try:
        return control.request_via(how, cmd, timeout=timeout, **fields)
    except control.ControlError as e:
        text = str(e)
        raise ProtectionError(f"{host}: {text}" if text.startswith("remusdbd ")
                              else f"remusdbd on {host}: {text}")
    except ValueError as e:  # a reply that is not JSON
        raise ProtectionError(f"remusdbd on {host} sent a malformed reply to {cmd}: {e}")


def status(host):
    return request(host, "status")


def primary_protection(host, vm):
    """The VM's protection object on its primary host, or None."""
    for v in status(host).get("vms", []):
        if v.get("name") == vm:
            return v.get("protection")
    return None


def daemon_run_state(host, vm):
    """The VM's QEMU run state as `host`'s remusdbd sees it ("running",
    "paused", "no-qemu", ...), or None when it lists no such VM. The
    daemon refuses to back up a VM whose QEMU it still sees, and it sees
    a QEMU that quit only once its QMP reconnect is refused (within about
    a second): wait for "no-qemu" before protecting back to that host."""
    for v in status(host).get("vms", []):
        if v.get("name") == vm:
            return v.get("run_state")
    return None


def replica(host, vm):
    """The backup's replica object for the VM, or None. A daemon may still
    list an old, finished replica next to a new one: prefer a live one."""
    found = [r for r in status(host).get("replicas", []) if r.get("vm") == vm]
    live = [r for r in found if r.get("state") not in REPLICA_BROKEN]
    return (live or found or [None])[-1]


def protect(vm, backup, interval_ms, host="primary", output_commit=True,
            unsafe_release_early=False, options=None, libvirt_uris=None):
    """Sends `protect`; returns the first protection object. `backup` is
    "IP:PORT" (see parse_backup). unsafe_release_early is a negative
    control for the drill (each epoch's output released one epoch early);
    it is sent only when set, since a daemon refuses fields it does not
    know. options: more protect fields, e.g. {"compress": False}.
    libvirt_uris: (this host's URI, the backup's URI) for a libvirt
    domain wired by `remusdb libvirt-wire` (docs/libvirt.md)."""
    check_interval(interval_ms)
    meta = libvirt_meta(host, vm, *libvirt_uris) if libvirt_uris else vm_meta(host, vm)
    extra = {"unsafe_release_early": True} if unsafe_release_early else {}
    extra.update(options or {})
    reply = request(host, "protect", timeout=10.0, vm=vm, backup=backup,
                    interval_ms=interval_ms, qemu_argv=meta["command"],
                    run_dir=meta.get("run_dir") or str(paths.vm_run_dir(host, vm)),
                    output_commit=output_commit, **extra)
    return reply.get("protection") or {}


def unprotect(vm, host="primary"):
    return request(host, "unprotect", timeout=10.0, vm=vm).get("protection") or {}


def reset_stats(vm, host="primary"):
    """Checkpoint statistics start again from zero; returns the protection."""
    return request(host, "reset-stats", timeout=10.0, vm=vm).get("protection") or {}


def hold_checkpoint(vm, dump, size, host="primary"):
    """The VM stays paused at its next checkpoint and QEMU writes `size`
    bytes of its memory (from guest physical 0) to `dump`; status shows
    checkpoint_hold. release_checkpoint() resumes it (or 60 s do)."""
    return request(host, "hold-checkpoint", timeout=10.0, vm=vm, dump=str(dump),
                   size=int(size)).get("protection") or {}


def release_checkpoint(vm, host="primary"):
    return request(host, "release-checkpoint", timeout=10.0, vm=vm).get("protection") or {}


def image_checksums(vm, block, path, host="backup"):
    """The backup writes the XXH3-64 of every page of RAM block `block` of
    its committed image to `path`; its replica shows image_checksums."""
    request(host, "image-checksums", timeout=10.0, vm=vm, block=block, path=str(path))


def failover(vm, host="backup"):
    request(host, "failover", timeout=10.0, vm=vm)


def disk_sync_percent(p):
    sync = p.get("disk_sync") or {}
    total = sync.get("total") or 0
    if sync.get("done"):
        return 100.0
    return 100.0 * (sync.get("bytes") or 0) / total if total else 0.0


def describe_progress(p):
    state = p.get("state", "?")
    if state == "syncing":
        sync = p.get("disk_sync") or {}
        return (f"syncing: disk {disk_sync_percent(p):.0f}% "
                f"({(sync.get('bytes') or 0) >> 20}/{(sync.get('total') or 0) >> 20} MiB), "
                f"epoch {p.get('epoch', 0)}")
    if state == "protected":
        return f"protected: epoch {p.get('epoch', 0)}, acked {p.get('acked_epoch', 0)}"
    return state


def _wait(poll, done, broken, timeout, progress, what):
    """Polls until poll() returns an object whose "state" is in done
    (returned) or broken (ProtectionError with the daemon's error), or
    until the timeout. progress(obj) is called whenever the picture
    changes (a change of state at once, other news every PROGRESS_EVERY
    seconds). A failing poll is retried for ERROR_GRACE seconds, so a
    daemon that is briefly busy does not end the wait but one that is
    gone does not keep the operator waiting for the whole timeout."""
    deadline = time.monotonic() + timeout
    last_shown, last_state, last_time, failing_since = None, None, 0.0, None
    while True:
        try:
            obj = poll()
            failing_since = None
        except ProtectionError as e:
            failing_since = failing_since or time.monotonic()
            if time.monotonic() - failing_since > ERROR_GRACE or time.monotonic() >= deadline:
                raise ProtectionError(f"{what}: {e}")
            time.sleep(POLL_SECONDS)
            continue
        state = obj.get("state")
        shown = describe_progress(obj)
        if progress and shown != last_shown and (
                state != last_state or time.monotonic() - last_time >= PROGRESS_EVERY):
            progress(obj)
            last_shown, last_state, last_time = shown, state, time.monotonic()
        if state in done:
            return obj
        if state in broken:
            raise ProtectionError(f"{what} ended {state}: "
                                  f"{obj.get('error') or 'remusdbd gave no reason'}")
        if time.monotonic() >= deadline:
            raise ProtectionError(f"{what}: still {state} after {timeout:.0f} s")
        time.sleep(POLL_SECONDS)


def wait_protected(vm, host="primary", timeout=600, progress=None):
    def poll():
        p = primary_protection(host, vm)
        if p is None:
            raise ProtectionError(f"remusdbd on {host} no longer lists VM {vm}")
        return p
    return _wait(poll, PRIMARY_DONE, PRIMARY_BROKEN, timeout, progress,
                 f"protection of {vm}")


def wait_active(vm, host="backup", timeout=60, progress=None):
    def poll():
        r = replica(host, vm)
        if r is None:
            raise ProtectionError(f"remusdbd on {host} holds no replica of {vm}")
        return r
    return _wait(poll, REPLICA_DONE, REPLICA_BROKEN, timeout, progress,
                 f"takeover of {vm} on {host}")
