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
import json
from pathlib import Path
import shutil
import subprocess
import tempfile
import xml.etree.ElementTree as ET

from . import cluster, paths, protection
from .libvirt_hook import DAEMON_QMP_CHARDEV_ID, QEMU_NS

ET.register_namespace("qemu", QEMU_NS)
NBD_RECONNECT_SECONDS = 5
LAUNCHER = paths.COMMANDS / "remusdb-libvirt-takeover"
DEFAULT_URI = "qemu:///system"
VIRSH_TIMEOUT = 120


class LibvirtError(Exception):
    """One line that says what failed and what to do."""


def virsh(uri, *args, check=True, timeout=VIRSH_TIMEOUT, prefix=None):
    """virsh's command; prefix: an argv that runs it elsewhere (a host's
    exec_prefix)."""
    cmd = ["virsh", "-q", "-c", uri, *args]
    if prefix:
        cmd = list(prefix) + cmd
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
            "qmp_daemon": run_dir / "qmp-daemon.sock", "qga": run_dir / "qga.sock"}


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
    # Every -device of ours is JSON, as libvirt writes its own: QEMU 7.2
    # creates all key=value -device options before any JSON one, so a
    # key=value PCI device here would take a slot libvirt had given one of
    # its own devices and the start would fail ("slot N not available").
    # Written JSON, ours come after libvirt's and take free slots.
    args += ["-netdev", f"stream,id=rdbnet0,server=on,addr.type=unix,addr.path={f['net']}",
             "-device", json.dumps({"driver": "virtio-net-pci", "netdev": "rdbnet0",
                                    "mac": mac, "romfile": ""}, separators=(",", ":"))]
    # remusdbd's own QMP monitor.
    args += ["-chardev", f"socket,id={DAEMON_QMP_CHARDEV_ID},path={f['qmp_daemon']},"
                         f"server=on,wait=off",
             "-mon", f"chardev={DAEMON_QMP_CHARDEV_ID},mode=control"]
    # The guest agent on a socket of ours, where `remusdb fork` gives a
    # clone its identity (vm_layout's qga.sock): libvirt's <channel> for
    # org.qemu.guest_agent.0 would have libvirtd hold the connection.
    args += ["-chardev", f"socket,id=rdbqga,path={f['qga']},server=on,wait=off",
             "-device", '{"driver":"virtio-serial-pci","id":"rdbserial"}',
             "-device", '{"driver":"virtserialport","bus":"rdbserial.0","chardev":"rdbqga",'
                        '"name":"org.qemu.guest_agent.0"}']
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
    from .vm_layout import check_name, mac_for
    check_name(domain)
    if protection.access(host).via != "local":
        raise LibvirtError(f"{host} is reached through ssh: wire() writes the domain's run "
                           f"directory and asks its libvirt from here; `remusdb libvirt-wire "
                           f"--host {host}` runs it on {host}")
    bridge = cluster.current().bridge
    if not bridge:
        raise LibvirtError(f"{cluster.current().path} names no `bridge:` (the guests' "
                           f"bridge the domain's NIC is relayed to)")
    xml = virsh(uri, "dumpxml", "--inactive", domain).stdout
    mac = mac or domain_mac(xml) or mac_for(domain)
    run_dir = paths.vm_run_dir(host, domain)
    new_xml, disk = wire_xml(xml, domain, run_dir, mac)
    if not Path(disk).exists():
        raise LibvirtError(f"domain {domain}'s disk {disk} does not exist")
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    protection.request(host, "vm-add", timeout=10.0, name=domain, disk=str(disk),
                    nbd_socket=str(vm_files(run_dir)["nbd"]),
                    qmp_socket=str(vm_files(run_dir)["qmp_daemon"]),
                    net_socket=str(vm_files(run_dir)["net"]), tap=f"rdbt-{domain}",
                    bridge=bridge, mac=mac)
    # The wiring's only record is libvirt's persistent definition (and
    # remusdbd's, in its state directory): nothing here is kept on /run,
    # which a reboot empties.
    with tempfile.TemporaryDirectory(prefix="remusdb-libvirt-") as d:
        xml_file = Path(d) / f"{domain}.xml"
        xml_file.write_text(new_xml)
        virsh(uri, "define", str(xml_file))
    return run_dir, disk


# What a start for an incoming migration adds to <qemu:commandline> (the
# takeover launcher, create_incoming), argument and value.
INCOMING_ARGS = {"-incoming": None, "-global": "migration.x-postcopy-ram=on"}


def without_incoming(xml_text):
    """The XML without the incoming migration's arguments. A domain that
    was started by a takeover (or is a clone) keeps them in its live XML
    (the launcher defines it without them, but the running definition is
    the one it was created with); passed on as they are, a failback's
    launcher would define them into the old primary's libvirt, whose
    next `virsh start` would then wait for a migration forever."""
    root = ET.fromstring(xml_text)
    cl = root.find(q("commandline"))
    if cl is None:
        return xml_text
    args = cl.findall(q("arg"))
    drop = set()
    for i, arg in enumerate(args[:-1]):
        name, value = arg.get("value"), args[i + 1].get("value")
        if name in INCOMING_ARGS and INCOMING_ARGS[name] in (None, value) and i not in drop:
            drop |= {i, i + 1}
    if not drop:
        return xml_text
    for i in sorted(drop):
        cl.remove(args[i])
    return ET.tostring(root, encoding="unicode")


