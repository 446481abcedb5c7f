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

A VM can also start from a saved guest (start(..., from_saved=True)):
the same VM booted fresh once, saved with QMP `migrate` to a file the
moment PostgreSQL accepted connections, together with its disk at that
moment (the blocks in which it differs from the guest image); later
starts restore that state on a fresh copy of that disk instead of
booting (saved_guest_dir has the cache and its key).
"""
import hashlib
import json
import os
from pathlib import Path
import shutil
import shlex
import subprocess
import time
from functools import partial

from .. import accel, control, output, paths
from ..vm_layout import (check_name, mac_for, process_alive as _process_alive,
                         running_pid, stop_qemu, vm_files)
from ..ownership import OwnershipError, owner
from . import disk_copies, netns, witness
from ..qmp import QMP, QMPError, wait_for_socket

DEFAULT_IP = f"{netns.SUBNET_PREFIX}.10"
QEMU_NBD_RECONNECT_SECONDS = 5


say = partial(output.say, "remusdb-vm", err=True)


# ---------------------------------------------------------------- remusdbd

def daemon_running(host):
    return control.reachable(paths.control_socket(host))


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


DAEMON_EXIT_WAIT_S = 10


def ensure_daemon(host, settings=None):
    """Starts remusdbd in the host's namespace unless it already answers.
    Returns its process (a subprocess.Popen) when it started one, else None.
    settings: see replication_args."""
    sock = paths.control_socket(host)
    if control.reachable(sock):
        return None
    # A killed remusdbd keeps its sockets open until its last thread has
    # left the system call it was in (a worker's pread, pwrite or
    # fdatasync); one started before that finds the VMs' NBD sockets still
    # listening and refuses to serve them. A host that comes back has none
    # of its old processes, and systemd restarts a unit only once its
    # processes are gone: so do we.
    deadline = time.monotonic() + DAEMON_EXIT_WAIT_S
    previous = daemon_pid(host)
    if previous is not None:
        say(f"remusdbd on {host}: the previous one (pid {previous}) is still "
            f"exiting; waiting up to {DAEMON_EXIT_WAIT_S} s for it")
    while daemon_pid(host) is not None and time.monotonic() < deadline:
        if control.reachable(sock):
            return None
        time.sleep(0.05)
    binary = daemon_binary()
    if not binary.exists():
        raise SystemExit(f"{binary} is missing: run `make setup` first")
    run_dir = paths.host_run_dir(host)
    run_dir.mkdir(parents=True, exist_ok=True)
    state = paths.host_state_dir(host)
    state.mkdir(parents=True, exist_ok=True)
    log = run_dir / "remusdbd.log"
    # Above the guests, as dom0 is in Xen: heartbeats and checkpoint answers
    # must not wait behind a TCG vCPU that saturates a core. Its own session
    # is its scheduling group under autogroup, and remusdbd gives that group
    # this nice value (base/sched_group.h): a thread's nice alone would
    # order it only among the daemon's own threads.
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

def prepare_disk(vm, fresh, saved=None):
    """The VM's disk: kept, or (fresh) a copy of the guest image, or (saved:
    a saved guest's directory) the disk that guest had when it was saved."""
    disk = paths.vm_disk(vm)
    base = paths.guest_dir() / "rootfs.img"
    if not base.exists():
        raise SystemExit(f"no guest image at {base}: run `make guest-image` first")
    if fresh or saved or not disk.exists():
        disk.parent.mkdir(parents=True, exist_ok=True)
        tmp = disk.with_suffix(".tmp")
        disk_copies.copy_image(base, tmp)
        if saved:
            apply_disk_delta(saved, tmp)
        # The old disk's change log (remusdbd's IMAGE.changes) vouches for the old
        # contents: left beside a new disk it would make a failback skip blocks.
        disk.with_name(disk.name + ".changes").unlink(missing_ok=True)
        os.replace(tmp, disk)
    return disk


def wiring_name(disk_via, net_via):
    return {("nbd", "relay"): "remusdbd", ("file", "tap"): "plain"}.get(
        (disk_via, net_via), f"{disk_via}+{net_via}")


