"""A libvirtd of the lab's own in a host's namespace, and a domain of the
lab's guest image for it: what tests/integration/test_libvirt.py wires to
remusdbd and protects the way an operator would (remusdb.libvirt)."""
from pathlib import Path
import subprocess
import time

from .. import paths
from ..libvirt import LibvirtError, running_domains, virsh
from . import netns, witness

DAEMON_DIRS = ["etc/libvirt", "run/libvirt", "var/lib/libvirt", "var/cache/libvirt",
               "var/log/libvirt"]

QEMU_CONF = """\
# a libvirtd for the RemusDB lab (tools/lib/remusdb/lab/libvirtd.py)
user = "root"
group = "root"
dynamic_ownership = 0
remember_owner = 0
security_driver = "none"
namespaces = [ ]
cgroup_controllers = [ ]
stdio_handler = "file"
"""

LIBVIRTD_CONF = """\
unix_sock_group = "root"
unix_sock_rw_perms = "0700"
auth_unix_rw = "none"
auth_unix_ro = "none"
log_filters = "1:qemu 3:qemu.qemu_monitor_json 3:object 3:util 3:rpc 3:event"
log_outputs = "1:file:/var/log/libvirt/libvirtd.log"
"""


class LabLibvirtd:
    """A plain libvirtd as root in a host's namespace, its own state in
    `base` (bind-mounted over libvirt's system directories inside a
    private mount namespace, so two hosts' daemons never meet), with the
    owner hook installed where libvirt looks for it (its /etc/libvirt is
    base/etc/libvirt), pointed at a config that names this lab host and
    the lab's etcd, as /etc/remusdb/HOST.conf does on a real host."""

    def __init__(self, host, base):
        self.host, self.base = host, Path(base)
        self.proc = None

    @property
    def hook_config(self):
        return self.base / "remusdbd.conf"

    def install_hook(self):
        self.hook_config.write_text(f"# what the owner hook reads of remusdbd's config\n"
                                    f"host = {self.host}\n"
                                    f"etcd = {witness.client_endpoints()}\n")
        hook_dir = self.base / "etc/libvirt/hooks/qemu.d"
        hook_dir.mkdir(parents=True, exist_ok=True)
        hook = hook_dir / "remusdb"
        # As dist/libvirt-hook.in runs it, on this package's own path (the
        # checkout's tools/lib, or where it is installed).
        package_root = Path(__file__).resolve().parents[2]
        hook.write_text(f"#!/bin/sh\nPYTHONPATH={package_root}\nexport PYTHONPATH\n"
                        f"exec /usr/bin/python3 -P -m remusdb.cli.libvirt_hook "
                        f"--config {self.hook_config} \"$@\"\n")
        hook.chmod(0o755)

    @property
    def socket(self):
        return self.base / "run/libvirt/libvirt-sock"

    @property
    def uri(self):
        return f"qemu:///system?socket={self.socket}"

    @property
    def log(self):
        return self.base / "var/log/libvirt/libvirtd.log"

    def start(self, timeout=60):
        for d in DAEMON_DIRS:
            (self.base / d).mkdir(parents=True, exist_ok=True)
            Path("/" + d).mkdir(parents=True, exist_ok=True)  # the mount points
        (self.base / "etc/libvirt/qemu.conf").write_text(QEMU_CONF)
        (self.base / "etc/libvirt/libvirtd.conf").write_text(LIBVIRTD_CONF)
        self.install_hook()  # libvirtd looks for its hooks when it starts
        mounts = "; ".join(f"mount --bind {self.base / d} /{d}" for d in DAEMON_DIRS)
        script = f"set -e; mount --make-rprivate /; {mounts}; exec libvirtd --pid-file /run/libvirt/libvirtd.pid"
        out = open(self.base / "libvirtd.out", "ab")
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", netns.namespace_of(self.host), "unshare", "--mount",
             "sh", "-c", script], stdin=subprocess.DEVNULL, stdout=out, stderr=out,
            start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise LibvirtError(f"libvirtd on {self.host} exited with {self.proc.returncode}; "
                                   f"see {self.base}/libvirtd.out")
            if self.socket.exists() and virsh(self.uri, "list", check=False,
                                              timeout=10).returncode == 0:
                return self
            time.sleep(0.2)
        raise LibvirtError(f"libvirtd on {self.host} did not answer within {timeout} s")

    def stop(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            for name in running_domains(self.uri):
                virsh(self.uri, "destroy", name, check=False)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


def lab_domain_xml(name, disk, ip, mac, console, mem_mib=1024, uuid=None):
    """A small TCG domain booting the lab's guest image the way vm.py's
    QEMU command does (direct kernel boot, 1 vCPU, a serial console file),
    with a plain file disk and a NIC on the host bridge: what an operator
    would have defined before wiring it to remusdbd. uuid: the domain's
    (else libvirt makes one up); a cached managed-save image
    (saved_domain.py) restores only into a domain of the same UUID."""
    g = paths.guest_dir()
    cmdline = (f"root=/dev/vda rw console=ttyS0 net.ifnames=0 quiet "
               f"systemd.hostname={name} rdb.ip={ip}/{netns.PREFIX_LEN}")
    uuid_line = f"\n  <uuid>{uuid}</uuid>" if uuid else ""
    return f"""<domain type='qemu'>
  <name>{name}</name>{uuid_line}
  <memory unit='MiB'>{mem_mib}</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <kernel>{g / 'vmlinuz'}</kernel>
    <initrd>{g / 'initrd.img'}</initrd>
    <cmdline>{cmdline}</cmdline>
  </os>
  <features>
    <acpi/>
  </features>
  <cpu mode='maximum'/>
  <clock offset='utc'/>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>restart</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>{paths.qemu_binary()}</emulator>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw'/>
      <source file='{disk}'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <controller type='usb' model='none'/>
    <interface type='bridge'>
      <mac address='{mac}'/>
      <source bridge='{netns.GUEST_BRIDGE}'/>
      <model type='virtio'/>
    </interface>
    <serial type='file'>
      <source path='{console}'/>
      <target port='0'/>
    </serial>
    <memballoon model='none'/>
  </devices>
</domain>
"""
