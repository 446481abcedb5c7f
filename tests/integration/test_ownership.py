"""A VM's owner in etcd that outlived the VM (docs/witness.md, "An owner
that outlived its VM"): a new VM of the same name on the primary, while
etcd still names the backup (what a takeover by the backup leaves once
that VM is gone).

What must hold: `remusdb protect` is refused with a line that names
`remusdb owner retire VM --host primary`; `remusdb owner retire` refuses
while a host other than the one named by --host holds the VM, and while
a host's remusdbd cannot be asked (unless --host-is-down names it), and
a retire that read the key before a takeover wrote it erases nothing;
once it retires the owner, protection is accepted and etcd names the
primary."""
import subprocess
from pathlib import Path

from remusdb import ownership, protection
from remusdb.lab import vm
from remusdb.drill.lab import forget_ownership

REPO = Path(__file__).resolve().parents[2]
REMUSDB = REPO / "tools" / "remusdb"


def remusdb(*args, check=True):
    r = subprocess.run([str(REMUSDB), *args], capture_output=True, text=True, timeout=900)
    print(f"$ remusdb {' '.join(args)} -> {r.returncode}\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    if check:
        assert r.returncode == 0, r.stderr
    return r


def one_line(r):
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


def test_a_stale_owner_is_retired_only_when_nobody_else_holds_the_vm(db_vm):
    name = db_vm["name"]  # runs on the primary
    vm.ensure_daemon("backup")
    forget_ownership(name)
    try:
        ownership.set_owner(name, "backup", 2)

        r = remusdb("protect", name, "--backup", "backup", "--interval", "50",
                    "--timeout", "120", check=False)
        assert r.returncode == 1, r.stderr
        assert "owned by host backup (generation 2)" in r.stderr, r.stderr
        assert f"`remusdb owner retire {name} --host primary` clears the stale owner" \
            in r.stderr, r.stderr
        assert ownership.owner(name) == {"owner": "backup", "generation": 2}

        show = remusdb("owner", "show", name)
        assert "owned by backup (generation 2)" in show.stdout, show.stdout
        assert f"primary: VM {name}" in show.stdout, show.stdout

        # The primary runs the VM: without --host that copy counts.
        r = remusdb("owner", "retire", name, check=False)
        assert r.returncode == 1
        assert f"primary has VM {name}" in one_line(r), r.stderr
        assert ownership.owner(name) == {"owner": "backup", "generation": 2}

        # A takeover between the read and the delete: nothing is erased.
        read = ownership.record(name)
        ownership.set_owner(name, "backup", 3)
        retired, now = ownership.retire(name, read["mod_revision"])
        assert not retired and now["generation"] == 3, now
        assert ownership.owner(name) == {"owner": "backup", "generation": 3}

        # The owner's remusdbd cannot be asked: refused, naming it.
        vm.stop_daemon("backup")
        r = remusdb("owner", "retire", name, "--host", "primary", check=False)
        assert r.returncode == 1
        line = one_line(r)
        assert "cannot ask backup" in line and "--host-is-down backup" in line, line
        assert ownership.owner(name) == {"owner": "backup", "generation": 3}

        r = remusdb("owner", "retire", name, "--host", "primary", "--host-is-down", "backup")
        assert "retired the stale owner (owned by backup (generation 3))" in r.stdout, r.stdout
        assert ownership.owner(name) is None
        r = remusdb("owner", "retire", name, "--host", "primary")
        assert "etcd names no owner: nothing to retire" in r.stdout, r.stdout

        vm.ensure_daemon("backup")
        remusdb("protect", name, "--backup", "backup", "--interval", "50", "--timeout", "300")
        assert ownership.owner(name) == {"owner": "primary", "generation": 1}
        # The owner runs it now: it is not stale, and retire says so;
        # asked to keep the backup's copy instead, it finds the owner's
        # VM and the backup's live replica of it.
        r = remusdb("owner", "retire", name, "--host", "primary", check=False)
        assert r.returncode == 1 and "not stale" in one_line(r), r.stderr
        r = remusdb("owner", "retire", name, "--host", "backup", check=False)
        assert r.returncode == 1
        line = one_line(r)
        assert f"primary has VM {name}" in line and "replica of" in line, line
        assert ownership.owner(name) == {"owner": "primary", "generation": 1}
    finally:
        try:
            protection.unprotect(name, "primary")
        except protection.ProtectionError:
            pass
        forget_ownership(name)
