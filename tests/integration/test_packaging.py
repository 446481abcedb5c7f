"""The Debian packages and `make install` (docs/packaging.md), without
touching the host: the packages are built by dpkg-buildpackage in a
temporary copy of the tree (nothing is left in the repository), and the
patched DBMS servers' packages by tools/setup/build-dbms-deb.sh into a
temporary directory; all are checked by lintian (an error fails the test;
a warning fails it unless docs/packaging.md explains that tag), unpacked
with `dpkg -x` into a temporary directory, and their programs run from
there (the DBMS packages' maintainer scripts in a throwaway dpkg root).
The last tests use the lab: the packaged daemon and QEMU protect a VM, and
the lab's guest image has the guest's packages installed, with the module
built by DKMS and loaded."""
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


# The packages these tests build are read (lintian, dpkg -x, dpkg -i) and
# thrown away: xz at level 1 instead of dpkg-deb's 6 makes the same files
# in an archive a tenth larger, in a tenth of the time (remusdb-qemu: 12 s
# at level 6 on two cores).  Nothing here checks the compression level;
# lintian checks the compressor, which stays xz.  dh_builddeb and
# build-dbms-deb.sh pass no -z, so dpkg-deb takes the level from here.
FAST_DEB = {"DPKG_DEB_COMPRESSOR_LEVEL": "1"}


def repo_state():
    return subprocess.run(["git", "status", "--porcelain", "--ignored"], cwd=REPO,
                          check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    before = repo_state()
    work = tmp_path_factory.mktemp("deb")
    src = work / "remusdb"
    tree_copy(src)
    # debian/rules runs make itself for the daemon, without -j; forced
    # mode puts -j<online CPUs> in MAKEFLAGS, which every make inherits.
    # (debian/rules is part of the guest image's cache key: editing it to
    # honour parallel=N would rebuild every machine's image.)
    env = dict(os.environ, DEB_BUILD_OPTIONS="nocheck", **FAST_DEB)
    r = subprocess.run(["dpkg-buildpackage", "-us", "-uc", "-b", "--jobs-force=auto"],
                       cwd=src, env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert repo_state() == before, "the package build changed the repository"
    debs = list(work.glob("remusdb_*_*.deb"))
    assert len(debs) == 1, list(work.iterdir())
    qemu_debs = list(work.glob("remusdb-qemu_*_*.deb"))
    assert len(qemu_debs) == 1, list(work.iterdir())
    guest_debs = list(work.glob("remusdb-guest_*_all.deb"))
    assert len(guest_debs) == 1, list(work.iterdir())
    root = work / "root"
    subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(root)], check=True)
    subprocess.run(["dpkg-deb", "-x", str(qemu_debs[0]), str(root)], check=True)
    guest_root = work / "guest-root"
    subprocess.run(["dpkg-deb", "-x", str(guest_debs[0]), str(guest_root)], check=True)
    return {"deb": debs[0], "qemu_deb": qemu_debs[0], "guest_deb": guest_debs[0],
            "changes": next(work.glob("remusdb_*.changes")), "root": root,
            "guest_root": guest_root, "src": src}


def explained_tags():
    """Tags docs/packaging.md explains, in its lintian section: `tag-name`."""
    text = (REPO / "docs" / "packaging.md").read_text()
    section = text.split("## Lintian", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"`([a-z0-9][a-z0-9+.-]+)`", section))


def lintian_problems(*targets):
    """lintian's errors, and its warnings docs/packaging.md does not
    explain, for .changes or .deb files (one lintian run: each tag line
    names its package)."""
    r = subprocess.run(["lintian", "--pedantic", "--display-info", *map(str, targets)],
                       capture_output=True, text=True)
    tags = [line for line in r.stdout.splitlines() if re.match(r"^[EWIP]: ", line)]
    explained = explained_tags()
    return [t for t in tags if t.startswith("E: ")
            or (t.startswith("W: ") and t.split()[2] not in explained)]


def test_lintian_has_no_errors_and_every_warning_is_explained(built):
    """The source package's three packages (remusdb, remusdb-qemu,
    remusdb-guest), through their .changes."""
    problems = lintian_problems(built["changes"])
    assert not problems, ("lintian errors, or warnings docs/packaging.md does not "
                          "explain:\n" + "\n".join(problems))


