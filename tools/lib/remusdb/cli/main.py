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
  libvirt-wire DOMAIN  wire a defined, shut-off libvirt domain to this host's remusdbd

Errors go to stderr with what to do about them; the exit status is 1 for
a failed operation and 2 for a bad command line."""
import argparse
import sys

from . import (check_image, failover, forget, fork, libvirt_wire, protect, reset_stats, status,
               switchover, unprotect)
from .runner import run

# The verbs in the order `remusdb --help` lists them.
VERBS = (status, protect, libvirt_wire, unprotect, failover, switchover, forget, reset_stats,
         check_image, fork)


def build_parser():
    parser = argparse.ArgumentParser(prog="remusdb", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                help="one of the commands above; COMMAND --help for its options")
    for verb in VERBS:
        verb.add_parser(sub)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    sys.exit(args.func(args))


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
