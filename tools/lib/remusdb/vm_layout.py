"""A VM's names and files on a host, as remusdbd and the tools share them:
its name's rule, its MAC, and the sockets and files under its run
directory (paths.vm_run_dir), and stopping the QEMU they name. The lab's
VMs and the product's clones (fork.py) are laid out alike, so that
remusdbd finds either."""
import hashlib
import os
import signal
import time

from . import paths
from .qmp import QMP, QMPError


def mac_for(vm):
    """A fixed, locally administered MAC for VM `vm` (QEMU's 52:54:00 prefix)."""
    digest = hashlib.sha256(vm.encode()).digest()
    return "52:54:00:%02x:%02x:%02x" % (digest[0], digest[1], digest[2])


def check_name(vm):
    """A VM name is short because it names taps (IFNAMSIZ) and exports."""
    if not vm or len(vm) > 10 or not all(c.isalnum() or c in "-_" for c in vm):
        raise SystemExit(f"invalid VM name {vm!r}: use up to 10 letters, digits, '-' or '_'")


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
        # A daemonized QEMU's stderr (its -D log): where it says why it died.
        "qemu_log": d / "qemu-stderr.log",
        "pid": d / "qemu.pid",
        "meta": d / "vm.json",
    }


def process_alive(pid):
    """True while any thread of pid runs. A zombie whose threads are all
    gone has let go of its sockets: not alive. But a killed process's main
    thread may exit first and show as a zombie while another thread still
    finishes the system call it was in (a worker's pread or fdatasync),
    and the process's files, its listening sockets too, stay open until
    that last thread leaves: alive."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                if f.read().rpartition(")")[2].split()[0] not in ("Z", "X"):
                    return True
        except (OSError, IndexError):
            continue  # that thread is gone
    return False


def running_pid(files):
    """QEMU's pid while it runs. A killed, daemonized QEMU whose parent does
    not reap it lingers as a zombie (a container's PID 1 may not): dead."""
    try:
        pid = int(files["pid"].read_text())
    except (FileNotFoundError, ValueError):
        return None
    return pid if process_alive(pid) else None


def stop_qemu(files, wait_s=5.0):
    """Stops the QEMU of `files` (vm_files): QMP quit, else SIGKILL, then
    waits up to wait_s for it to be gone. Nothing to do when none runs."""
    pid = running_pid(files)
    if not pid:
        return
    try:
        with QMP(files["qmp"], timeout=5) as q:
            q.command("quit")
    except (OSError, QMPError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    while running_pid(files) and time.monotonic() < deadline:
        time.sleep(0.05)
