"""KVM or TCG.

/dev/kvm can exist and still not run our guest (a nested PVM hypervisor
rejects stock guest kernels), so its presence proves nothing.  The probe
boots the guest kernel itself under KVM with an init that does not exist:
a working KVM reaches the kernel's attempt to run init (and its panic) in a
second or two.  The verdict is cached per kernel so the probe runs once.
"""
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

from . import paths

PROBE_SECONDS = 20
BOOTED_MARKERS = ("Run /rdb-kvm-probe", "Kernel panic", "No working init")


def _probe_kvm(kernel: Path, initrd: Path) -> bool:
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return False
    with tempfile.TemporaryDirectory() as tmp:
        console = Path(tmp) / "console.log"
        cmd = [str(paths.qemu_binary()), "-accel", "kvm", "-m", "256", "-smp", "1",
               "-nodefaults", "-display", "none", "-no-reboot",
               "-kernel", str(kernel), "-initrd", str(initrd),
               "-append", "console=ttyS0 rdinit=/rdb-kvm-probe panic=-1",
               "-serial", f"file:{console}"]
        for d in paths.QEMU_FIRMWARE_DIRS:
            cmd += ["-L", d]
        try:
            subprocess.run(cmd, timeout=PROBE_SECONDS, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            pass
        text = console.read_text(errors="replace") if console.exists() else ""
        return any(marker in text for marker in BOOTED_MARKERS)


def choose(kernel: Path, initrd: Path) -> str:
    """Returns "kvm" or "tcg". REMUSDB_ACCEL=kvm|tcg overrides the probe."""
    forced = os.environ.get("REMUSDB_ACCEL")
    if forced in ("kvm", "tcg"):
        return forced
    digest = hashlib.sha256(kernel.read_bytes()).hexdigest()[:16]
    verdict_file = paths.CACHE / f"accel-probe-{digest}"
    if verdict_file.exists():
        return verdict_file.read_text().strip()
    verdict = "kvm" if _probe_kvm(kernel, initrd) else "tcg"
    verdict_file.write_text(verdict + "\n")
    return verdict
