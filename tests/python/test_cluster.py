"""remusdb.cluster: the cluster file's parser. Pure Python, no lab, no
daemon: each kind of bad file must give its one line, and a good file
must give what it says (the positive controls)."""
from pathlib import Path

import pytest

from remusdb import cluster
from remusdb.cluster import ClusterError

GOOD = """\
hosts:
  - name: db1
    replication: db1.example.com:7788
    control: {via: local, socket: /run/remusdb/db1/remusdbd.sock}
    metrics: db1.example.com:9187
  - name: db2
    replication: 192.0.2.2
    control:
      via: ssh
      target: root@db2.example.com
      port: 2222
      identity_file: /root/.ssh/remusdb
      known_hosts_file: /etc/remusdb/known_hosts
      socket: /run/remusdb/db2/remusdbd.sock
      command: /opt/remusdb/bin/remusdb
  - name: db3
    replication: "[2001:db8::3]:7799"
    control: {via: ssh, target: db3}
etcd: [http://etcd1.example.com:2379, "http://192.0.2.5:2379"]
key_file: /var/lib/remusdb/psk
bridge: br0
default_host: db1
fork:
  clone_addresses: [192.0.2.51, 192.0.2.52]
  prefix_len: 24
  db_user: replicator
  db_password_file: /etc/remusdb/replicator.password
"""


def problems(text):
    with pytest.raises(ClusterError) as e:
        cluster.parse(text, "c.yml")
    return e.value.problems


def test_a_complete_file_gives_what_it_says():
    c = cluster.parse(GOOD, "c.yml")
    assert c.names() == ["db1", "db2", "db3"]
    db1, db2, db3 = (c.host(n) for n in c.names())
    assert db1.replication == ("db1.example.com", 7788) and db1.metrics == ("db1.example.com", 9187)
    assert db1.control.via == "local" and db1.control.socket == "/run/remusdb/db1/remusdbd.sock"
    assert db2.replication == ("192.0.2.2", 7788)  # the default port
    assert db2.control.ssh_argv("control-relay", "--socket", db2.control.socket) == [
        "ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-p", "2222",
        "-i", "/root/.ssh/remusdb", "-o", "IdentitiesOnly=yes",
        "-o", "UserKnownHostsFile=/etc/remusdb/known_hosts", "-o", "StrictHostKeyChecking=yes",
        "--", "root@db2.example.com",
        "/opt/remusdb/bin/remusdb control-relay --socket /run/remusdb/db2/remusdbd.sock"]
    assert db3.replication == ("2001:db8::3", 7799) and db3.replication_text == "[2001:db8::3]:7799"
    # A socket not given is the systemd unit's; the remote command remusdb on PATH.
    assert db3.control.socket.endswith("/db3/remusdbd.sock") and db3.control.command == "remusdb"
    assert c.etcd == ["http://etcd1.example.com:2379", "http://192.0.2.5:2379"]
    assert (c.key_file, c.bridge, c.the_default_host()) == ("/var/lib/remusdb/psk", "br0", "db1")
    assert c.fork.clone_addresses == ["192.0.2.51", "192.0.2.52"]
    assert (c.fork.prefix_len, c.fork.db_user) == (24, "replicator")


def test_a_minimal_file_loads_and_its_only_local_host_is_the_default():
    c = cluster.parse("hosts:\n  - {name: a, replication: 10.0.0.1:7788, "
                      "control: {via: local}}\n  - {name: b, replication: b.lan, "
                      "control: {via: ssh, target: b.lan}}\n", "c.yml")
    assert c.the_default_host() == "a" and c.etcd == [] and c.bridge is None


def test_no_default_host_and_two_local_hosts_asks_for_host():
    c = cluster.parse("hosts:\n  - {name: a, replication: a:1, control: {via: local}}\n"
                      "  - {name: b, replication: b:1, control: {via: local}}\n", "c.yml")
    with pytest.raises(ClusterError) as e:
        c.the_default_host()
    assert "give --host (one of a, b)" in str(e.value)


def test_an_unknown_key_is_one_line_with_a_suggestion():
    assert problems(GOOD.replace("bridge:", "bridg:")) == [
        "c.yml: key 'bridg' is unknown (did you mean 'bridge'?)"]
    assert problems(GOOD.replace("socket: /run/remusdb/db2", "sokcet: /run/remusdb/db2")) == [
        "c.yml: hosts[1] (db2): control: key 'sokcet' is unknown (did you mean 'socket'?)"]
    assert problems(GOOD.replace("metrics:", "metric:")) == [
        "c.yml: hosts[0] (db1): key 'metric' is unknown (did you mean 'metrics'?)"]
    # A local host has no ssh keys: a target there is a mistake, said as one.
    [line] = problems(GOOD.replace("{via: local,", "{via: local, target: x,"))
    assert line.startswith("c.yml: hosts[0] (db1): control: key 'target' is unknown")


def test_a_missing_field_names_the_host_and_the_field():
    assert problems(GOOD.replace("    replication: 192.0.2.2\n", "")) == [
        "c.yml: hosts[1] (db2): missing `replication:`"]
    assert problems(GOOD.replace("    control: {via: ssh, target: db3}\n", "")) == [
        "c.yml: hosts[2] (db3): missing `control:`"]
    assert problems(GOOD.replace("control: {via: ssh, target: db3}",
                                 "control: {via: ssh}")) == [
        "c.yml: hosts[2] (db3): control: `via: ssh` needs `target: [USER@]HOST`"]
    assert problems("etcd: http://e:2379\n") == [
        "c.yml: missing `hosts:`, a list of at least one host"]


