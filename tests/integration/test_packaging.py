"""The Debian package and `make install` (docs/packaging.md), without the
lab and without touching the host: the package is built by
dpkg-buildpackage in a temporary copy of the tree (nothing is left in the
repository), checked by lintian (an error fails the test; a warning fails
it unless docs/packaging.md explains that tag), unpacked with `dpkg -x`
into a temporary directory, and its programs run from there."""
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PYTHON = "/usr/bin/python3"
# Where the Debian package (and `make install`, Debian's layout) puts the
# Python package, under the prefix.
SITE = "lib/python3/dist-packages"
WANTED = [
    "usr/sbin/remusdbd",
    "usr/lib/remusdb/remusdbd-pagesrc",
    "usr/bin/remusdb",
    "usr/bin/remusdb-protect",
    "usr/bin/remusdb-drill",
    "usr/bin/remusdb-fork",
    "usr/bin/remusdb-libvirt-takeover",
    f"usr/{SITE}/remusdb/protection.py",
    f"usr/{SITE}/remusdb/protect_config.py",
    f"usr/{SITE}/remusdb/cli/main.py",
    "lib/systemd/system/remusdbd@.service",
    "etc/libvirt/hooks/qemu.d/remusdb",
    "usr/share/man/man8/remusdbd.8.gz",
    "usr/share/man/man1/remusdb.1.gz",
    "usr/share/man/man1/remusdb-protect.1.gz",
    "usr/share/man/man1/remusdb-drill.1.gz",
    "usr/share/man/man1/remusdb-fork.1.gz",
    "usr/share/man/man1/remusdb-libvirt-takeover.1.gz",
    "usr/share/doc/remusdb/examples/protect-db.yml",
    "usr/share/doc/remusdb/examples/remusdbd.conf",
    "usr/share/remusdb/prometheus/remusdb-alerts.yml",
    "usr/share/doc/remusdb/examples/cluster.yml",
    "usr/share/doc/remusdb/copyright",
]


