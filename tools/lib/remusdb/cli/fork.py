"""`remusdb fork` and `remusdb fork-release`: clone a running VM into N
clones, and end its fork once the clones are stopped (docs/fork.md).

A parent running on a host reached through ssh is forked by `remusdb
fork` run there (remusdb.remote_verb): the fork needs the parent's
files (its command line, its guest agent) and starts the clones from
the parent's host. A password file given here is read here and handed
over on ssh's stdin (`--db-password-file -`), never on a command line."""
import json
import sys

from .. import cluster, control, protection, remote_verb
from .arguments import add_forwarded, positive_int
from .output import fail


def forwarded_args(args, parent_host):
    """`remusdb fork`'s arguments as the parent's host runs them: the same
    options, --host its own name, and the password (when given here) on
    stdin."""
    argv = [args.vm, "-n", str(args.n), "--host", parent_host, "--role", args.role]
    for option, value in (("--hosts", args.hosts), ("--dbms", args.dbms),
                          ("--clone-ip", args.clone_ip), ("--db-user", args.db_user),
                          ("--libvirt", args.libvirt), ("--clone-libvirt", args.clone_libvirt),
                          ("--json", args.json)):
        if value:
            argv += [option, value]
    if args.db_password_file:
        argv += ["--db-password-file", "-"]
    return argv


def read_password(path):
    """The first line of the password file (`-`: of stdin, where a
    forwarded fork is given it), or None when none is named."""
    if not path:
        return None
    if path == "-":
        return sys.stdin.readline().rstrip("\r\n")
    with open(path, encoding="utf-8") as f:
        return f.readline().rstrip("\r\n")


def forward(args, fork):
    """Runs the fork on the parent's host when that host is reached
    through ssh; returns its exit status, or None to fork here."""
    if args.forwarded is not None:
        remote_verb.check_forwarded(args.forwarded, args.host)
        return None
    parent_host = args.host or fork.parent_host_of(args.vm, args.libvirt)
    args.host = parent_host
    if cluster.current().host(parent_host).control.via == "local":
        return None
    password = read_password(args.db_password_file)
    return remote_verb.run(parent_host, "fork", *forwarded_args(args, parent_host),
                           stdin_data=None if password is None else password.encode() + b"\n")


def cmd_fork(args):
    from .. import fork  # starts daemons and QEMU; imported only when needed
    from ..clone_identity import CloneIdentityError
    hosts = args.hosts.split(",") if args.hosts else None
    ips = [ip for ip in args.clone_ip.split(",") if ip] if args.clone_ip else None
    try:
        if args.host:
            cluster.current().host(args.host)
        code = forward(args, fork)
        if code is not None:
            return code
        user, password = fork.credentials(args.db_user, read_password(args.db_password_file))
        report = fork.fork(args.vm, args.n, hosts=hosts, role=args.role, dbms=args.dbms,
                           ips=ips, user=user, password=password,
                           libvirt_uri=args.libvirt, clone_libvirt_uri=args.clone_libvirt,
                           parent_host=args.host)
    except OSError as e:
        return fail(f"cannot read the database password file {args.db_password_file}: "
                    f"{e.strerror}")
    except (remote_verb.RemoteVerbError, protection.ProtectionError) as e:
        return fail(e)
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
    p.add_argument("--host", metavar="HOST",
                   help="the parent's host, of the cluster file (default: the host that "
                        "runs it). On a host reached through ssh the fork runs there, "
                        "through ssh: its clones then go on that host or hosts sharing its "
                        "files, --libvirt URIs are as it sees them, --json is written there")
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
                   help="its password, the file's first line, read here; - reads stdin "
                        "(default: the cluster file's fork.db_password_file)")
    p.add_argument("--libvirt", metavar="URI",
                   help="VM is a libvirt domain (wired by `remusdb libvirt-wire`) on this "
                        "libvirt; the clones are libvirt domains too (docs/libvirt.md)")
    p.add_argument("--clone-libvirt", metavar="URI",
                   help="the libvirt URI the clones are started through (default: the "
                        "same as --libvirt)")
    p.add_argument("--json", metavar="FILE", help="write the timed report here")
    add_forwarded(p)
    p.set_defaults(func=cmd_fork)

    p = sub.add_parser("fork-release",
                       description="Ends the VM's fork: its page source stops and its "
                                   "frozen disk snapshot goes. The clones' disks read "
                                   "through that snapshot: stop the clones first.")
    p.add_argument("vm", metavar="VM")
    p.set_defaults(func=cmd_fork_release)