def test_a_host_named_twice_is_refused():
    text = GOOD.replace("  - name: db3\n", "  - name: db1\n").replace("default_host: db1\n", "")
    assert problems(text) == ["c.yml: hosts[2]: host 'db1' is named twice (hosts[0] and hosts[2])"]


@pytest.mark.parametrize("address, says", [
    ("db1.example.com:99999", "'db1.example.com:99999': the port must be 1..65535"),
    ("db1.example.com:0", "'db1.example.com:0': the port must be 1..65535"),
    ("db1.example.com:x", "'db1.example.com:x': the port must be 1..65535"),
    ("db_1.example.com:7788", "'db_1.example.com' is neither an IP address nor a DNS name"),
    ("-db1:7788", "'-db1' is neither an IP address nor a DNS name"),
    ("10.0.0.300:7788", "'10.0.0.300' is neither an IP address nor a DNS name"),
    ("2001:db8::1:7788", "'2001:db8::1:7788': write an IPv6 address as [ADDRESS]:PORT"),
    ('"[db1]:7788"', "'db1' is not an IPv6 address"),
    ("''", "must be HOST:PORT, not ''"),
])
def test_a_bad_replication_address_says_why(address, says):
    assert problems(GOOD.replace("replication: db1.example.com:7788",
                                 f"replication: {address}")) == [
        f"c.yml: hosts[0] (db1): replication: {says}"]


def test_a_metrics_address_needs_its_port():
    assert problems(GOOD.replace("metrics: db1.example.com:9187", "metrics: db1.example.com")) == [
        "c.yml: hosts[0] (db1): metrics: 'db1.example.com' has no :PORT"]


def test_every_problem_is_reported_one_line_each():
    lines = problems("""hosts:
  - name: a b
    replication: x:1
    control: {via: telnet}
  - name: ok
    replication: ok:1
    control: {via: ssh, target: "root@", port: 70000, socket: relative.sock}
    exec_prefix: echo
etcd: ftp://x
key_file: psk
default_host: nobody
colour: blue
fork: {clone_addresses: [10.0.0.1, 10.0.0.1, banana], prefix_len: 0}
""")
    assert all(line.startswith("c.yml: ") and "\n" not in line for line in lines)
    joined = "\n".join(lines)
    for fragment in ("hosts[0]: name: 'a b' is not a host name",
                     "hosts[0]: control: via: must be local or ssh, not 'telnet'",
                     "hosts[1] (ok): control: port: must be a port 1..65535, not 70000",
                     "hosts[1] (ok): control: socket: must be an absolute path",
                     "hosts[1] (ok): control: target: must be [USER@]HOST, not 'root@'",
                     "hosts[1] (ok): exec_prefix: must be a list of strings",
                     "etcd: 'ftp://x' is not an etcd client URL",
                     "key_file: must be an absolute path, not 'psk'",
                     "default_host: 'nobody' is not one of the hosts (a b, ok)",
                     "key 'colour' is unknown",
                     "fork: clone_addresses: 'banana' is not an IP address",
                     "fork: clone_addresses: '10.0.0.1' is listed twice",
                     "fork: prefix_len: must be 1..128, not 0"):
        assert fragment in joined, (fragment, joined)
    assert len(lines) == 13, lines


def test_yaml_syntax_errors_name_the_line_and_a_list_is_not_a_cluster():
    [line] = problems("hosts:\n  - [oops\n")
    assert line.startswith("c.yml:") and "not valid YAML" in line
    assert problems("- hosts\n") == [
        "c.yml: expected `hosts:` and the cluster's settings, got a list"]
    assert problems("") == ["c.yml: expected `hosts:` and the cluster's settings, got nothing"]


def test_a_missing_file_says_how_to_name_one(tmp_path, monkeypatch):
    monkeypatch.setenv("REMUSDB_CLUSTER", str(tmp_path / "none.yml"))
    with pytest.raises(ClusterError) as e:
        cluster.load()
    assert str(e.value).startswith(f"no cluster file at {tmp_path}/none.yml: write one")


def test_current_reads_the_file_again_when_it_changes(tmp_path):
    f = tmp_path / "c.yml"
    f.write_text("hosts:\n  - {name: a, replication: a:1, control: {via: local}}\n")
    cluster.use(f)
    try:
        assert cluster.current().names() == ["a"]
        f.write_text("hosts:\n  - {name: b, replication: b:1, control: {via: local}}\n"
                     "  - {name: c, replication: c:1, control: {via: local}}\n")
        assert cluster.current().names() == ["b", "c"]
    finally:
        cluster.use(None)


def test_host_at_finds_a_host_by_its_address_and_port():
    c = cluster.parse(GOOD, "c.yml")
    assert c.host_at("192.0.2.2:7788").name == "db2"
    assert c.host_at("192.0.2.2:7789") is None   # another port: another daemon
    assert c.host_at("192.0.2.9:7788") is None
    with pytest.raises(ClusterError) as e:
        c.host("db9")
    assert str(e.value) == "c.yml names no host 'db9': the hosts are db1, db2, db3"


def test_the_documented_example_is_valid():
    example = Path(__file__).resolve().parents[2] / "docs" / "examples" / "cluster.yml"
    c = cluster.load(example)
    assert c.names() == ["db1", "db2"] and c.host("db2").control.via == "ssh"
    assert c.the_default_host() == "db1" and len(c.etcd) == 3
