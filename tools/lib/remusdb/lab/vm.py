"""Starting and stopping database VMs in the lab.

Each of the VM's two paths is wired one of two ways:
  disk: "nbd"   an NBD export served by remusdbd (default), or
        "file"  the image file opened by QEMU itself;
  net:  "relay" a `-netdev stream` socket relayed by remusdbd to a tap on
                the host bridge (default), or
        "tap"   a plain tap on the host bridge.
nbd+relay is the path checkpoint replication builds on; file+tap ("plain")
is the baseline the benchmark compares against; the mixed wirings let the
benchmark tell the disk's share from the network's.
"""
import hashlib
import json
import os
from pathlib import Path
import shutil
import signal
import subprocess
import sys
import time

from .. import accel, control, paths
from ..ownership import OwnershipError, owner
from . import netns, witness
from ..qmp import QMP, QMPError, wait_for_socket

DEFAULT_IP = f"{netns.SUBNET_PREFIX}.10"
QEMU_NBD_RECONNECT_SECONDS = 5


def say(msg):
    print(f"[remusdb-vm] {msg}", file=sys.stderr, flush=True)


def mac_for(vm):
    digest = hashlib.sha256(vm.encode()).digest()
    return "52:54:00:%02x:%02x:%02x" % (digest[0], digest[1], digest[2])


def check_name(vm):
    if not vm or len(vm) > 10 or not all(c.isalnum() or c in "-_" for c in vm):
        raise SystemExit(f"invalid VM name {vm!r}: use up to 10 letters, digits, '-' or '_'")


# ---------------------------------------------------------------- remusdbd

def daemon_running(host):
    return control.reachable(paths.control_socket(host))


def _process_alive(pid):
    """True while pid runs (a zombie has let go of its sockets: not alive)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def stop_daemon(host, timeout=15):
    """Asks the host's remusdbd to shut down and waits until its process is
    gone. Its control socket closes first, its replication listener last:
    a new daemon started before the old process ended would find the
    replication port still taken."""
    pid_file = paths.host_run_dir(host) / "remusdbd.pid"
    try:
        pid = int(pid_file.read_text())
    except (OSError, ValueError):
        pid = None
    if daemon_running(host):
        control.request(paths.control_socket(host), "shutdown")
    deadline = time.monotonic() + timeout
    while pid is not None and _process_alive(pid):
        if time.monotonic() > deadline:
            raise SystemExit(f"remusdbd on {host} (pid {pid}) did not exit within {timeout} s")
        time.sleep(0.05)


REPLICATION_PORT = 7788


def psk_file():
    """The lab's pre-shared key (both hosts read the same file here; real
    hosts get a copy). REMUSDB_PSK_FILE points a daemon at another key,
    which is how the wrong-key drill is run."""
    override = os.environ.get("REMUSDB_PSK_FILE")
    if override:
        return Path(override)
    path = paths.STATE / "psk"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.with_suffix(".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(os.urandom(32).hex() + "\n")
        os.replace(path.with_suffix(".tmp"), path)
    return path


def replication_args(host, settings=None):
    """Every VM host serves replicas on its LAN address and arbitrates
    through the lab's etcd. REMUSDBD_EXTRA_ARGS adds options (tests use
    it for timings). settings (a protection file's key_file, etcd,
    fence_command: remusdb protect --config) replace the lab's."""
    # The lab runs the daemon's own failure-detection defaults (50 ms
    # heartbeats, 200 ms timeout): its heartbeat thread runs at real-time
    # priority, so two busy TCG guests on two cores do not delay it.
    settings = settings or {}
    args = ["--psk-file", str(settings.get("key_file") or psk_file()),
            "--etcd", settings.get("etcd") or witness.client_endpoints()]
    if settings.get("fence_command"):
        args += ["--fence-command", settings["fence_command"]]
    _, address, has_bridge = netns.HOSTS[host]
    if has_bridge:
        args += ["--listen", f"{address}:{REPLICATION_PORT}"]
    extra = os.environ.get("REMUSDBD_EXTRA_ARGS")
    if extra:
        args += extra.split()
    return args


def daemon_binary():
    """The remusdbd to start: REMUSDBD_BINARY overrides the build's
    (tests run an ASan+UBSan build through it)."""
    return Path(os.environ.get("REMUSDBD_BINARY") or paths.REMUSDBD)


