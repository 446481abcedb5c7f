"""The cluster an operator describes: one YAML file naming the hosts that
run remusdbd, how to reach each one's daemon, and what they share.

    # /etc/remusdb/cluster.yml (--cluster FILE or $REMUSDB_CLUSTER for another)
    hosts:
      - name: db1
        replication: db1.example.com:7788    # HOST[:PORT]; DNS names allowed
        control:                             # how the CLI reaches its remusdbd
          via: local
          socket: /run/remusdb/db1/remusdbd.sock
        metrics: db1.example.com:9187        # remusdbd --http (optional)
      - name: db2
        replication: 192.0.2.2:7788
        control:
          via: ssh
          target: root@db2.example.com
          port: 22                           # optional
          identity_file: /root/.ssh/remusdb  # optional
          known_hosts_file: /etc/remusdb/known_hosts   # optional
          socket: /run/remusdb/db2/remusdbd.sock       # on db2
          command: remusdb                   # remusdb on db2 (default: on its PATH)
    etcd: [http://192.0.2.5:2379]            # the witness every daemon uses
    key_file: /var/lib/remusdb/psk           # the pre-shared key they hold
    bridge: br0                              # the guests' bridge on every host
    default_host: db1                        # what --host means when not given
    fork:                                    # remusdb fork's clones (optional)
      clone_addresses: [192.0.2.51, 192.0.2.52]
      prefix_len: 24
      db_user: replicator
      db_password_file: /etc/remusdb/replicator.password

A host's `socket` defaults to the systemd unit's (/run/remusdb/NAME/
remusdbd.sock). `exec_prefix` (a list, optional) is how a program is run
on that host from the machine the CLI runs on, for `remusdb fork`, which
starts clones' QEMU there; a `local` host without one runs it here.

Why ssh reaches another host's daemon, and not a TCP channel of
remusdbd's own: operators already run, harden and audit sshd, its keys
and its logs; a control channel in the daemon would be a new listening
port with its own authentication to get right and to audit, for a
handful of requests an hour. So the CLI does what `virsh -c
qemu+ssh://` does: `ssh TARGET remusdb control-relay --socket PATH`,
which hands one request line to the daemon's local control socket and
its one response line back (remusdb/cli/control_relay.py).

load() reports every problem at once, one line each, naming the file:
"FILE: hosts[1] (db2): control: key 'sokcet' is unknown (did you mean 'socket'?)".
"""
import difflib
import ipaddress
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from . import paths

DEFAULT_REPLICATION_PORT = 7788
DNS_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
HOST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
SSH_TARGET = re.compile(r"^([A-Za-z_][A-Za-z0-9_.-]*@)?[^\s@/]+$")
ETCD_URL = re.compile(r"^https?://[A-Za-z0-9.\-\[\]:]+:\d{1,5}/?$")


class ClusterError(Exception):
    """`problems` holds one line per problem, each naming the file."""

    def __init__(self, problems):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


SSH_FAILED = 255  # ssh's own exit status for its own failures


