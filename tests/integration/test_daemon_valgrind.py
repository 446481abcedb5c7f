"""remusdbd itself under valgrind: serve an export, take real NBD traffic
and bad peers, shut down on request, and report no memory errors or leaks."""
import os
import socket
import struct
import subprocess
import time

import pytest

from remusdb import control, paths
from peers import closed_by_peer
from nbd_client import NBDClient, CMD_READ, REQUEST_MAGIC

NS = "rdb-backup"  # a VM host namespace with a bridge; no VM needed here
HTTP_ADDR, HTTP_PORT = "10.77.0.2", 9188  # the backup host's address in the lab

# From inside NS: a client that sends half a request and stalls, then
# /metrics and /primary?vm=vg1 answered while it still hangs (libmicrohttpd
# runs on remusdbd's loop: a stuck client must not stop it).
HTTP_PROBE = f"""
import socket, urllib.request, urllib.error
stuck = socket.create_connection(("{HTTP_ADDR}", {HTTP_PORT}))
stuck.sendall(b"GET /metr")
def get(path):
    try:
        r = urllib.request.urlopen("http://{HTTP_ADDR}:{HTTP_PORT}" + path, timeout=30)
        return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
code, text = get("/metrics")
print(code, int('remusdb_vm_info{{vm="vg1",role="primary",run_state="unknown"}} 1' in text))
print(get("/primary?vm=vg1")[0])
stuck.close()
"""


@pytest.fixture
def daemon_under_valgrind(lab, tmp_path):
    sock = tmp_path / "ctl.sock"
    vg_log = tmp_path / "valgrind.log"
    cmd = ["ip", "netns", "exec", NS, "valgrind", "-q", "--leak-check=full",
           "--errors-for-leak-kinds=definite,indirect", "--error-exitcode=97",
           f"--log-file={vg_log}", str(paths.REMUSDBD), "--host", "vgtest",
           "--control", str(sock), "--state-dir", str(tmp_path / "state"),
           "--log", str(tmp_path / "remusdbd.log"), "--http", f"{HTTP_ADDR}:{HTTP_PORT}"]
    proc = subprocess.Popen(cmd)
    deadline = time.monotonic() + 60
    while not control.reachable(sock):
        assert proc.poll() is None, "remusdbd under valgrind exited early"
        assert time.monotonic() < deadline, "remusdbd under valgrind did not come up"
        time.sleep(0.2)
    yield {"proc": proc, "sock": sock, "dir": tmp_path, "valgrind_log": vg_log}
    if proc.poll() is None:
        proc.kill()


def accept_stream_peer(listener):
    """Waits for remusdbd's relay to connect to our stand-in for QEMU's
    stream netdev (the relay is the client, QEMU the listener)."""
    conn, _ = listener.accept()
    conn.settimeout(10)
    return conn


