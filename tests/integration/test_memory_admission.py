"""The backup's memory admission (backup/replica_memory.h): a protection
the backup cannot hold beside its other replicas is refused in one line
with the numbers and the fix, before any image is made, instead of the
OOM killer finding it mid-takeover.

The refusal and the admission are a few MiB apart: the limit that
refuses is the need of a guest whose RAM blocks were exactly 1 GiB, and
the real guest's small blocks (BIOS, option ROMs, ACPI tables) put it
just over; a limit 16 MiB higher admits it. So the check is shown to
count the blocks to the byte, not only to refuse a gross overcommit."""
import os

import pytest

from remusdb import protection
from remusdb.lab import vm
from conftest import fresh_guest

# The wrong-key test's VM (test_remus.py): its saved guest serves both.
NAME = "wrongkey"
MIB = 1 << 20
GIB = 1 << 30
# 1 GiB image + an eighth of it staged + 256 MiB of deferred frames; the
# takeover maps the image (the default shared restore), so no copy.
NEED_OF_EXACTLY_1_GIB = GIB + GIB // 8 + 256 * MIB


def backup_daemon_with(limit):
    vm.stop_daemon("backup")
    os.environ["REMUSDBD_EXTRA_ARGS"] = f"--memory-limit {limit}"
    try:
        vm.ensure_daemon("backup")
    finally:
        del os.environ["REMUSDBD_EXTRA_ARGS"]


def backup_memory():
    return protection.request("backup", "status")["memory"]


def test_a_replica_that_does_not_fit_is_refused_and_one_that_fits_is_admitted(lab):
    with fresh_guest(NAME, backup_daemon=False):
        try:
            backup_daemon_with(f"{NEED_OF_EXACTLY_1_GIB // MIB}M")
            assert backup_memory()["limit_bytes"] == NEED_OF_EXACTLY_1_GIB
            protection.protect(NAME, "10.77.0.2:7788", 50)
            with pytest.raises(protection.ProtectionError) as e:
                protection.wait_protected(NAME, timeout=60)
            text = str(e.value)
            print("refused:", text)
            assert f"not enough memory for a replica of {NAME} here" in text
            assert "of this backup's 1.38 GiB --memory-limit are left (0 replicas" in text
            assert "raise --memory-limit" in text
            # short by the small blocks and their eighth: well under 8 MiB
            short = float(text.split(" MiB short")[0].rsplit(" ", 1)[1])
            assert 0 < short < 8, text
            mem = backup_memory()
            assert mem["admitted_bytes"] == 0 and mem["replicas"] == 0, mem
            # the refusal ended that protection: a new one may start

            backup_daemon_with(f"{NEED_OF_EXACTLY_1_GIB // MIB + 16}M")
            protection.protect(NAME, "10.77.0.2:7788", 50)
            protection.wait_protected(NAME, timeout=120)
            replica = protection.replica("backup", NAME)
            need, mem = replica["memory"], backup_memory()
            print("admitted:", need, mem)
            small_blocks = need["image_bytes"] - GIB
            assert 0 < small_blocks < 8 * MIB, need
            assert need["takeover_bytes"] == 0, need  # the takeover maps the image
            assert need["admitted_bytes"] == (need["image_bytes"] + need["image_bytes"] // 8
                                              + 256 * MIB), need
            assert NEED_OF_EXACTLY_1_GIB < need["admitted_bytes"] <= mem["limit_bytes"], mem
            assert mem["admitted_bytes"] == need["admitted_bytes"] and mem["replicas"] == 1, mem
            assert mem["protected_ram_bytes"] == need["image_bytes"], mem
            assert mem["daemon_rss_bytes"] > 0, mem
            print(f"backup RSS {mem['daemon_rss_bytes'] / GIB:.2f} GiB for "
                  f"{mem['protected_ram_bytes'] / GIB:.2f} GiB protected: "
                  f"{mem['daemon_rss_per_protected_gib'] / GIB:.2f} per protected GiB")
        finally:
            vm.stop_daemon("backup")  # the next tests get the default limit
