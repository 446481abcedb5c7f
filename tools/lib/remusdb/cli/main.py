"""remusdb: the operator's CLI; talks JSON to remusdbd's control socket.

  status               VMs, disks, NICs, protection and replicas of every host
  protect VM           start Remus protection of a running VM to a backup host
  unprotect VM         stop it (the VM keeps running, unprotected)
  failover VM          manual takeover: resume the VM on the backup host
  switchover VM        planned role swap: the backup resumes the VM at an acknowledged checkpoint
  reset-stats VM       checkpoint statistics start again from zero
  check-image VM       does the backup's image equal the guest's memory at a checkpoint?
  fork VM -n N         clone a running VM into N read replicas (memory on demand)
  fork-release VM      end the VM's fork (stop its clones first)
  forget VM            retire a host's replicas of a VM that is gone
  owner show|retire VM the VM's owner in etcd; retire one that outlived its VM
  libvirt-wire DOMAIN  wire a defined, shut-off libvirt domain to a host's remusdbd

The hosts are those of the cluster file (--cluster FILE, else
$REMUSDB_CLUSTER, else /etc/remusdb/cluster.yml; docs/operations.md):
--host names one of them, from whichever host the command runs on; a
host reached through ssh is asked with `ssh HOST remusdb control-relay`.
The verbs that need a host's files run there through ssh: libvirt-wire
and fork (of a parent on that host) whole, check-image's hashing of each
host's file.

Errors go to stderr with what to do about them; the exit status is 1 for
a failed operation and 2 for a bad command line or cluster file."""
import argparse
import sys

from .. import cluster
from . import (check_image, control_relay, failover, forget, fork, libvirt_wire, owner,
               page_sums, protect, reset_stats, status, switchover, unprotect, vm_meta)
from .arguments import add_cluster
from .runner import run

# The verbs in the order `remusdb --help` lists them; control-relay,
# vm-meta and page-sums (what ssh runs on the far host) come last and are
# not listed.
VERBS = (status, protect, libvirt_wire, unprotect, failover, switchover, forget, owner,
         reset_stats, check_image, fork, control_relay, vm_meta, page_sums)
HIDDEN = ("control-relay", "vm-meta", "page-sums")


def build_parser():
    parser = argparse.ArgumentParser(prog="remusdb", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cluster(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                help="one of the commands above; COMMAND --help for its options")
    for verb in VERBS:
        verb.add_parser(sub)
    for name, p in sub.choices.items():
        if name not in HIDDEN:
            add_cluster(p, suppress=True)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    cluster.use(args.cluster)
    try:
        code = args.func(args)
    except cluster.ClusterError as e:
        for line in e.problems:
            print(f"remusdb: error: {line}", file=sys.stderr)
        code = 2
    sys.exit(code)


def entry():
    """The `remusdb` command."""
    run(main, "remusdb")


def protect_entry():
    """`remusdb-protect`: the name the design gives operators for `remusdb
    protect`; the same command, options and exit status."""
    run(lambda: main(["protect", *sys.argv[1:]]), "remusdb")


def fork_entry():
    """`remusdb-fork`: the name the design gives operators for `remusdb
    fork`; the same command, options and exit status."""
    run(lambda: main(["fork", *sys.argv[1:]]), "remusdb")


if __name__ == "__main__":
    entry()
