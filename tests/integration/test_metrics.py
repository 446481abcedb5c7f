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
(tests/unit/test_metrics.c), not here.

The alert rules the package ships (dist/prometheus/remusdb-alerts.yml):
`promtool check rules` accepts them, `promtool test rules` fires each
alert on synthetic series exactly when meant
(tests/integration/prometheus/remusdb-alerts-test.yml), and every metric
they name is a family a real remusdbd serves (its /metrics lists every
family, with or without samples). promtool knows nothing of remusdbd's
names, so a misspelled one passes it: that is the negative control of
the last check. The first two need no lab."""
import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

from remusdb import control, paths

DAEMON_NS, DAEMON_ADDR = "rdb-backup", "10.77.0.2"
PROM_NS, PROM_ADDR = "rdb-client", "10.77.0.3"
HTTP_PORT, PROM_PORT = 9187, 9090
VM = "mvm"
REPO = Path(__file__).resolve().parents[2]
ALERT_RULES = REPO / "dist" / "prometheus" / "remusdb-alerts.yml"
ALERT_TESTS = Path(__file__).resolve().parent / "prometheus" / "remusdb-alerts-test.yml"
PROMTOOL = "/usr/bin/promtool"
# Series Prometheus makes itself for every target, not remusdbd's.
PROMETHEUS_OWN = {"up"}


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


# ---------------------------------------------------------------- alert rules

def promtool(*args):
    assert Path(PROMTOOL).exists(), "promtool is missing (Debian's prometheus package)"
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120)


def rules_copy(tmp_path, text):
    """The rules text at the path the promtool tests' rule_files names
    (../../../dist/prometheus/ from the tests' directory), in tmp_path."""
    rules = tmp_path / "dist" / "prometheus" / ALERT_RULES.name
    rules.parent.mkdir(parents=True, exist_ok=True)
    rules.write_text(text)
    tests = tmp_path / "tests" / "integration" / "prometheus" / ALERT_TESTS.name
    tests.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(ALERT_TESTS, tests)
    return rules, tests


def test_promtool_accepts_the_alert_rules(tmp_path):
    r = promtool("check", "rules", str(ALERT_RULES))
    assert r.returncode == 0 and "SUCCESS: 4 rules found" in r.stdout, r.stdout + r.stderr
    # Negative control: one operator misspelled is a syntax error.
    text = ALERT_RULES.read_text()
    assert text.count("unless on (instance, vm)") == 1
    bad, _ = rules_copy(tmp_path, text.replace("unless on (instance, vm)", "unles on (instance, vm)"))
    r = promtool("check", "rules", str(bad))
    assert r.returncode != 0 and "RemusDBVMUnprotected" in r.stdout + r.stderr, r.stdout + r.stderr
    # ... but a misspelled metric name is not: why the scrape check below exists.
    typo, _ = rules_copy(tmp_path, text.replace("remusdb_ack_age_seconds", "remusdb_ack_age_second"))
    r = promtool("check", "rules", str(typo))
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_alerts_fire_when_meant(tmp_path):
    r = promtool("test", "rules", str(ALERT_TESTS))
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr
    # Negative control, a small bug: the unprotected alert asks for a
    # state remusdbd never exports, so protected VMs fire it too.
    text = ALERT_RULES.read_text()
    assert text.count('remusdb_protection_state{state="protected"}') == 2
    bug = text.replace('remusdb_protection_state{state="protected"} == 1\n        for: 10m',
                       'remusdb_protection_state{state="protecting"} == 1\n        for: 10m')
    assert bug != text
    _, tests = rules_copy(tmp_path, bug)
    r = promtool("test", "rules", str(tests))
    assert r.returncode != 0 and 'vm="db"' in r.stdout + r.stderr, r.stdout + r.stderr


def served_families(exposition):
    """Metric names a /metrics text serves: every `# TYPE` family, with
    a histogram's or summary's _bucket, _sum and _count."""
    names = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", exposition, re.M):
        names.add(name)
        if kind in ("histogram", "summary"):
            names.update(f"{name}{s}" for s in ("_bucket", "_sum", "_count"))
    return names


PROMQL_WORDS = {"and", "or", "unless", "bool", "offset", "on", "ignoring", "by", "without",
                "group_left", "group_right", "inf", "nan"}


def rule_metric_names(rules_text):
    """The metric names the rules' expressions read: what is left of each
    expression without its strings, label matchers, ranges, label lists
    and function calls."""
    names = set()
    for group in yaml.safe_load(rules_text)["groups"]:
        for rule in group["rules"]:
            expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", rule["expr"])
            expr = re.sub(r"\{[^}]*\}|\[[^]]*\]", " ", expr)
            expr = re.sub(r"\b(?:on|ignoring|by|without|group_left|group_right)\s*\([^)]*\)",
                          " ", expr)
            for word in re.findall(r"\b[A-Za-z_:][A-Za-z0-9_:]*\b(?!\s*\()", expr):
                if word.lower() not in PROMQL_WORDS:
                    names.add(word)
    return names


def unknown_metric_names(rules_text, served):
    return sorted(rule_metric_names(rules_text) - served - PROMETHEUS_OWN)


def test_every_metric_the_alert_rules_name_is_served(daemon_with_http):
    status, text = ns_get(PROM_NS, f"http://{DAEMON_ADDR}:{HTTP_PORT}/metrics")
    assert status == 200
    served = served_families(text)
    rules = ALERT_RULES.read_text()
    named = rule_metric_names(rules)
    assert {"remusdb_vm_qemu_running", "remusdb_protection_state", "remusdb_ack_age_seconds",
            "remusdb_checkpoint_interval_seconds", "remusdb_backpressure_events_total",
            "remusdb_checkpoints_total", "up"} == named, named  # the parser finds them all
    assert unknown_metric_names(rules, served) == []
    # Negative control: one letter dropped from one name is reported.
    typo = rules.replace("remusdb_ack_age_seconds", "remusdb_ack_age_second")
    assert unknown_metric_names(typo, served) == ["remusdb_ack_age_second"]
