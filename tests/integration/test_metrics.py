"""remusdbd's HTTP endpoint in the lab: a real remusdbd started with --http
on the backup host's address, Debian's prometheus scraping it from the
client host every second, and a value read back through Prometheus's own
HTTP API (/api/v1/query); the health checks answered over the lab's LAN,
as HAProxy would ask them.

No QEMU here (a protected VM is too heavy for this test): the VM is
vm-add'ed with its disk, and a stand-in QMP server on its monitor socket
answers query-status "running", as QEMU would.  Stopping the stand-in is
the negative control: the same VM's /primary must turn 503, as must a
name this host does not run and /replica of a VM it holds no replica of.
The protection and replica series are covered by the unit tests
(tests/unit/test_metrics.c), not here."""
import json
import os
import socket
import subprocess
import threading
import time

import pytest

from remusdb import control, paths

DAEMON_NS, DAEMON_ADDR = "rdb-backup", "10.77.0.2"
PROM_NS, PROM_ADDR = "rdb-client", "10.77.0.3"
HTTP_PORT, PROM_PORT = 9187, 9090
VM = "mvm"


def ns_get(ns, url, timeout=5):
    """GET url from inside namespace ns: (status, body)."""
    code = ("import sys, urllib.request, urllib.error\n"
            "try:\n"
            f"    r = urllib.request.urlopen({url!r}, timeout={timeout})\n"
            "    print(r.status); sys.stdout.write(r.read().decode())\n"
            "except urllib.error.HTTPError as e:\n"
            "    print(e.code); sys.stdout.write(e.read().decode())\n")
    out = subprocess.run(["ip", "netns", "exec", ns, "/usr/bin/python3", "-c", code],
                         capture_output=True, text=True, timeout=timeout + 10, check=True).stdout
    status, _, body = out.partition("\n")
    return int(status), body


class FakeQMP:
    """Enough of QEMU's monitor for remusdbd's QMP client: the greeting,
    qmp_capabilities, and query-status answered "running"."""

    def __init__(self, path):
        self.path = str(path)
        self.listener = socket.socket(socket.AF_UNIX)
        self.listener.bind(self.path)
        self.listener.listen(4)
        self.listener.settimeout(0.2)
        self.stopping = False
        self.conns = []
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        while not self.stopping:
            try:
                conn, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self.talk, args=(conn,), daemon=True).start()

    def talk(self, conn):
        f = conn.makefile("rwb")
        try:
            f.write(json.dumps({"QMP": {"version": {"qemu": {"major": 7, "minor": 2, "micro": 0},
                                                    "package": ""}, "capabilities": []}}).encode() + b"\n")
            f.flush()
            for line in f:
                msg = json.loads(line)
                ret = {}
                if msg.get("execute") == "query-status":
                    ret = {"status": "running", "running": True, "singlestep": False}
                f.write(json.dumps({"return": ret, "id": msg.get("id")}).encode() + b"\n")
                f.flush()
        except (OSError, ValueError):
            pass

    def stop(self):
        self.stopping = True
        self.listener.close()
        for c in self.conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()
        os.unlink(self.path)


@pytest.fixture
def daemon_with_http(lab, tmp_path):
    sock = tmp_path / "ctl.sock"
    log = tmp_path / "remusdbd.log"
    proc = subprocess.Popen(["ip", "netns", "exec", DAEMON_NS, str(paths.REMUSDBD),
                             "--host", "mtest", "--control", str(sock),
                             "--state-dir", str(tmp_path / "state"), "--run-dir", str(tmp_path / "run"),
                             "--log", str(log), "--http", f"{DAEMON_ADDR}:{HTTP_PORT}"])
    deadline = time.monotonic() + 30
    while not control.reachable(sock):
        assert proc.poll() is None, f"remusdbd exited: {log.read_text() if log.exists() else ''}"
        assert time.monotonic() < deadline
        time.sleep(0.1)
    yield {"sock": sock, "dir": tmp_path, "log": log}
    proc.terminate()
    assert proc.wait(timeout=30) == 0