def ensure_daemon(host, settings=None):
    """Starts remusdbd in the host's namespace unless it already answers.
    Returns its process (a subprocess.Popen) when it started one, else None.
    settings: see replication_args."""
    sock = paths.control_socket(host)
    if control.reachable(sock):
        return None
    binary = daemon_binary()
    if not binary.exists():
        raise SystemExit(f"{binary} is missing: run `make setup` first")
    run_dir = paths.host_run_dir(host)
    run_dir.mkdir(parents=True, exist_ok=True)
    state = paths.host_state_dir(host)
    state.mkdir(parents=True, exist_ok=True)
    log = run_dir / "remusdbd.log"
    # Above the guests, as dom0 is in Xen: heartbeats and checkpoint answers
    # must not wait behind a TCG vCPU that saturates a core.
    cmd = ["ip", "netns", "exec", netns.namespace_of(host), "nice", "-n", "-10",
           str(binary),
           "--host", host, "--control", str(sock), "--state-dir", str(state),
           "--log", str(log), "--run-dir", str(run_dir)] + replication_args(host, settings)
    extra = os.environ.get("REMUSDBD_WRAPPER")  # e.g. "valgrind -q --log-file=..."
    if extra:
        cmd = cmd[:7] + extra.split() + cmd[7:]
    with open(run_dir / "remusdbd.out", "ab") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                start_new_session=True)
    (run_dir / "remusdbd.pid").write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if control.reachable(sock):
            say(f"remusdbd started on {host} (pid {proc.pid}, log {log})")
            return proc
        if proc.poll() is not None:
            raise SystemExit(f"remusdbd exited with {proc.returncode}; see {log} and {run_dir}/remusdbd.out")
        time.sleep(0.1)
    raise SystemExit(f"remusdbd did not answer on {sock} within 30 s")


# ---------------------------------------------------------------- QEMU

def vm_files(host, vm):
    d = paths.vm_run_dir(host, vm)
    return {
        "dir": d,
        "qmp": d / "qmp.sock",              # for the tools
        "qmp_daemon": d / "qmp-daemon.sock",  # owned by remusdbd
        "qga": d / "qga.sock",
        "nbd": d / "nbd.sock",
        "net": d / "net.sock",
        "console": d / "console.log",
        "pid": d / "qemu.pid",
        "meta": d / "vm.json",
    }


def prepare_disk(vm, fresh):
    disk = paths.vm_disk(vm)
    base = paths.guest_dir() / "rootfs.img"
    if not base.exists():
        raise SystemExit(f"no guest image at {base}: run `make guest-image` first")
    if fresh or not disk.exists():
        disk.parent.mkdir(parents=True, exist_ok=True)
        tmp = disk.with_suffix(".tmp")
        subprocess.run(["cp", "--sparse=always", str(base), str(tmp)], check=True)
        # The old disk's change log (remusdbd's IMAGE.changes) vouches for the old
        # contents: left beside a new disk it would make a failback skip blocks.
        disk.with_name(disk.name + ".changes").unlink(missing_ok=True)
        os.replace(tmp, disk)
    return disk


def wiring_name(disk_via, net_via):
    return {("nbd", "relay"): "remusdbd", ("file", "tap"): "plain"}.get(
        (disk_via, net_via), f"{disk_via}+{net_via}")


