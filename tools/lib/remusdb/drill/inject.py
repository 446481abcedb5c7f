"""How a drill fails a VM host: kill its processes, cut its LAN link, or
take its power away. The host is the primary unless named: a failback
drill (tests/integration/test_failback.py) cuts the backup host too, once
it runs the VM.

A power loss is the hard case for failure detection: the host goes silent
at one instant and nobody hears a goodbye.  A plain SIGKILL is not that:
the kernel closes the dead processes' sockets, so the backup gets a FIN or
an RST from the primary's remusdbd within milliseconds, and the clients
get them from the guest's relayed connections.  So `power` first drops
every frame into and out of the primary's namespace with nftables, and
only then kills every QEMU the host runs, its remusdbd and that daemon's
children; whatever their kernel sends after that
dies at the namespace's edge.

The namespace has one wire to the rest of the lab, its eth0 (a veth whose
other end, p-primary, is a port of the LAN bridge in rdb-lan; netns.py).
eth0 is also a port of the host's own bridge br0, which carries the
guest's tap.  Routed traffic of the host and bridged traffic of the guest
both leave and enter through eth0, so a netdev ingress and a netdev
egress chain on eth0 see every frame in both directions; a bridge table
and an inet table drop the same traffic earlier as well (loopback
excepted, so that the "rebooted" host's tools can still run).  The
evidence that nothing got out is the LAN side's own receive counter on
p-primary, read when the cut begins and again when it ends. Every VM
host is wired alike (netns.py): for host H, eth0 in its namespace and
p-H on the LAN bridge.
"""
import json
import os
import signal
import subprocess
import time
from pathlib import Path

from ..lab import netns
from .. import paths

PRIMARY_PORT = "p-primary"       # the primary's veth port on the LAN bridge
PRIMARY_WIRE = "eth0"            # its other end, inside rdb-primary (every host's wire)
CUT_TABLE = "remusdb_power_cut"
PROCESS_GONE_TIMEOUT_S = 10
NFT_TIMEOUT_S = 10


class InjectError(Exception):
    """The failure could not be injected (or undone)."""


def cut_ruleset(wire=PRIMARY_WIRE, table=CUT_TABLE):
    """The nft script that silences a namespace whose only link is `wire`.
    Every chain counts what it drops, so the drill can show the cut held."""
    drop = "policy drop; counter drop;"
    return f"""
table netdev {table} {{
  chain wire_in {{ type filter hook ingress device "{wire}" priority -500; {drop} }}
  chain wire_out {{ type filter hook egress device "{wire}" priority -500; {drop} }}
}}
table bridge {table} {{
  chain bridge_in {{ type filter hook input priority -500; {drop} }}
  chain bridge_forward {{ type filter hook forward priority -500; {drop} }}
  chain bridge_out {{ type filter hook output priority -500; {drop} }}
}}
table inet {table} {{
  chain ip_in {{ type filter hook input priority -500; policy drop; iifname "lo" accept; counter drop; }}
  chain ip_forward {{ type filter hook forward priority -500; {drop} }}
  chain ip_out {{ type filter hook output priority -500; policy drop; oifname "lo" accept; counter drop; }}
}}
"""


FAMILIES = ("netdev", "bridge", "inet")


def nft(ns, *args, stdin=None):
    try:
        r = subprocess.run(["ip", "netns", "exec", ns, "nft", *args], input=stdin,
                           capture_output=True, text=True, timeout=NFT_TIMEOUT_S)
    except FileNotFoundError:
        raise InjectError("nft is not installed (tools/setup/install-deps.sh installs nftables)")
    except subprocess.TimeoutExpired:
        raise InjectError(f"nft {' '.join(args)} in {ns} timed out")
    if r.returncode != 0:
        raise InjectError(f"nft {' '.join(args)} in {ns} failed: {r.stderr.strip()}")
    return r.stdout


def lan_port(host):
    """The LAN bridge's veth port of a lab host (netns.up names it p-HOST)."""
    netns.namespace_of(host)  # an unknown host is refused
    return f"p-{host}"


def lan_port_counters(port=PRIMARY_PORT):
    """(frames, bytes) the LAN bridge's port `port` received, i.e. what the
    host behind it sent onto the LAN."""
    out = netns.in_ns(netns.LAN_NS, "ip", "-s", "-j", "link", "show", port,
                      capture=True).stdout
    rx = json.loads(out)[0]["stats64"]["rx"]
    return rx["packets"], rx["bytes"]


def drop_counters(ns, table=CUT_TABLE):
    """{"family chain": frames dropped} of the cut's tables in `ns`."""
    out = {}
    for family in FAMILIES:
        data = json.loads(nft(ns, "-j", "list", "table", family, table))
        for item in data.get("nftables", []):
            rule = item.get("rule")
            if not rule:
                continue
            for expr in rule.get("expr", []):
                if "counter" in expr:
                    out[f"{family} {rule['chain']}"] = expr["counter"]["packets"]
    return out


