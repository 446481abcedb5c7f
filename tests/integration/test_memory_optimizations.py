"""RemusDB's memory optimizations on a real guest (issue 9): one VM under
pgbench, protected with ASC and RT on (the default), then with both off
(`--no-compress --no-read-tracking`, the unoptimized baseline in the same
binary). With them on, pages must go as XOR_RLE/LZ4 and fewer bytes than
the raw dirty pages must be sent, while the backup decodes every page to
the checksum the primary computed: no divergence, no page asked for
again; the device state blob must go as a delta against the previous
epoch's, a fraction of its size. With them off, every page and every
device blob must go whole. The drills in test_remus.py
run with the optimizations on (the default) and check that no
acknowledged commit is lost."""
import os
import subprocess

from pathlib import Path

import pytest
from conftest import fresh_guest
from pgbench_load import PgbenchLoad
from polling import wait_for
import xxhash

from remusdb import image_check, protection
from remusdb.lab import vm, workload
from remusdb.drill.lab import forget_ownership

NAME = "asctest"
REPO = Path(__file__).resolve().parents[2]
BACKUP = "10.77.0.2:7788"
# The checks compare totals and per-epoch means of one window: 8 s at 50 ms
# is over a hundred epochs of pgbench (more was only a longer wait).
WINDOW_S = 8


@pytest.fixture(scope="module")
def guest(lab):
    with fresh_guest(NAME) as name:
        yield name


def protected_window(options):
    """Protects at 50 ms with `options`, runs WINDOW_S of pgbench in a
    window whose statistics start from zero, and returns both sides'
    status."""
    forget_ownership(NAME)
    protection.protect(NAME, BACKUP, 50, options=options)
    try:
        protection.wait_protected(NAME, timeout=900)
        workload.pgbench(vm.DEFAULT_IP, seconds=2, clients=4)  # uncounted: load before the window
        protection.reset_stats(NAME)
        r = workload.pgbench(vm.DEFAULT_IP, seconds=WINDOW_S, clients=4)
        assert r["exit_code"] == 0 and r["transactions"], r["output"][-2000:]
        primary = protection.primary_protection("primary", NAME)
        backup = protection.replica("backup", NAME)
    finally:
        protection.unprotect(NAME)
    assert primary["state"] == "protected", primary.get("error")
    return primary, backup


def test_optimizations_on_compress_and_the_backup_agrees(guest):
    primary, backup = protected_window({})
    pl = primary["pipeline"]
    print("pipeline:", pl)
    print("backup coded pages:", backup["coded_pages"])
    kinds = pl["pages_by_kind"]
    assert pl["compression"]["enabled"] and pl["read_tracking"]["enabled"]
    assert kinds["xor_rle"] > 0, kinds
    assert pl["raw_dirty_bytes_total"] > 0
    assert pl["page_bytes_sent_total"] < pl["raw_dirty_bytes_total"], pl
    coded = backup["coded_pages"]
    assert coded["checksum_mismatches"] == 0, coded
    assert coded["undecodable"] == 0, coded
    assert coded["page_requests"] == 0 and pl["page_requests"] == 0, coded
    # the backup counts since the replica began (reset-stats is the primary's)
    assert coded["disk_refs"] >= kinds["disk_ref"], (coded, kinds)
    # device state: deltas, decoded by the backup to the primary's checksum
    # (a wrong one ends the link, and the state check above would fail)
    assert coded["device_deltas"] > 0, coded
    blob, sent = pl["device_blob_bytes_per_epoch_mean"], pl["device_bytes_sent_per_epoch_mean"]
    assert blob > 0 and sent < blob / 4, (blob, sent)


def test_optimizations_off_send_raw_pages(guest):
    primary, backup = protected_window({"compress": False, "read_tracking": False})
    pl = primary["pipeline"]
    print("pipeline:", pl)
    kinds = pl["pages_by_kind"]
    assert not pl["compression"]["enabled"] and not pl["read_tracking"]["enabled"]
    assert kinds["raw"] > 0, kinds
    assert kinds["xor_rle"] == kinds["lz4"] == kinds["disk_ref"] == 0, kinds
    assert backup["coded_pages"]["checksum_mismatches"] == 0
    assert backup["coded_pages"]["device_deltas"] == 0, backup["coded_pages"]
    assert pl["device_bytes_sent_per_epoch_mean"] > pl["device_blob_bytes_per_epoch_mean"] > 0