def test_daemon_is_valgrind_clean(daemon_under_valgrind):
    d = daemon_under_valgrind
    disk = d["dir"] / "disk.img"
    with open(disk, "wb") as f:
        f.truncate(64 << 20)
    # a peer on the NIC's stream socket that sends an oversize frame
    listener = socket.socket(socket.AF_UNIX)
    listener.settimeout(30)
    listener.bind(str(d["dir"] / "net.sock"))
    listener.listen(1)
    control.request(d["sock"], "vm-add", name="vg1", disk=str(disk),
                    nbd_socket=str(d["dir"] / "nbd.sock"), net_socket=str(d["dir"] / "net.sock"),
                    qmp_socket=str(d["dir"] / "qmp.sock"), tap="rdbt-vg1", bridge="br0",
                    mac="52:54:00:00:00:99")
    peer = accept_stream_peer(listener)
    ethernet_frame = b"\xff" * 6 + bytes.fromhex("525400000099") + b"\x88\xb5" + b"\0" * 50
    peer.sendall(struct.pack(">I", len(ethernet_frame)) + ethernet_frame)
    peer.sendall(struct.pack(">I", 1 << 24) + b"z" * 100)  # 16 MiB: oversize
    assert closed_by_peer(peer), "relay did not close the stream"
    peer.close()
    peer = accept_stream_peer(listener)  # ... and it reconnects
    peer.close()
    listener.close()
    log = (d["dir"] / "remusdbd.log").read_text()
    assert "malformed frame from QEMU" in log
    nic = control.request(d["sock"], "status")["vms"][0]["nics"][0]
    assert nic["frames_from_guest"] == 1 and nic["connects"] >= 2

    client = NBDClient(d["dir"] / "nbd.sock", "vg1")
    assert client.size == 64 << 20
    block = os.urandom(65536)
    assert client.write(4096, block, fua=True) == 0
    err, data = client.read(4096, len(block))
    assert err == 0 and data == block
    err, _ = client.read((64 << 20) - 512, 4096)   # beyond the end: an error reply
    assert err != 0
    client.close()
    with open(disk, "rb") as f:
        f.seek(4096)
        assert f.read(len(block)) == block
    # a peer that vanishes in the middle of a write payload
    c2 = NBDClient(d["dir"] / "nbd.sock", "vg1")
    c2.sock.sendall(struct.pack(">IHHQQI", REQUEST_MAGIC, 0, 1, 7, 0, 8192) + b"y" * 1000)
    c2.close()
    # oversize read request: refused, the daemon lives on
    c3 = NBDClient(d["dir"] / "nbd.sock", "vg1")
    try:
        err, _ = c3.request(CMD_READ, 0, 1 << 30)
        assert err != 0
    except ConnectionError:
        pass
    c3.close()
    # a fork's clone: quarantined, then only its new identity, then released
    clone_listener = socket.socket(socket.AF_UNIX)
    clone_listener.settimeout(30)
    clone_listener.bind(str(d["dir"] / "cnet.sock"))
    clone_listener.listen(1)
    control.request(d["sock"], "vm-add", name="vgc1", clone_of="vg1@fork-1-1",
                    net_socket=str(d["dir"] / "cnet.sock"), qmp_socket=str(d["dir"] / "cqmp.sock"),
                    tap="rdbt-vgc1", bridge="br0", mac="52:54:00:00:00:98")
    cpeer = accept_stream_peer(clone_listener)

    def ipv4_frame(src_mac, src_ip):
        ip = bytes.fromhex("450000140000000040110000") + socket.inet_aton(src_ip) + \
            socket.inet_aton("10.77.0.3")
        return b"\xff" * 6 + bytes.fromhex(src_mac.replace(":", "")) + b"\x08\x00" + ip + b"\0" * 26

    def clone_nic():
        vms = {v["name"]: v for v in control.request(d["sock"], "status")["vms"]}
        return vms["vgc1"]["nics"][0]

    def send_and_settle(frame, key, want):
        cpeer.sendall(struct.pack(">I", len(frame)) + frame)
        deadline = time.monotonic() + 10
        while clone_nic()[key] < want:
            assert time.monotonic() < deadline, clone_nic()
            time.sleep(0.1)

    assert clone_nic()["quarantine"] == "all"
    send_and_settle(ipv4_frame("52:54:00:00:00:99", "10.77.0.12"), "quarantine_dropped", 1)
    control.request(d["sock"], "vm-release", vm="vgc1", mac="52:54:00:00:00:98", ip="10.77.0.51")
    assert clone_nic()["quarantine"] == "identity"
    send_and_settle(ipv4_frame("52:54:00:00:00:98", "10.77.0.12"), "quarantine_dropped", 2)
    send_and_settle(ipv4_frame("52:54:00:00:00:98", "10.77.0.51"), "frames_from_guest", 1)
    control.request(d["sock"], "vm-release", vm="vgc1")
    assert clone_nic()["quarantine"] == "off"
    cpeer.close()
    clone_listener.close()
    # a fork of a VM whose QEMU is not there: refused with its reason
    with pytest.raises(control.ControlError, match="QMP socket is not connected"):
        control.request(d["sock"], "fork-start", vm="vg1", clones=1)
    # garbage on the control socket
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(d["sock"]))
        s.sendall(b"\x00\xff{{{\n")
        assert b"false" in s.recv(4096)
    status = control.request(d["sock"], "status")
    assert status["vms"][0]["disks"][0]["writes"] >= 1
    # the HTTP endpoint once: /metrics with a VM in it, and /primary of a
    # VM without QEMU (503), past a client stalled mid-request
    probe = subprocess.run(["ip", "netns", "exec", NS, "/usr/bin/python3", "-c", HTTP_PROBE],
                           capture_output=True, text=True, timeout=120)
    assert probe.stdout.split() == ["200", "1", "503"], probe.stdout + probe.stderr
    control.request(d["sock"], "shutdown")
    rc = d["proc"].wait(timeout=60)
    report = d["valgrind_log"].read_text()
    assert rc == 0, f"remusdbd exit {rc}; valgrind says:\n{report}"
    assert report.strip() == "", report
