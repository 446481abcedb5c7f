"""Rolling upgrades: daemons of different replication protocol versions
(docs/protocol.md, section 7, "Versions and upgrades").

- This tree's daemon (versions 1..3) as primary protects a VM to the
  previous release's daemon (da66a9f, version 1 only, built from the
  repository's history by old_daemon.py): the old backup refuses the
  offer of 3 with its plain ERROR(1), the primary connects again with 1,
  and the protection reaches "protected" at protocol 1: the version
  binding (the range in each nonce, the version in version 3's MACs)
  costs an old peer nothing. The control: the same VM protected to this
  tree's backup runs at protocol 3, whose MACs bind the version.
- A primary built to speak 4..4 only (make remusdbd-proto) against this
  tree's backup: no common version, so `protect` fails within seconds
  with the one line that names both ranges, in the primary's status, and
  the backup logs its refusal in one line.

Each daemon is started from its binary through REMUSDBD_BINARY (lab/vm.py);
the VM is restored from its saved guest (conftest.py)."""
import os
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from remusdb import paths, protection
from remusdb.drill.lab import forget_ownership, stop_vm_everywhere
from remusdb.lab import vm

import old_daemon

REPO = Path(__file__).resolve().parents[2]
DAEMON_DIR = REPO / "dom0-daemon"
NAME = "vskew"
BACKUP = f"10.77.0.2:{vm.REPLICATION_PORT}"


class Binaries:
    """The previous release's remusdbd (old), and this tree's built to speak
    4..4 (proto_4_4()). The 4..4 build (every daemon source compiled again
    into objects of its own, build/obj/proto-4-4: tens of seconds on a fresh
    checkout) goes on in the background, niced, while the first test runs
    on the old daemon."""

    def __init__(self):
        # This tree's daemon first, in the foreground: the tests start it.
        subprocess.run(["make", "-s", "-C", str(DAEMON_DIR), "build/remusdbd"], check=True)
        # Unoptimized (CFLAGS comes after the Makefile's -O2): it builds in
        # half the time, and what it is for, the versions it offers and the
        # refusal it reports, does not depend on the optimizer.
        self.proto_make = subprocess.Popen(
            ["nice", "-n", "10", "make", "-s", "-C", str(DAEMON_DIR), "remusdbd-proto",
             "PROTO_MIN=4", "PROTO_MAX=4", "CFLAGS=-O0"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            self.old = old_daemon.build(old_daemon.PREVIOUS_RELEASE)
        except BaseException:
            self.finish()
            raise

    def finish(self):
        """Waits for the 4..4 build; its output."""
        out, _ = self.proto_make.communicate(timeout=900)
        return out

    def proto_4_4(self):
        out = self.finish()
        assert self.proto_make.returncode == 0, f"make remusdbd-proto failed:\n{out}"
        return DAEMON_DIR / "build" / "proto" / "remusdbd-proto-4-4"


@pytest.fixture(scope="module")
def binaries():
    b = Binaries()
    yield b
    b.finish()  # not left running when the module's tests did not need it


def start_daemon(host, binary=None):
    """(Re)starts the host's remusdbd, from binary (None: this tree's build)."""
    vm.stop_daemon(host)
    before = os.environ.get("REMUSDBD_BINARY")
    if binary:
        os.environ["REMUSDBD_BINARY"] = str(binary)
    else:
        os.environ.pop("REMUSDBD_BINARY", None)
    try:
        vm.ensure_daemon(host)
    finally:
        if before is None:
            os.environ.pop("REMUSDBD_BINARY", None)
        else:
            os.environ["REMUSDBD_BINARY"] = before


class LogTail:
    """What a host's remusdbd.log gained since this was made."""

    def __init__(self, host):
        self.path = paths.host_run_dir(host) / "remusdbd.log"
        self.start = self.path.stat().st_size if self.path.exists() else 0

    def text(self):
        with open(self.path, "rb") as f:
            f.seek(self.start)
            return f.read().decode(errors="replace")

    def lines_with(self, needle):
        return [line for line in self.text().splitlines() if needle in line]


@contextmanager
def guest(primary_binary=None, backup_binary=None):
    """The VM restored on the primary, the daemons started from the binaries
    given; afterwards the VM is gone and both daemons are stopped, so that
    the next test starts this tree's."""
    stop_vm_everywhere(NAME)
    forget_ownership(NAME)
    start_daemon("primary", primary_binary)
    start_daemon("backup", backup_binary)
    try:
        vm.start(NAME, "primary", from_saved=True, wait=False)
        yield
    finally:
        stop_vm_everywhere(NAME)
        vm.stop_daemon("primary")
        vm.stop_daemon("backup")


def protect_and_check_protocol(expected, timeout=300):
    forget_ownership(NAME)
    protection.protect(NAME, BACKUP, 50)
    p = protection.wait_protected(NAME, timeout=timeout)
    print({k: p.get(k) for k in ("state", "protocol", "epochs", "peer")})
    assert p["state"] == "protected"
    assert p["protocol"] == expected, p
    protection.unprotect(NAME)
    return p


def test_new_primary_protects_to_the_previous_release(lab, binaries):
    primary_log, backup_log = LogTail("primary"), LogTail("backup")
    with guest(backup_binary=binaries.old):
        protect_and_check_protocol(1)
        # The old backup refused the offer of 3 once, in its own words;
        # the primary then asked for 1, which it took.
        refusals = backup_log.lines_with("the peer speaks replication protocol version 3, "
                                         "we speak 1")
        assert len(refusals) == 1, backup_log.text()[-3000:]
        retries = primary_log.lines_with(f"backup {BACKUP} speaks replication protocol 1..1, "
                                         "not 3: connecting again with version 1")
        assert len(retries) == 1, primary_log.text()[-3000:]
        assert primary_log.lines_with(f"({BACKUP}), replication protocol 1")

        # Control: the same primary and VM against this tree's backup agree
        # on 3 without a retry, so `protocol` tells the two apart.
        start_daemon("backup")
        primary_log = LogTail("primary")
        protect_and_check_protocol(3)
        assert not primary_log.lines_with("connecting again")


def test_disjoint_versions_are_refused_in_one_line(lab, binaries):
    primary_log, backup_log = LogTail("primary"), LogTail("backup")
    want = (f"backup {BACKUP} speaks replication protocol 1..3, this daemon 4..4: "
            "upgrade the older daemon (the backup's) first")
    with guest(primary_binary=binaries.proto_4_4()):
        forget_ownership(NAME)
        began = time.monotonic()
        protection.protect(NAME, BACKUP, 50)
        with pytest.raises(protection.ProtectionError) as e:
            protection.wait_protected(NAME, timeout=30)
        took = time.monotonic() - began
        print(f"refused after {took:.2f} s: {e.value}")
        assert took < 10
        assert str(e.value).endswith(want)
        p = protection.primary_protection("primary", NAME)
        assert p["state"] == "failed" and p["error"] == want and p["protocol"] is None, p
        assert len(primary_log.lines_with(want)) == 1, primary_log.text()[-3000:]
        # The backup: one line, its range and what the primary offered.
        refusal = ("supported 1..3; the primary offers replication protocol 4, this daemon "
                   "speaks 1..3: the primary retries with 3 if it speaks it, otherwise "
                   "upgrade this daemon first")
        lines = backup_log.lines_with("replication: refusing 10.77.0.1:")
        assert len(lines) == 1 and lines[0].endswith(refusal), backup_log.text()[-3000:]
        # No second attempt: there is no version to retry with.
        assert not primary_log.lines_with("connecting again")