def test_protecting_again_keeps_read_tracking_alive(guest):
    """A second protection starts its read index before the first
    protection object is destroyed; the first must not stop the second's
    index (it did: the encoder then looked pages up in freed memory and the
    daemon died). The first protection only has to start its index and
    end: no load of its own."""
    forget_ownership(NAME)
    protection.protect(NAME, BACKUP, 50, options={})
    try:
        protection.wait_protected(NAME, timeout=900)
    finally:
        protection.unprotect(NAME)
    primary, backup = protected_window({})
    rt = primary["pipeline"]["read_tracking"]
    assert rt["enabled"] and rt["index_lookups"] > 0, rt
    assert backup["coded_pages"]["checksum_mismatches"] == 0


def test_backup_image_equals_the_guest_memory_at_a_held_checkpoint(guest):
    """With ASC and RT on and pgbench running, the primary holds the VM
    paused at a checkpoint and QEMU dumps its memory; the backup's image of
    that epoch must have the same XXH3-64 for every page of RAM
    (image_check.py says how, and which 96 legacy pages are skipped)."""
    # Not the names check-image uses: it deletes its own files when done.
    dump = f"/dev/shm/rdb-{NAME}-itest-memory.dump"
    sums = f"/dev/shm/rdb-{NAME}-itest-backup.sums"
    forget_ownership(NAME)
    protection.protect(NAME, BACKUP, 50, options={})
    load = {}
    runner = None
    try:
        protection.wait_protected(NAME, timeout=900)
        # pgbench from before the hold until the operator's check is done,
        # and no longer (pgbench_load.py).
        runner = PgbenchLoad(vm.DEFAULT_IP, clients=4)
        # coded epochs under load before the hold
        runner.wait_connected()
        wait_for(lambda: protection.primary_protection("primary", NAME)["pipeline"]
                 ["pages_by_kind"]["xor_rle"] > 0, 60, "epochs coded under the load")
        held = image_check.capture(NAME, dump, sums, 1024 << 20)
        # The operator's command does the same at the next checkpoint.
        cli = subprocess.run([str(REPO / "tools" / "remusdb"), "check-image", NAME],
                             capture_output=True, text=True, timeout=120)
        load = runner.finish()
        print(f"load: {load['runs']} pgbench runs, {load['transactions']} transactions, "
              f"longest idle {load['longest_idle_s']} s")
        primary = protection.primary_protection("primary", NAME)
    finally:
        if runner:
            runner.finish()
        protection.unprotect(NAME)
    try:
        print("held checkpoint:", held)
        print("remusdb check-image:", cli.stdout, cli.stderr)
        assert cli.returncode == 0 and ", 0 differ" in cli.stdout, (cli.stdout, cli.stderr)
        kinds = primary["pipeline"]["pages_by_kind"]
        print("pages by kind:", kinds)
        assert primary["state"] == "protected", primary.get("error")
        assert load.get("exit_code") == 0 and load.get("transactions"), load.get("output")
        assert kinds["xor_rle"] > 0, kinds  # the coded path carried the image there
        ours, theirs = image_check.page_sums_of_dump(dump), image_check.page_sums_of_backup(sums)
        assert len(ours) == 262144
        assert image_check.differing_pages(ours, theirs) == []

        # Negative control: one flipped bit in one page of the guest's
        # memory is one differing page, that page.
        k = 200003
        with open(dump, "rb") as f:
            f.seek(k * image_check.PAGE)
            page = bytearray(f.read(image_check.PAGE))
        page[image_check.PAGE - 1] ^= 1
        flipped = list(ours)
        flipped[k] = xxhash.xxh3_64_intdigest(bytes(page))
        assert image_check.differing_pages(flipped, theirs) == [k]
    finally:
        for f in (dump, sums):
            if os.path.exists(f):
                os.unlink(f)
