"""remusdbd@.service without a service manager: systemd is not PID 1 in
this container, so `systemctl start` and `systemd-run` cannot run the
unit. What can be checked, is:

- `systemd-analyze verify` accepts the unit (instance `primary`) with no
  warning at all; a misspelled Type= is a warning, the negative control;
- systemd orders it after the network and a local etcd and before
  libvirt (a probe unit's ordering cycle, reported by verify, says so);
- dist/remusdbd.conf.example, installed and left unfilled, stops the
  daemon at start with a line naming the placeholder; filled in, it is
  the --config of the notify test below;
- the unit's own ExecStart line (its %i, its EnvironmentFile's
  $REMUSDBD_OPTS, its --config file) run in the lab's rdb-primary
  namespace speaks systemd's notify protocol: the test is the service
  manager's end of NOTIFY_SOCKET (a unix datagram socket, sd_notify(3)),
  READY=1 comes only once the control socket answers and the replication
  and HTTP ports listen, STOPPING=1 comes at SIGTERM, and a daemon whose startup
  fails exits 2 and never says READY=1 (the unit's
  RestartPreventExitStatus=2: no restart loop on a bad config);
- with stderr as the journal's stream (JOURNAL_STREAM names it) every log
  line carries a syslog priority prefix, and without it none does.
"""
import os
import re
import shlex
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from remusdb import control
from remusdb.lab import netns, vm

REPO = Path(__file__).resolve().parents[2]
UNIT_IN = REPO / "dist" / "remusdbd@.service.in"
EXAMPLE_CONF = REPO / "dist" / "remusdbd.conf.example"
PORT = 7790  # not the lab daemons' 7788
HTTP_PORT = 7791


def unit_text(sbindir, sysconfdir):
    return (UNIT_IN.read_text().replace("@SBINDIR@", str(sbindir))
            .replace("@SYSCONFDIR@", str(sysconfdir)))


def service_value(text, key):
    values = [line.split("=", 1)[1] for line in text.splitlines()
              if line.startswith(f"{key}=")]
    assert len(values) == 1, (key, values)
    return values[0]


def verify(path):
    return subprocess.run(["systemd-analyze", "verify", "--man=no", str(path)],
                          capture_output=True, text=True)


def test_systemd_analyze_verify_accepts_the_unit(tmp_path):
    binary = vm.daemon_binary()
    unit = tmp_path / "remusdbd@primary.service"
    unit.write_text(unit_text(binary.parent, tmp_path / "etc"))
    r = verify(unit)
    assert r.returncode == 0 and not r.stderr.strip() and not r.stdout.strip(), r.stderr
    bad = tmp_path / "bad@primary.service"
    bad.write_text(unit.read_text().replace("Type=notify", "Type=notfy"))
    r = verify(bad)
    assert "Failed to parse service type" in r.stderr, r.stderr


def systemd_orders(first, then, unit_dir):
    """Does systemd start `first` before `then`? Asked of systemd itself:
    a probe unit that wants both and is ordered after `then` and before
    `first` closes an ordering cycle exactly when first comes before then,
    and `systemd-analyze verify` reports the cycles of the transaction it
    builds for the probe (units in unit_dir, the rest from the system)."""
    probe = unit_dir / "order-probe.service"
    probe.write_text(f"[Unit]\nDescription=ordering probe\nWants={first} {then}\n"
                     f"After={then}\nBefore={first}\n[Service]\nExecStart=/bin/true\n")
    try:
        r = verify(probe)
    finally:
        probe.unlink()
    return "Found ordering cycle" in r.stderr


ORDER = [  # (first, then): why in the unit's comments
    ("network-online.target", "remusdbd@primary.service"),
    ("etcd.service", "remusdbd@primary.service"),
    ("remusdbd@primary.service", "libvirtd.service"),
    ("remusdbd@primary.service", "libvirt-guests.service"),
]


