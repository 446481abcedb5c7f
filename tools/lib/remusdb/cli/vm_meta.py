"""`remusdb vm-meta --host NAME VM` (hidden): what `ssh HOST remusdb
vm-meta` runs on a host of the cluster for a CLI elsewhere that protects
a VM running there: the VM's run directory, its vm.json (the QEMU
command line the backup rebuilds it from) and whether its QEMU runs, as
one JSON object on stdout (protection.vm_dir_state). It reads files and
/proc only; the daemon is asked through control-relay."""
import json

from .. import protection


def cmd_vm_meta(args):
    protection.check_vm_name(args.vm)
    print(json.dumps(protection.vm_dir_state(args.host, args.vm)))
    return 0


def add_parser(sub):
    # Hidden: no help line in `remusdb --help`; it is for ssh, not people.
    p = sub.add_parser("vm-meta", description="The VM's run directory, vm.json and whether "
                                              "its QEMU runs on this host, as JSON (what the "
                                              "CLI runs here through ssh).")
    p.add_argument("--host", required=True, help="this host's name in the cluster file")
    p.add_argument("vm", metavar="VM")
    p.set_defaults(func=cmd_vm_meta)