def test_lintian_check_fails_on_a_broken_package(built, tmp_path):
    """Negative control: the same package with its copyright file gone is
    a lintian error, so the check above can fail."""
    pkg = tmp_path / "pkg"
    subprocess.run(["dpkg-deb", "-R", str(built["deb"]), str(pkg)], check=True)
    (pkg / "usr/share/doc/remusdb/copyright").unlink()
    bad = tmp_path / "remusdb_0_amd64.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-b", str(pkg), str(bad)], check=True,
                   capture_output=True, env=dict(os.environ, **FAST_DEB))
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
        # Restored, not booted, from the saved guest of the tree's QEMU (made
        # once, by a boot): the package holds that build, stripped. A saved
        # guest is keyed by its QEMU binary's identity, and each run unpacks
        # a new one, so a key of the package's own would never be found.
        restore_env()
        os.environ.pop("REMUSDB_QEMU", None)
        entry = vm.saved_guest_dir(PACKAGED_VM, "primary")
        if not (entry / vm.SAVED_STATE).exists():
            vm.start(PACKAGED_VM, "primary", from_saved=True, wait_timeout=400)
            stop_vm_everywhere(PACKAGED_VM)
        os.environ["REMUSDBD_BINARY"] = str(daemon)
        os.environ["REMUSDB_QEMU"] = str(qemu)
        for host in ("primary", "backup"):
            vm.stop_daemon(host)
            vm.ensure_daemon(host)
        vm.restore(PACKAGED_VM, "primary", entry, wait_timeout=400)
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


# ------------------------------------------------------- the guest's packages

KMOD_SOURCES = ("Kbuild", "Makefile", "remusdb_cp.c", "remusdb_cp.h")
# (package, the Debian package it depends on exactly, the diverted binary)
DBMS_PACKAGES = {
    "postgresql": ("remusdb-postgresql-15-cp", "postgresql-15",
                   "usr/lib/postgresql/15/bin/postgres"),
    "mariadb": ("remusdb-mariadb-cp", "mariadb-server-core", "usr/sbin/mariadbd"),
}


def test_remusdb_guest_holds_the_module_as_dkms_source_and_the_fork_hook(built):
    root = built["guest_root"]
    version = subprocess.run(["dpkg-deb", "-f", str(built["guest_deb"]), "Version"],
                             capture_output=True, text=True, check=True).stdout.strip()
    src = root / f"usr/src/remusdb-cp-{version}"
    for name in KMOD_SOURCES:
        assert (src / name).read_bytes() == (REPO / "guest-kmod" / name).read_bytes(), name
    conf = (src / "dkms.conf").read_text()
    assert f'PACKAGE_VERSION="{version}"' in conf, conf  # dh_dkms -V filled it in
    assert 'PACKAGE_NAME="remusdb-cp"' in conf and 'BUILT_MODULE_NAME[0]="remusdb_cp"' in conf
    assert 'AUTOINSTALL="yes"' in conf
    loads = (root / "usr/lib/modules-load.d/remusdb_cp.conf").read_text().split("\n")
    assert "remusdb_cp" in loads, loads
    hook = root / "usr/libexec/remusdb/remusdb-clone-identity"
    assert os.access(hook, os.X_OK)
    assert hook.read_bytes() == (REPO / "guest-clone/remusdb-clone-identity").read_bytes()
    assert ". /usr/share/remusdb/clone-mariadb.sh\n" in hook.read_text()
    assert (root / "usr/share/remusdb/clone-mariadb.sh").read_bytes() == (
        REPO / "guest-clone/clone-mariadb.sh").read_bytes()
    from remusdb import clone_identity
    assert clone_identity.HOOK == "/usr/libexec/remusdb/remusdb-clone-identity"
    fields = {f: subprocess.run(["dpkg-deb", "-f", str(built["guest_deb"]), f],
                                capture_output=True, text=True, check=True).stdout.strip()
              for f in ("Architecture", "Depends")}
    assert fields["Architecture"] == "all"
    assert re.search(r"\bdkms\b", fields["Depends"]) and "qemu-guest-agent" in fields["Depends"]
    postinst = subprocess.run(["dpkg-deb", "--ctrl-tarfile", str(built["guest_deb"])],
                              capture_output=True, check=True).stdout
    assert b"/usr/lib/dkms/common.postinst" in postinst and b"DKMS_NAME=remusdb-cp" in postinst
    # the lab-only parts stay out of the product's package
    everything = [p.relative_to(root).as_posix() for p in root.rglob("*")]
    assert not [p for p in everything if "rdb-" in p or "bench" in p], everything


