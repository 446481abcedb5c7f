"""Block status and structured replies of remusdbd's NBD export, checked
with libnbd's own tools against a real daemon: no lab, no VM.

A remusdbd is started on a temporary directory and serves a sparse raw
image whose data/hole layout the test wrote itself.  Then:
- `nbdinfo --can structured-reply` / `--can multi-conn` succeed and the
  export lists the base:allocation context;
- `nbdinfo --map --json` equals the layout written, extent for extent
  (offset, length, type), and equals what SEEK_DATA/SEEK_HOLE say of the
  file; the comparison is exact, which the negative control shows: the
  same map with one 64 KiB data block turned into a hole (or a hole into
  data) fails it;
- a 4 KiB write over NBD into a hole appears in the next map at exactly
  that place (the map is computed from the image at each request);
- `nbdcopy` copies the export to a file byte for byte, sparse: the copy
  has the same data extents, and the daemon read about the data bytes
  (its disk stats: 5.5 MB of a 64 MiB image with 4.5 MB of data), not
  the holes.
"""
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from nbd_client import NBDClient
from remusdb import control, paths

REPO = Path(__file__).resolve().parents[2]
DAEMON = REPO / "dom0-daemon" / "build" / "remusdbd"
K64 = 64 * 1024
MiB = 1024 * 1024
SIZE = 64 * MiB
# Data runs (offset, length), 64 KiB aligned: at the start, in the
# middle, a long run, and the image's very last block.
DATA_RUNS = [(0, K64), (3 * MiB, 2 * K64), (10 * MiB + K64, K64),
             (20 * MiB, 4 * MiB), (SIZE - K64, K64)]
DATA, HOLE_ZERO = 0, 3  # base:allocation: NBD_STATE_HOLE | NBD_STATE_ZERO
EXPORT = "sparse"


def layout_extents(runs, size):
    """The (offset, length, type) extents an exact server must report."""
    extents, pos = [], 0
    for off, length in sorted(runs):
        if off > pos:
            extents.append((pos, off - pos, HOLE_ZERO))
        extents.append((off, length, DATA))
        pos = off + length
    if pos < size:
        extents.append((pos, size - pos, HOLE_ZERO))
    return merge(extents)


def merge(extents):
    """Adjacent extents of one type as one: a server (or nbdinfo) may
    split a run at request boundaries, which says nothing wrong.  Merging
    cannot hide a wrong type: a block reported as the other type still
    splits its neighbours."""
    out = []
    for off, length, kind in extents:
        if out and out[-1][2] == kind and out[-1][0] + out[-1][1] == off:
            out[-1] = (out[-1][0], out[-1][1] + length, kind)
        else:
            out.append((off, length, kind))
    return out


def file_extents(path):
    """The same from the file system: SEEK_DATA/SEEK_HOLE on the file."""
    extents, pos, size = [], 0, os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        while pos < size:
            try:
                data = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError:  # ENXIO: a hole up to the end
                data = size
            if data > pos:
                extents.append((pos, data - pos, HOLE_ZERO))
                pos = data
                continue
            hole = os.lseek(fd, pos, os.SEEK_HOLE)
            extents.append((pos, hole - pos, DATA))
            pos = hole
    finally:
        os.close(fd)
    return merge(extents)


