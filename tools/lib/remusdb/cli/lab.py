"""remusdb-lab up|down|status: the network namespaces that play the hosts.
`up` also starts a one-member etcd witness unless one already runs, an
sshd in each VM host, and writes the lab's cluster files (the CLI run
from this checkout reads RUN/cluster.yml; lab/cluster_file.py).

remusdb-lab witness up [--members 1|3] | down | status: the etcd witness
(docs/witness.md); `up` with another member count restarts it with fresh
data, `down` keeps the data."""
import argparse
import shutil

from .. import paths
from ..lab import cluster_file, netns, witness
from .runner import run


def main():
    parser = argparse.ArgumentParser(prog="remusdb-lab", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["up", "down", "status", "witness"])
    parser.add_argument("witness_action", nargs="?", choices=["up", "down", "status"],
                        help="with `witness`")
    parser.add_argument("--members", type=int, choices=witness.MEMBER_COUNTS, default=1,
                        help="etcd members for `witness up` (default 1)")
    args = parser.parse_args()
    if args.action != "witness" and args.witness_action:
        parser.error(f"unexpected argument {args.witness_action!r} after {args.action!r}")
    if args.action == "witness":
        if not args.witness_action:
            parser.error("witness needs up, down or status")
        if args.witness_action == "up":
            witness.start(args.members)
            print(witness.status())
        elif args.witness_action == "down":
            witness.stop()
            print("witness is down (data kept)")
        else:
            print(witness.status())
    elif args.action == "up":
        netns.up()
        if not witness.running_members():
            witness.start(max(witness.configured_members(), 1))
        print(netns.status())
        print(witness.status())
        print(f"cluster file: {cluster_file.path()} (what tools/remusdb reads from this "
              f"checkout); as seen from a VM host, with the others through ssh: "
              f"{', '.join(str(cluster_file.from_host_path(h)) for h in netns.VM_HOSTS)}")
    elif args.action == "down":
        netns.down()  # kills etcd with everything else in the namespaces
        # runtime sockets, logs, daemon state and the VMs' disk copies
        shutil.rmtree(paths.RUN, ignore_errors=True)
        shutil.rmtree(paths.STATE, ignore_errors=True)
        print("lab is down")
    else:
        print(netns.status())
        print(witness.status())


def entry():
    """The `remusdb-lab` command."""
    run(main, "remusdb-lab")


if __name__ == "__main__":
    entry()