def migratable_xml(uri, domain):
    """The running domain's XML as another libvirt can start it (without
    the arguments of the incoming migration it may have been started
    with)."""
    return without_incoming(virsh(uri, "dumpxml", "--migratable", domain).stdout)


def protect_argv(domain, uri, backup_uri, xml=None):
    """The command line VM_CONFIG carries for a libvirt domain: the
    launcher, the backup's libvirt URI and the migratable XML (its run
    dir is rewritten to the backup's by remusdbd, like QEMU's arguments)."""
    xml = xml or migratable_xml(uri, domain)
    return [str(LAUNCHER), "--connect", backup_uri, "--xml", xml, "--"]


def domain_state(uri, domain, prefix=None):
    r = virsh(uri, "domstate", domain, check=False, prefix=prefix)
    return r.stdout.strip() if r.returncode == 0 else None


def running_domains(uri, prefix=None):
    return virsh(uri, "list", "--name", prefix=prefix).stdout.split()


# ---------------------------------------------------------------- fork

def monitor_command(uri, domain, command, arguments=None):
    """One QMP command to the domain's QEMU through libvirt's passthrough
    (libvirt owns its monitor); returns its "return". arguments: a dict
    (QMP's own names, one of which is "uri")."""
    msg = {"execute": command}
    if arguments:
        msg["arguments"] = arguments
    out = virsh(uri, "qemu-monitor-command", domain, json.dumps(msg)).stdout
    try:
        return json.loads(out).get("return")
    except ValueError:
        raise LibvirtError(f"{command} on {domain}: libvirt sent no JSON: {out.strip()[:200]}")


def clone_xml(xml_text, parent, parent_run_dir, run_dir, name, mac, overlay, backing):
    """A fork clone of the parent's XML: the same devices (its device state
    must load into them), its own name, run dir and MAC, and its disk a
    qcow2 overlay whose backing store is the frozen snapshot served over
    NBD. backing: {"export", and "socket" or "host" and "port"}."""
    text = xml_text.replace(str(parent_run_dir) + "/", str(run_dir) + "/")
    root = ET.fromstring(text)
    root.find("name").text = name
    for tag in ("uuid", "title", "description"):
        for old in root.findall(tag):
            root.remove(old)
    disk = None
    for d in root.iterfind("devices/disk"):
        src = d.find("source")
        if d.get("type") == "network" and src is not None and \
                src.get("protocol") == "nbd" and src.get("name") == parent:
            disk = d
            break
    if disk is None:
        raise LibvirtError(f"domain {parent} has no NBD disk of remusdbd's named {parent}")
    for old in disk.findall("source") + disk.findall("backingStore"):
        disk.remove(old)
    disk.set("type", "file")
    driver = disk.find("driver")
    driver.set("type", "qcow2")
    at = list(disk).index(driver) + 1
    disk.insert(at, ET.Element("source", {"file": str(overlay)}))
    store = ET.Element("backingStore", {"type": "network"})
    ET.SubElement(store, "format", {"type": "raw"})
    src = ET.SubElement(store, "source", {"protocol": "nbd", "name": backing["export"]})
    if backing.get("socket"):
        ET.SubElement(src, "host", {"transport": "unix", "socket": str(backing["socket"])})
    else:
        ET.SubElement(src, "host", {"name": str(backing["host"]), "port": str(backing["port"])})
    ET.SubElement(store, "backingStore")  # the chain ends there: libvirt probes no further
    disk.insert(at + 1, store)
    for arg in root.iterfind(f"{q('commandline')}/{q('arg')}"):
        arg.set("value", nic_with_mac(arg.get("value") or "", mac))
    return ET.tostring(root, encoding="unicode")


def nic_with_mac(value, mac):
    """A -device value of the relay's NIC with another MAC (JSON, or the
    key=value of domains wired before the NIC was JSON); any other
    argument unchanged."""
    if value.startswith("virtio-net-pci,"):
        return ",".join(p if not p.startswith("mac=") else f"mac={mac}"
                        for p in value.split(","))
    if value.startswith("{"):
        try:
            device = json.loads(value)
        except ValueError:
            return value
        if isinstance(device, dict) and device.get("driver") == "virtio-net-pci":
            return json.dumps(dict(device, mac=mac), separators=(",", ":"))
    return value


def create_incoming(uri, xml_text, incoming_uri, postcopy=False):
    """Starts a transient domain waiting for an incoming migration on
    incoming_uri (`-incoming defer`, then migrate-incoming through the
    passthrough once libvirt is done starting it: see the takeover)."""
    name = ET.fromstring(xml_text).findtext("name")
    with tempfile.TemporaryDirectory(prefix="remusdb-libvirt-") as d:
        f = Path(d) / "domain-incoming.xml"
        f.write_text(add_commandline(xml_text, ["-incoming", "defer"]))
        virsh(uri, "create", str(f))
    if postcopy:
        monitor_command(uri, name, "migrate-set-capabilities", {"capabilities": [
            {"capability": "postcopy-ram", "state": True}]})
    monitor_command(uri, name, "migrate-incoming", {"uri": incoming_uri})