@dataclass(frozen=True)
class Control:
    via: str                    # "local" or "ssh"
    socket: str                 # the control socket, on the host itself
    target: str = None          # ssh: [USER@]HOST
    port: int = None
    identity_file: str = None
    known_hosts_file: str = None
    command: str = "remusdb"    # ssh: remusdb on that host

    def ssh_argv(self, *remote):
        """ssh's command line that runs `remote` (remusdb's arguments) on
        the host. BatchMode: a missing key or an unknown host key is an
        error at once, never a prompt that waits."""
        argv = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5"]
        if self.port:
            argv += ["-p", str(self.port)]
        if self.identity_file:
            argv += ["-i", self.identity_file, "-o", "IdentitiesOnly=yes"]
        if self.known_hosts_file:
            argv += ["-o", f"UserKnownHostsFile={self.known_hosts_file}",
                     "-o", "StrictHostKeyChecking=yes"]
        command = " ".join(shlex.quote(a) for a in [*shlex.split(self.command), *remote])
        return argv + ["--", self.target, command]

    def ssh_failure(self, code, last_line, host):
        """The one line for an ssh run that failed before remusdb spoke
        on the far side: ssh's own failure (exit 255: unreachable, a
        refused key, an unknown host key) or no remusdb to run there
        (126, 127). None for any other exit: the far side's own."""
        if code == SSH_FAILED:
            return f"ssh {self.target}: {last_line or 'connection failed'}"
        if code in (126, 127):
            return (f"{host}: cannot run {self.command!r} through ssh {self.target} (exit "
                    f"{code}: {last_line or 'no message'}): install remusdb there, or set "
                    f"`command:` of {host}'s control in the cluster file")
        return None

    def describe(self):
        if self.via == "local":
            return f"control socket {self.socket}"
        return f"ssh {self.target}{f' -p {self.port}' if self.port else ''}, socket {self.socket}"


@dataclass(frozen=True)
class Host:
    name: str
    replication: tuple          # (host, port); host may be a DNS name
    control: Control
    metrics: tuple = None       # (host, port) or None
    exec_prefix: tuple = None   # argv prefix that runs a program there

    @property
    def address(self):
        """The host's LAN address as written (an IP or a DNS name)."""
        return self.replication[0]

    @property
    def replication_text(self):
        return join_address(*self.replication)


@dataclass
class Fork:
    clone_addresses: list = field(default_factory=list)
    prefix_len: int = None
    db_user: str = None
    db_password_file: str = None


@dataclass
class Cluster:
    path: str
    hosts: dict                 # name -> Host, in the file's order
    etcd: list = field(default_factory=list)
    key_file: str = None
    bridge: str = None
    default_host: str = None
    fork: Fork = field(default_factory=Fork)

    def names(self):
        return list(self.hosts)

    def host(self, name):
        """The host `name`; ClusterError naming the file and its hosts if
        the file has none of that name."""
        if name not in self.hosts:
            raise ClusterError([f"{self.path} names no host {name!r}: the hosts are "
                                f"{', '.join(self.hosts)}"])
        return self.hosts[name]

    def the_default_host(self):
        """What --host means when it is not given: default_host, else the
        only host reached through a local socket."""
        if self.default_host:
            return self.default_host
        local = [h.name for h in self.hosts.values() if h.control.via == "local"]
        if len(local) == 1:
            return local[0]
        raise ClusterError([f"give --host (one of {', '.join(self.hosts)}), or name the "
                            f"host verbs act on by default with `default_host:` in "
                            f"{self.path}"])

    def host_at(self, address):
        """The host whose replication address (resolved) is `address`
        ("IP" or "IP:PORT", as remusdbd reports a peer), or None."""
        ip, _, port = address.rpartition(":") if ":" in address else (address, "", "")
        for h in self.hosts.values():
            if port and port.isdigit() and int(port) != h.replication[1]:
                continue
            if h.address == ip or ip in resolve_all(h.address):
                return h
        return None


# ---------------------------------------------------------------- addresses

def split_address(text, default_port=None):
    """"HOST:PORT", "[V6]:PORT" or (with default_port) "HOST" -> (host,
    port), or a phrase saying what is wrong."""
    if not isinstance(text, str) or not text.strip():
        return f"must be HOST:PORT, not {text!r}"
    text = text.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else None
        if not sep or (rest and port_text is None):
            return f"{text!r} is not [IPV6]:PORT"
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    elif ":" in text:
        return f"{text!r}: write an IPv6 address as [ADDRESS]:PORT"
    else:
        host, port_text = text, None
    if port_text is None:
        if default_port is None:
            return f"{text!r} has no :PORT"
        port = default_port
    elif not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        return f"{text!r}: the port must be 1..65535"
    else:
        port = int(port_text)
    problem = host_problem(host, bracketed=text.startswith("["))
    return problem or (host, port)


