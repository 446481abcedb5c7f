"""The power drill's cut must make the primary host silent: after it, a
process that dies in rdb-primary (or in a guest bridged there) gets no
FIN or RST out, and the LAN bridge's port of the primary receives not one
frame.  A namespace plays the guest: a veth on rdb-primary's br0, as a
guest's tap is.  Without the cut the same kills are heard at once (the
control that shows the test can fail)."""
import json
import subprocess
import time

import pytest

from remusdb.lab import netns
from remusdb.drill.inject import Cut, lan_port_counters, remove_leftover_cut

GUEST_NS = "rdb-pguest"
GUEST_IP = f"{netns.SUBNET_PREFIX}.99"
PORT = 5999
WATCH_S = 4

LISTENER = """
import socket, sys
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind((sys.argv[1], int(sys.argv[2])))
l.listen()
print("listening", flush=True)
c, _ = l.accept()
while c.recv(65536):
    pass
"""

# Connects to every address, then (after a line on stdin) keeps sending to
# each for WATCH seconds and reports what it heard: a dead peer's kernel
# answers data with an RST, and closes with a FIN.
CLIENT = """
import json, socket, sys, time
watch, port, hosts = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]

def connect(h):
    # a fresh namespace's first frames can be lost: retry what is setup, not test
    until = time.time() + 20
    while True:
        try:
            return socket.create_connection((h, port), timeout=2)
        except OSError as e:
            if time.time() > until:
                sys.exit("cannot connect to %s:%d: %s" % (h, port, e))

socks = [connect(h) for h in hosts]
print("connected", flush=True)
sys.stdin.readline()
heard = {h: "nothing" for h in hosts}
for s in socks:
    s.setblocking(False)
until = time.time() + watch
while time.time() < until:
    for h, s in zip(hosts, socks):
        if heard[h] != "nothing":
            continue
        try:
            s.send(b"x")
            if s.recv(100) == b"":
                heard[h] = "FIN"
        except BlockingIOError:
            pass
        except (ConnectionResetError, BrokenPipeError):
            heard[h] = "RST"
        except OSError as e:
            heard[h] = "error: %s" % e
    time.sleep(0.1)
print(json.dumps(heard), flush=True)
"""


def popen_in(ns, *args, stdin=None):
    return subprocess.Popen(["ip", "netns", "exec", ns, "/usr/bin/python3", *args],
                            stdin=stdin, stdout=subprocess.PIPE, text=True)


@pytest.fixture
def fake_guest(lab):
    """A namespace bridged into rdb-primary's br0, as a guest's tap is."""
    remove_leftover_cut()
    netns.sh("ip", "netns", "add", GUEST_NS)
    try:
        netns.in_ns(netns.namespace_of("primary"), "ip", "link", "add", "vg-pguest", "type",
                    "veth", "peer", "name", "eth0", "netns", GUEST_NS)
        netns.in_ns(netns.namespace_of("primary"), "ip", "link", "set", "vg-pguest",
                    "master", netns.GUEST_BRIDGE, "up")
        # one MAC for every run: rdb-client's ARP entry of the last one stays valid
        netns.in_ns(GUEST_NS, "ip", "link", "set", "eth0", "address", "02:00:0a:4d:00:63")
        netns.in_ns(GUEST_NS, "ip", "link", "set", "lo", "up")
        netns.in_ns(GUEST_NS, "ip", "link", "set", "eth0", "up")
        netns.in_ns(GUEST_NS, "ip", "addr", "add", f"{GUEST_IP}/{netns.PREFIX_LEN}",
                    "dev", "eth0")
        yield GUEST_NS
    finally:
        netns.kill_processes(GUEST_NS)
        netns.sh("ip", "netns", "delete", GUEST_NS, check=False)
        remove_leftover_cut()


def connect_and_kill(cut):
    """Listeners on the primary host itself (routed) and in the fake guest
    (bridged), a client in rdb-client connected to both; then, with the
    cut or without it, both listeners are SIGKILLed. Returns what the
    client heard, the LAN port's frames from the primary after the
    kills/cut, and the cut's evidence."""
    primary_ns = netns.namespace_of("primary")
    primary_ip = netns.HOSTS["primary"][1]
    listeners = [popen_in(primary_ns, "-c", LISTENER, primary_ip, str(PORT)),
                 popen_in(GUEST_NS, "-c", LISTENER, GUEST_IP, str(PORT))]
    client = None
    try:
        for li in listeners:
            assert li.stdout.readline().strip() == "listening"
        client = popen_in("rdb-client", "-c", CLIENT, str(WATCH_S), str(PORT), primary_ip,
                          GUEST_IP, stdin=subprocess.PIPE)
        assert client.stdout.readline().strip() == "connected"
        time.sleep(0.5)  # let the handshakes' last ACKs pass
        if cut:
            cut.install()
        # Counted from the cut on: a frame the host sent just before it
        # (CI once saw one) is not one the cut let out.
        lan_before = lan_port_counters()[0]
        for li in listeners:
            li.kill()
            li.wait()
        client.stdin.write("go\n")
        client.stdin.flush()
        heard = json.loads(client.stdout.readline())
        client.wait(timeout=10)
        evidence = cut.finish() if cut else None
        frames = lan_port_counters()[0] - lan_before
        return heard, frames, evidence
    finally:
        for p in listeners + ([client] if client else []):
            if p.poll() is None:
                p.kill()
                p.wait()
        if cut:
            cut.remove()


def test_kill_without_the_cut_is_heard(fake_guest):
    heard, frames, _ = connect_and_kill(cut=None)
    print("without the cut:", heard, frames)
    assert all(v in ("FIN", "RST") for v in heard.values()), heard
    assert frames > 0


def test_the_power_cut_lets_no_frame_out(fake_guest):
    heard, frames, evidence = connect_and_kill(cut=Cut())
    print("with the cut:", heard, frames, evidence)
    assert all(v == "nothing" for v in heard.values()), heard
    assert frames == 0
    assert evidence["lan_frames_from_primary_after_cut"] == 0
    # the client's retransmissions reached the primary's wire and died there
    assert evidence["frames_dropped"]["netdev wire_in"] > 0
    # the cut is gone again: the primary host answers
    r = netns.in_ns("rdb-client", "ping", "-c", "1", "-W", "2", netns.HOSTS["primary"][1],
                    check=False, capture=True)
    assert r.returncode == 0, r.stdout
