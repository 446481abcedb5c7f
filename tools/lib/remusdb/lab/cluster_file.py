"""The lab described as a cluster (remusdb.cluster), so that the product
finds its hosts the way it finds an operator's: `remusdb-lab up` writes

  RUN/cluster.yml   what the CLI run from the checkout reads by default
                    (paths.CLUSTER_FILE): every host `via: local`, since
                    the lab's namespaces share this machine's files, and
                    its `exec_prefix` the namespace's `ip netns exec`;
  RUN/lab/cluster-from-HOST.yml
                    the same cluster as an operator on VM host HOST sees
                    it: HOST local, the other VM hosts through ssh to the
                    lab's sshd in their namespaces (lab/sshd.py). Run the
                    CLI in HOST's namespace with --cluster THAT_FILE to
                    go through the product's real remote path.

The tests and the lab tools use RUN/cluster.yml; a control socket is
faster than an ssh login per request, and the drills time failovers.
"""
from .. import paths
from . import netns, sshd, witness

CLONE_FIRST, CLONE_COUNT = 51, 20     # 10.77.0.51.. for remusdb fork's clones
DB_USER = DB_PASSWORD = "replicator"  # tools/guest/customize.sh's replication role


def path():
    return paths.RUN / "cluster.yml"


def from_host_path(host):
    return paths.RUN / "lab" / f"cluster-from-{host}.yml"


def db_password_file():
    return paths.RUN / "lab" / "replicator.password"


def _quote(text):
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _host_lines(host, remote):
    ns, address, _ = netns.HOSTS[host]
    socket = paths.control_socket(host)
    lines = [f"  - name: {host}",
             f"    replication: {address}:7788",
             f"    metrics: {address}:9187"]
    if remote:
        lines += ["    control:",
                  "      via: ssh",
                  f"      target: root@{address}",
                  f"      port: {sshd.PORT}",
                  f"      identity_file: {_quote(sshd.client_key())}",
                  f"      known_hosts_file: {_quote(sshd.known_hosts())}",
                  f"      socket: {_quote(socket)}",
                  f"      command: {_quote(paths.COMMANDS / 'remusdb')}"]
    else:
        lines += ["    control:",
                  "      via: local",
                  f"      socket: {_quote(socket)}",
                  f"    exec_prefix: [ip, netns, exec, {ns}]"]
    return lines


def text(local_hosts=None):
    """The file; local_hosts: the hosts reached `via: local` (None: all)."""
    hosts = netns.VM_HOSTS
    clones = [f"{netns.SUBNET_PREFIX}.{CLONE_FIRST + i}" for i in range(CLONE_COUNT)]
    lines = ["# written by remusdb-lab up (remusdb.lab.cluster_file): the lab's hosts",
             "hosts:"]
    for h in hosts:
        lines += _host_lines(h, remote=local_hosts is not None and h not in local_hosts)
    etcd = witness.client_endpoints().split(",")
    lines += [f"etcd: [{', '.join(etcd)}]",
              f"key_file: {_quote(paths.STATE / 'psk')}",
              f"bridge: {netns.GUEST_BRIDGE}",
              f"default_host: {(local_hosts or hosts)[0]}",
              "fork:",
              f"  clone_addresses: [{', '.join(clones)}]",
              f"  prefix_len: {netns.PREFIX_LEN}",
              f"  db_user: {DB_USER}",
              f"  db_password_file: {_quote(db_password_file())}",
              ""]
    return "\n".join(lines)


def write():
    """Writes the lab's cluster files (and the replication role's password
    file fork reads); returns the default one's path."""
    pw = db_password_file()
    pw.parent.mkdir(parents=True, exist_ok=True)
    pw.write_text(DB_PASSWORD + "\n")
    pw.chmod(0o600)
    for host in netns.VM_HOSTS:
        _atomic_write(from_host_path(host), text(local_hosts=[host]))
    _atomic_write(path(), text())
    return path()


def _atomic_write(target, content):
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(content)
    tmp.replace(target)