def test_systemd_starts_the_daemon_after_the_network_and_etcd_and_before_libvirt(tmp_path):
    """The order, as systemd computes it from the unit and the installed
    units of Debian's libvirt-daemon-system and etcd-server (make setup
    installs both). Negative control: the same unit with libvirtd.service
    moved from Before= to After= (the small slip) is caught."""
    for unit in ("libvirtd.service", "libvirt-guests.service", "etcd.service"):
        assert Path("/lib/systemd/system", unit).exists(), f"{unit} is not installed"
    text = unit_text(vm.daemon_binary().parent, tmp_path / "etc")
    unit = tmp_path / "remusdbd@primary.service"
    unit.write_text(text)
    wrong = [pair for pair in ORDER if not systemd_orders(*pair, tmp_path)]
    assert not wrong, f"systemd does not order these as the unit means to: {wrong}"
    # Only ordering: remusdbd pulls in neither libvirt nor a local etcd.
    wants = service_value(text, "Wants").split()
    assert wants == ["network-online.target"], wants
    before = service_value(text, "Before").split()
    assert "libvirtd.service" in before
    unit.write_text(text.replace("Before=libvirtd.service", "Before=")
                    .replace("After=etcd.service", "After=etcd.service libvirtd.service"))
    assert not systemd_orders("remusdbd@primary.service", "libvirtd.service", tmp_path)
    assert systemd_orders("network-online.target", "remusdbd@primary.service", tmp_path)


def test_the_unit_says_what_the_daemon_does():
    text = UNIT_IN.read_text()
    assert service_value(text, "Type") == "notify"
    assert service_value(text, "Restart") == "on-failure"
    assert service_value(text, "RestartPreventExitStatus") == "2"  # main.c: EXIT_USAGE
    assert service_value(text, "KillMode") == "process"
    assert "StandardError" not in text  # stderr goes to the journal, systemd's default
    assert "--log " not in text


