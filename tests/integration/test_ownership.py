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
import time
from pathlib import Path

from remusdb import ownership, paths, protection
from remusdb.lab import vm, witness
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


def unprotect_and_forget(name):
    """What each test leaves: the VM unprotected and no owner in etcd."""
    try:
        protection.unprotect(name, "primary")
    except protection.ProtectionError:
        pass
    forget_ownership(name)


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
        unprotect_and_forget(name)


def test_protect_waits_out_a_stalled_etcd_and_fails_clearly_past_its_patience(db_vm):
    """etcd that accepts connections but answers nothing (every member
    SIGSTOPped, as in a slow fsync or a leader election) only delays the
    claim: `protect` asks again and succeeds once etcd answers, and the
    daemon's log names each missed try. Silent for longer than the
    claim's patience (10 s), it fails `protect` in one line naming etcd,
    and nobody else is named the owner."""
    name = db_vm["name"]
    vm.ensure_daemon("backup")
    forget_ownership(name)
    log = paths.host_run_dir("primary") / "remusdbd.log"
    log_start = log.stat().st_size
    protect = [str(REMUSDB), "protect", name, "--backup", "backup", "--interval", "50",
               "--timeout", "300"]
    try:
        with witness.stalled():
            proc = subprocess.Popen(protect, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)
            time.sleep(3)
        out, err = proc.communicate(timeout=300)
        print(out, err)
        assert proc.returncode == 0, err
        assert ownership.owner(name) == {"owner": "primary", "generation": 1}
        with open(log, encoding="utf-8", errors="replace") as f:
            f.seek(log_start)
            news = f.read()
        assert f"vm {name}: etcd did not answer the claim (try 1" in news, news[-3000:]
        protection.unprotect(name, "primary")
        forget_ownership(name)

        started = time.monotonic()
        with witness.stalled():
            r = remusdb(*protect[1:], check=False)
        waited = time.monotonic() - started
        assert r.returncode == 1, r.stderr
        assert "cannot reach etcd" in r.stderr and "still failing after 10000 ms" in r.stderr, \
            r.stderr
        assert waited < 60, f"protect failed only after {waited:.0f} s"
        # The tries etcd received while stopped are still in its sockets
        # and may be applied when it resumes: at most this host's claim,
        # which the next `protect` from here goes on from.
        assert ownership.owner(name) in (None, {"owner": "primary", "generation": 1})
    finally:
        unprotect_and_forget(name)
