"""Does the backup's image equal the guest's memory at a checkpoint?

The primary holds the VM paused at the end of a checkpoint (QEMU never
gets VMSTATE_LOADED) and QEMU writes the guest's memory to a file with
pmemsave; the epoch is shipped and acknowledged as usual, and no later
epoch can start while the VM is paused, so the backup's committed image
stays at exactly that epoch. The backup then writes the XXH3-64 of every
page of its pc.ram block, and this module compares them with the same
hash of every page of the dump. The VM resumes when the comparison's
inputs are on disk.

pmemsave reads guest-physical addresses, and pc.ram page p is guest
physical page p below 4 GiB, except the legacy window 0xA0000-0xFFFFF
where VGA and the BIOS shadows sit on top of RAM: those 96 pages are not
RAM as the guest sees it and are skipped.
"""
import struct
import time

import xxhash

from . import protection

PAGE = 4096
LEGACY_HOLE = range(0xA0000 // PAGE, 0x100000 // PAGE)


class ImageCheckError(RuntimeError):
    pass


def _wait(what, poll, timeout):
    deadline = time.monotonic() + timeout
    while True:
        value = poll()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise ImageCheckError(f"timed out waiting for {what}")
        time.sleep(0.1)


def capture(vm, dump, sums, size, timeout=45, primary="primary", backup="backup"):
    """Holds the next checkpoint, dumps both sides, releases; returns
    {"epoch": N, "held_s": ..., "pages": ...}. Raises ImageCheckError on
    any failure (the VM is released in every case)."""
    protection.hold_checkpoint(vm, dump, size, host=primary)
    started = time.monotonic()
    try:
        def held():
            p = protection.primary_protection(primary, vm) or {}
            h = p.get("checkpoint_hold") or {}
            if h.get("state") in ("failed", "released"):
                raise ImageCheckError(f"the hold ended early: {h}")
            if h.get("state") == "held" and (p.get("acked_epoch") or 0) >= h["epoch"]:
                return h["epoch"]
            return None
        epoch = _wait("the held checkpoint to be dumped and acknowledged", held, timeout)
        protection.image_checksums(vm, "pc.ram", sums, host=backup)

        def summed():
            c = (protection.replica(backup, vm) or {}).get("image_checksums") or {}
            if c.get("state") == "failed":
                raise ImageCheckError(f"the backup's checksum dump failed: {c.get('error')}")
            return c if c.get("state") == "done" and c.get("path") == str(sums) else None
        c = _wait("the backup's checksums", summed, timeout)
        if c["epoch"] != epoch:
            raise ImageCheckError(f"the backup summed epoch {c['epoch']}, the hold is {epoch}")
    finally:
        protection.release_checkpoint(vm, host=primary)
    return {"epoch": epoch, "held_s": time.monotonic() - started, "pages": c["pages"]}


def page_sums_of_dump(dump):
    """XXH3-64 of every 4 KiB page of a pmemsave file."""
    sums = []
    with open(dump, "rb") as f:
        while True:
            page = f.read(PAGE)
            if not page:
                return sums
            if len(page) != PAGE:
                raise ImageCheckError(f"{dump} ends inside a page")
            sums.append(xxhash.xxh3_64_intdigest(page))


def page_sums_of_backup(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) % 8:
        raise ImageCheckError(f"{path} is not a list of 8-byte checksums")
    return list(struct.unpack(f">{len(data) // 8}Q", data))


def differing_pages(primary, backup):
    """Page numbers whose checksums differ (the legacy window skipped);
    a length mismatch is an error, not a difference."""
    if len(primary) != len(backup):
        raise ImageCheckError(f"the dump has {len(primary)} pages, the backup's "
                              f"block {len(backup)}")
    return [i for i, (a, b) in enumerate(zip(primary, backup))
            if a != b and i not in LEGACY_HOLE]


def guest_memory_bytes(command):
    """The guest RAM size from a QEMU command line's -m (MiB, or with a
    G/M suffix), as remusdb-vm writes it."""
    for flag, value in zip(command, command[1:]):
        if flag == "-m":
            text = value.split(",")[0].removeprefix("size=").upper()
            scale = {"G": 1 << 30, "M": 1 << 20}.get(text[-1:], None)
            return int(text[:-1]) * scale if scale else int(text) << 20
    raise ImageCheckError("the VM's QEMU command line has no -m")
