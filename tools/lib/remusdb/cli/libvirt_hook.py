"""remusdb-libvirt-hook [--config FILE] [--host NAME] DOMAIN OPERATION SUB-OPERATION EXTRA

libvirt's qemu hook (installed as /etc/libvirt/hooks/qemu.d/remusdb):
refuses to start a domain wired to remusdbd that etcd says another host
owns; everything else passes (remusdb.libvirt_hook says what and why).
The domain's XML comes on stdin. Exit 0 allows, 1 refuses with one line
on stderr, which libvirt shows in its error."""
import argparse
import sys

from ..libvirt_hook import decide


def main():
    p = argparse.ArgumentParser(prog="remusdb-libvirt-hook",
                                description=__doc__.splitlines()[0])
    p.add_argument("--config", help="remusdbd's config file on this host (default: the one "
                                    "*.conf in /etc/remusdb)")
    p.add_argument("--host", help="this host's name as remusdbd knows it (default: the "
                                  "config's `host` key, else its file name)")
    p.add_argument("domain")
    p.add_argument("operation")
    p.add_argument("sub_operation")
    p.add_argument("extra", nargs="*")
    a = p.parse_args()
    xml = sys.stdin.read()  # always read: libvirt writes the whole XML
    why = decide(a.domain, a.operation, a.sub_operation, xml, a.config, a.host)
    if why is None:
        return 0
    print(f"remusdb: {why}", file=sys.stderr, flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