@pytest.fixture(scope="module")
def dbms_debs(tmp_path_factory):
    """remusdb-postgresql-15-cp and remusdb-mariadb-cp, packaged by their
    recipe from the cached patched builds (build-dbms.sh), side by side:
    each run packages its own server in its own staging directory, and
    spends most of its time in one-threaded dpkg-shlibdeps."""
    out = tmp_path_factory.mktemp("dbms-debs")
    runs = {which: subprocess.Popen(["bash", str(REPO / "tools/setup/build-dbms-deb.sh"), which,
                                     str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, env=dict(os.environ, **FAST_DEB))
            for which in DBMS_PACKAGES}
    debs = {}
    for which, run in runs.items():
        stdout, stderr = run.communicate()
        assert run.returncode == 0, f"build-dbms-deb.sh {which}: " + stderr[-3000:]
        debs[which] = Path(stdout.splitlines()[-1])
        assert debs[which].parent == out and debs[which].exists(), stdout
    return debs


def test_lintian_passes_the_dbms_packages(dbms_debs):
    problems = lintian_problems(*dbms_debs.values())
    assert not problems, ("lintian errors, or warnings docs/packaging.md does not "
                          "explain, for the DBMS packages:\n" + "\n".join(problems))


def test_the_dbms_packages_hold_the_cached_builds_and_pin_debian_s_version(dbms_debs, tmp_path):
    from remusdb import paths
    for which, (package, debian_package, target) in DBMS_PACKAGES.items():
        deb = dbms_debs[which]
        cached = paths.CACHE / "dbms" / which / "current"
        debian_version = (cached / "version").read_text().strip()
        fields = {f: subprocess.run(["dpkg-deb", "-f", str(deb), f], capture_output=True,
                                    text=True, check=True).stdout.strip()
                  for f in ("Package", "Version", "Depends")}
        assert fields["Package"] == package
        assert fields["Version"].startswith(debian_version + "+remusdb"), fields
        assert f"{debian_package} (= {debian_version})" in fields["Depends"].split(", "), fields
        assert "libc6" in fields["Depends"], fields  # dpkg-shlibdeps's
        root = tmp_path / which
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
        (tmp_path / f"{which}-cached").mkdir()
        assert sections(root / target, root) == sections(
            cached / Path(target).name, tmp_path / f"{which}-cached"), \
            f"{package} does not hold the cached build of build-dbms.sh"


def install_and_remove(deb, package, target, root):
    """Installs deb into a throwaway dpkg root that holds a stand-in for
    Debian's binary at target, then removes it; returns what target held
    and the diversions, after each step.  dpkg runs the maintainer scripts
    without chroot and with DPKG_ROOT set, which dpkg-divert honours; the
    host's dpkg database is not touched."""
    for d in ("var/lib/dpkg/info", "var/lib/dpkg/updates", Path(target).parent):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "var/lib/dpkg/status").touch()
    (root / target).write_bytes(b"Debian's server\n")
    dpkg = ["dpkg", f"--root={root}", "--force-script-chrootless", "--force-depends"]

    def state():
        held = (root / target).read_bytes() if (root / target).exists() else None
        diversions = subprocess.run(["dpkg-divert", f"--root={root}", "--list"],
                                    capture_output=True, text=True, check=True).stdout
        aside = (root / f"{target}.debian").exists()
        return {"held": held, "diversions": diversions, "aside": aside}

    states = []
    for step in (["-i", str(deb)], ["-r", package]):
        subprocess.run(dpkg + step, capture_output=True, check=True)
        states.append(state())
    return states


def diversion_faults(package, target, installed, removed):
    """What is wrong with the diversion's life cycle, as a list."""
    faults = []
    if installed["held"] == b"Debian's server\n" or not installed["aside"]:
        faults.append("installed: Debian's binary is not moved aside")
    if f"/{target} to /{target}.debian by {package}" not in installed["diversions"]:
        faults.append("installed: no diversion by the package")
    if removed["held"] != b"Debian's server\n" or removed["aside"]:
        faults.append("removed: Debian's binary is not back in its place")
    if removed["diversions"].strip():
        faults.append("removed: the diversion is left: " + removed["diversions"].strip())
    return faults


