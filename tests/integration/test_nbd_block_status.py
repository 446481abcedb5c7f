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
from remusdb import control

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


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    for tool in ("nbdinfo", "nbdcopy"):
        assert shutil.which(tool), f"{tool} missing: run tools/setup/install-deps.sh (libnbd-bin)"
    r = subprocess.run(["make", "-s", "-C", str(REPO / "dom0-daemon"), "build/remusdbd"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"building remusdbd failed:\n{r.stdout}\n{r.stderr}"
    d = tmp_path_factory.mktemp("nbd-bs")
    image = d / "disk.img"
    with open(image, "wb") as f:
        f.truncate(SIZE)
        for off, length in DATA_RUNS:
            f.seek(off)
            # Nonzero everywhere: nbdcopy must not mistake it for zeros.
            f.write(bytes((off // K64 + i) % 251 + 1 for i in range(256)) * (length // 256))
    # The file system must show exactly what was written, or the test
    # would compare against the wrong truth.
    assert file_extents(image) == layout_extents(DATA_RUNS, SIZE), \
        f"{d}: this file system does not report holes exactly"
    ctl = d / "control.sock"
    proc = subprocess.Popen([str(DAEMON), "--control", str(ctl), "--state-dir", str(d / "state"),
                             "--run-dir", str(d / "run"), "--log", str(d / "remusdbd.log"),
                             "--host", "nbd-test"])
    try:
        for _ in range(100):
            if control.reachable(ctl):
                break
            assert proc.poll() is None, "remusdbd exited at start"
            time.sleep(0.1)
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