def host_problem(host, bracketed=False):
    """None when `host` is an IP address or a DNS name, else why not."""
    try:
        ip = ipaddress.ip_address(host)
        if bracketed != (ip.version == 6):
            return f"{host!r}: an IPv6 address goes in brackets, an IPv4 one not"
        return None
    except ValueError:
        pass
    if bracketed:
        return f"{host!r} is not an IPv6 address"
    labels = host.rstrip(".").split(".")
    if (not host or len(host) > 253 or not all(DNS_LABEL.match(label) for label in labels)
            or labels[-1].isdigit()):
        return f"{host!r} is neither an IP address nor a DNS name"
    return None


def join_address(host, port):
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def resolve_all(host):
    """Every IPv4 address `host` has (itself if it is one); [] when it
    does not resolve."""
    import socket
    try:
        return [str(ipaddress.IPv4Address(host))]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    return sorted({info[4][0] for info in infos})


def resolve_ipv4(host):
    """host's first IPv4 address: remusdbd takes only IPv4 addresses, so a
    DNS name is resolved here, on the CLI's host. ClusterError if it has
    none."""
    found = resolve_all(host)
    if not found:
        raise ClusterError([f"{host!r} does not resolve to an IPv4 address"])
    return found[0]


# ---------------------------------------------------------------- the file's keys

def _unknown(origin, key, known):
    near = difflib.get_close_matches(str(key), known, n=1)
    return (f"{origin}key {key!r} is unknown"
            + (f" (did you mean {near[0]!r}?)" if near else f" (known: {', '.join(known)})"))


def _path(value):
    if not isinstance(value, str) or not value.startswith("/"):
        return f"must be an absolute path, not {value!r}"
    return None


def _port(value):
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        return f"must be a port 1..65535, not {value!r}"
    return None


def _text(value):
    if not isinstance(value, str) or not value.strip():
        return f"must be a non-empty string, not {value!r}"
    return None


CONTROL_KEYS = {
    "local": {"via": None, "socket": _path},
    "ssh": {"via": None, "socket": _path, "target": None, "port": _port,
            "identity_file": _path, "known_hosts_file": _path, "command": _text},
}


def _control(name, value, origin, problems):
    where = f"{origin}control: "
    if not isinstance(value, dict):
        problems.append(f"{where}must be a mapping with `via: local` or `via: ssh`, "
                        f"not {value!r}")
        return None
    via = value.get("via")
    if via not in CONTROL_KEYS:
        problems.append(f"{where}via: must be local or ssh, not {via!r}")
        return None
    keys = CONTROL_KEYS[via]
    bad = len(problems)
    for key, item in value.items():
        if key not in keys:
            problems.append(_unknown(where, key, list(keys)))
        elif keys[key] and (problem := keys[key](item)):
            problems.append(f"{where}{key}: {problem}")
    target = value.get("target")
    if via == "ssh":
        if target is None:
            problems.append(f"{where}`via: ssh` needs `target: [USER@]HOST`")
        elif not isinstance(target, str) or not SSH_TARGET.match(target):
            problems.append(f"{where}target: must be [USER@]HOST, not {target!r}")
        elif (problem := host_problem(target.rpartition("@")[2].strip("[]"),
                                      bracketed=target.rpartition("@")[2].startswith("["))):
            problems.append(f"{where}target: {problem}")
    if len(problems) > bad:
        return None
    return Control(via=via, socket=value.get("socket") or str(paths.control_socket(name)),
                   target=target, port=value.get("port"),
                   identity_file=value.get("identity_file"),
                   known_hosts_file=value.get("known_hosts_file"),
                   command=value.get("command") or "remusdb")


HOST_KEYS = ("name", "replication", "control", "metrics", "exec_prefix")


