"""`remusdb libvirt-wire`: wire a defined, shut-off libvirt domain to this
host's remusdbd (docs/libvirt.md)."""
from ..protection import ProtectionError
from .arguments import add_host, host_or_default
from .output import fail


def cmd_libvirt_wire(args):
    from .. import libvirt
    try:
        args.host = host_or_default(args.host)
        run_dir, disk = libvirt.wire(args.domain, args.host, args.connect)
    except libvirt.LibvirtError as e:
        return fail(f"{e}")
    except ProtectionError as e:
        return fail(e)
    print(f"{args.domain}: disk {disk} served by remusdbd on {args.host} over NBD, NIC "
          f"relayed, sockets in {run_dir}; start it with `virsh -c {args.connect} start "
          f"{args.domain}`, then `tools/remusdb protect {args.domain} --libvirt "
          f"{args.connect} --backup HOST`")
    return 0


def add_parser(sub):
    p = sub.add_parser("libvirt-wire",
                       description="Serves a defined, shut-off libvirt domain's disk file "
                                   "through remusdbd's NBD export and relays its NIC: the "
                                   "domain is redefined with an NBD <disk> and, where libvirt "
                                   "has no element, <qemu:commandline> (docs/libvirt.md).")
    p.add_argument("domain", metavar="DOMAIN")
    p.add_argument("--connect", default="qemu:///system", metavar="URI",
                   help="libvirt URI (default qemu:///system)")
    add_host(p, "the host whose remusdbd serves it", "default: the cluster's default_host")
    p.set_defaults(func=cmd_libvirt_wire)