def nbdinfo_map(uri):
    r = subprocess.run(["nbdinfo", "--map", "--json", uri], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, f"nbdinfo --map failed: {r.stderr}"
    return merge([(e["offset"], e["length"], e["type"]) for e in json.loads(r.stdout)])


def compare(got, want):
    """None when equal, else the first difference, described."""
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            return f"extent {i}: got {g}, want {w}"
    if len(got) != len(want):
        return f"{len(got)} extents, want {len(want)}"
    return None


def flip_block(runs, off, to_hole):
    """The layout with one 64 KiB block at off turned into a hole (or,
    with to_hole False, into data)."""
    if not to_hole:
        return runs + [(off, K64)]
    out = []
    for r_off, length in runs:
        if r_off <= off < r_off + length:
            if off > r_off:
                out.append((r_off, off - r_off))
            if off + K64 < r_off + length:
                out.append((off + K64, r_off + length - off - K64))
        else:
            out.append((r_off, length))
    return out


def disk_stats(ctl):
    vms = control.request(ctl, "status")["vms"]
    return next(v for v in vms if v["name"] == EXPORT)["disks"][0]


def build_daemon(*targets):
    r = subprocess.run(["make", "-s", "-C", str(REPO / "dom0-daemon"), *targets],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"building remusdbd failed:\n{r.stdout}\n{r.stderr}"


def write_image(image, runs):
    """A sparse SIZE-byte image with data exactly at runs."""
    with open(image, "wb") as f:
        f.truncate(SIZE)
        for off, length in runs:
            f.seek(off)
            # Nonzero everywhere: nbdcopy must not mistake it for zeros.
            f.write(bytes((off // K64 + i) % 251 + 1 for i in range(256)) * (length // 256))
    # The file system must show exactly what was written, or the test
    # would compare against the wrong truth.
    assert file_extents(image) == layout_extents(runs, SIZE), \
        f"{image.parent}: this file system does not report holes exactly"


def start_daemon(d, host):
    """remusdbd with its files under d, once its control socket answers."""
    ctl = d / "control.sock"
    proc = subprocess.Popen([str(DAEMON), "--control", str(ctl), "--state-dir", str(d / "state"),
                             "--run-dir", str(d / "run"), "--log", str(d / "remusdbd.log"),
                             "--host", host])
    for _ in range(100):
        if control.reachable(ctl):
            break
        if proc.poll() is not None:
            raise AssertionError("remusdbd exited at start")
        time.sleep(0.1)
    return ctl, proc


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    for tool in ("nbdinfo", "nbdcopy"):
        assert shutil.which(tool), f"{tool} missing: run tools/setup/install-deps.sh (libnbd-bin)"
    build_daemon("build/remusdbd")
    d = tmp_path_factory.mktemp("nbd-bs")
    image = d / "disk.img"
    write_image(image, DATA_RUNS)
    ctl, proc = start_daemon(d, "nbd-test")
    try:
        control.request(ctl, "vm-add", name=EXPORT, disk=str(image),
                        nbd_socket=str(d / "nbd.sock"))
        yield {"dir": d, "image": image, "ctl": ctl, "socket": d / "nbd.sock",
               "uri": f"nbd+unix:///{EXPORT}?socket={d / 'nbd.sock'}"}
    finally:
        if control.reachable(ctl):
            control.request(ctl, "shutdown")
        try:
            assert proc.wait(timeout=30) == 0, "remusdbd did not exit cleanly"
        finally:
            if proc.poll() is None:
                proc.kill()


def test_negotiation(export):
    uri = export["uri"]
    for what in ("structured-reply", "multi-conn", "connect"):
        r = subprocess.run(["nbdinfo", "--can", what, uri], capture_output=True, text=True)
        assert r.returncode == 0, f"nbdinfo --can {what}: {r.returncode} {r.stderr}"
    r = subprocess.run(["nbdinfo", "--json", uri], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["protocol"] == "newstyle-fixed"
    assert info["exports"][0]["contexts"] == ["base:allocation"]
    assert info["exports"][0]["export-size"] == SIZE


def test_map_matches_the_image_exactly(export):
    got = nbdinfo_map(export["uri"])
    want = layout_extents(DATA_RUNS, SIZE)
    print("nbdinfo --map:", got)
    assert compare(got, want) is None, compare(got, want)
    assert got == file_extents(export["image"])


def test_map_comparison_catches_one_wrong_block(export):
    """The negative control: one 64 KiB block misreported, either way,
    fails the very comparison the test above passes."""
    got = nbdinfo_map(export["uri"])
    wrong_hole = layout_extents(flip_block(DATA_RUNS, 21 * MiB, True), SIZE)
    wrong_data = layout_extents(flip_block(DATA_RUNS, 40 * MiB, False), SIZE)
    for wrong in (wrong_hole, wrong_data):
        diff = compare(got, wrong)
        print("negative control:", diff)
        assert diff is not None
    # And the server's own answer with one data block flipped is caught.
    tampered = merge([x for e in got for x in (
        [(e[0], K64, HOLE_ZERO), (e[0] + K64, e[1] - K64, DATA)]
        if e == (20 * MiB, 4 * MiB, DATA) else [e])])
    assert compare(tampered, layout_extents(DATA_RUNS, SIZE)) is not None


def test_map_follows_writes(export):
    """A 4 KiB write into a hole is in the next map, exactly there."""
    c = NBDClient(export["socket"], EXPORT)
    try:
        assert c.write(30 * MiB + 8192, b"\x5a" * 4096) == 0
    finally:
        c.close()
    want = merge(layout_extents(DATA_RUNS, SIZE))
    got = nbdinfo_map(export["uri"])
    assert (30 * MiB + 8192, 4096, DATA) in got, got
    assert compare(got, file_extents(export["image"])) is None
    assert compare(got, want) is not None  # it did change


def test_nbdcopy_is_exact_and_sparse(export, tmp_path):
    before = disk_stats(export["ctl"])
    out = tmp_path / "copy.img"
    r = subprocess.run(["nbdcopy", export["uri"], str(out)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, f"nbdcopy failed: {r.stderr}"
    after = disk_stats(export["ctl"])
    with open(export["image"], "rb") as a, open(out, "rb") as b:
        assert a.read() == b.read(), "nbdcopy's copy differs from the image"
    src = file_extents(export["image"])
    data_bytes = sum(length for _, length, kind in src if kind == DATA)
    read = after["bytes_read"] - before["bytes_read"]
    allocated = os.stat(out).st_blocks * 512
    print(f"nbdcopy: image {SIZE} bytes, data {data_bytes}, read over NBD {read}, "
          f"copy allocates {allocated}, block status requests "
          f"{after['block_status'] - before['block_status']}")
    # Sparse: the copy has holes where the image has, and the daemon
    # served the data but not the holes.  nbdcopy reads in requests of
    # its own size (256 KiB), so a data run may cost up to one request
    # more at each end; the 58 MiB of holes are never read.
    assert file_extents(out) == src
    assert allocated <= data_bytes + 64 * 1024
    runs = sum(1 for _, _, kind in src if kind == DATA)
    assert data_bytes <= read <= data_bytes + runs * 2 * 256 * 1024
    assert read < SIZE // 8
    assert after["block_status"] > before["block_status"]


# ---- a fork's frozen disk -------------------------------------------------
#
# A real fork (docs/fork.md) of a parent QEMU with no guest (held at -S,
# so it writes nothing): remusdbd freezes the parent's disk and serves
# the snapshot read-only, as clones' overlays read it.  After the freeze
# the "parent" (this test, on the live export) writes into a hole,
# trims data, overwrites data, and writes across a data/hole edge.  The
# snapshot's map must still be the layout at the freeze, exactly.
FROZEN_RUNS = [(0, K64), (2 * MiB, 2 * MiB), (10 * MiB, K64), (SIZE - K64, K64)]
CMD_TRIM = 4


def fork_disk(ctl, vm):
    st = control.request(ctl, "status")
    return next(v for v in st["vms"] if v["name"] == vm)["fork"]["disk"]


@pytest.fixture(scope="module")
def fork_snapshot(tmp_path_factory):
    qemu = paths.qemu_binary()
    assert qemu.exists(), f"patched QEMU not found at {qemu}: run `make setup`"
    build_daemon("build/remusdbd", "build/remusdbd-pagesrc")
    d = tmp_path_factory.mktemp("nbd-fork-bs")
    image = d / "parent.img"
    write_image(image, FROZEN_RUNS)
    ctl, proc = start_daemon(d, "nbd-fork-test")
    procs = [proc]
    try:
        control.request(ctl, "vm-add", name="bsp", disk=str(image),
                        nbd_socket=str(d / "nbd.sock"), qmp_socket=str(d / "qmp.sock"))
        fw = [a for p in paths.QEMU_FIRMWARE_DIRS for a in ("-L", p)]
        procs.append(subprocess.Popen(
            [str(qemu), "-machine", "pc", "-accel", "tcg", "-m", "32", "-nodefaults",
             "-display", "none", "-S", *fw, "-qmp", f"unix:{d / 'qmp.sock'},server=on,wait=off",
             "-blockdev", f"driver=nbd,node-name=disk0,server.type=unix,"
                          f"server.path={d / 'nbd.sock'},export=bsp",
             "-device", "virtio-blk-pci,drive=disk0"]))
        deadline = time.monotonic() + 30
        while True:
            vm_status = next(v for v in control.request(ctl, "status")["vms"]
                             if v["name"] == "bsp")
            if vm_status.get("run_state") == "prelaunch":
                break
            assert procs[1].poll() is None, "QEMU exited at start"
            assert time.monotonic() < deadline, f"QEMU's QMP never reached remusdbd: {vm_status}"
            time.sleep(0.2)
        frozen = image.read_bytes()  # QEMU at -S writes nothing: the disk at the fork
        control.request(ctl, "fork-start", vm="bsp", clones=1)
        deadline = time.monotonic() + 60
        while True:
            f = next(v for v in control.request(ctl, "status")["vms"]
                     if v["name"] == "bsp").get("fork") or {}
            if f.get("state") == "serving":
                break
            assert f.get("state") != "failed", f"fork failed: {f.get('error')}"
            assert time.monotonic() < deadline, f"the fork did not freeze the disk: {f}"
            time.sleep(0.2)
        disk = f["disk"]
        # The parent writes on after the freeze.
        c = NBDClient(d / "nbd.sock", "bsp")
        try:
            assert c.write(6 * MiB, b"\x77" * (4 * K64)) == 0                  # a hole
            assert c.request(CMD_TRIM, 3 * MiB, MiB)[0] == 0                   # data
            assert c.write(0, b"\x66" * K64) == 0                              # data
            assert c.write(10 * MiB - K64, b"\x55" * (3 * K64)) == 0           # hole|data|hole
        finally:
            c.close()
        # 4 KiB blocks: 64 written into the hole, 256 trimmed, 16 + 48 written.
        assert fork_disk(ctl, "bsp")["blocks_preserved"] == 64 + 256 + 16 + 48, \
            fork_disk(ctl, "bsp")
        yield {"dir": d, "ctl": ctl, "image": image, "frozen": frozen, "disk": disk,
               "uri": f"nbd+unix:///{disk['export']}?socket={disk['socket']}"}
    finally:
        if control.reachable(ctl):
            control.request(ctl, "shutdown")
        daemon_rc = procs[0].wait(timeout=30)
        for p in procs[1:]:
            p.kill()
            p.wait()
        assert daemon_rc == 0, "remusdbd did not exit cleanly"


def test_snapshot_map_is_the_frozen_layout(fork_snapshot):
    """nbdinfo --map of the fork's snapshot export: the layout at the
    freeze, extent for extent, though the live image has changed under
    it in all four ways; every hole reads as zeros in the frozen bytes."""
    got = nbdinfo_map(fork_snapshot["uri"])
    want = layout_extents(FROZEN_RUNS, SIZE)
    print("snapshot nbdinfo --map:", got)
    assert compare(got, want) is None, compare(got, want)
    assert any(k == HOLE_ZERO for _, _, k in got) and any(k == DATA for _, _, k in got)
    frozen = fork_snapshot["frozen"]
    for off, length, kind in got:
        if kind == HOLE_ZERO:
            assert frozen[off:off + length].count(0) == length, f"hole at {off} is not zeros"
    # Negative control: the live image's own map now differs (6 MiB is
    # data there, 3-4 MiB a hole), so answering from it would fail.
    live = file_extents(fork_snapshot["image"])
    print("live image map:        ", live)
    assert compare(live, want) is not None


def test_nbdcopy_of_the_snapshot_skips_its_holes(fork_snapshot, tmp_path):
    """A sparse copy of the frozen disk: exact bytes, the frozen layout,
    and only the data read; --no-extents (every block asked for, as
    before) is the baseline."""
    ctl, uri = fork_snapshot["ctl"], fork_snapshot["uri"]
    data_bytes = sum(length for _, length in FROZEN_RUNS)
    read = {}
    for mode in ("extents", "no-extents"):
        out = tmp_path / f"{mode}.img"
        before = fork_disk(ctl, "bsp")
        t0 = time.monotonic()
        r = subprocess.run(["nbdcopy"] + (["--no-extents"] if mode == "no-extents" else [])
                           + [uri, str(out)], capture_output=True, text=True, timeout=300)
        secs = time.monotonic() - t0
        assert r.returncode == 0, f"nbdcopy failed: {r.stderr}"
        after = fork_disk(ctl, "bsp")
        read[mode] = after["bytes_read"] - before["bytes_read"]
        assert out.read_bytes() == fork_snapshot["frozen"], f"{mode}: the copy is not the frozen disk"
        print(f"nbdcopy ({mode}): read {read[mode]} of {SIZE} bytes over NBD in {secs:.2f} s, "
              f"block status requests {after['block_status'] - before['block_status']}, "
              f"copy allocates {os.stat(out).st_blocks * 512}")
        if mode == "extents":
            assert file_extents(out) == layout_extents(FROZEN_RUNS, SIZE)
            assert after["block_status"] > before["block_status"]
    runs = len(FROZEN_RUNS)
    assert data_bytes <= read["extents"] <= data_bytes + runs * 2 * 256 * 1024
    assert read["no-extents"] == SIZE


def test_clone_overlay_sees_the_holes(fork_snapshot, tmp_path):
    """A clone's disk: a qcow2 overlay backed by the snapshot over NBD.
    qemu-img map through the overlay shows the frozen holes, and
    qemu-img convert of the overlay reads only the data from the
    snapshot."""
    ctl, uri = fork_snapshot["ctl"], fork_snapshot["uri"]
    overlay = tmp_path / "clone.qcow2"
    r = subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", uri,
                        str(overlay)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(["qemu-img", "map", "--output=json", str(overlay)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = merge([(e["start"], e["length"], DATA if e["data"] else HOLE_ZERO)
                 for e in json.loads(r.stdout)])
    print("qemu-img map of the clone's overlay:", got)
    assert compare(got, layout_extents(FROZEN_RUNS, SIZE)) is None
    before = fork_disk(ctl, "bsp")
    out = tmp_path / "clone.raw"
    r = subprocess.run(["qemu-img", "convert", "-O", "raw", str(overlay), str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    read = fork_disk(ctl, "bsp")["bytes_read"] - before["bytes_read"]
    print(f"qemu-img convert of the overlay: read {read} of {SIZE} bytes from the snapshot")
    assert out.read_bytes() == fork_snapshot["frozen"]
    assert read <= sum(length for _, length in FROZEN_RUNS) + 4 * MiB