def _host(i, value, origin, problems):
    where = f"{origin}: hosts[{i}]"
    if not isinstance(value, dict):
        problems.append(f"{where}: must be a mapping (name, replication, control, ...), "
                        f"not {value!r}")
        return None
    name = value.get("name")
    if isinstance(name, str) and HOST_NAME.match(name):
        where += f" ({name})"
    bad = len(problems)
    for key in value:
        if key not in HOST_KEYS:
            problems.append(_unknown(f"{where}: ", key, list(HOST_KEYS)))
    for key in ("name", "replication", "control"):
        if value.get(key) is None:
            problems.append(f"{where}: missing `{key}:`")
    if name is not None and not (isinstance(name, str) and HOST_NAME.match(name)):
        problems.append(f"{where}: name: {name!r} is not a host name (letters, digits, "
                        f"'.', '-', '_'; up to 63)")
    replication = metrics = None
    if value.get("replication") is not None:
        replication = split_address(value["replication"], DEFAULT_REPLICATION_PORT)
        if isinstance(replication, str):
            problems.append(f"{where}: replication: {replication}")
    if value.get("metrics") is not None:
        metrics = split_address(value["metrics"])
        if isinstance(metrics, str):
            problems.append(f"{where}: metrics: {metrics}")
    prefix = value.get("exec_prefix")
    if prefix is not None and not (isinstance(prefix, list) and prefix
                                   and all(isinstance(a, str) and a for a in prefix)):
        problems.append(f"{where}: exec_prefix: must be a list of strings, not {prefix!r}")
    control = None
    if value.get("control") is not None:
        control = _control(name if isinstance(name, str) else "?", value["control"],
                           f"{where}: ", problems)
    if len(problems) > bad:
        return None
    return Host(name=name, replication=replication, control=control, metrics=metrics,
                exec_prefix=tuple(prefix) if prefix else None)


def _etcd(value):
    urls = value.split(",") if isinstance(value, str) else value
    if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
        return None, f"must be a URL, a comma-separated string of them or a list, not {value!r}"
    urls = [u.strip() for u in urls if u.strip()]
    if not urls:
        return None, "names no endpoint"
    bad = [u for u in urls if not ETCD_URL.match(u)]
    if bad:
        return None, f"{bad[0]!r} is not an etcd client URL like http://etcd1:2379"
    return urls, None


FORK_KEYS = ("clone_addresses", "prefix_len", "db_user", "db_password_file")


def _fork(value, origin, problems):
    where = f"{origin}: fork: "
    if not isinstance(value, dict):
        problems.append(f"{where}must be a mapping ({', '.join(FORK_KEYS)}), not {value!r}")
        return Fork()
    for key in value:
        if key not in FORK_KEYS:
            problems.append(_unknown(where, key, list(FORK_KEYS)))
    addresses = value.get("clone_addresses", [])
    if not isinstance(addresses, list):
        problems.append(f"{where}clone_addresses: must be a list of IP addresses, "
                        f"not {addresses!r}")
        addresses = []
    for a in addresses:
        try:
            ipaddress.ip_address(a)
        except ValueError:
            problems.append(f"{where}clone_addresses: {a!r} is not an IP address")
    seen = {a for a in addresses if addresses.count(a) > 1}
    if seen:
        problems.append(f"{where}clone_addresses: {sorted(seen)[0]!r} is listed twice")
    prefix = value.get("prefix_len")
    if prefix is not None and (isinstance(prefix, bool) or not isinstance(prefix, int)
                               or not 1 <= prefix <= 128):
        problems.append(f"{where}prefix_len: must be 1..128, not {prefix!r}")
    for key, check in (("db_user", _text), ("db_password_file", _path)):
        if value.get(key) is not None and (problem := check(value[key])):
            problems.append(f"{where}{key}: {problem}")
    return Fork(clone_addresses=[str(a) for a in addresses], prefix_len=prefix,
                db_user=value.get("db_user"), db_password_file=value.get("db_password_file"))


TOP_KEYS = ("hosts", "etcd", "key_file", "bridge", "default_host", "fork")


