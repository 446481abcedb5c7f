"""`remusdb libvirt-wire`: wire a defined, shut-off libvirt domain to a
host's remusdbd (docs/libvirt.md). On a host reached through ssh the
verb runs there (remusdb.remote_verb), since it needs that host's
libvirt, the domain's disk file and its run directory: --connect is then
a URI as that host sees it (qemu:///system is its own libvirt)."""
from .. import protection, remote_verb
from ..protection import ProtectionError
from .arguments import add_forwarded, add_host, host_or_default
from .output import fail


def forwarded_args(args):
    """The verb's arguments as the far host runs them (its own host)."""
    return [args.domain, "--connect", args.connect, "--host", args.host]


def cmd_libvirt_wire(args):
    from .. import libvirt
    try:
        args.host = host_or_default(args.host)
        if args.forwarded is not None:
            remote_verb.check_forwarded(args.forwarded, args.host)
        elif protection.access(args.host).via == "ssh":
            return remote_verb.run(args.host, "libvirt-wire", *forwarded_args(args))
        run_dir, disk = libvirt.wire(args.domain, args.host, args.connect)
    except libvirt.LibvirtError as e:
        return fail(f"{e}")
    except (ProtectionError, remote_verb.RemoteVerbError) as e:
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
                                   "has no element, <qemu:commandline> (docs/libvirt.md). "
                                   "On a host reached through ssh it runs there, through "
                                   "ssh (docs/operations.md).")
    p.add_argument("domain", metavar="DOMAIN")
    p.add_argument("--connect", default="qemu:///system", metavar="URI",
                   help="libvirt URI, as the domain's host sees it (default "
                        "qemu:///system, that host's own libvirt)")
    add_host(p, "the host whose remusdbd serves it", "default: the cluster's default_host")
    add_forwarded(p)
    p.set_defaults(func=cmd_libvirt_wire)

