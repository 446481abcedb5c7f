"""`remusdb failover`: the manual takeover, resuming the VM on the backup
host from its last committed checkpoint."""
from .. import protection
from ..protection import ProtectionError
from .arguments import add_host, host_or_default, positive_int, replica_host
from .output import fail, show_progress


def cmd_failover(args):
    try:
        args.host = host_or_default(args.host) if args.host else replica_host(args.vm)
        protection.failover(args.vm, args.host)
        print(f"takeover of {args.vm} on {args.host} started", flush=True)
        r = protection.wait_active(args.vm, args.host, args.timeout, progress=show_progress)
    except ProtectionError as e:
        return fail(e)
    f = r.get("failover") or {}
    total = f.get("total_ms")
    print(f"{args.vm} now runs on {args.host} from epoch {r.get('committed_epoch', '?')}"
          + (f" (takeover {total:.0f} ms)" if total is not None else ""))
    return 0


def add_parser(sub):
    p = sub.add_parser("failover",
                       description="Asks the backup's remusdbd to resume the VM from its last "
                                   "committed checkpoint and waits until it runs there.")
    p.add_argument("vm", metavar="VM", help="the VM's name")
    add_host(p, "the backup host holding the replica",
             "default: the one host that holds one")
    p.add_argument("--timeout", type=positive_int, default=60, metavar="S",
                   help="seconds to wait for the VM to run on the backup (default 60)")
    p.set_defaults(func=cmd_failover)