@pytest.fixture
def prometheus(lab, tmp_path):
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: remusdb
    static_configs:
      - targets: ['{DAEMON_ADDR}:{HTTP_PORT}']
""")
    out = open(tmp_path / "prometheus.out", "wb")
    proc = subprocess.Popen(["ip", "netns", "exec", PROM_NS, "/usr/bin/prometheus",
                             f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address={PROM_ADDR}:{PROM_PORT}"],
                            stdout=out, stderr=out)
    yield f"http://{PROM_ADDR}:{PROM_PORT}"
    proc.terminate()
    proc.wait(timeout=30)
    out.close()


def prom_query(base, expr):
    from urllib.parse import quote
    status, body = ns_get(PROM_NS, f"{base}/api/v1/query?query={quote(expr)}")
    assert status == 200, body
    reply = json.loads(body)
    assert reply["status"] == "success", reply
    return reply["data"]["result"]


def wait_for(what, fn, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def test_prometheus_scrapes_and_health_checks(daemon_with_http, prometheus):
    d = daemon_with_http
    disk = d["dir"] / "disk.img"
    with open(disk, "wb") as f:
        f.truncate(16 << 20)
    qmp = FakeQMP(d["dir"] / "qmp.sock")
    control.request(d["sock"], "vm-add", name=VM, disk=str(disk),
                    nbd_socket=str(d["dir"] / "nbd.sock"), qmp_socket=str(qmp.path))
    wait_for("QEMU running per status", lambda: control.request(
        d["sock"], "status", vm=VM)["vm"]["run_state"] == "running")

    # the exposition straight from the daemon, across the LAN
    status, text = ns_get(PROM_NS, f"http://{DAEMON_ADDR}:{HTTP_PORT}/metrics")
    assert status == 200
    assert f'remusdb_vm_qemu_running{{vm="{VM}",role="primary"}} 1\n' in text
    assert "# TYPE remusdb_checkpoint_pause_seconds histogram\n" in text

    # ... and the same value read back through Prometheus's query API
    up = wait_for("Prometheus to scrape remusdbd",
                  lambda: [r for r in prom_query(prometheus, 'up{job="remusdb"}') if r["value"][1] == "1"])
    assert up[0]["metric"]["instance"] == f"{DAEMON_ADDR}:{HTTP_PORT}"
    res = wait_for("remusdb_vm_qemu_running in Prometheus",
                   lambda: prom_query(prometheus, f'remusdb_vm_qemu_running{{vm="{VM}"}}'))
    assert res[0]["metric"]["role"] == "primary" and res[0]["value"][1] == "1", res
    info = prom_query(prometheus, f'remusdb_vm_info{{vm="{VM}"}}')
    assert info[0]["metric"]["run_state"] == "running", info

    # health: 200 for the VM this host runs, 503 for everything else
    base = f"http://{DAEMON_ADDR}:{HTTP_PORT}"
    assert ns_get(PROM_NS, f"{base}/primary?vm={VM}")[0] == 200
    assert ns_get(PROM_NS, f"{base}/primary/{VM}")[0] == 200
    code, body = ns_get(PROM_NS, f"{base}/primary?vm=not-here")
    assert code == 503 and "no VM named not-here" in body
    code, body = ns_get(PROM_NS, f"{base}/replica?vm={VM}")
    assert code == 503 and f"no replica of {VM}" in body
    assert ns_get(PROM_NS, f"{base}/primary")[0] == 400

    # negative control on the same VM: its "QEMU" goes away
    qmp.stop()
    wait_for("run state to leave running", lambda: control.request(
        d["sock"], "status", vm=VM)["vm"]["run_state"] != "running")
    code, body = ns_get(PROM_NS, f"{base}/primary?vm={VM}")
    assert code == 503, body
    res = wait_for("Prometheus to see QEMU gone", lambda: [
        r for r in prom_query(prometheus, f'remusdb_vm_qemu_running{{vm="{VM}"}}')
        if r["value"][1] == "0"])
    assert res