def tree_copy(dest):
    """The working tree as git sees it (tracked and new files, not ignored
    ones such as dom0-daemon/build)."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                           check=True, capture_output=True).stdout.split(b"\0")
    for name in filter(None, files):
        src = REPO / os.fsdecode(name)
        if src.is_file():
            (dest / os.fsdecode(name)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / os.fsdecode(name))


def repo_state():
    return subprocess.run(["git", "status", "--porcelain", "--ignored"], cwd=REPO,
                          check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    before = repo_state()
    work = tmp_path_factory.mktemp("deb")
    src = work / "remusdb"
    tree_copy(src)
    env = dict(os.environ, DEB_BUILD_OPTIONS="nocheck")
    r = subprocess.run(["dpkg-buildpackage", "-us", "-uc", "-b"], cwd=src, env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert repo_state() == before, "the package build changed the repository"
    debs = list(work.glob("remusdb_*_*.deb"))
    assert len(debs) == 1, list(work.iterdir())
    qemu_debs = list(work.glob("remusdb-qemu_*_*.deb"))
    assert len(qemu_debs) == 1, list(work.iterdir())
    root = work / "root"
    subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(root)], check=True)
    subprocess.run(["dpkg-deb", "-x", str(qemu_debs[0]), str(root)], check=True)
    return {"deb": debs[0], "qemu_deb": qemu_debs[0],
            "changes": next(work.glob("remusdb_*.changes")), "root": root, "src": src}


def explained_tags():
    """Tags docs/packaging.md explains, in its lintian section: `tag-name`."""
    text = (REPO / "docs" / "packaging.md").read_text()
    section = text.split("## Lintian", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"`([a-z0-9][a-z0-9+.-]+)`", section))


def test_lintian_has_no_errors_and_every_warning_is_explained(built):
    r = subprocess.run(["lintian", "--pedantic", "--display-info", str(built["changes"])],
                       capture_output=True, text=True)
    tags = [line for line in r.stdout.splitlines() if re.match(r"^[EWIP]: ", line)]
    errors = [t for t in tags if t.startswith("E: ")]
    assert not errors, "\n".join(errors)
    explained = explained_tags()
    unexplained = [t for t in tags if t.startswith("W: ") and t.split()[2] not in explained]
    assert not unexplained, ("lintian warnings docs/packaging.md does not explain:\n"
                             + "\n".join(unexplained))


def test_lintian_check_fails_on_a_broken_package(built, tmp_path):
    """Negative control: the same package with its copyright file gone is
    a lintian error, so the check above can fail."""
    pkg = tmp_path / "pkg"
    subprocess.run(["dpkg-deb", "-R", str(built["deb"]), str(pkg)], check=True)
    (pkg / "usr/share/doc/remusdb/copyright").unlink()
    bad = tmp_path / "remusdb_0_amd64.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-b", str(pkg), str(bad)], check=True,
                   capture_output=True)
    r = subprocess.run(["lintian", str(bad)], capture_output=True, text=True)
    assert re.search(r"^E: remusdb: no-copyright-file", r.stdout, re.M), r.stdout


def test_the_package_holds_the_programs_units_and_man_pages(built):
    root = built["root"]
    missing = [p for p in WANTED if not (root / p).exists()]
    assert not missing, missing
    for p in ("usr/sbin/remusdbd", "usr/lib/remusdb/remusdbd-pagesrc", "usr/bin/remusdb"):
        assert os.access(root / p, os.X_OK), p
    unit = (root / "lib/systemd/system/remusdbd@.service").read_text()
    assert "ExecStart=/usr/sbin/remusdbd --config /etc/remusdb/%i.conf" in unit
    assert "Type=notify" in unit and "@" not in unit.split("[Unit]", 1)[1].replace(
        "remusdbd@", "")  # every @PLACEHOLDER@ substituted
    # The example configuration is the operator's, not the lab's: one key
    # path, placeholders where the lab's addresses were.
    conf = (root / "usr/share/doc/remusdb/examples/remusdbd.conf").read_text()
    assert "10.77.0." not in conf and "psk-file = /etc/remusdb/psk\n" in conf, conf
    rules = root / "usr/share/remusdb/prometheus/remusdb-alerts.yml"
    assert rules.read_text() == (REPO / "dist/prometheus/remusdb-alerts.yml").read_text()


def test_the_unpacked_programs_run(built):
    """remusdbd and the CLI from the unpacked tree: the console scripts
    find their package on PYTHONPATH (installed: /usr/bin/python3's own
    dist-packages), and the package finds remusdbd in ../sbin, not in a
    repository (there is none beside it)."""
    root = built["root"]
    env = dict(os.environ, PYTHONPATH=str(root / "usr" / SITE))
    r = subprocess.run([str(root / "usr/sbin/remusdbd"), "--help"], capture_output=True,
                       text=True)
    assert r.returncode == 0 and "--psk-file" in r.stdout, r.stderr
    for cmd in (["remusdb", "--help"], ["remusdb", "protect", "--help"],
                ["remusdb-protect", "--help"], ["remusdb-drill", "--help"]):
        r = subprocess.run([PYTHON, str(root / "usr/bin" / cmd[0]), *cmd[1:]],
                           capture_output=True, text=True, cwd="/", env=env)
        assert r.returncode == 0, (cmd, r.stderr)
        assert "usage:" in r.stdout, (cmd, r.stdout)
    # libvirt's owner hook: executable, on the package's path (libvirt gives
    # hooks no PYTHONPATH), and a domain not wired to remusdbd passes.
    hook = root / "etc/libvirt/hooks/qemu.d/remusdb"
    assert os.access(hook, os.X_OK)
    assert f"PYTHONPATH=/usr/{SITE}\n" in hook.read_text()
    r = subprocess.run([PYTHON, "-m", "remusdb.cli.libvirt_hook", "db", "prepare", "begin", "-"],
                       input="<domain><name>db</name><devices/></domain>", capture_output=True,
                       text=True, env=env, cwd="/")
    assert r.returncode == 0, r.stderr
    r = subprocess.run([PYTHON, "-c", "from remusdb import libvirt, paths; "
                        "print(paths.INSTALLED, paths.REMUSDBD, libvirt.LAUNCHER)"],
                       capture_output=True, text=True, env=env, cwd="/")
    assert r.stdout.split() == ["True", str(root / "usr/sbin/remusdbd"),
                                str(root / "usr/bin/remusdb-libvirt-takeover")], (
        r.stdout + r.stderr)


def sections(binary, tmp_path, names=(".text", ".rodata", ".data")):
    """The bytes of an ELF file's code and data sections, which stripping
    leaves alone."""
    out = {}
    for name in names:
        dump = tmp_path / f"{binary.name}{name}"
        subprocess.run(["objcopy", "-O", "binary", f"--only-section={name}", str(binary),
                        str(dump)], capture_output=True, check=True)
        out[name] = dump.read_bytes()
        assert out[name], f"{binary} has no {name}"
    return out


def test_remusdb_qemu_is_the_lab_s_patched_qemu(built, tmp_path):
    """remusdb-qemu holds the build of `make qemu` (the same recipe, byte
    for byte on this host), remusdb depends on it, and the relocated
    binary starts and answers QMP with Debian's firmware on -L."""
    from remusdb import paths
    qemu = built["root"] / "usr/lib/remusdb/qemu/bin/qemu-system-x86_64"
    lab_qemu = paths.CACHE / "qemu" / "current" / "bin" / "qemu-system-x86_64"
    # dh_strip drops the symbol table, so the code and data are compared
    (tmp_path / "pkg").mkdir()
    (tmp_path / "lab").mkdir()
    assert sections(qemu, tmp_path / "pkg") == sections(lab_qemu, tmp_path / "lab"), \
        "not the build of make qemu"
    # Negative control: one byte of code changed in a copy is caught.
    headers = subprocess.run(["objdump", "-h", str(qemu)], capture_output=True, text=True,
                             check=True).stdout
    text_offset = int(next(line.split()[5] for line in headers.splitlines()
                           if line.split()[1:2] == [".text"]), 16)
    changed = tmp_path / "qemu-one-byte-changed"
    data = bytearray(qemu.read_bytes())
    data[text_offset + 4096] ^= 0x01
    changed.write_bytes(data)
    (tmp_path / "changed").mkdir()
    assert sections(changed, tmp_path / "changed") != sections(qemu, tmp_path / "pkg")
    depends = subprocess.run(["dpkg-deb", "-f", str(built["deb"]), "Depends"],
                             capture_output=True, text=True, check=True).stdout
    assert re.search(r"\bremusdb-qemu \(= ", depends), depends
    assert "qemu-system-x86" not in depends, depends
    firmware = [a for d in paths.QEMU_FIRMWARE_DIRS for a in ("-L", d)]
    r = subprocess.run([str(qemu), *firmware, "-machine", "pc", "-accel", "tcg", "-m", "64",
                        "-display", "none", "-nodefaults", "-S", "-qmp", "stdio"],
                       input='{"execute": "qmp_capabilities"}\n'
                             '{"execute": "query-version"}\n{"execute": "quit"}\n',
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    replies = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
    versions = [m["return"]["qemu"] for m in replies
                if isinstance(m.get("return"), dict) and "qemu" in m["return"]]
    assert versions and (versions[0]["major"], versions[0]["minor"]) == (7, 2), r.stdout
    # installed, the tools run the package's QEMU (REMUSDB_QEMU unset)
    env = {k: v for k, v in os.environ.items() if k != "REMUSDB_QEMU"}
    env["PYTHONPATH"] = str(built["root"] / "usr" / SITE)
    r = subprocess.run([PYTHON, "-c", "from remusdb import paths; print(paths.qemu_binary())"],
                       capture_output=True, text=True, env=env, cwd="/")
    assert r.stdout.strip() == "/usr/lib/remusdb/qemu/bin/qemu-system-x86_64", r.stdout + r.stderr


def test_the_man_pages_render(built):
    for page in ("man8/remusdbd.8.gz", "man1/remusdb.1.gz"):
        r = subprocess.run(["man", "-l", str(built["root"] / "usr/share/man" / page)],
                           capture_output=True, text=True, env=dict(os.environ, MANWIDTH="80"))
        assert r.returncode == 0 and "SYNOPSIS" in r.stdout, r.stderr


def test_make_install_honors_prefix_and_destdir(built, tmp_path):
    """`make install` into a DESTDIR with PREFIX=/opt/rdb, in the package
    build's copy of the tree (its daemon is built already; the repository
    gets no build output)."""
    dest = tmp_path / "dest"
    r = subprocess.run(["make", "-s", "install", f"DESTDIR={dest}", "PREFIX=/opt/rdb"],
                       cwd=built["src"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    for p in ("opt/rdb/sbin/remusdbd", "opt/rdb/lib/remusdb/remusdbd-pagesrc",
              "opt/rdb/bin/remusdb", f"opt/rdb/{SITE}/remusdb/lab/vm.py",
              "opt/rdb/lib/systemd/system/remusdbd@.service",
              "opt/rdb/share/man/man8/remusdbd.8",
              "opt/rdb/share/remusdb/prometheus/remusdb-alerts.yml",
              "etc/libvirt/hooks/qemu.d/remusdb"):
        assert (dest / p).exists(), p
    assert f"PYTHONPATH=/opt/rdb/{SITE}\n" in (dest / "etc/libvirt/hooks/qemu.d/remusdb").read_text()
    unit = (dest / "opt/rdb/lib/systemd/system/remusdbd@.service").read_text()
    assert "ExecStart=/opt/rdb/sbin/remusdbd " in unit
    r = subprocess.run([PYTHON, str(dest / "opt/rdb/bin/remusdb"), "status", "--help"],
                       capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(dest / "opt/rdb" / SITE)))
    assert r.returncode == 0, r.stderr


# ------------------------------------------------- the packaged binaries at work

PACKAGED_VM = "pkgvm"


def test_the_packaged_daemon_and_qemu_protect_a_vm(built, lab):
    """The two packages' programs, unpacked, do the job: both hosts'
    remusdbd are the package's /usr/sbin/remusdbd and the VM runs the
    remusdb-qemu package's QEMU; the VM reaches "protected" and the
    backup commits epochs of it. What runs is read from /proc, not
    assumed from the environment the test set."""
    from remusdb import paths, protection
    from remusdb.drill.lab import forget_ownership, stop_vm_everywhere
    from remusdb.lab import vm
    root = built["root"]
    daemon = root / "usr/sbin/remusdbd"
    qemu = root / "usr/lib/remusdb/qemu/bin/qemu-system-x86_64"
    saved = {k: os.environ.get(k) for k in ("REMUSDBD_BINARY", "REMUSDB_QEMU")}

    def restore_env():
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    stop_vm_everywhere(PACKAGED_VM)
    forget_ownership(PACKAGED_VM)
    try:
        os.environ["REMUSDBD_BINARY"] = str(daemon)
        os.environ["REMUSDB_QEMU"] = str(qemu)
        for host in ("primary", "backup"):
            vm.stop_daemon(host)
            vm.ensure_daemon(host)
        # Booted, not restored: a saved guest is keyed by its QEMU binary's
        # identity, and each run unpacks a new one.
        vm.start(PACKAGED_VM, "primary", wait_timeout=400)
        for host in ("primary", "backup"):
            pid = int((paths.host_run_dir(host) / "remusdbd.pid").read_text())
            assert Path(f"/proc/{pid}/exe").resolve() == daemon.resolve(), host
        qemu_pid = int((paths.vm_run_dir("primary", PACKAGED_VM) / "qemu.pid").read_text())
        assert Path(f"/proc/{qemu_pid}/exe").resolve() == qemu.resolve()
        protection.protect(PACKAGED_VM, "10.77.0.2:7788", 100)
        protection.wait_protected(PACKAGED_VM, timeout=900)
        first = protection.replica("backup", PACKAGED_VM)["committed_epoch"]
        deadline = time.monotonic() + 60
        while protection.replica("backup", PACKAGED_VM)["committed_epoch"] < first + 10:
            assert time.monotonic() < deadline, "the backup committed no further epochs"
            time.sleep(0.5)
        assert protection.primary_protection("primary", PACKAGED_VM)["state"] == "protected"
    finally:
        stop_vm_everywhere(PACKAGED_VM)
        restore_env()
        for host in ("primary", "backup"):
            vm.stop_daemon(host)  # the next tests start the tree's own build