def qemu_command(vm, files, disk, ip, mac, accel_name, mem_mb, disk_via, plain_tap):
    g = paths.guest_dir()
    append = (f"root=/dev/vda rw console=ttyS0 net.ifnames=0 quiet "
              f"systemd.hostname={vm} rdb.ip={ip}/{netns.PREFIX_LEN}")
    cmd = [str(paths.qemu_binary()), "-name", vm, "-machine", "pc",
           "-accel", accel_name, "-cpu", "host" if accel_name == "kvm" else "max",
           "-m", str(mem_mb), "-smp", "1", "-nodefaults", "-display", "none",
           "-kernel", str(g / "vmlinuz"), "-initrd", str(g / "initrd.img"),
           "-append", append,
           "-serial", f"file:{files['console']}",
           "-qmp", f"unix:{files['qmp']},server=on,wait=off",
           "-chardev", f"socket,id=qga0,path={files['qga']},server=on,wait=off",
           "-device", "virtio-serial-pci",
           "-device", "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0",
           "-daemonize", "-pidfile", str(files["pid"])]
    for d in paths.QEMU_FIRMWARE_DIRS:
        cmd += ["-L", d]
    cmd += ["-qmp", f"unix:{files['qmp_daemon']},server=on,wait=off"]
    if disk_via == "file":
        cmd += ["-blockdev", f"driver=file,node-name=file0,filename={disk},cache.direct=off",
                "-blockdev", "driver=raw,node-name=disk0,file=file0"]
    else:
        cmd += ["-blockdev", (f"driver=nbd,node-name=disk0,server.type=unix,"
                              f"server.path={files['nbd']},export={vm},"
                              f"reconnect-delay={QEMU_NBD_RECONNECT_SECONDS}")]
    if plain_tap:
        cmd += ["-netdev", f"tap,id=net0,ifname={plain_tap},script=no,downscript=no"]
    else:
        cmd += ["-netdev", f"stream,id=net0,server=on,addr.type=unix,addr.path={files['net']}"]
    cmd += ["-device", "virtio-blk-pci,drive=disk0",
            "-device", f"virtio-net-pci,netdev=net0,mac={mac},romfile="]
    return cmd


def held_definition(host, vm):
    """The VM's status in the host's remusdbd, or None when it has no such VM."""
    reply = control.request(paths.control_socket(host), "status")
    return next((v for v in reply.get("vms", []) if v.get("name") == vm), None)


def recover_definition(vm, host, fresh):
    """remusdbd on host still holds the VM's definition from before (a
    crash, a restarted daemon) and no QEMU runs it. etcd decides: if
    another host owns the VM, it runs there and nothing starts here;
    otherwise the stale definition goes and the VM restarts from its own
    disk. Each refusal is one line that names the fix."""
    try:
        rec = owner(vm)
    except OwnershipError as e:
        raise SystemExit(f"{vm}: remusdbd on {host} holds it from before, and etcd cannot "
                         f"say who owns it ({e}); start the witness "
                         f"(tools/remusdb-lab witness) and retry")
    if rec and rec["owner"] != host:
        raise SystemExit(f"{vm}: etcd says {rec['owner']} owns it (generation "
                         f"{rec['generation']}): it runs there, not on {host}; to move it "
                         f"back, protect it from {rec['owner']} with `remusdb protect {vm} "
                         f"--backup {host}` and fail over")
    if fresh:
        raise SystemExit(f"{vm}: remusdbd on {host} holds it from before with its disk; "
                         f"restart it without --fresh, or `tools/remusdb-vm stop {vm} "
                         f"--host {host}` first to throw that disk away")
    control.request(paths.control_socket(host), "vm-remove", vm=vm)
    say(f"{vm}: remusdbd on {host} held it from before with no QEMU "
        f"({'etcd names ' + rec['owner'] if rec else 'etcd names no owner'}): "
        f"restarting it from its own disk")