def test_the_dbms_packages_divert_debian_s_binary_until_removed(dbms_debs, tmp_path):
    for which, (package, _, target) in DBMS_PACKAGES.items():
        installed, removed = install_and_remove(dbms_debs[which], package, target,
                                                tmp_path / which)
        assert installed["held"].startswith(b"\x7fELF"), installed["held"][:16]
        assert not diversion_faults(package, target, installed, removed)


def test_the_diversion_check_catches_a_postrm_that_keeps_the_diversion(dbms_debs, tmp_path):
    """Negative control: the PostgreSQL package with its postrm's
    dpkg-divert --remove taken out (a one-line slip) leaves the diversion
    and Debian's binary aside, and the check says so."""
    package, _, target = DBMS_PACKAGES["postgresql"]
    pkg = tmp_path / "pkg"
    subprocess.run(["dpkg-deb", "-R", str(dbms_debs["postgresql"]), str(pkg)], check=True)
    postrm = pkg / "DEBIAN/postrm"
    text = postrm.read_text()
    slipped = re.sub(r"\t\tdpkg-divert [^\n]*\\\n[^\n]*--remove[^\n]*\n", "", text)
    assert slipped != text
    postrm.write_text(slipped)
    bad = tmp_path / "bad.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-b", str(pkg), str(bad)], check=True,
                   capture_output=True, env=dict(os.environ, **FAST_DEB))
    installed, removed = install_and_remove(bad, package, target, tmp_path / "root")
    faults = diversion_faults(package, target, installed, removed)
    assert any(f.startswith("removed: the diversion is left") for f in faults), faults


# ------------------------------------- the guest's packages in the lab's image

GUEST_VM = "pkgguest"
GUEST_PACKAGES = ("remusdb-guest", "remusdb-postgresql-15-cp", "remusdb-mariadb-cp")


@pytest.fixture(scope="module")
def guest(lab):
    from conftest import fresh_guest
    from remusdb.lab import vm
    with fresh_guest(GUEST_VM, backup_daemon=False):
        yield vm.vm_files("primary", GUEST_VM)["qga"]


def guest_sh(qga, script):
    from remusdb import guest_agent
    r = guest_agent.run(qga, ["/bin/sh", "-c", script], timeout=60)
    print(f"$ {script} -> exit {r['exitcode']}\n{r['out']}{r['err']}")
    return r


def installed_version(qga, package):
    """The version dpkg in the guest has installed of package, or None."""
    r = guest_sh(qga, f"dpkg-query -W -f '${{db:Status-Abbrev}}|${{Version}}' {package}")
    status, _, version = r["out"].partition("|")
    return version if r["exitcode"] == 0 and status.startswith("ii") else None


def dkms_module_faults(qga, module, dkms_name):
    """Why module in the running guest is not DKMS's build of dkms_name,
    loaded: a list, empty when it is.  It must be loaded, DKMS must call it
    installed for the running kernel, modprobe must resolve it to DKMS's
    directory and to no other copy, and that file must be DKMS's own build
    output."""
    r = guest_sh(qga, f"""
        k=$(uname -r); echo "kernel $k"
        grep -q '^{module} ' /proc/modules && echo loaded
        echo "resolves $(modprobe --show-depends {module} | sed -n 's/^insmod //p' | tail -1 | tr -d ' ')"
        echo "copies $(find /lib/modules/$k -name '{module}.ko*' | sort | tr '\\n' ' ')"
        dkms status -m {dkms_name} -k $k | sed 's/^/dkms /'
        for f in /lib/modules/$k/updates/dkms/{module}.ko /var/lib/dkms/{dkms_name}/*/$k/*/module/{module}.ko; do
          echo "sum $(sha256sum < $f 2>/dev/null | cut -c1-64) $f"
        done""")
    out = r["out"]
    kernel = re.search(r"^kernel (\S+)", out, re.M).group(1)
    dkms_ko = f"/lib/modules/{kernel}/updates/dkms/{module}.ko"
    faults = []
    if "\nloaded\n" not in out:
        faults.append("not loaded")
    if not re.search(rf"^dkms {re.escape(dkms_name)}/\S+, {re.escape(kernel)}, \S+: installed",
                     out, re.M):
        faults.append(f"DKMS does not have {dkms_name} installed for {kernel}")
    if f"resolves {dkms_ko}\n" not in out:
        faults.append("modprobe does not resolve it to DKMS's directory")
    if f"copies {dkms_ko} \n" not in out:
        faults.append("not exactly one copy in the kernel's module tree, DKMS's")
    sums = re.findall(r"^sum (\S+) (\S+)", out, re.M)
    if len(sums) != 2 or sums[0][0] != sums[1][0] or len(sums[0][0]) != 64:
        faults.append(f"the installed file is not DKMS's build output: {sums}")
    return faults


