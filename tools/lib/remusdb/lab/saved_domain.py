"""A lab libvirt domain's managed-save image, cached across runs, so that
`virsh start` of the domain resumes a guest that booted once instead of
booting it (a boot under TCG takes ~30 s, a restore a few).

libvirt itself restores a domain from its managed-save image
(/var/lib/libvirt/qemu/save/NAME.save) when that file exists at `virsh
start`, and deletes the file once the restore succeeded: this is what a
real host does after `virsh managedsave` or libvirt-guests at a reboot.
The lab's libvirtds are new every run, so the image is kept in
$REMUSDB_CACHE/saved-domains with the domain's disk at the moment it was
saved (as vm.py's saved guests keep theirs, as the blocks that differ
from the guest image). The image holds the domain's XML and the QEMU
device state of exactly that XML: the cache key is the wired XML itself
(UUID included: libvirt restores only into a domain of the same name and
UUID), the QEMU, libvirt and guest files, and the firmware.
"""
import hashlib
import json
import os
from pathlib import Path
import shutil
import time

from .. import paths
from ..libvirt import virsh, wire_xml
from . import vm

SAVED_IMAGE = "domain.save"


def saved_domains_root():
    return paths.CACHE / "saved-domains"


def cache_entry(name, lab_xml, run_dir, mac):
    """Where the saved domain of lab_xml (before wiring) is cached: wired
    as remusdb.libvirt.wire wires it."""
    g = paths.guest_dir()
    key = {"xml": wire_xml(lab_xml, name, run_dir, mac)[0],
           "qemu": vm._file_identity(paths.qemu_binary()),
           "libvirtd": vm._file_identity(shutil.which("libvirtd") or "/usr/sbin/libvirtd"),
           "guest": [vm._file_identity(g / n) for n in ("vmlinuz", "initrd.img", "rootfs.img")],
           "firmware": vm._firmware_identity()}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return saved_domains_root() / f"{name}-{digest}"


def complete(entry):
    return (Path(entry) / SAVED_IMAGE).exists()


def managed_save_path(daemon, name):
    """The domain's managed-save image as the lab libvirtd `daemon` sees it
    (its /var/lib/libvirt is daemon.base/var/lib/libvirt)."""
    return daemon.base / "var/lib/libvirt/qemu/save" / f"{name}.save"


def place(entry, daemon, name):
    """Gives the defined, shut-off domain the cached image as its managed
    save: its next `virsh start` restores it."""
    target = managed_save_path(daemon, name)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    try:
        os.link(Path(entry) / SAVED_IMAGE, tmp)  # libvirt only reads it, then unlinks it
    except OSError:
        shutil.copyfile(Path(entry) / SAVED_IMAGE, tmp)
    os.replace(tmp, target)


def save(entry, daemon, name, disk):
    """`virsh managedsave` of the running domain, then its image and its
    disk (the blocks that differ from the guest image) into the cache
    entry, which appears whole or not at all. The domain is left shut
    off with its managed save, which its next `virsh start` restores."""
    began = time.monotonic()
    virsh(daemon.uri, "managedsave", name, timeout=600)
    partial = Path(entry).with_name(Path(entry).name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    # QEMU has quit: the disk is what the guest had written by the save.
    vm.write_disk_delta(paths.guest_dir() / "rootfs.img", disk, partial)
    shutil.copyfile(managed_save_path(daemon, name), partial / SAVED_IMAGE)
    with open(partial / SAVED_IMAGE, "rb") as f:
        os.fsync(f.fileno())
    for stale in Path(entry).parent.glob(f"{name}-" + "?" * 16):
        shutil.rmtree(stale, ignore_errors=True)  # made for an older key
    os.replace(partial, entry)
    vm.say(f"{name}: managed-save image cached at {entry} "
           f"({(Path(entry) / SAVED_IMAGE).stat().st_size / 2**20:.0f} MiB, "
           f"saved in {time.monotonic() - began:.1f} s)")
