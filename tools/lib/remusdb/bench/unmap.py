"""What freeing a replica's image costs, by its size: the time of the
munmap and close that remusdbd did on its event loop when a takeover
ended, and now does on a thread of its own (base/unmap_later.c).

An image is a memfd per RAM block with every page written, as after the
initial copy. Two cases, alternating, each the best and the median of
--passes:
  sole    the daemon's mapping is the last: its pages are freed (eager
          and lazy restore, a lost arbitration, a retired replica);
  shared  another mapping keeps them, as the takeover's QEMU does under
          --restore shared: only the daemon's page tables go.
No VM; the numbers are the kernel's, on this machine (unmap.json/png)."""
import mmap
import os
import statistics
import time
from pathlib import Path

from ..lab import workload
from .harness import csv_ints
from .plot import pyplot

CHUNK = 64 << 20


def say(msg):
    print(f"[bench unmap] {msg}", flush=True)


def add_parser(sub):
    b = sub.add_parser("unmap", help="freeing a replica's image by its size: munmap and "
                       "close of a written memfd, sole and shared")
    b.add_argument("--sizes", default="256,1024,2048,4096",
                   help="image sizes in MiB (default 256,1024,2048,4096)")
    b.add_argument("--passes", type=int, default=5, help="passes per size and case (default 5)")
    b.add_argument("--out", default=None, help="output stem (default docs/bench/unmap)")


def _written_image(size):
    fd = os.memfd_create("remusdb-bench-unmap", os.MFD_CLOEXEC)
    os.ftruncate(fd, size)
    m = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    block = b"\xa5" * CHUNK
    for off in range(0, size, CHUNK):
        n = min(CHUNK, size - off)
        m[off:off + n] = block[:n]
    return fd, m


def _one(size, shared):
    """Seconds of munmap + close of a written image; shared: a second
    mapping (QEMU's, under --restore shared) outlives it."""
    fd, m = _written_image(size)
    keeper = None
    if shared:
        keeper = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
        keeper[0:1]
    t0 = time.perf_counter()
    m.close()
    os.close(fd)
    spent = time.perf_counter() - t0
    if keeper is not None:
        keeper.close()
    return spent


def run(args, out_dir):
    sizes = csv_ints(args.sizes)
    loadavg = Path("/proc/loadavg").read_text().split()[:3]
    rows = []
    for mib in sizes:
        times = {"sole": [], "shared": []}
        for _ in range(args.passes):
            for case in ("sole", "shared"):
                times[case].append(_one(mib << 20, case == "shared") * 1000.0)
        row = {"mib": mib}
        for case, ms in times.items():
            row[case] = {"ms": [round(x, 2) for x in ms], "best_ms": round(min(ms), 2),
                         "median_ms": round(statistics.median(ms), 2)}
        say(f"{mib} MiB: sole {row['sole']['median_ms']} ms, shared "
            f"{row['shared']['median_ms']} ms (medians of {args.passes})")
        rows.append(row)
    result = {"benchmark": "unmap", "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
              "loadavg": loadavg, "passes": args.passes, "sizes": rows,
              "per_gib_sole_ms": _per_gib(rows, "sole"),
              "per_gib_shared_ms": _per_gib(rows, "shared")}
    stem = str(args.out) if args.out else str(out_dir / "unmap")
    workload.save_json(stem + ".json", result)
    _plot(rows, stem + ".png")
    say(f"wrote {stem}.json and {stem}.png")
    return result


def _per_gib(rows, case):
    """The slope through the largest size: ms per GiB."""
    big = max(rows, key=lambda r: r["mib"], default=None)
    return round(big[case]["median_ms"] * 1024 / big["mib"], 2) if big else None


def _plot(rows, path):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    gib = [r["mib"] / 1024 for r in rows]
    for case, label in (("sole", "sole mapping: pages freed"),
                        ("shared", "QEMU maps it too (--restore shared)")):
        ax.plot(gib, [r[case]["median_ms"] for r in rows], marker="o", label=label)
    ax.set_xlabel("image size (GiB)")
    ax.set_ylabel("munmap + close (ms, median)")
    ax.set_title("Freeing a replica's image: what the event loop no longer waits for")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
