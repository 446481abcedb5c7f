"""`remusdb fork` and `remusdb fork-release`: clone a running VM into N
clones, and end its fork once the clones are stopped (docs/fork.md)."""
import json

from .. import control
from .arguments import positive_int
from .output import fail


def cmd_fork(args):
    from .. import fork  # starts daemons and QEMU; imported only when needed
    from ..clone_identity import CloneIdentityError
    hosts = args.hosts.split(",") if args.hosts else None
    ips = [ip for ip in args.clone_ip.split(",") if ip] if args.clone_ip else None
    try:
        password = None
        if args.db_password_file:
            with open(args.db_password_file, encoding="utf-8") as f:
                password = f.readline().rstrip("\r\n")
        user, password = fork.credentials(args.db_user, password)
        report = fork.fork(args.vm, args.n, hosts=hosts, role=args.role, dbms=args.dbms,
                           ips=ips, user=user, password=password,
                           libvirt_uri=args.libvirt, clone_libvirt_uri=args.clone_libvirt)
    except OSError as e:
        return fail(f"cannot read the database password file {args.db_password_file}: "
                    f"{e.strerror}")
    except (fork.ForkError, CloneIdentityError, control.ControlError) as e:
        return fail(f"{e} (clones already started stay for inspection; "
                    f"`tools/remusdb-vm stop NAME --host H` stops one"
                    + (", `virsh destroy NAME` a libvirt one" if args.libvirt else "") + ")")
    f = report["fork"] or {}
    print(f"{args.vm}: parent paused {f.get('parent_pause_ms', 0):.0f} ms; "
          f"snapshot {f.get('snapshot_ms', 0) / 1000:.2f} s")
    for c in report["clones"]:
        print(f"  clone {c['name']} on {c['host']} at {c['ip']} ({report['dbms']} {args.role}): running "
              f"{c['running_s']:.2f} s, first read query {c['first_query_s']:.2f} s after the fork")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=2)
    return 0


def cmd_fork_release(args):
    from .. import fork
    try:
        f = fork.release(args.vm)
    except (fork.ForkError, control.ControlError) as e:
        return fail(e)
    print(f"{args.vm}: fork {f.get('id')} released ({f.get('state')})")
    return 0


def add_parser(sub):
    p = sub.add_parser("fork",
                       description="Clones a running database VM into N clones: remusdbd "
                                   "snapshots it (a short pause), each clone resumes at once "
                                   "with its memory served on demand and its disk a "
                                   "copy-on-write overlay of the frozen disk, gets a new MAC, "
                                   "address and hostname through qemu-guest-agent while "
                                   "quarantined, becomes a streaming replica of the parent "
                                   "(--role replica) or an independent copy (--role copy), "
                                   "and only then joins the LAN. Its first read query is "
                                   "asked from this machine: run it where clients reach the "
                                   "database LAN. docs/fork.md.")
    p.add_argument("vm", metavar="VM", help="the running parent VM")
    p.add_argument("-n", type=positive_int, default=1, metavar="N",
                   help="how many clones (default 1)")
    p.add_argument("--hosts", metavar="H1,H2",
                   help="hosts of the cluster file for the clones, used in turn "
                        "(default the parent's host)")
    p.add_argument("--role", choices=["replica", "copy"], default="replica",
                   help="replica: PostgreSQL streaming replica or MariaDB GTID replica of "
                        "the parent (default); copy: an independent primary with a new "
                        "system identifier (PostgreSQL) or server_id (MariaDB)")
    p.add_argument("--dbms", choices=["postgresql", "mariadb"],
                   help="the DBMS to make the clones replicas or copies of (default: the "
                        "one running in the parent, asked through its guest agent)")
    p.add_argument("--clone-ip", metavar="IP1,IP2",
                   help="the clones' addresses, one per clone (default: the first N of "
                        "the cluster file's fork.clone_addresses)")
    p.add_argument("--db-user", metavar="ROLE",
                   help="the database role the parent's backup session and the clones' "
                        "replication use (default: the cluster file's fork.db_user)")
    p.add_argument("--db-password-file", metavar="FILE",
                   help="its password, the file's first line (default: the cluster "
                        "file's fork.db_password_file)")
    p.add_argument("--libvirt", metavar="URI",
                   help="VM is a libvirt domain (wired by `remusdb libvirt-wire`) on this "
                        "libvirt; the clones are libvirt domains too (docs/libvirt.md)")
    p.add_argument("--clone-libvirt", metavar="URI",
                   help="the libvirt URI the clones are started through (default: the "
                        "same as --libvirt)")
    p.add_argument("--json", metavar="FILE", help="write the timed report here")
    p.set_defaults(func=cmd_fork)

    p = sub.add_parser("fork-release",
                       description="Ends the VM's fork: its page source stops and its "
                                   "frozen disk snapshot goes. The clones' disks read "
                                   "through that snapshot: stop the clones first.")
    p.add_argument("vm", metavar="VM")
    p.set_defaults(func=cmd_fork_release)
