"""An `ssh` for the CLI's tests without a network: put first on PATH, it
records its options, target and command beside itself (files options,
targets, commands), then runs the command here as the far host's shell
would, with the far host's cluster file (far.yml beside it) if the test
wrote one. sshd itself is exercised by tests/integration/test_cluster_remote.py."""
import os

FAKE_SSH = """#!/bin/sh
here="$(dirname "$0")"
while [ "$1" != "--" ]; do echo "$1" >> "$here/options"; shift; done
shift; echo "$1" >> "$here/targets"; shift
echo "$1" >> "$here/commands"
if [ -f "$here/far.yml" ]; then REMUSDB_CLUSTER="$here/far.yml"; export REMUSDB_CLUSTER; fi
exec sh -c "$1"
"""


def put_fake_ssh_on_path(tmp_path, monkeypatch):
    """The fake ssh's directory, first on PATH for the test."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ssh = bin_dir / "ssh"
    ssh.write_text(FAKE_SSH)
    ssh.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return bin_dir
