"""remusdb-libvirt-takeover --connect URI --xml XML -- QEMU-ARGS...

What a backup's remusdbd runs at takeover for a libvirt domain, in place
of the QEMU command line it runs for other VMs (docs/libvirt.md). The
daemon appends `-incoming unix:RUN/incoming.sock` (and, under --restore
lazy, `-global migration.x-postcopy-ram=on`) as it would to QEMU's
arguments; they go to QEMU in the domain's <qemu:commandline>, the
-incoming as `-incoming defer`. The domain is started transient with
`virsh create`, so that the incoming migration is only this start's; once
libvirt runs it, QMP `migrate-incoming` on the daemon's URI goes through
libvirt (`virsh qemu-monitor-command`), and QEMU listens where remusdbd
waits. Then the domain is defined without those arguments: the backup's
libvirt keeps it as an ordinary persistent domain. Exit 0 once that is
done; the output lands in the VM's qemu.log on the backup.
"""
import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
import xml.etree.ElementTree as ET

from .. import libvirt


def main():
    p = argparse.ArgumentParser(prog="remusdb-libvirt-takeover",
                                description=__doc__.splitlines()[0])
    p.add_argument("--connect", required=True, help="the backup's libvirt URI")
    p.add_argument("--xml", required=True, help="the domain's XML (with the backup's paths)")
    p.add_argument("qemu_args", nargs=argparse.REMAINDER)
    a = p.parse_args()
    extra = a.qemu_args[1:] if a.qemu_args[:1] == ["--"] else a.qemu_args
    # QEMU must not take the stream before libvirt has finished starting
    # it (libvirt kills a QEMU whose state changes under its start-up
    # queries): it starts with -incoming defer, and the URI remusdbd
    # waits on is given by migrate-incoming once libvirt runs it.
    try:
        at = extra.index("-incoming")
        uri = extra[at + 1]
    except (ValueError, IndexError):
        print("remusdb-libvirt-takeover: no -incoming URI after --", file=sys.stderr)
        return 2
    extra = extra[:at] + ["-incoming", "defer"] + extra[at + 2:]
    # (a protection sends the XML without them; one from an older remusdb
    # may have them, and they must not go into the definition)
    a.xml = libvirt.without_incoming(a.xml)
    name = ET.fromstring(a.xml).findtext("name")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="remusdb-libvirt-") as d:
        plain = Path(d) / "domain.xml"
        plain.write_text(a.xml)
        incoming = Path(d) / "domain-incoming.xml"
        incoming.write_text(libvirt.add_commandline(a.xml, extra))
        try:
            libvirt.virsh(a.connect, "create", str(incoming))
            created = time.monotonic()
            libvirt.virsh(a.connect, "qemu-monitor-command", name, json.dumps(
                {"execute": "migrate-incoming", "arguments": {"uri": uri}}))
            listening = time.monotonic()
            libvirt.virsh(a.connect, "define", str(plain))
        except libvirt.LibvirtError as e:
            print(f"remusdb-libvirt-takeover: {e}", file=sys.stderr, flush=True)
            return 1
    print(f"remusdb-libvirt-takeover: {name} started through {a.connect} with "
          f"{' '.join(extra)} (virsh create {1000 * (created - started):.0f} ms), "
          f"migrate-incoming {uri} ({1000 * (listening - created):.0f} ms), then defined "
          f"(pid {os.getpid()})", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