def dbms_package_faults(qga, package, target):
    """What is wrong with a DBMS package in the guest, as a list: the
    diversion of its server is not its own, or dpkg -V finds a file of it
    changed or missing.  The image's dpkg path-exclude keeps /usr/share/doc
    out but the copyright files, so dpkg -V calls the changelog missing."""
    faults = []
    r = guest_sh(qga, f"dpkg-divert --listpackage /{target}")
    if r["out"].split() != [package]:
        faults.append(f"/{target} is diverted by {r['out'].split()}, not {package}")
    r = guest_sh(qga, f"dpkg -V {package}")
    changed = [line for line in r["out"].splitlines()
               if not re.match(r"missing +/usr/share/doc/", line)]
    if r["exitcode"] != 0 or changed:
        faults.append(f"dpkg -V: {r['out'].strip()}")
    return faults


def test_the_guest_image_has_the_guest_s_packages_installed(guest):
    """The lab's image got the packages an operator installs, by dpkg, with
    the DBMS servers diverted and dpkg -V clean (no file changed after the
    install), and each DBMS package at exactly the Debian version it pins."""
    for package in GUEST_PACKAGES:
        assert installed_version(guest, package), f"{package} is not installed in the guest"
    for package, debian_package, target in DBMS_PACKAGES.values():
        debian_version = installed_version(guest, debian_package)
        assert installed_version(guest, package).startswith(debian_version + "+remusdb")
        assert not dbms_package_faults(guest, package, target)


def test_the_dbms_package_check_catches_a_changed_server(guest):
    """Negative control: one byte appended to the guest's mariadbd (not
    running: the image does not start MariaDB at boot) is caught, and only
    that; the byte is taken away again."""
    package, _, target = DBMS_PACKAGES["mariadb"]
    assert guest_sh(guest, f"printf x >> /{target}")["exitcode"] == 0
    try:
        faults = dbms_package_faults(guest, package, target)
    finally:
        assert guest_sh(guest, f"truncate -s -1 /{target}")["exitcode"] == 0
    assert len(faults) == 1 and re.search(rf"\?\?5\S* +/{target}", faults[0]), faults
    assert not dbms_package_faults(guest, package, target)


def test_the_installed_check_fails_for_a_package_the_guest_lacks(guest):
    """Negative control: the host's package, one letter from the guest's."""
    assert installed_version(guest, "remusdb-qemu") is None
    assert installed_version(guest, "remusdb-guest")


def test_the_module_was_built_by_dkms_and_is_loaded(guest):
    faults = dkms_module_faults(guest, "remusdb_cp", "remusdb-cp")
    assert not faults, faults


def test_the_dkms_check_fails_for_an_unloaded_or_stock_module(guest):
    """Negative controls: remusdb_cp unloaded (all else as before), and a
    module of the kernel's own package that is loaded, are both caught."""
    assert guest_sh(guest, "rmmod remusdb_cp")["exitcode"] == 0
    try:
        assert dkms_module_faults(guest, "remusdb_cp", "remusdb-cp") == ["not loaded"]
    finally:
        assert guest_sh(guest, "modprobe remusdb_cp")["exitcode"] == 0
    loaded = [line.split()[0] for line in guest_sh(guest, "cat /proc/modules")["out"].splitlines()
              if not line.startswith("remusdb_cp ")]
    if not loaded:  # the kernel's own modules may all be built in: load one
        assert guest_sh(guest, "modprobe dummy")["exitcode"] == 0
        loaded = ["dummy"]
    faults = dkms_module_faults(guest, loaded[0], "remusdb-cp")
    assert "modprobe does not resolve it to DKMS's directory" in faults, (loaded[0], faults)