# Every line of QEMU's log stamped with the time (util/error-report.c and
# the trace events' log backend, which stamps only with it): its last words
# line up with remusdbd's log, and a trace enabled through QMP
# (trace-event-set-state, as `remusdb-bench scale --qemu-trace` does) can
# be timed.
LOG_TIMESTAMPS = ("-msg", "timestamp=on")


def qemu_command(vm, files, disk, ip, mac, accel_name, mem_mb, disk_via, plain_tap, cpus=1):
    g = paths.guest_dir()
    append = (f"root=/dev/vda rw console=ttyS0 net.ifnames=0 quiet "
              f"systemd.hostname={vm} rdb.ip={ip}/{netns.PREFIX_LEN}")
    cmd = [str(paths.qemu_binary()), "-name", vm, "-machine", "pc",
           "-accel", accel_name, "-cpu", "host" if accel_name == "kvm" else "max",
           "-m", str(mem_mb), "-smp", str(cpus), "-nodefaults", "-display", "none",
           "-kernel", str(g / "vmlinuz"), "-initrd", str(g / "initrd.img"),
           "-append", append,
           "-serial", f"file:{files['console']}",
           "-qmp", f"unix:{files['qmp']},server=on,wait=off",
           "-chardev", f"socket,id=qga0,path={files['qga']},server=on,wait=off",
           "-device", "virtio-serial-pci",
           "-device", "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0",
           "-daemonize", "-pidfile", str(files["pid"]),
           # Daemonized, QEMU sends its stderr to /dev/null unless it has a
           # log file (os-posix.c): with one, its last words are kept there.
           "-D", str(files["qemu_log"]), *LOG_TIMESTAMPS]
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
          fresh=False, wait=True, wait_timeout=300, from_saved=False, cpus=1):
    """Starts the VM on host and (wait) waits until PostgreSQL accepts
    connections. fresh: on a new copy of the guest image, booted.
    from_saved: on a new copy of its saved guest's disk, restored from the
    saved guest's memory and device state instead of booted; the saved
    guest is made the first time (a fresh boot, then saved).
    cpus: the guest's vCPUs (-smp; multi-threaded TCG where KVM is not
    used); its saved guest is another one than a single vCPU's."""
    check_cpus(cpus)
    if not from_saved:
        return _start(vm, host, ip, mem_mb, disk_via, net_via, fresh, wait, wait_timeout,
                      cpus=cpus)
    entry = saved_guest_dir(vm, host, ip, mem_mb, disk_via, net_via, cpus=cpus)
    if not (entry / SAVED_STATE).exists():
        save_guest(entry, vm, host, ip, mem_mb, disk_via, net_via, wait_timeout, cpus=cpus)
    return restore(vm, host, entry, ip, mem_mb, disk_via, net_via, wait, wait_timeout,
                   cpus=cpus)


def check_cpus(cpus):
    if not isinstance(cpus, int) or not 1 <= cpus <= 64:
        raise SystemExit(f"--cpus {cpus}: a guest has 1 to 64 vCPUs")


def restore(vm, host, entry, ip=DEFAULT_IP, mem_mb=1024, disk_via="nbd", net_via="relay",
            wait=True, wait_timeout=300, cpus=1):
    """Starts the VM from the saved guest in entry (saved_guest_dir) with
    the QEMU configured now, which may be another build of the QEMU that
    saved it: loading its state is then QEMU's own migration between two
    builds of one version (the package's stripped QEMU and the tree's)."""
    return _start(vm, host, ip, mem_mb, disk_via, net_via, True, wait, wait_timeout,
                  saved=entry, cpus=cpus)


