"""libvirt-managed VMs (issue 12, part 3; docs/libvirt.md).

A domain defined in libvirt is wired to the host's remusdbd the way a
`remusdb-vm` VM is, as far as libvirt 9.0 (Debian bookworm) can say it:

  disk  libvirt's own <disk type='network'><source protocol='nbd'> on
        remusdbd's unix socket;
  NIC   `-netdev stream` (QEMU listens, the relay connects) through
        <qemu:commandline>: libvirt 9.0 has no interface type for it;
  QMP   remusdbd's own monitor, -chardev/-mon through <qemu:commandline>:
        libvirt keeps its monitor to itself.

Protection ships, as the VM's "QEMU command line", the command that starts
the domain through the backup's libvirt (tools/remusdb-libvirt-takeover
and the domain's XML): at takeover the backup's remusdbd runs it with
`-incoming unix:...` appended, as it would run QEMU; the launcher starts
the domain transient with `-incoming defer` in a <qemu:commandline>,
then passes the URI to QEMU's `migrate-incoming` through libvirt's QMP
passthrough. remusdbd feeds the committed image into that socket exactly
as it does for the QEMU it spawns itself. Afterwards the launcher defines
the domain (without -incoming), so the backup's libvirt keeps it as a
persistent domain.
"""
from pathlib import Path
import shutil
import subprocess
import time
import xml.etree.ElementTree as ET

from . import control, paths
from .lab import netns, witness
from .libvirt_hook import DAEMON_QMP_CHARDEV_ID, QEMU_NS

ET.register_namespace("qemu", QEMU_NS)
NBD_RECONNECT_SECONDS = 5
LAUNCHER = paths.COMMANDS / "remusdb-libvirt-takeover"
DEFAULT_URI = "qemu:///system"
VIRSH_TIMEOUT = 120


class LibvirtError(Exception):
    """One line that says what failed and what to do."""


def virsh(uri, *args, check=True, timeout=VIRSH_TIMEOUT, ns=None):
    cmd = ["virsh", "-q", "-c", uri, *args]
    if ns:
        cmd = ["ip", "netns", "exec", ns] + cmd
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise LibvirtError(f"virsh {' '.join(args[:2])} failed: "
                           f"{(r.stderr or r.stdout).strip()}")
    return r


def q(tag):
    return f"{{{QEMU_NS}}}{tag}"


# ---------------------------------------------------------------- wiring

def vm_files(run_dir):
    run_dir = Path(run_dir)
    return {"nbd": run_dir / "nbd.sock", "net": run_dir / "net.sock",
            "qmp_daemon": run_dir / "qmp-daemon.sock"}


def commandline_args(run_dir, mac):
    """What libvirt 9.0 cannot say, as QEMU arguments (docs/libvirt.md)."""
    f = vm_files(run_dir)
    args = []
    # Firmware search path: our QEMU is built without blobs; Debian's
    # packages hold them (paths.QEMU_FIRMWARE_DIRS). libvirt has <loader>
    # for the BIOS only, not for the option ROMs and linuxboot_dma.bin.
    for d in paths.QEMU_FIRMWARE_DIRS:
        args += ["-L", d]
    # The NIC: a stream netdev whose listening unix socket remusdbd's relay
    # connects to (why QEMU listens: docs/architecture.md).
    args += ["-netdev", f"stream,id=rdbnet0,server=on,addr.type=unix,addr.path={f['net']}",
             "-device", f"virtio-net-pci,netdev=rdbnet0,mac={mac},romfile="]
    # remusdbd's own QMP monitor.
    args += ["-chardev", f"socket,id={DAEMON_QMP_CHARDEV_ID},path={f['qmp_daemon']},"
                         f"server=on,wait=off",
             "-mon", f"chardev={DAEMON_QMP_CHARDEV_ID},mode=control"]
    return args


def wire_xml(xml_text, vm, run_dir, mac):
    """The domain's XML rewired to remusdbd; returns (xml, disk file).

    The first file-backed disk becomes an NBD disk on remusdbd's export
    `vm`; interfaces are dropped (the relay's NIC replaces them); the
    arguments libvirt has no element for go into <qemu:commandline>,
    replacing any earlier wiring of ours."""
    root = ET.fromstring(xml_text)
    if root.tag != "domain":
        raise LibvirtError("not a libvirt domain XML")
    devices = root.find("devices")
    if devices is None:
        raise LibvirtError("the domain has no <devices>")
    disk_path = None
    for disk in devices.findall("disk"):
        if disk.get("device", "disk") != "disk":
            continue
        src = disk.find("source")
        if disk.get("type") == "file" and src is not None and src.get("file"):
            disk_path = src.get("file")
        elif disk.get("type") == "network" and src is not None and \
                src.get("protocol") == "nbd" and src.get("name") == vm:
            raise LibvirtError(f"domain {vm} is already wired to remusdbd")
        else:
            continue
        disk.set("type", "network")
        disk.remove(src)
        src = ET.Element("source", {"protocol": "nbd", "name": vm})
        ET.SubElement(src, "host", {"transport": "unix", "socket": str(vm_files(run_dir)["nbd"])})
        # libvirt >= 9.2 turns this into the blockdev's reconnect-delay;
        # 9.0 (bookworm) drops it silently (docs/libvirt.md).
        ET.SubElement(src, "reconnect", {"delay": str(NBD_RECONNECT_SECONDS)})
        disk.insert(1, src)
        driver = disk.find("driver")
        if driver is None:
            driver = ET.Element("driver")
            disk.insert(0, driver)
        driver.set("name", "qemu")
        driver.set("type", "raw")
        break
    if disk_path is None:
        raise LibvirtError(f"domain {vm} has no file-backed disk to serve over NBD")
    for nic in devices.findall("interface"):
        devices.remove(nic)
    set_commandline(root, commandline_args(run_dir, mac))
    return ET.tostring(root, encoding="unicode"), disk_path


