"""Commit protection on the primary's relay, with the real module in a real
guest (issue 10): rdb-cp-echo in the guest answers 'P' lines with its
socket protected (as a patched DBMS answers a COMMIT) and other lines
unprotected. A client in the lab's client namespace talks to it while a
packet socket there records every IPv4 packet the guest sends it.

With `--commit-protection`, the relay must hold the protected replies
(status: marked_held), let the unprotected ones out at once
(released_at_once), and clear the mark: the client sees DSCP 0 on every
packet. The control: a relay told a different code point than the
module's does not recognize the mark, holds nothing as marked, and the
client sees the module's DSCP on the wire, so the wire check catches a
mark that leaks."""
import json
import subprocess
import textwrap

import pytest
from conftest import fresh_guest

from remusdb import guest_agent, protection
from remusdb.lab import vm, workload
from remusdb.drill.lab import forget_ownership

NAME = "cprelay"
BACKUP = "10.77.0.2:7788"
PORT = 7007
LINES = 20
MODULE_DSCP = 47

# Runs in the client namespace: a capture thread on every interface, then
# LINES unprotected and LINES protected exchanges; prints one JSON object.
CLIENT = textwrap.dedent("""
    import json, socket, struct, sys, threading, time
    ip, port, lines = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    cap = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0800))
    cap.settimeout(0.2)
    seen, stop = [], threading.Event()
    def capture():
        while not stop.is_set():
            try:
                frame = cap.recv(65535)
            except socket.timeout:
                continue
            ipv4 = frame[14:]
            if len(ipv4) < 24 or ipv4[9] != 6 or socket.inet_ntoa(ipv4[12:16]) != ip:
                continue
            ihl = (ipv4[0] & 15) * 4
            sport = struct.unpack("!H", ipv4[ihl:ihl + 2])[0]
            if sport == port:
                seen.append(ipv4[1] >> 2)
    t = threading.Thread(target=capture)
    t.start()
    s = socket.create_connection((ip, port), timeout=30)
    f = s.makefile("rwb", buffering=0)
    replies, latency = {"U": [], "P": [], "N": [], "E": []}, {"U": [], "P": []}
    for kind in ("U", "P"):
        for i in range(lines):
            start = time.monotonic()
            f.write(f"{kind}{i}\\n".encode())
            reply = f.readline().decode()
            latency[kind].append(round((time.monotonic() - start) * 1000, 1))
            replies[reply[:1]].append(reply.strip())
    f.write(b"QUIT\\n")
    s.close()
    time.sleep(0.5)
    stop.set()
    t.join()
    print(json.dumps({"replies": {k: len(v) for k, v in replies.items()},
                      "latency_ms": latency, "dscp_seen": sorted(set(seen)),
                      "packets_seen": len(seen)}))
""")


@pytest.fixture(scope="module")
def guest(lab):
    with fresh_guest(NAME) as name:
        qga = vm.vm_files("primary", name)["qga"]
        guest_agent.start(qga, ["/usr/local/bin/rdb-cp-echo", str(PORT)])
        yield name


def exchange():
    r = subprocess.run(["ip", "netns", "exec", workload.CLIENT_NS, "/usr/bin/python3", "-c",
                        CLIENT, vm.DEFAULT_IP, str(PORT), str(LINES)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def protected_exchange(cp_dscp):
    forget_ownership(NAME)
    protection.protect(NAME, BACKUP, 100,
                       options={"commit_protection": True, "cp_dscp": cp_dscp})
    try:
        protection.wait_protected(NAME, timeout=900)
        before = protection.primary_protection("primary", NAME)["commit_protection"]
        result = exchange()
        after = protection.primary_protection("primary", NAME)
    finally:
        protection.unprotect(NAME)
    assert after["state"] == "protected", after.get("error")
    cp = after["commit_protection"]
    # Counters over the exchange; the code point and the flows holding as they are.
    result["relay"] = {k: cp[k] - before[k] if k not in ("dscp", "flows_holding") else cp[k]
                       for k in cp}
    print(json.dumps(result, indent=1))
    return result


def test_protected_replies_wait_and_lose_their_mark(guest):
    r = protected_exchange(MODULE_DSCP)
    assert r["replies"]["P"] == LINES and r["replies"]["U"] == LINES, r["replies"]
    assert r["packets_seen"] >= 2 * LINES
    # Every packet the client saw from the guest is unmarked.
    assert r["dscp_seen"] == [0], r["dscp_seen"]
    # The relay held each protected reply as marked, and let the rest out.
    assert r["relay"]["marked_held"] >= LINES, r["relay"]
    assert r["relay"]["released_at_once"] >= LINES, r["relay"]
    assert r["relay"]["marked_dropped"] == 0 and r["relay"]["flow_table_failures"] == 0


def test_a_relay_with_the_wrong_code_point_leaks_the_mark(guest):
    r = protected_exchange(MODULE_DSCP - 1)
    assert r["replies"]["P"] == LINES
    assert r["relay"]["marked_held"] == 0, r["relay"]
    assert MODULE_DSCP in r["dscp_seen"], r["dscp_seen"]
