"""`remusdb failover`: the manual takeover, resuming the VM on the backup
host from its last committed checkpoint."""
from .. import protection
from ..protection import ProtectionError
from .arguments import VM_HOSTS, positive_int
from .output import fail, show_progress


def cmd_failover(args):
    try:
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
    p.add_argument("--host", choices=VM_HOSTS, default="backup",
                   help="the backup host holding the replica (default backup)")
    p.add_argument("--timeout", type=positive_int, default=60, metavar="S",
                   help="seconds to wait for the VM to run on the backup (default 60)")
    p.set_defaults(func=cmd_failover)