def start(vm, host, ip=DEFAULT_IP, mem_mb=1024, disk_via="nbd", net_via="relay",
          fresh=False, wait=True, wait_timeout=300):
    check_name(vm)
    if not netns.is_up():
        raise SystemExit("the lab is down: run `tools/remusdb-lab up` first")
    ns = netns.namespace_of(host)
    files = vm_files(host, vm)
    if running_pid(files):
        ensure_daemon(host)
        if held_definition(host, vm):
            # A restarted remusdbd reconnects to a live QEMU by itself.
            say(f"{vm} is already running on {host}; remusdbd there has it (re-attached)")
            return files
        raise SystemExit(f"VM {vm} is already running on {host}; stop it first")
    ensure_daemon(host)
    if held_definition(host, vm):
        recover_definition(vm, host, fresh)
    shutil.rmtree(files["dir"], ignore_errors=True)
    files["dir"].mkdir(parents=True)
    qemu = paths.qemu_binary()
    if not qemu.exists():
        raise SystemExit(f"patched QEMU not found at {qemu}: run `make setup`")
    g = paths.guest_dir()
    accel_name = accel.choose(g / "vmlinuz", g / "initrd.img")
    disk = prepare_disk(vm, fresh)
    mac = mac_for(vm)
    plain_tap = None
    if net_via == "tap":
        plain_tap = f"rdbp-{vm}"
        netns.in_ns(ns, "ip", "tuntap", "add", "dev", plain_tap, "mode", "tap", check=False,
                    capture=True)
        netns.in_ns(ns, "ip", "link", "set", plain_tap, "master", netns.GUEST_BRIDGE, "up")
    # remusdbd always gets the VM (its QMP socket, and the NBD export even
    # when QEMU opens the file itself); the NIC only when it relays it.
    ensure_daemon(host)
    nic = {} if plain_tap else {"net_socket": str(files["net"]), "tap": f"rdbt-{vm}",
                                "bridge": netns.GUEST_BRIDGE, "mac": mac}
    control.request(paths.control_socket(host), "vm-add", name=vm, disk=str(disk),
                    nbd_socket=str(files["nbd"]), qmp_socket=str(files["qmp_daemon"]), **nic)
    cmd = qemu_command(vm, files, disk, ip, mac, accel_name, mem_mb, disk_via, plain_tap)
    files["meta"].write_text(json.dumps({
        "vm": vm, "host": host, "ip": ip, "mac": mac, "accel": accel_name,
        "wiring": wiring_name(disk_via, net_via), "disk_via": disk_via, "net_via": net_via,
        "disk": str(disk),
        "qemu": str(qemu), "command": cmd}, indent=2))
    result = subprocess.run(["ip", "netns", "exec", ns] + cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"QEMU failed to start: {result.stderr.strip()}")
    with wait_for_socket(files["qmp"]) as q:
        version = q.greeting["QMP"]["version"]["qemu"]
    say(f"{vm} started on {host}: QEMU {version['major']}.{version['minor']}."
        f"{version['micro']} ({qemu}), accel={accel_name}, "
        f"wiring={wiring_name(disk_via, net_via)}, ip={ip}, mac={mac}")
    if wait:
        wait_for_postgres(ip, wait_timeout)
        say(f"{vm}: PostgreSQL accepts connections at {ip}:5432")
    return files


def wait_for_postgres(ip, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = netns.in_ns("rdb-client", "pg_isready", "-q", "-h", ip, "-t", "2", check=False,
                        capture=True)
        if r.returncode == 0:
            return
        time.sleep(1)
    raise SystemExit(f"PostgreSQL at {ip} not ready after {timeout} s")


def running_pid(files):
    """QEMU's pid while it runs. A killed, daemonized QEMU whose parent does
    not reap it lingers as a zombie (this machine's PID 1 does not): dead."""
    try:
        pid = int(files["pid"].read_text())
    except (FileNotFoundError, ValueError):
        return None
    return pid if _process_alive(pid) else None


def stop(vm, host):
    files = vm_files(host, vm)
    pid = running_pid(files)
    if pid:
        try:
            with QMP(files["qmp"], timeout=5) as q:
                q.command("quit")
        except (OSError, QMPError):
            os.kill(pid, signal.SIGKILL)
        for _ in range(100):
            if not running_pid(files):
                break
            time.sleep(0.05)
    meta = json.loads(files["meta"].read_text()) if files["meta"].exists() else {}
    if meta.get("net_via") == "tap":
        netns.in_ns(netns.namespace_of(host), "ip", "link", "del", f"rdbp-{vm}",
                    check=False, capture=True)
    if daemon_running(host):
        try:
            control.request(paths.control_socket(host), "vm-remove", vm=vm)
        except control.ControlError as e:
            say(f"remusdbd: {e}")
    say(f"{vm} stopped on {host}")


def status(vm, host):
    files = vm_files(host, vm)
    meta = json.loads(files["meta"].read_text()) if files["meta"].exists() else {}
    pid = running_pid(files)
    info = {"vm": vm, "host": host, "running": bool(pid), "pid": pid,
            "accel": meta.get("accel"), "wiring": meta.get("wiring"),
            "ip": meta.get("ip"), "qemu": meta.get("qemu")}
    if pid:
        try:
            with QMP(files["qmp"], timeout=5) as q:
                info["run_state"] = q.command("query-status")["status"]
        except (OSError, QMPError) as e:
            info["run_state"] = f"unknown ({e})"
    return info
