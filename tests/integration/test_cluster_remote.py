"""`remusdb status` run on one host of the cluster shows another host's
remusdbd through the cluster file's remote access: the CLI runs in the
primary's namespace with the cluster file as the primary sees it
(lab/cluster_file.py: the primary local, the backup through ssh to the
sshd the lab runs in the backup's namespace), as an operator would run
it on the primary. No VM.

Negative controls: the same file with the backup's host key replaced in
known_hosts is refused by ssh (so the answer did come over ssh, checked
against the host key), and a backup whose remusdbd is stopped shows as
unreachable, with the primary still listed."""
import json
import subprocess
import time
from pathlib import Path

from remusdb import cluster
from remusdb.lab import cluster_file, netns, sshd, vm

REPO = Path(__file__).resolve().parents[2]
REMUSDB = REPO / "tools" / "remusdb"


def status_from_primary(cluster_path, *args):
    began = time.monotonic()
    r = subprocess.run(["ip", "netns", "exec", netns.namespace_of("primary"), str(REMUSDB),
                        "--cluster", str(cluster_path), "status", *args],
                       capture_output=True, text=True, timeout=120)
    print(f"status {' '.join(args)}: exit {r.returncode} in {time.monotonic() - began:.2f} s\n"
          f"{r.stdout}{r.stderr}")
    return r


def test_status_on_the_primary_shows_the_backup_through_ssh(lab, tmp_path):
    vm.ensure_daemon("primary")
    vm.ensure_daemon("backup")
    path = cluster_file.from_host_path("primary")
    seen = cluster.load(path)
    assert seen.host("primary").control.via == "local"
    assert seen.host("backup").control.via == "ssh"

    r = status_from_primary(path)
    assert r.returncode == 0, r.stderr
    assert "host primary: remusdbd" in r.stdout.splitlines()
    assert "host backup: remusdbd" in r.stdout.splitlines()

    # The backup's own daemon answered (it names itself), over ssh.
    r = status_from_primary(path, "--host", "backup", "--json")
    assert r.returncode == 0, r.stderr
    reply = json.loads(r.stdout)["backup"]
    assert reply["ok"] and reply["host"] == "backup"

    # Control: another host key for the backup's address: ssh refuses,
    # and status says so on the backup's line.
    other_key = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other_key)],
                   check=True)
    address = netns.HOSTS["backup"][1]
    known = tmp_path / "known_hosts"
    known.write_text(f"{address} {other_key.with_suffix('.pub').read_text()}")
    forged = tmp_path / "cluster.yml"
    forged.write_text(path.read_text().replace(str(sshd.known_hosts()), str(known)))
    r = status_from_primary(forged)
    assert r.returncode == 0  # the primary still answers
    [line] = [x for x in r.stdout.splitlines() if x.startswith("host backup:")]
    assert line.startswith("host backup: unreachable (ssh root@") and \
        "Host key verification failed" in line, line

    # Control: the backup's remusdbd stopped: unreachable, one line, through ssh.
    vm.stop_daemon("backup")
    try:
        r = status_from_primary(path)
        [line] = [x for x in r.stdout.splitlines() if x.startswith("host backup:")]
        assert "unreachable" in line and "remusdbd is not running" in line, line
        assert "host primary: remusdbd" in r.stdout.splitlines()
    finally:
        vm.ensure_daemon("backup")
