"""`remusdb switchover`: the planned role swap for rolling upgrades. The
protected VM stops at an acknowledged checkpoint on its host, the backup
resumes exactly that checkpoint, and the VM ends protected the other way
round (remusdb/switchover.py has the steps)."""
from .. import switchover
from ..protection import ProtectionError
from .arguments import host_or_default, positive_int
from ..cluster import ClusterError
from .output import fail


def cmd_switchover(args):
    try:
        args.host = host_or_default(args.host)
    except ClusterError as e:
        return fail(e)
    steps = switchover.Steps(progress=lambda line: print(f"  {line}", flush=True))
    print(f"switchover of {args.vm} from {args.host}", flush=True)
    try:
        result = switchover.handover(args.vm, args.host, args.timeout, steps=steps)
    except ProtectionError as e:
        return fail(e)
    except KeyboardInterrupt:
        return fail(f"interrupted: `tools/remusdb status` shows where {args.vm} runs; a VM "
                    f"held for the switchover resumes on {args.host} by itself within "
                    f"{2 * args.timeout} s unless the backup took it over")
    stopped, resumed = result.get("stopped_at_unix"), result.get("resumed_at_unix")
    paused = (f"paused {resumed - stopped:.2f} s" if stopped and resumed else "paused n/a")
    print(f"{args.vm} switched over to {result['to']} at checkpoint {result['epoch']} "
          f"(VM {paused}, {steps.done[-1]['at_s']:.2f} s in all)", flush=True)
    if args.no_protect_back:
        print(f"{args.vm} runs UNPROTECTED on {result['to']}; protect it back with "
              f"`tools/remusdb protect {args.vm} --host {result['to']} --backup "
              f"{result['from']}`")
        return 0
    try:
        switchover.protect_back(args.vm, result, args.protect_timeout, steps=steps)
    except ProtectionError as e:
        return fail(f"{args.vm} runs on {result['to']}, but protecting it back to "
                    f"{result['from']} failed: {e}")
    print(f"{args.vm} runs on {result['to']}, protected to {result['from']}")
    return 0


def add_parser(sub):
    p = sub.add_parser("switchover",
                       description="Moves a protected VM to its backup with no acknowledged "
                                   "commit lost and client connections kept: the VM stops at "
                                   "a checkpoint, the backup acknowledges it and resumes it, "
                                   "the old primary stays stopped for good, and the VM is "
                                   "protected back to it (changed-block resync). A step that "
                                   "fails before the backup took the VM over resumes it on "
                                   "its host, still protected.")
    p.add_argument("vm", metavar="VM", help="the VM's name")
    p.add_argument("--host", metavar="HOST",
                   help="the host of the cluster file that runs the VM, protected (default: "
                        "the cluster's default host)")
    p.add_argument("--timeout", type=positive_int, default=switchover.DEFAULT_STEP_TIMEOUT_S,
                   metavar="S", help="seconds each step of the handover may take (default "
                                     f"{switchover.DEFAULT_STEP_TIMEOUT_S})")
    p.add_argument("--protect-timeout", type=positive_int,
                   default=switchover.DEFAULT_PROTECT_TIMEOUT_S, metavar="S",
                   help="seconds the protection back may take (default "
                        f"{switchover.DEFAULT_PROTECT_TIMEOUT_S})")
    p.add_argument("--no-protect-back", action="store_true",
                   help="leave the VM unprotected on the backup (to upgrade the old primary "
                        "first; docs/operations.md, \"Upgrades\")")
    p.set_defaults(func=cmd_switchover)