def _start(vm, host, ip, mem_mb, disk_via, net_via, fresh, wait, wait_timeout, saved=None,
           cpus=1):
    began = time.monotonic()
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
    disk = prepare_disk(vm, fresh, saved)
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
    cmd = qemu_command(vm, files, disk, ip, mac, accel_name, mem_mb, disk_via, plain_tap,
                       cpus=cpus)
    # The command a backup rebuilds the VM from (protection ships it, and
    # remusdbd adds its own -incoming): a restored VM's is the booted one's.
    meta = {"vm": vm, "host": host, "ip": ip, "mac": mac, "accel": accel_name,
            "wiring": wiring_name(disk_via, net_via), "disk_via": disk_via, "net_via": net_via,
            "disk": str(disk),
            "qemu": str(qemu), "command": cmd}
    run_cmd = cmd
    if saved:
        meta["restored_from"] = str(saved)
        run_cmd = cmd + ["-incoming", f"exec:cat {shlex.quote(str(saved / SAVED_STATE))}"]
    files["meta"].write_text(json.dumps(meta, indent=2))
    result = subprocess.run(["ip", "netns", "exec", ns] + run_cmd, capture_output=True,
                            text=True)
    if result.returncode != 0:
        raise SystemExit(f"QEMU failed to start: {result.stderr.strip()}")
    with wait_for_socket(files["qmp"]) as q:
        version = q.greeting["QMP"]["version"]["qemu"]
    say(f"{vm} started on {host}: QEMU {version['major']}.{version['minor']}."
        f"{version['micro']} ({qemu}), accel={accel_name}, "
        f"wiring={wiring_name(disk_via, net_via)}, ip={ip}, mac={mac}"
        f"{', restoring ' + str(saved) if saved else ''}")
    if saved:
        wait_restored(vm, files, saved)
        settle_restored_guest(vm, files)
        say(f"{vm}: restored and running {time.monotonic() - began:.1f} s after its start "
            f"began")
    if wait:
        wait_for_postgres(ip, wait_timeout)
        say(f"{vm}: PostgreSQL accepts connections at {ip}:5432 "
            f"({time.monotonic() - began:.1f} s after its start began)")
    return files


