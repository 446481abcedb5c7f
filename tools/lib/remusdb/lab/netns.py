"""Network namespaces that play the lab's hosts.

Topology (all made and removed by this module; nothing else is touched;
up() also starts an sshd in each VM host and writes the cluster files,
lab/sshd.py and lab/cluster_file.py):

    rdb-lan:      bridge lan0, one veth port per host
    rdb-primary:  eth0 -> bridge br0 (10.77.0.1); guest taps join br0
    rdb-backup:   eth0 -> bridge br0 (10.77.0.2); guest taps join br0
    rdb-client:   eth0 (10.77.0.3)
    rdb-witness:  eth0 (10.77.0.5; witness.py adds .6 and .7 for a
                  three-member etcd)

A VM host keeps its own bridge so that a guest's tap sits on the LAN while
the host keeps an address of its own, as a dom0 does with xenbr0.
"""
import os
import subprocess

SUBNET_PREFIX = "10.77.0"
PREFIX_LEN = 24
LAN_NS = "rdb-lan"
LAN_BRIDGE = "lan0"
HOSTS = {  # name -> (namespace, host address, has a bridge for guests)
    "primary": ("rdb-primary", f"{SUBNET_PREFIX}.1", True),
    "backup": ("rdb-backup", f"{SUBNET_PREFIX}.2", True),
    "client": ("rdb-client", f"{SUBNET_PREFIX}.3", False),
    "witness": ("rdb-witness", f"{SUBNET_PREFIX}.5", False),  # etcd (witness.py)
}
# The hosts that can run a VM (they have the guest bridge).
VM_HOSTS = [host for host, (_, _, has_bridge) in HOSTS.items() if has_bridge]
GUEST_BRIDGE = "br0"
ALL_NAMESPACES = [LAN_NS] + [ns for ns, _, _ in HOSTS.values()]


def sh(*args, check=True, capture=False):
    return subprocess.run(list(args), check=check, text=True,
                          stdout=subprocess.PIPE if capture else None,
                          stderr=subprocess.PIPE if capture else None)


def in_ns(ns, *args, check=True, capture=False):
    return sh("ip", "netns", "exec", ns, *args, check=check, capture=capture)


def namespaces():
    out = sh("ip", "netns", "list", capture=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def namespace_of(host):
    if host not in HOSTS:
        raise SystemExit(f"unknown lab host {host!r}; hosts are: {', '.join(HOSTS)}")
    return HOSTS[host][0]


def link_exists(ns, name):
    return in_ns(ns, "ip", "link", "show", name, check=False, capture=True).returncode == 0


def bridge_mac(address):
    """A fixed, locally administered MAC for the host bridge holding `address`."""
    return "02:01:" + ":".join(f"{int(octet):02x}" for octet in address.split("."))


def up():
    existing = namespaces()
    for ns in ALL_NAMESPACES:
        if ns not in existing:
            sh("ip", "netns", "add", ns)
        in_ns(ns, "ip", "link", "set", "lo", "up")
    if not link_exists(LAN_NS, LAN_BRIDGE):
        in_ns(LAN_NS, "ip", "link", "add", LAN_BRIDGE, "type", "bridge")
    in_ns(LAN_NS, "ip", "link", "set", LAN_BRIDGE, "up")
    for host, (ns, address, has_bridge) in HOSTS.items():
        port = f"p-{host}"
        if not link_exists(LAN_NS, port):
            in_ns(LAN_NS, "ip", "link", "add", port, "type", "veth",
                  "peer", "name", "eth0", "netns", ns)
        in_ns(LAN_NS, "ip", "link", "set", port, "master", LAN_BRIDGE, "up")
        addressed = "eth0"
        if has_bridge:
            if not link_exists(ns, GUEST_BRIDGE):
                in_ns(ns, "ip", "link", "add", GUEST_BRIDGE, "type", "bridge")
            # A bridge without an address of its own takes the lowest MAC
            # of its ports, so the host's MAC would change whenever a guest
            # tap with a lower one joins or leaves, and its peers' ARP
            # caches would point at a MAC nobody has for half a minute.
            in_ns(ns, "ip", "link", "set", GUEST_BRIDGE, "address", bridge_mac(address))
            in_ns(ns, "ip", "link", "set", "eth0", "master", GUEST_BRIDGE)
            in_ns(ns, "ip", "link", "set", GUEST_BRIDGE, "up")
            addressed = GUEST_BRIDGE
        in_ns(ns, "ip", "link", "set", "eth0", "up")
        in_ns(ns, "ip", "addr", "replace", f"{address}/{PREFIX_LEN}", "dev", addressed)
    # The hosts as the product sees them: an sshd in each VM host, and the
    # cluster files naming them (they build on the namespaces made here).
    from . import cluster_file, sshd
    sshd.start()
    cluster_file.write()


def client_call(fn, *args, **kwargs):
    """fn(*args, **kwargs) in the client host's network stack: the lab's
    connect_via for remusdb.fork and remusdb.clone_identity, whose
    connections to the guests must come from a host on the LAN."""
    return call_in(HOSTS["client"][0], fn, *args, **kwargs)


def read_pool_site(host):
    """Where a read pool (remusdb.read_pool) runs in lab host `host`'s
    namespace, and where clients reach it."""
    from ..read_pool import Site
    ns, address, _ = HOSTS[host]
    return Site(name=host, exec_prefix=("ip", "netns", "exec", ns), address=address)


def kill_processes(ns):
    """Stops whatever runs in one of our namespaces (QEMU, remusdbd)."""
    out = sh("ip", "netns", "pids", ns, check=False, capture=True).stdout
    for pid in out.split():
        sh("kill", "-KILL", pid, check=False)


def down():
    existing = namespaces()
    for ns in ALL_NAMESPACES:
        if ns in existing:
            kill_processes(ns)
            sh("ip", "netns", "delete", ns)


def status():
    existing = namespaces()
    lines = []
    for host, (ns, address, _) in HOSTS.items():
        if ns not in existing:
            lines.append(f"{host:8} {ns:12} absent")
            continue
        pids = sh("ip", "netns", "pids", ns, check=False, capture=True).stdout.split()
        lines.append(f"{host:8} {ns:12} up  {address}/{PREFIX_LEN}  processes: {len(pids)}")
    lines.append(f"lan      {LAN_NS:12} {'up' if LAN_NS in existing else 'absent'}")
    return "\n".join(lines)


def is_up():
    return set(ALL_NAMESPACES) <= namespaces()


CLONE_NEWNET = 0x40000000


def enter(ns):
    """Moves the calling thread into namespace ns's network stack
    (setns(2) through libc: Python 3.11 has no os.setns)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into {ns}: {os.strerror(err)}")
    finally:
        os.close(fd)


def call_in(ns, fn, *args, **kwargs):
    """fn(*args, **kwargs) run in namespace ns's network stack, from this
    process: a thread enters the namespace (setns affects that thread
    only) and calls fn there. Sockets keep the namespace they were made in,
    so a connection opened this way is usable from any thread afterwards."""
    import threading
    result = {}

    def run():
        try:
            enter(ns)
            result["value"] = fn(*args, **kwargs)
        except BaseException as e:  # handed to the caller
            result["error"] = e

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in result:
        raise result["error"]
    return result["value"]
