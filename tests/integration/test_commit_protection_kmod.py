"""The commit-protection module (guest-kmod/remusdb_cp) in a real guest:
it is loaded at boot, and its selftests (tools/guest/src/rdb-cp-selftest.c,
TAP) pass inside the guest: option round-trips on IPv4 and IPv6 TCP, the
DSCP mark seen on the wire by a packet socket, an unprivileged owner,
the refusals, and an unload with a protected socket open. The control:
with the module unloaded, the same selftests fail."""
import pytest
from conftest import fresh_guest

from remusdb import guest_agent
from remusdb.lab import vm

NAME = "cpkmod"
SELFTEST = "/usr/local/bin/rdb-cp-selftest"


@pytest.fixture(scope="module")
def guest(lab):
    with fresh_guest(NAME, backup_daemon=False):
        yield vm.vm_files("primary", NAME)["qga"]


def run(qga, argv, timeout=60):
    r = guest_agent.run(qga, argv, timeout=timeout)
    # Indented: the control's expected "not ok" lines, printed in the CI
    # log with -rP, must not read as a failing TAP test to a log scanner.
    shown = "".join(f"    {line}\n" for line in (r["out"] + r["err"]).splitlines())
    print(f"$ {' '.join(argv)} -> exit {r['exitcode']}\n{shown}", end="")
    return r


def test_module_is_loaded_at_boot(guest):
    r = run(guest, ["/bin/cat", "/sys/kernel/remusdb_cp/dscp", "/proc/modules"])
    assert r["exitcode"] == 0
    assert r["out"].splitlines()[0] == "47", r["out"]
    assert any(line.startswith("remusdb_cp ") for line in r["out"].splitlines())


def test_selftests_pass_in_the_guest(guest):
    r = run(guest, [SELFTEST])
    lines = r["out"].splitlines()
    assert "1..8" in lines, r["out"]
    assert [x for x in lines if x.startswith("ok ")] and not [
        x for x in lines if x.startswith("not ok")], r["out"]
    assert len([x for x in lines if x.startswith("ok ")]) == 8, r["out"]
    assert r["exitcode"] == 0


def test_selftests_fail_without_the_module(guest):
    assert run(guest, ["/sbin/rmmod", "remusdb_cp"])["exitcode"] == 0
    try:
        r = run(guest, [SELFTEST])
        assert r["exitcode"] != 0
        assert "not ok 1 - the module is loaded" in r["out"], r["out"]
    finally:
        assert run(guest, ["/sbin/modprobe", "remusdb_cp"])["exitcode"] == 0
