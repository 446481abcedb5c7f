"""remusdb.libvirt's XML rewrites, without libvirt: a wired domain and a
fork clone of it (docs/libvirt.md, "Fork"). Each rewrite is checked for
what it must change and what it must keep (the clone's devices are the
parent's, or its device state would not load), and bad input gives its
one line."""
import json
import xml.etree.ElementTree as ET

import pytest

from remusdb import libvirt
from remusdb.libvirt_hook import wired_to_remusdbd

PARENT_RUN = "/run/remusdb/db1/vms/db"
CLONE_RUN = "/run/remusdb/db1/vms/dbc1"

PLAIN = """<domain type='qemu'>
  <name>db</name>
  <uuid>3f0b1c9e-1111-2222-3333-444455556666</uuid>
  <memory unit='MiB'>1024</memory>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw'/>
      <source file='/var/lib/libvirt/images/db.img'/>
      <target dev='vda' bus='virtio'/>
      <address type='pci' domain='0x0000' bus='0x00' slot='0x04' function='0x0'/>
    </disk>
    <interface type='bridge'>
      <mac address='52:54:00:12:34:56'/>
      <source bridge='br0'/>
    </interface>
    <serial type='file'><source path='/run/remusdb/db1/vms/db/console.log'/></serial>
  </devices>
</domain>"""


def wired():
    xml, disk = libvirt.wire_xml(PLAIN, "db", PARENT_RUN, "52:54:00:12:34:56")
    assert disk == "/var/lib/libvirt/images/db.img"
    return xml


def args(xml):
    root = ET.fromstring(xml)
    return [a.get("value") for a in root.iter(libvirt.q("arg"))]


def test_wiring_gives_the_guest_agent_a_socket_of_ours():
    a = args(wired())
    assert f"socket,id=rdbqga,path={PARENT_RUN}/qga.sock,server=on,wait=off" in a
    assert any('"driver":"virtserialport"' in v and '"name":"org.qemu.guest_agent.0"' in v
               for v in a), a
    # JSON, so that QEMU creates them after libvirt's devices (commandline_args)
    devices = [v for v, before in zip(a[1:], a) if before == "-device"]
    assert len(devices) == 3 and all(v.startswith("{") for v in devices), a
    assert wired_to_remusdbd(ET.fromstring(wired()), "db")
    assert not wired_to_remusdbd(ET.fromstring(PLAIN), "db")  # control


def clone(xml=None, backing=None):
    return libvirt.clone_xml(xml or wired(), "db", PARENT_RUN, CLONE_RUN, "dbc1",
                             "52:54:00:aa:bb:cc", "/var/lib/remusdb/disks/dbc1.qcow2",
                             backing or {"export": "fork-db-1",
                                         "socket": "/run/remusdb/db1/fork.sock"})


def test_a_clone_keeps_the_devices_and_changes_name_disk_mac_and_run_dir():
    parent, child = ET.fromstring(wired()), ET.fromstring(clone())
    assert child.findtext("name") == "dbc1" and child.find("uuid") is None
    disk = child.find("devices/disk")
    assert disk.get("type") == "file" and disk.find("driver").get("type") == "qcow2"
    assert disk.find("source").get("file") == "/var/lib/remusdb/disks/dbc1.qcow2"
    store = disk.find("backingStore")
    assert store.get("type") == "network" and store.find("format").get("type") == "raw"
    src = store.find("source")
    assert (src.get("protocol"), src.get("name")) == ("nbd", "fork-db-1")
    assert src.find("host").get("socket") == "/run/remusdb/db1/fork.sock"
    assert store.find("backingStore") is not None and len(store.find("backingStore")) == 0
    # the device model is the parent's: same address, same target
    assert ET.tostring(disk.find("address")) == ET.tostring(parent.find("devices/disk/address"))
    assert disk.find("target").get("dev") == "vda"
    a = args(clone())
    assert all(PARENT_RUN + "/" not in v for v in a), a
    assert any(f"path={CLONE_RUN}/qmp-daemon.sock" in v for v in a)
    nic = [json.loads(v) for v in a if '"virtio-net-pci"' in v]
    assert nic == [{"driver": "virtio-net-pci", "netdev": "rdbnet0",
                    "mac": "52:54:00:aa:bb:cc", "romfile": ""}], nic
    assert len(a) == len(args(wired()))  # no argument added or lost
    assert child.find("devices/serial/source").get("path") == f"{CLONE_RUN}/console.log"


def test_a_clone_on_another_host_reads_the_snapshot_over_tcp():
    child = ET.fromstring(clone(backing={"export": "fork-db-1", "host": "192.0.2.1",
                                         "port": 10809}))
    h = child.find("devices/disk/backingStore/source/host")
    assert (h.get("name"), h.get("port"), h.get("socket")) == ("192.0.2.1", "10809", None)


def test_a_nic_wired_before_json_gets_its_mac_too():
    old = "virtio-net-pci,netdev=rdbnet0,mac=52:54:00:12:34:56,romfile="
    assert libvirt.nic_with_mac(old, "52:54:00:aa:bb:cc") == \
        "virtio-net-pci,netdev=rdbnet0,mac=52:54:00:aa:bb:cc,romfile="
    other = '{"driver":"virtio-serial-pci","id":"rdbserial"}'
    assert libvirt.nic_with_mac(other, "52:54:00:aa:bb:cc") == other  # control


def test_a_domain_without_remusdbd_disk_cannot_be_cloned():
    with pytest.raises(libvirt.LibvirtError, match="no NBD disk of remusdbd's named db"):
        clone(PLAIN)


def test_the_incoming_migration_arguments_are_left_out():
    """A domain started by a takeover keeps `-incoming defer` (and, under a
    lazy restore, the postcopy -global) in its live XML: a failback must
    not carry them into the old primary's definition."""
    started = libvirt.add_commandline(wired(), ["-incoming", "defer", "-global",
                                                "migration.x-postcopy-ram=on"])
    assert "-incoming" in args(started)  # control: the input has them
    stripped = args(libvirt.without_incoming(started))
    assert stripped == args(wired()), stripped
    other = libvirt.add_commandline(wired(), ["-global", "kvm-pit.lost_tick_policy=delay"])
    assert args(libvirt.without_incoming(other)) == args(other)  # another -global stays