def parse(text, origin):
    """The file's text -> Cluster; ClusterError with every problem."""
    import yaml
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{origin}:{mark.line + 1}" if mark else origin
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ClusterError([f"{where}: not valid YAML: {problem}"])
    if not isinstance(data, dict):
        raise ClusterError([f"{origin}: expected `hosts:` and the cluster's settings, got "
                            f"{'nothing' if data is None else 'a ' + type(data).__name__}"])
    problems = []
    for key in data:
        if key not in TOP_KEYS:
            problems.append(_unknown(f"{origin}: ", key, list(TOP_KEYS)))
    raw_hosts = data.get("hosts")
    hosts = {}
    if not isinstance(raw_hosts, list) or not raw_hosts:
        problems.append(f"{origin}: missing `hosts:`, a list of at least one host"
                        if raw_hosts is None else
                        f"{origin}: hosts: must be a list of hosts, not {raw_hosts!r}")
        raw_hosts = []
    first_index = {}
    for i, item in enumerate(raw_hosts):
        h = _host(i, item, origin, problems)
        name = item.get("name") if isinstance(item, dict) else None
        if isinstance(name, str) and name in first_index:
            problems.append(f"{origin}: hosts[{i}]: host {name!r} is named twice (hosts"
                            f"[{first_index[name]}] and hosts[{i}])")
            continue
        if isinstance(name, str):
            first_index[name] = i
        if h:
            hosts[h.name] = h
    etcd = []
    if data.get("etcd") is not None:
        etcd, problem = _etcd(data["etcd"])
        if problem:
            problems.append(f"{origin}: etcd: {problem}")
    for key, check in (("key_file", _path), ("bridge", _text), ("default_host", _text)):
        if key in data and (problem := check(data[key])):
            problems.append(f"{origin}: {key}: {problem}")
    default = data.get("default_host")
    if isinstance(default, str) and first_index and default not in first_index:
        problems.append(f"{origin}: default_host: {default!r} is not one of the hosts "
                        f"({', '.join(first_index)})")
    fork = _fork(data["fork"], origin, problems) if data.get("fork") is not None else Fork()
    if problems:
        raise ClusterError(problems)
    return Cluster(path=origin, hosts=hosts, etcd=etcd or [], key_file=data.get("key_file"),
                   bridge=data.get("bridge"), default_host=default, fork=fork)


def default_path():
    """$REMUSDB_CLUSTER, else paths.CLUSTER_FILE."""
    return Path(os.environ.get("REMUSDB_CLUSTER") or paths.CLUSTER_FILE)


def load(path=None):
    """The cluster file at `path` (default_path() when None)."""
    path = Path(path) if path else default_path()
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(1 << 20)
    except FileNotFoundError:
        raise ClusterError([f"no cluster file at {path}: write one (docs/operations.md, "
                            f"\"The cluster file\") or name it with --cluster FILE or "
                            f"$REMUSDB_CLUSTER"])
    except (OSError, UnicodeDecodeError) as e:
        raise ClusterError([f"{path}: cannot read it: {getattr(e, 'strerror', None) or e}"])
    return parse(text, str(path))


_current = {"path": None, "stamp": None, "cluster": None}


def use(path):
    """Makes `path` (None: default_path()) the file current() loads: the
    CLI's --cluster."""
    _current.update(path=path, stamp=None, cluster=None)


def current():
    """The cluster the process works with: the file use() named, else
    default_path(); read again whenever the file changes (the lab
    rewrites it at each `up`)."""
    path = Path(_current["path"]) if _current["path"] else default_path()
    try:
        st = path.stat()
        stamp = (str(path), st.st_mtime_ns, st.st_ino, st.st_size)
    except OSError:
        stamp = None
    if stamp is None or stamp != _current["stamp"]:
        cluster = load(path)
        _current.update(stamp=stamp, cluster=cluster)
    return _current["cluster"]
