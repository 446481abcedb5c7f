"""`remusdb unprotect`: stop protecting a VM; it keeps running, unprotected."""
from .. import protection
from ..protection import ProtectionError
from .arguments import add_host, host_or_default
from .output import fail


def cmd_unprotect(args):
    try:
        args.host = host_or_default(args.host)
        p = protection.unprotect(args.vm, args.host)
    except ProtectionError as e:
        return fail(e)
    print(f"{args.vm} on {args.host}: protection {p.get('state', 'stopped')}; the VM keeps running")
    return 0


def add_parser(sub):
    p = sub.add_parser("unprotect", description="Stops checkpointing the VM; it keeps "
                                                "running on its host, unprotected.")
    p.add_argument("vm", metavar="VM", help="the VM's name")
    add_host(p, "the host the VM runs on", "default: the cluster's default_host")
    p.set_defaults(func=cmd_unprotect)
