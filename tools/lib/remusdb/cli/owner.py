"""`remusdb owner show|retire VM`: the VM's owner in etcd, and retiring an
owner that outlived its VM (stale_owner.py says when that is safe)."""
from .. import cluster, ownership, protection, stale_owner
from ..ownership import OwnershipError
from ..stale_owner import StaleOwnerError
from .output import fail


def cmd_show(args):
    try:
        protection.check_vm_name(args.vm)
        rec = ownership.record(args.vm)
    except (OwnershipError, protection.ProtectionError) as e:
        return fail(e)
    where = f", etcd mod revision {rec['mod_revision']}" if rec else ""
    print(f"{args.vm}: {stale_owner.describe(rec)}{where}")
    answered, unasked = stale_owner.survey(args.vm, protection.vm_hosts())
    for host, what in answered.items():
        print(f"  {host}: {', '.join(what) if what else 'holds nothing of it'}")
    for host, why in unasked.items():
        print(f"  {host}: not asked: {why}")
    return 0


def cmd_retire(args):
    try:
        for host in filter(None, [args.host, *(args.host_is_down or ())]):
            cluster.current().host(host)  # a host of the cluster file, or one line
        rec = stale_owner.retire(args.vm, keep=args.host, down=args.host_is_down or ())
    except (StaleOwnerError, cluster.ClusterError) as e:
        return fail(e)
    if rec is None:
        print(f"{args.vm}: etcd names no owner: nothing to retire")
        return 0
    who = args.host or "any host"
    print(f"{args.vm}: retired the stale owner ({stale_owner.describe(rec)}); "
          f"{who} may protect it now")
    return 0


def add_parser(sub):
    p = sub.add_parser("owner", description="The VM's owner in etcd (the witness key "
                                            "takeovers are arbitrated with, docs/witness.md).")
    verbs = p.add_subparsers(dest="owner_command", required=True, metavar="show|retire")
    show = verbs.add_parser("show", description="Prints the VM's owner in etcd and what "
                                                "each host's remusdbd holds of it.")
    show.add_argument("vm", metavar="VM", help="the VM's name")
    show.set_defaults(func=cmd_show)
    retire = verbs.add_parser(
        "retire",
        description="Deletes an owner that outlived its VM, so that a new VM of the same "
                    "name can be protected: only after every host's remusdbd said it "
                    "holds neither the VM nor a live replica of it (the host given by "
                    "--host may run the new VM), and only if etcd's record is still the "
                    "one read before (a takeover meanwhile is never erased).")
    retire.add_argument("vm", metavar="VM", help="the VM's name")
    retire.add_argument("--host", metavar="HOST",
                        help="the host that runs the new VM and will protect it: its "
                             "definition of VM is not counted (a host of the cluster file)")
    retire.add_argument("--host-is-down", action="append", metavar="HOST",
                        help="HOST is known to be dead: that its remusdbd does not "
                             "answer does not stop the retire (by default it does); "
                             "repeat for more hosts")
    retire.set_defaults(func=cmd_retire)