def set_commandline(root, args):
    for old in root.findall(q("commandline")):
        root.remove(old)
    cl = ET.SubElement(root, q("commandline"))
    for a in args:
        ET.SubElement(cl, q("arg"), {"value": a})


def add_commandline(xml_text, args):
    """Appends QEMU arguments to the domain's <qemu:commandline>."""
    root = ET.fromstring(xml_text)
    cl = root.find(q("commandline"))
    if cl is None:
        cl = ET.SubElement(root, q("commandline"))
    for a in args:
        ET.SubElement(cl, q("arg"), {"value": a})
    return ET.tostring(root, encoding="unicode")


def domain_mac(xml_text):
    """The MAC of the domain's first interface, or None."""
    root = ET.fromstring(xml_text)
    m = root.find("devices/interface/mac")
    return m.get("address") if m is not None else None


def wire(domain, host, uri=DEFAULT_URI, mac=None):
    """Registers the defined, shut-off `domain` with the host's remusdbd
    and redefines it wired to it. Returns (run_dir, disk)."""
    from .lab import vm as vm_module
    vm_module.check_name(domain)
    xml = virsh(uri, "dumpxml", "--inactive", domain).stdout
    mac = mac or domain_mac(xml) or vm_module.mac_for(domain)
    run_dir = paths.vm_run_dir(host, domain)
    new_xml, disk = wire_xml(xml, domain, run_dir, mac)
    if not Path(disk).exists():
        raise LibvirtError(f"domain {domain}'s disk {disk} does not exist")
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    vm_module.ensure_daemon(host)
    control.request(paths.control_socket(host), "vm-add", name=domain, disk=str(disk),
                    nbd_socket=str(vm_files(run_dir)["nbd"]),
                    qmp_socket=str(vm_files(run_dir)["qmp_daemon"]),
                    net_socket=str(vm_files(run_dir)["net"]), tap=f"rdbt-{domain}",
                    bridge=netns.GUEST_BRIDGE, mac=mac)
    xml_file = run_dir / "domain.xml"
    xml_file.write_text(new_xml)
    virsh(uri, "define", str(xml_file))
    return run_dir, disk


def protect_argv(domain, uri, backup_uri):
    """The command line VM_CONFIG carries for a libvirt domain: the
    launcher, the backup's libvirt URI and the migratable XML (its run
    dir is rewritten to the backup's by remusdbd, like QEMU's arguments)."""
    xml = virsh(uri, "dumpxml", "--migratable", domain).stdout
    return [str(LAUNCHER), "--connect", backup_uri, "--xml", xml, "--"]


def domain_state(uri, domain, ns=None):
    r = virsh(uri, "domstate", domain, check=False, ns=ns)
    return r.stdout.strip() if r.returncode == 0 else None


def running_domains(uri, ns=None):
    return virsh(uri, "list", "--name", ns=ns).stdout.split()


# ---------------------------------------------------------------- a libvirtd for the lab

DAEMON_DIRS = ["etc/libvirt", "run/libvirt", "var/lib/libvirt", "var/cache/libvirt",
               "var/log/libvirt"]

QEMU_CONF = """\
# a libvirtd for the RemusDB lab (tools/lib/remusdb/libvirt.py)
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
        package_root = Path(__file__).resolve().parents[1]
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


def lab_domain_xml(name, disk, ip, mac, console, mem_mib=1024):
    """A small TCG domain booting the lab's guest image the way vm.py's
    QEMU command does (direct kernel boot, 1 vCPU, a serial console file),
    with a plain file disk and a NIC on the host bridge: what an operator
    would have defined before wiring it to remusdbd."""
    g = paths.guest_dir()
    cmdline = (f"root=/dev/vda rw console=ttyS0 net.ifnames=0 quiet "
               f"systemd.hostname={name} rdb.ip={ip}/{netns.PREFIX_LEN}")
    return f"""<domain type='qemu'>
  <name>{name}</name>
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
