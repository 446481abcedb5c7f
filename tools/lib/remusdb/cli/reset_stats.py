"""`remusdb reset-stats`: a protected VM's checkpoint statistics start
again from zero."""
from .. import protection
from ..protection import ProtectionError
from .arguments import add_host, host_or_default
from .output import fail


def cmd_reset_stats(args):
    try:
        args.host = host_or_default(args.host)
        protection.reset_stats(args.vm, args.host)
    except ProtectionError as e:
        return fail(e)
    print(f"{args.vm} on {args.host}: checkpoint statistics start again from zero")
    return 0


def add_parser(sub):
    p = sub.add_parser("reset-stats",
                       description="Starts the protected VM's pause and epoch-size "
                                   "percentiles, backpressure count and peer silence again "
                                   "from zero (status then covers only what came after).")
    p.add_argument("vm", metavar="VM", help="the VM's name")
    add_host(p, "the host the VM runs on", "default: the cluster's default_host")
    p.set_defaults(func=cmd_reset_stats)
