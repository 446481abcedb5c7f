"""What `remusdb`'s verbs accept on their command lines: a host of the
cluster file (--host, checked against the file once it is read, not
against a fixed list), the cluster file itself (--cluster), and the
argparse types of positive numbers and checkpoint intervals."""
import argparse

from .. import cluster, protection


def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be positive")
    return value


def interval_ms(text):
    value = positive_int(text)
    lo, hi = protection.INTERVAL_MS_RANGE
    if not lo <= value <= hi:
        raise argparse.ArgumentTypeError(f"{value} ms is out of range: use {lo}..{hi}")
    return value


def add_cluster(parser, suppress=False):
    """--cluster FILE; given on the verb too (`remusdb status --cluster F`),
    where it must not reset what was given before the verb."""
    parser.add_argument("--cluster", metavar="FILE",
                        default=argparse.SUPPRESS if suppress else None,
                        help="the cluster file (default $REMUSDB_CLUSTER, else "
                             "/etc/remusdb/cluster.yml when installed)")


def add_host(parser, what, default_help):
    parser.add_argument("--host", metavar="HOST",
                        help=f"{what}: a host of the cluster file ({default_help})")


def add_forwarded(parser):
    """--forwarded N (hidden from --help): given to a verb run on its own
    host through ssh by a remusdb elsewhere (remusdb.remote_verb)."""
    parser.add_argument("--forwarded", type=int, metavar="N", help=argparse.SUPPRESS)


def host_or_default(host):
    """`host` checked against the cluster file, or, when None, the file's
    default host. ClusterError (one line) otherwise."""
    c = cluster.current()
    if host is None:
        return c.the_default_host()
    c.host(host)
    return host


def replica_host(vm):
    """The one host of the cluster holding a replica of `vm` (a verb on
    the backup side given no --host): ClusterError unless exactly one
    does, or one live one."""
    c = cluster.current()
    found, live = [], []
    for name in c.names():
        try:
            r = protection.replica(name, vm)
        except protection.ProtectionError:
            continue
        if r:
            found.append(name)
            if r.get("state") not in protection.REPLICA_BROKEN:
                live.append(name)
    pick = live if len(live) == 1 else found
    if len(pick) == 1:
        return pick[0]
    if not pick:
        raise cluster.ClusterError([f"no reachable host of {c.path} holds a replica of "
                                    f"{vm}: give --host"])
    raise cluster.ClusterError([f"{', '.join(pick)} hold replicas of {vm}: say which "
                                f"with --host"])
