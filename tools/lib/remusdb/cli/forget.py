"""`remusdb forget`: retire a host's replicas of a VM that is gone, at once."""
from .. import protection
from ..protection import ProtectionError
from .arguments import VM_HOSTS
from .output import fail


def cmd_forget(args):
    try:
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
    p.add_argument("--host", choices=VM_HOSTS, default="backup",
                   help="the host holding the replica (default backup)")
    p.set_defaults(func=cmd_forget)