class Cut:
    """A host's namespace silenced (the primary's unless `host` names
    another): install() puts the tables in and notes the LAN port's
    counter, finish() reads the evidence and remove() takes the tables out
    again."""

    def __init__(self, ns=None, wire=PRIMARY_WIRE, port=None, host="primary"):
        self.host = host
        self.ns = ns or netns.namespace_of(host)
        self.wire, self.port = wire, port or lan_port(host)
        self.installed = False
        self.lan_rx_at_cut = None
        self.evidence = None

    def install(self):
        nft(self.ns, "-f", "-", stdin=cut_ruleset(self.wire))
        self.installed = True
        self.lan_rx_at_cut = lan_port_counters(self.port)
        return time.time()

    def finish(self):
        """What the cut let through (must be nothing) and what it dropped;
        call it before remove()."""
        rx = lan_port_counters(self.port)
        self.evidence = {
            "host": self.host,
            "lan_port": self.port,
            "lan_frames_from_primary_after_cut": rx[0] - self.lan_rx_at_cut[0],
            "lan_bytes_from_primary_after_cut": rx[1] - self.lan_rx_at_cut[1],
            "frames_dropped": drop_counters(self.ns),
        }
        return self.evidence

    def remove(self):
        if not self.installed:
            return
        for family in FAMILIES:
            nft(self.ns, "delete", "table", family, CUT_TABLE)
        self.installed = False


def remove_leftover_cut(ns=None, host="primary"):
    """An earlier drill that died mid-way may have left a host cut."""
    ns = ns or netns.namespace_of(host)
    for family in FAMILIES:
        subprocess.run(["ip", "netns", "exec", ns, "nft", "delete", "table", family, CUT_TABLE],
                       capture_output=True, timeout=NFT_TIMEOUT_S)


# ---------------------------------------------------------------- processes

def live_pid(pid_file, must_contain):
    """The pid in pid_file if it runs a command containing must_contain
    (a reused pid must never be killed)."""
    try:
        pid = int(Path(pid_file).read_text())
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if must_contain in f.read():
                return pid
    except (OSError, ValueError):
        pass
    return None


def process_gone(pid):
    """Gone or a zombie: either way it holds no socket and no device."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def wait_gone(pids, timeout=PROCESS_GONE_TIMEOUT_S):
    deadline = time.monotonic() + timeout
    while not all(process_gone(p) for p in pids):
        if time.monotonic() > deadline:
            raise InjectError(f"processes {pids} still exist {timeout} s after SIGKILL")
        time.sleep(0.02)


def children(pid):
    """pid's child processes (a fork of a replica, a page source)."""
    kids = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids += [int(k) for k in (task / "children").read_text().split()]
        except (OSError, ValueError):
            pass
    return kids


def host_pids(name, host="primary", whole_host=True):
    """What a power cut of host kills: every QEMU it runs (VM name's
    first, which must run), its remusdbd, and that daemon's children. A
    host with two VMs loses both: a QEMU left alive in the cut namespace
    would come back with the network, which a power loss never does.
    whole_host=False: VM name's QEMU and the daemon only (mode kill).
    name None: a host that runs no VM loses its daemon and its children."""
    qemu = live_pid(paths.vm_run_dir(host, name) / "qemu.pid", b"qemu") if name else None
    daemon_pid_file = paths.host_run_dir(host) / "remusdbd.pid"
    daemon = live_pid(daemon_pid_file, b"remusdbd")
    if qemu is None and (name or not whole_host):
        raise InjectError(f"the {host}'s QEMU for {name} is not running: nothing to kill")
    if daemon is None:
        raise InjectError(f"no running remusdbd pid in {daemon_pid_file}")
    if not whole_host:
        return qemu, daemon
    others = [pid for f in sorted((paths.host_run_dir(host) / "vms").glob("*/qemu.pid"))
              if (pid := live_pid(f, b"qemu")) not in (None, qemu)]
    return (*([qemu] if qemu else []), *others, daemon, *children(daemon))


def kill_pids(pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # a daemon's child that ended on its own meanwhile


def set_link(host, up):
    netns.sh("ip", "-n", netns.LAN_NS, "link", "set", lan_port(host), "up" if up else "down")


class Injection:
    """One failure of the host running VM name (the primary unless `host`
    names another), and how to undo its network part once that host's VM
    and daemon are gone (undo())."""

    def __init__(self, mode, name, host="primary"):
        self.mode, self.name, self.host = mode, name, host
        self.cut = None
        self.link_down = False
        self.killed = []

    def inject(self):
        """Fails the host; returns the unix time of the failure."""
        if self.mode == "kill":
            pids = host_pids(self.name, self.host, whole_host=False)
            at = time.time()
            kill_pids(pids)
            self.killed = list(pids)
            return at
        if self.mode == "cut-link":
            at = time.time()
            set_link(self.host, False)
            self.link_down = True
            return at
        if self.mode == "power":
            pids = host_pids(self.name, self.host)  # before the cut: nothing to undo if absent
            self.cut = Cut(host=self.host)
            at = self.cut.install()
            kill_pids(pids)
            self.killed = list(pids)
            return at
        raise InjectError(f"unknown failure mode {self.mode!r}")

    def evidence(self):
        """For power: what reached the LAN after the cut (call before undo)."""
        if self.cut is None or not self.cut.installed:
            return None
        wait_gone(self.killed)
        return self.cut.finish()

    def undo(self):
        """Restores the host's network; the caller has stopped its old VM
        first (or the cut killed it), so that it never meets the new one on
        the LAN."""
        if self.killed:
            wait_gone(self.killed)
        if self.cut is not None:
            self.cut.remove()
        if self.link_down:
            set_link(self.host, True)
            self.link_down = False
