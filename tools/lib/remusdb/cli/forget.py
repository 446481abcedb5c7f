"""`remusdb forget`: retire a host's replicas of a VM that is gone, at once."""
from .. import protection
from ..protection import ProtectionError
from .arguments import add_host, host_or_default, replica_host
from .output import fail


def cmd_forget(args):
    try:
        args.host = host_or_default(args.host) if args.host else replica_host(args.vm)
        n = protection.request(args.host, "forget", vm=args.vm)["retired"]
    except ProtectionError as e:
        return fail(e)
    print(f"{args.vm}: {n} replica(s) on {args.host} retired")
    return 0


def add_parser(sub):
    p = sub.add_parser("forget",
                       description="Retires the replicas a host holds of a VM that is gone "
                                   "(passive, failed, or taken over and since stopped) at "
                                   "once, instead of after remusdbd's "
                                   "--retire-replicas-after (600 s). A replica in use is "
                                   "refused, with why.")
    p.add_argument("vm", metavar="VM", help="the VM's name")
    add_host(p, "the host holding the replica", "default: the one host that holds one")
    p.set_defaults(func=cmd_forget)