class Notifications:
    """The service manager's end of NOTIFY_SOCKET."""

    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.path = path
        self.seen = []

    def wait_for(self, field, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(4096)
            except socket.timeout:
                break
            msg = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            self.seen.append(msg)
            if field in msg:
                return msg
        return None

    def close(self):
        self.sock.close()


def example_config(sysconfdir):
    """dist/remusdbd.conf.example as `make install` installs it."""
    return EXAMPLE_CONF.read_text().replace("@SYSCONFDIR@", str(sysconfdir))


def filled_example(sysconfdir, listen, http, etcd, psk):
    """The example with its placeholders filled in, as an operator would
    (docs/deployment.md), and the test's key in place of SYSCONFDIR/remusdb/psk."""
    lines = []
    for line in example_config(sysconfdir).splitlines():
        if line.startswith("listen = "):
            line = f"listen = {listen}"
        elif line.startswith("http = "):
            line = f"http = {http}"
        elif line.startswith("etcd = "):
            line = f"etcd = {etcd}"
        elif line.startswith("psk-file = "):
            assert line == f"psk-file = {sysconfdir}/remusdb/psk", line
            line = f"psk-file = {psk}"
        lines.append(line)
    text = "\n".join(lines) + "\n"
    settings = [l for l in text.splitlines() if l and not l.startswith("#")]
    assert not [l for l in settings if "<" in l], settings  # no placeholder left
    return text


def unit_command(tmp_path, host, listen, psk, extra_opts=""):
    """The unit's ExecStart for instance `host`, as systemd would run it,
    with /etc, /run and /var/lib moved into tmp_path."""
    etc = tmp_path / "etc"
    (etc / "remusdb").mkdir(parents=True)
    (etc / "remusdb" / f"{host}.conf").write_text(filled_example(
        etc, listen, f"{listen.rpartition(':')[0]}:{HTTP_PORT}",
        f"http://{netns.SUBNET_PREFIX}.5:2379", psk))
    (etc / "remusdb" / f"{host}.env").write_text(f"REMUSDBD_OPTS={extra_opts}\n")
    text = unit_text(vm.daemon_binary().parent, etc)
    line = (service_value(text, "ExecStart").replace("%i", host)
            .replace("/run/remusdb/", f"{tmp_path}/run/remusdb/")
            .replace("/var/lib/remusdb/", f"{tmp_path}/lib/remusdb/"))
    env_file = service_value(text, "EnvironmentFile").lstrip("-").replace("%i", host)
    env = dict(l.split("=", 1) for l in Path(env_file).read_text().splitlines() if "=" in l)
    argv = []
    for word in shlex.split(line):  # $VAR alone is split at whitespace, as systemd does
        argv += env.get(word[1:], "").split() if word.startswith("$") else [word]
    for d in ("run/remusdb", "lib/remusdb"):  # RuntimeDirectory=, StateDirectory=
        (tmp_path / d / host).mkdir(parents=True, exist_ok=True)
    return argv


@pytest.fixture
def psk(tmp_path):
    key = tmp_path / "psk"
    key.write_text(os.urandom(16).hex() + "\n")
    key.chmod(0o600)
    return key


def start_in_lab(argv, tmp_path, notify_path, stderr):
    env = dict(os.environ, NOTIFY_SOCKET=str(notify_path))
    st = os.fstat(stderr.fileno())
    env["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
    return subprocess.Popen(["ip", "netns", "exec", netns.namespace_of("primary"), *argv],
                            stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr, env=env)


def listening(ns, port):
    out = netns.in_ns(ns, "ss", "-Hltn", f"sport = :{port}", capture=True)
    return bool(out.stdout.strip())


def test_the_unit_command_notifies_ready_after_its_sockets_then_stopping(lab, tmp_path, psk):
    from remusdb import protect_config
    address = netns.HOSTS["primary"][1]
    argv = unit_command(tmp_path, "primary", f"{address}:{PORT}", psk,
                        extra_opts="--log-level debug --heartbeat-rt-priority 1")
    assert "--log-level" in argv and "debug" in argv  # from the EnvironmentFile
    notes = Notifications(tmp_path / "notify.sock")
    journal = open(tmp_path / "journal.txt", "w+")
    proc = start_in_lab(argv, tmp_path, notes.path, journal)
    try:
        ready = notes.wait_for("READY", timeout=30)
        assert ready is not None, (proc.poll(), (tmp_path / "journal.txt").read_text())
        # At READY=1 both sockets already accept, before anything else:
        sock = tmp_path / "run/remusdb/primary/remusdbd.sock"
        reply = control.request(sock, "ping", timeout=2.0)
        assert reply["host"] == "primary" and reply["pid"] == int(ready["MAINPID"])
        assert listening(netns.namespace_of("primary"), PORT)
        assert listening(netns.namespace_of("primary"), HTTP_PORT)  # --http (metrics)
        assert ready["READY"] == "1"
        assert ready["STATUS"].startswith("host primary: 0 VM(s), control ")
        assert f"replication on {address}:{PORT}" in ready["STATUS"]
        # The key, witness and fence command a protection file is checked against:
        settings = reply["settings"]
        assert settings["psk_sha256"] == protect_config.key_fingerprint(psk)
        assert settings["etcd"] == f"http://{netns.SUBNET_PREFIX}.5:2379"
        assert settings["fence_command"] == ""
        proc.send_signal(signal.SIGTERM)  # what systemctl stop sends (KillMode=process)
        stopping = notes.wait_for("STOPPING", timeout=15)
        assert stopping is not None and stopping["STOPPING"] == "1", notes.seen
        assert "shutting down" in stopping.get("STATUS", "")
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        notes.close()
    journal.seek(0)
    lines = journal.read().splitlines()
    assert lines and all(re.match(r"^<[3467]>", line) for line in lines), lines[:5]
    assert any(line.startswith("<7>") for line in lines)  # --log-level debug from the env file
    assert any(line.startswith("<6>remusdbd stopped") for line in lines), lines[-3:]


def test_a_daemon_that_cannot_start_never_says_ready(lab, tmp_path, psk):
    """Negative control: the same command with a config key remusdbd does
    not know exits 2 (a bad config: the unit does not restart it) and the
    notify socket hears nothing."""
    address = netns.HOSTS["primary"][1]
    argv = unit_command(tmp_path, "primary", f"{address}:{PORT}", psk)
    conf = tmp_path / "etc/remusdb/primary.conf"
    conf.write_text(conf.read_text() + "heartbeat-msec = 50\n")
    notes = Notifications(tmp_path / "notify.sock")
    journal = open(tmp_path / "journal.txt", "w+")
    proc = start_in_lab(argv, tmp_path, notes.path, journal)
    try:
        assert proc.wait(timeout=30) == 2
        assert notes.wait_for("READY", timeout=0.5) is None and not notes.seen
    finally:
        notes.close()
    journal.seek(0)
    assert "unknown key 'heartbeat-msec'" in journal.read()


def free_local_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_to_exit(argv, tmp_path, timeout=30):
    """remusdbd with a notify socket, outside the lab (it must fail before
    it serves anything): (exit status, its output, the notifications)."""
    notes = Notifications(tmp_path / "notify.sock")
    env = dict(os.environ, NOTIFY_SOCKET=str(notes.path))
    env.pop("JOURNAL_STREAM", None)
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env,
                           stdin=subprocess.DEVNULL)
        notes.wait_for("READY", timeout=0.5)
        return r.returncode, r.stdout + r.stderr, notes.seen
    finally:
        notes.close()


def test_the_example_config_left_unfilled_refuses_to_start(tmp_path, psk):
    """dist/remusdbd.conf.example as installed, its key path pointed at a
    real key: each of its etcd, listen and http placeholders, left
    unfilled, stops the daemon with a line naming it and no READY=1 (etcd
    with exit 2, which the unit does not restart). Each run fills one more
    placeholder, so each is shown to be caught on its own (the small bug:
    one line forgotten)."""
    conf = tmp_path / "remusdbd.conf"
    example = example_config(tmp_path).replace(f"psk-file = {tmp_path}/remusdb/psk",
                                               f"psk-file = {psk}")
    assert f"psk-file = {psk}" in example
    argv = [str(vm.daemon_binary()), "--config", str(conf), "--host", "x",
            "--control", str(tmp_path / "c.sock"), "--state-dir", str(tmp_path / "state"),
            "--run-dir", str(tmp_path / "run")]
    conf.write_text(example)
    status, out, notes = run_to_exit(argv, tmp_path)
    assert status == 2 and not notes, (status, notes, out)
    assert "etcd endpoint '<witness' is not an http:// or https:// URL" in out, out
    (tmp_path / "notify.sock").unlink()
    example = example.replace(
        "<witness 1 client URL>,<witness 2 client URL>,<witness 3 client URL>",
        "http://192.0.2.11:2379,http://192.0.2.12:2379,http://192.0.2.13:2379")
    assert "<witness" not in example
    conf.write_text(example)
    status, out, notes = run_to_exit(argv, tmp_path)
    assert status == 1 and not notes, (status, notes, out)
    assert "'<this host's replication IPv4 address>' is not an IPv4 address" in out, out
    (tmp_path / "notify.sock").unlink()
    listen_filled = example.replace("<this host's replication IPv4 address>:7788",
                                    f"127.0.0.1:{free_local_port()}")
    assert listen_filled != example
    conf.write_text(listen_filled)
    status, out, notes = run_to_exit(argv, tmp_path)
    assert status == 1 and not notes, (status, notes, out)
    assert "'<this host's management IPv4 address>' is not an IPv4 address" in out, out


def test_without_the_journal_lines_keep_their_timestamps(tmp_path, psk):
    """The other half of the journal check: JOURNAL_STREAM naming some
    other file, stderr lines are the plain timestamped ones."""
    out = open(tmp_path / "stderr.txt", "w+")
    other = os.stat(psk)
    env = dict(os.environ, JOURNAL_STREAM=f"{other.st_dev}:{other.st_ino}")
    env.pop("NOTIFY_SOCKET", None)
    proc = subprocess.Popen([str(vm.daemon_binary()), "--host", "x", "--control",
                             str(tmp_path / "c.sock"), "--state-dir", str(tmp_path / "state"),
                             "--run-dir", str(tmp_path)], stdin=subprocess.DEVNULL,
                            stdout=out, stderr=out, env=env)
    try:
        deadline = time.monotonic() + 30
        while not control.reachable(tmp_path / "c.sock") and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out.seek(0)
    lines = out.read().splitlines()
    assert any("remusdbd stopped" in line for line in lines), lines
    assert all(re.match(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} ", line) for line in lines), lines
