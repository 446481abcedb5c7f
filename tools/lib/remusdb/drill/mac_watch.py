"""Which host a VM's frames reach the LAN from, counted on the LAN
bridge itself: the soak's check that two copies of a VM never served at
once (drill/soak.py).

A copy serves only by sending: its replies leave its host through that
host's remusdbd (the relay) and its bridge, then through the host's one
veth port into the LAN bridge (p-primary or p-backup, netns.py). Both
copies of a VM carry the same MAC, so nftables counters on the LAN
bridge, one per (VM MAC, host port), tell from outside both hosts which
host the VM's frames come from. Sampled every SAMPLE_S, they give a
timeline; frames of the same MAC from both ports that no move of the VM
explains are two primaries serving (both_ports_intervals). A copy whose output is held (a primary
waiting for its backup's acknowledgement), paused (fenced), cut off, or
whose relay died sends nothing here, so neither counts, which is the
point: what the clients could have seen is what is counted.
"""
import json
import threading
import time

from ..lab import netns
from .inject import InjectError, nft

TABLE = "remusdb_soak_macs"
SAMPLE_S = 0.1
PORTS = ("p-primary", "p-backup")


def ruleset(macs):
    """One counter rule per (MAC, port), each tagged `comment "MAC PORT"`
    so that the JSON listing names what it counts."""
    rules = "\n".join(f'    iifname "{port}" ether saddr {mac} counter comment "{mac} {port}"'
                      for mac in macs for port in PORTS)
    return f"""
table bridge {TABLE} {{
  chain count {{
    type filter hook prerouting priority -400; policy accept;
{rules}
  }}
}}
"""


def read_counters():
    """{(mac, port): frames} from the LAN bridge's table."""
    data = json.loads(nft(netns.LAN_NS, "-j", "list", "table", "bridge", TABLE))
    out = {}
    for item in data.get("nftables", []):
        rule = item.get("rule")
        if not rule or "comment" not in rule:
            continue
        mac, port = rule["comment"].split()
        for expr in rule.get("expr", []):
            if "counter" in expr:
                out[(mac, port)] = expr["counter"]["packets"]
    return out


def remove():
    try:
        nft(netns.LAN_NS, "delete", "table", "bridge", TABLE)
    except InjectError:
        pass  # none there


def _grew(before, after, mac):
    return [p for p in PORTS if after.get((mac, p), 0) > before.get((mac, p), 0)]


def both_ports_intervals(samples, mac):
    """Pure: the sampling intervals in which frames of `mac` came from both
    ports while no move explains it (unix times of their ends). samples:
    [(unix time, {(mac, port): frames})] in time order.

    A VM that moves (a takeover, a switchover) stops sending from one port
    and starts from the other; when the gap between its last old frame
    and its first new one is shorter than a sampling interval (a
    switchover pauses it about 100 ms, and a loaded host stretches the
    intervals), that one interval sees both ports. That is a move when
    the intervals around it with frames from one port only show the old
    port before and the new one after. Two primaries show otherwise: the
    same port before and after (the other copy spoke meanwhile), or both
    ports in two intervals in a row."""
    per = [(t, _grew(before, after, mac)) for (_, before), (t, after) in zip(samples, samples[1:])]
    found = []
    for i, (t, ports) in enumerate(per):
        if len(ports) < len(PORTS):
            continue
        if (i > 0 and len(per[i - 1][1]) == len(PORTS)) or \
                (i + 1 < len(per) and len(per[i + 1][1]) == len(PORTS)):
            found.append(t)  # both, twice in a row
            continue
        before = next((p[0] for _, p in reversed(per[:i]) if len(p) == 1), None)
        after = next((p[0] for _, p in per[i + 1:] if len(p) == 1), None)
        if before is not None and before == after:
            found.append(t)  # A, both, A: the other copy spoke while A served
    return found


def port_runs(samples, mac):
    """Pure: the ports `mac`'s frames came from, one entry per run of
    intervals with frames from the same single port, e.g. ["p-primary",
    "p-backup"] for one move. A VM that serves from one host at a time
    moves once per takeover; an A, B, A within one fault means the old
    copy spoke again."""
    runs = []
    for (_, before), (_, after) in zip(samples, samples[1:]):
        grew = _grew(before, after, mac)
        if len(grew) == 1 and (not runs or runs[-1] != grew[0]):
            runs.append(grew[0])
    return runs


class MacWatch(threading.Thread):
    """Installs the counters for `macs` ({vm: mac}) and samples them until
    stop(); window(t0, t1) gives each VM's verdict over part of the run."""

    def __init__(self, macs):
        super().__init__(daemon=True)
        self.macs = dict(macs)
        self.samples = []
        self.errors = 0
        self.stopping = threading.Event()
        self.lock = threading.Lock()

    def start(self):
        remove()
        try:
            nft(netns.LAN_NS, "-f", "-", stdin=ruleset(self.macs.values()))
        except InjectError as e:
            raise InjectError(f"cannot count the VMs' frames on the LAN bridge: {e}")
        super().start()

    def run(self):
        while not self.stopping.is_set():
            try:
                counters = read_counters()
                with self.lock:
                    self.samples.append((time.time(), counters))
            except (InjectError, ValueError):
                self.errors += 1
            time.sleep(SAMPLE_S)

    def stop(self):
        self.stopping.set()
        self.join(timeout=5)
        remove()

    def window(self, t0, t1):
        """{vm: {"both_ports_intervals": n, "ports": [...]}} over [t0, t1]."""
        with self.lock:
            part = [s for s in self.samples if t0 <= s[0] <= t1]
        return {vm: {"both_ports_intervals": len(both_ports_intervals(part, mac)),
                     "ports": port_runs(part, mac), "samples": len(part)}
                for vm, mac in self.macs.items()}
