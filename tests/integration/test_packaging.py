"""The Debian package and `make install` (docs/packaging.md), without the
lab and without touching the host: the package is built by
dpkg-buildpackage in a temporary copy of the tree (nothing is left in the
repository), checked by lintian (an error fails the test; a warning fails
it unless docs/packaging.md explains that tag), unpacked with `dpkg -x`
into a temporary directory, and its programs run from there."""
import os
import re
import shutil
import subprocess
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
    root = work / "root"
    subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(root)], check=True)
    return {"deb": debs[0], "changes": next(work.glob("remusdb_*.changes")), "root": root,
            "src": src}


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
              "opt/rdb/share/man/man8/remusdbd.8", "etc/libvirt/hooks/qemu.d/remusdb"):
        assert (dest / p).exists(), p
    assert f"PYTHONPATH=/opt/rdb/{SITE}\n" in (dest / "etc/libvirt/hooks/qemu.d/remusdb").read_text()
    unit = (dest / "opt/rdb/lib/systemd/system/remusdbd@.service").read_text()
    assert "ExecStart=/opt/rdb/sbin/remusdbd " in unit
    r = subprocess.run([PYTHON, str(dest / "opt/rdb/bin/remusdb"), "status", "--help"],
                       capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(dest / "opt/rdb" / SITE)))
    assert r.returncode == 0, r.stderr
