"""Fresh copies of the guest image for the lab's VM disks, one made ahead.

Every VM the lab starts gets its own copy of the guest image (2 GiB,
about 1.2 GB of data), and the copy took 1-2 s of each start: 40 starts
in `make test`. So after handing out a copy, the next one is made in the
background, while the VM runs, beside the disks as
.spare-<identity of the image>.img; the next start takes it with one
rename. The identity (inode, size, mtime) ties a spare to the image it
was copied from: a rebuilt image leaves the old spare unused, and it is
deleted. Two starts at once cannot both take the spare: the rename
succeeds for one, and the other copies as before.
"""
import os
import subprocess
import time
from pathlib import Path

SPARE_PREFIX = ".spare-"
# A partial copy this old was left by a process that died: started again.
STALE_PARTIAL_S = 120


def _spare_for(base, disks_dir):
    st = os.stat(base)
    return Path(disks_dir) / f"{SPARE_PREFIX}{st.st_ino}-{st.st_size}-{st.st_mtime_ns}.img"


def copy_image(base, dest):
    """dest becomes a fresh copy of the image base (sparse), taken from
    the spare when there is one; a new spare is started either way."""
    dest = Path(dest)
    spare = _spare_for(base, dest.parent)
    try:
        os.replace(spare, dest)
    except FileNotFoundError:
        subprocess.run(["cp", "--sparse=always", str(base), str(dest)], check=True)
    start_spare(base, dest.parent)


def start_spare(base, disks_dir):
    """Starts copying base to the spare unless it exists or a copy of it
    is under way; drops spares of other images. Returns at once."""
    spare = _spare_for(base, disks_dir)
    for old in Path(disks_dir).glob(f"{SPARE_PREFIX}*"):
        if old.name not in (spare.name, spare.name + ".partial"):
            old.unlink(missing_ok=True)
    partial = spare.with_name(spare.name + ".partial")
    if spare.exists():
        return
    try:
        fd = os.open(partial, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        try:
            if time.time() - partial.stat().st_mtime < STALE_PARTIAL_S:
                return  # a copy is under way (cp keeps writing to it)
            partial.unlink()
            fd = os.open(partial, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except (FileNotFoundError, FileExistsError):
            return  # another start got there first
    os.close(fd)
    # Detached: the copy outlives this process (a CLI start exits at once),
    # and only a complete copy is renamed to the spare.
    subprocess.Popen(["sh", "-c", 'cp --sparse=always "$0" "$1" && mv "$1" "$2"',
                      str(base), str(partial), str(spare)],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True)