def wait_for_postgres(ip, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = netns.in_ns("rdb-client", "pg_isready", "-q", "-h", ip, "-t", "2", check=False,
                        capture=True)
        if r.returncode == 0:
            return
        time.sleep(0.2)  # refused at once: it is starting
    raise SystemExit(f"PostgreSQL at {ip} not ready after {timeout} s")


def stop(vm, host):
    files = vm_files(host, vm)
    stop_qemu(files)
    meta = json.loads(files["meta"].read_text()) if files["meta"].exists() else {}
    if meta.get("net_via") == "tap":
        netns.in_ns(netns.namespace_of(host), "ip", "link", "del", f"rdbp-{vm}",
                    check=False, capture=True)
    if daemon_running(host):
        try:
            control.request(paths.control_socket(host), "vm-remove", vm=vm)
        except control.ControlError as e:
            if "no VM named" not in str(e):
                raise SystemExit(f"{vm}: QEMU stopped on {host}, but remusdbd there did not "
                                 f"forget it ({e}): it holds {vm} still")
            say(f"remusdbd: {e}")
    else:
        forget_while_daemon_down(vm, host)
    say(f"{vm} stopped on {host}")


def daemon_pid(host):
    """The pid of the host's remusdbd while that process lives, else None."""
    try:
        pid = int((paths.host_run_dir(host) / "remusdbd.pid").read_text())
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except (OSError, ValueError):
        return None
    # Not a reused pid. An empty command line is a process whose main thread
    # has exited while others finish (_process_alive): its pid cannot have
    # been reused while that main thread's entry stays, so it is ours.
    is_remusdbd = b"remusdbd" in cmdline or not cmdline
    return pid if is_remusdbd and _process_alive(pid) else None


def persisted_files(host, vm):
    """What the host's remusdbd persisted of the VM in its --state-dir and
    reloads when it starts: the definition (vm/vm_store.c) and, while it
    was protected, the protection marker (primary/protection_marker.c)
    and the protect settings it re-protects with
    (primary/protect_settings.c)."""
    state = paths.host_state_dir(host)
    return [state / "vms" / f"{vm}.json", state / "protected" / f"{vm}.json",
            state / "protect-settings" / f"{vm}.json"]


def forget_while_daemon_down(vm, host):
    """The host's remusdbd is down (a host back from a power cut, before
    its daemon started): what it persisted of the VM goes, or it would
    bring the VM back when it starts. A daemon process that lives but
    does not answer may still write them: nothing is touched then."""
    pid = daemon_pid(host)
    if pid:
        raise SystemExit(f"{vm}: remusdbd on {host} (pid {pid}) runs but does not answer, "
                         f"so it still holds {vm} and would bring it back; run the stop again "
                         f"once it answers")
    removed = []
    for f in persisted_files(host, vm):
        try:
            f.unlink()
        except FileNotFoundError:
            continue
        except OSError as e:
            raise SystemExit(f"{vm}: remusdbd on {host} is down and {f} cannot be removed "
                             f"({e}): it would bring {vm} back when it starts; remove that "
                             f"file by hand")
        fd = os.open(f.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)  # the unlink must survive the next power cut too
        finally:
            os.close(fd)
        removed.append(str(f))
    if removed:
        say(f"{vm}: remusdbd on {host} is down: removed what it persisted of {vm} "
            f"({', '.join(removed)}), so that it does not come back when remusdbd starts")


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


# ---------------------------------------------------------------- saved guests
# A saved guest is valid for exactly the QEMU command line it was saved
# under (devices, MAC, memory, paths: the device state loads only into the
# same devices) and the files that command and the guest's disk come from.
# It is cached across runs: the key changes, and a new one is made, when
# any of those changes; the entries an older key left for the same VM and
# host go when the new one is complete, unless they belong to another guest
# image that still exists (_saved_for_this_image).

SAVED_STATE = "state"    # the QMP migration stream: RAM and device state
# The disk at the same moment, as the blocks in which it differs from the
# guest image (the key pins that image): a few MiB rather than a whole
# disk per saved guest. disk-delta.img holds them at their own offsets
# (holes elsewhere), disk-blocks.json lists those offsets.
SAVED_DISK_DELTA = "disk-delta.img"
SAVED_DISK_BLOCKS = "disk-blocks.json"
DISK_DELTA_BLOCK = 64 << 10
# The guest is stopped while saved: nothing to converge, so no rate limit.
SAVE_BANDWIDTH = 16 << 30
SAVE_TIMEOUT = 300
RESTORE_TIMEOUT = 300


def saved_guests_root():
    return paths.CACHE / "saved-guests"


def _file_identity(path):
    """What tells one build of path from another without reading it all:
    where it resolves to, its size, its modification time and its inode
    (the setup scripts write new files and rename them into place)."""
    real = Path(path).resolve()
    try:
        st = real.stat()
    except FileNotFoundError:
        raise SystemExit(f"{path} is missing: run `make setup` first")
    return [str(real), st.st_size, st.st_mtime_ns, st.st_ino]


def _firmware_identity():
    """The ROMs QEMU loads from its -L directories become RAM blocks of the
    saved state: a firmware update invalidates it too."""
    found = []
    for d in paths.QEMU_FIRMWARE_DIRS:
        for root, _, names in sorted(os.walk(d)):
            for n in sorted(names):
                p = Path(root) / n
                try:
                    st = p.stat()
                except OSError:
                    continue  # a dangling link: QEMU cannot load it either
                found.append([str(p), st.st_size, st.st_mtime_ns])
    return found


def without(cmd, pair):
    """cmd without the option pair (an option and its value), wherever it is."""
    out, i = [], 0
    while i < len(cmd):
        if tuple(cmd[i:i + len(pair)]) == tuple(pair):
            i += len(pair)
            continue
        out.append(cmd[i])
        i += 1
    return out


def saved_guest_key(vm, host, ip, mem_mb, disk_via, net_via, cpus=1):
    """The key parts (JSON-able) a saved guest of this VM must match."""
    g = paths.guest_dir()
    guest = [_file_identity(g / n) for n in ("vmlinuz", "initrd.img", "rootfs.img")]
    accel_name = accel.choose(g / "vmlinuz", g / "initrd.img")
    files = vm_files(host, vm)
    plain_tap = f"rdbp-{vm}" if net_via == "tap" else None
    cmd = qemu_command(vm, files, paths.vm_disk(vm), ip, mac_for(vm), accel_name, mem_mb,
                       disk_via, plain_tap, cpus=cpus)
    # How QEMU stamps its log lines is nothing a saved guest depends on, and
    # guests saved before the stamps came stay good.
    cmd = without(cmd, LOG_TIMESTAMPS)
    return {"command": cmd,
            "qemu": _file_identity(paths.qemu_binary()),
            "guest": guest,
            "firmware": _firmware_identity()}


def saved_guest_dir(vm, host, ip=DEFAULT_IP, mem_mb=1024, disk_via="nbd", net_via="relay",
                    cpus=1):
    key = saved_guest_key(vm, host, ip, mem_mb, disk_via, net_via, cpus=cpus)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return saved_guests_root() / f"{host}-{vm}-{digest}"


def save_guest(entry, vm, host, ip, mem_mb, disk_via, net_via, wait_timeout, cpus=1):
    """Boots the VM fresh, waits for PostgreSQL, stops the guest and saves
    its RAM and device state to entry/state, stops the VM and saves its
    disk (write_disk_delta). The entry appears whole or not at all."""
    say(f"{vm}: no saved guest at {entry}: booting one to save")
    files = _start(vm, host, ip, mem_mb, disk_via, net_via, True, True, wait_timeout,
                   cpus=cpus)
    partial = entry.with_name(entry.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    began = time.monotonic()
    try:
        with QMP(files["qmp"], timeout=60) as q:
            # Stopped before the stream starts: QEMU drains and flushes the
            # disk (through remusdbd's export) at the stop, the state is of
            # that one moment, and the guest writes nothing after it.
            q.command("stop")
            q.command("migrate-set-parameters", **{"max-bandwidth": SAVE_BANDWIDTH})
            q.command("migrate", uri=f"exec:cat > {shlex.quote(str(partial / SAVED_STATE))}")
            deadline = time.monotonic() + SAVE_TIMEOUT
            while True:
                info = q.command("query-migrate")
                if info.get("status") == "completed":
                    break
                if info.get("status") in ("failed", "cancelled") or time.monotonic() > deadline:
                    raise SystemExit(f"{vm}: saving the guest to {partial} failed "
                                     f"({info.get('status')}: {info.get('error-desc', '')})")
                time.sleep(0.1)
    finally:
        stop(vm, host)
    # QEMU has quit and remusdbd has let go of the disk: the file is what
    # the guest had written by the stop, and nothing writes it now.
    blocks = write_disk_delta(paths.guest_dir() / "rootfs.img", paths.vm_disk(vm), partial)
    # cat wrote the state without a sync: a cached entry must survive a crash whole.
    with open(partial / SAVED_STATE, "rb") as f:
        os.fsync(f.fileno())
    key = saved_guest_key(vm, host, ip, mem_mb, disk_via, net_via, cpus=cpus)
    (partial / "saved.json").write_text(json.dumps({
        "vm": vm, "host": host, "ip": ip, "saved_at": time.time(), "key": key}, indent=2))
    for stale in entry.parent.glob(f"{host}-{vm}-" + "?" * 16):
        if _saved_for_this_image(stale, key["guest"]):
            shutil.rmtree(stale, ignore_errors=True)
    os.replace(partial, entry)
    state_mb = (entry / SAVED_STATE).stat().st_size / 2**20
    say(f"{vm}: saved guest at {entry} ({state_mb:.0f} MiB of state, "
        f"{blocks * DISK_DELTA_BLOCK / 2**20:.0f} MiB of changed disk; saved in "
        f"{time.monotonic() - began:.1f} s)")


def _saved_for_this_image(entry, guest):
    """Whether an older saved guest may go: it was saved from the same guest
    image (guest: the key's identity of its files), or from one that no
    longer exists.  A saved guest of another image that still exists stays:
    REMUSDB_GUEST_DIR lets one user of the cache test a new image while the
    others go on with theirs, and each would otherwise delete the other's
    saved guests and boot new ones."""
    try:
        saved = json.loads((entry / "saved.json").read_text())["key"]["guest"]
    except (OSError, ValueError, KeyError, TypeError):
        return True
    if saved == guest:
        return True
    return not all(Path(identity[0]).exists() for identity in saved)


def write_disk_delta(base, disk, entry):
    """Writes the blocks in which disk differs from base into entry (see
    SAVED_DISK_DELTA); returns how many."""
    offsets = []
    with open(base, "rb") as b, open(disk, "rb") as d, \
            open(entry / SAVED_DISK_DELTA, "wb") as out:
        size = os.fstat(d.fileno()).st_size
        if os.fstat(b.fileno()).st_size != size:
            raise SystemExit(f"{disk} is not the size of {base}: not a copy of it")
        out.truncate(size)
        for offset in range(0, size, DISK_DELTA_BLOCK):
            block = d.read(DISK_DELTA_BLOCK)
            if block != b.read(DISK_DELTA_BLOCK):
                out.seek(offset)
                out.write(block)
                offsets.append(offset)
        out.flush()
        os.fsync(out.fileno())
    (entry / SAVED_DISK_BLOCKS).write_text(json.dumps(
        {"block": DISK_DELTA_BLOCK, "size": size, "offsets": offsets}))
    return len(offsets)


def apply_disk_delta(entry, disk):
    """Turns disk, a copy of the guest image, into the saved guest's disk."""
    blocks = json.loads((entry / SAVED_DISK_BLOCKS).read_text())
    if os.stat(disk).st_size != blocks["size"]:
        raise SystemExit(f"{disk} is not the size of the disk saved in {entry}")
    with open(entry / SAVED_DISK_DELTA, "rb") as delta, open(disk, "r+b") as out:
        for offset in blocks["offsets"]:
            delta.seek(offset)
            out.seek(offset)
            out.write(delta.read(blocks["block"]))


def wait_restored(vm, files, entry):
    """Waits until the restoring QEMU has loaded the saved state, then
    resumes the guest: the state was saved stopped, and QEMU keeps the
    run state the stream carries (paused) rather than starting it."""
    deadline = time.monotonic() + RESTORE_TIMEOUT
    try:
        with QMP(files["qmp"], timeout=60) as q:
            while True:
                status = q.command("query-status")["status"]
                if status == "running":
                    return
                if status == "paused":
                    q.command("cont")
                elif status != "inmigrate" or time.monotonic() > deadline:
                    raise SystemExit(f"{vm}: restoring {entry} left QEMU {status}")
                time.sleep(0.1)
    except (OSError, QMPError) as e:
        # QEMU 7.2 exits when an incoming migration fails to load.
        raise SystemExit(f"{vm}: QEMU quit while restoring {entry} ({e}); a saved guest "
                         f"that no longer loads can be deleted, the next start saves "
                         f"a new one")


def settle_restored_guest(vm, files):
    """What a restore leaves behind and a boot would not, set right through
    the guest agent: the guest's clock still reads the time it was saved
    at (its clocks went on from there), and its neighbour table holds the
    lab addresses of the run that saved it (the lab's namespaces are made
    anew per run)."""
    from ..guest_agent import GuestAgent, GuestAgentError
    deadline = time.monotonic() + 120
    while True:
        try:
            ga = GuestAgent(files["qga"], 10.0)
            break
        except GuestAgentError:
            if time.monotonic() > deadline:
                raise SystemExit(f"{vm}: the restored guest's agent did not answer")
            time.sleep(0.5)
    try:
        # Read last, just before the exec: the guest takes the host's time.
        script = ("PATH=/usr/sbin:/usr/bin:/sbin:/bin; "
                  f"date -u -s @{time.time():.6f} >/dev/null && ip neigh flush all")
        pid = ga.exec_start(["/bin/sh", "-c", script])
        result = ga.wait_exec(pid, 60, poll=0.1)
    except GuestAgentError as e:
        raise SystemExit(f"{vm}: settling the restored guest: {e}")
    finally:
        ga.close()
    if result["exitcode"] != 0:
        raise SystemExit(f"{vm}: settling the restored guest failed: {result['err'].strip()}")
