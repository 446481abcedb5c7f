"""remusdb-bench: benchmarks measured side by side in one run, each writing
JSON plus a PNG plot under docs/bench/.

  baseline  pgbench through remusdbd (NBD disk + network relay) versus the
            same VM wired with a plain tap and a plain disk file, alternating
            the wirings (ABAB...) so that drift in the machine's speed hits
            both alike (baseline.json, baseline.png).
  remus     the "unoptimized Remus" baseline: pgbench against one VM,
            unprotected and protected at each checkpoint interval, with the
            checkpoint pause p50/p99, bytes and dirty pages per epoch over
            each measurement window (remus.json, remus.png).
  silence   one VM protected under the drill's load with nothing failing:
            the gaps between each side's heartbeats (histogram) next to the
            longest silence of the TCP stream, and any false failover
            (silence.json, silence.png).
  overhead  unprotected vs. Remus, ASC, RT and ASC+RT at each interval,
            OLTP (pgbench, 4 and 32 clients) and DSS (scans over a table
            several times the buffer pool): throughput ratios, bytes
            replicated, pauses and the backup's CPU (overhead.json/png).
  compress  the page codecs of checkpoint compression on page traces:
            encode/decode GB/s per core and compression ratio of our
            XOR+RLE, LZ4, LZ4 of the XOR delta and QEMU's XBZRLE format
            (compress.json, compress.png); no VM, a synthetic trace unless
            --trace names recorded ones.
  dirty     dirty pages per epoch at each interval for a synthetic guest
            writer (rdb-dirty: idle, sparse and dense at several rates) and
            pgbench, against the pages the writer should add; a dense rate
            sweep for the highest rate without backpressure (dirty.json/png).
  dirty-asc the same writer, sparse and dense, under plain Remus and under
            ASC+RT at one interval: bytes per epoch, pause p99, the highest
            sustained rate of each (dirty-asc.json/png).
  fork      a loaded PostgreSQL VM forked into N = 1, 2, 4 streaming
            replicas: time to the first read query and to catching up,
            bytes fetched, the parent's TPS dip, against a replica made
            with pg_basebackup and a fresh VM (fork.json, fork.png).
  takeover  failover drills with the backup restoring eagerly (every page
            before the VM runs), lazily (postcopy from its image) or
            shared (QEMU maps the image's RAM), by --modes and --sizes,
            alternating: takeover, restore step, client-visible downtime,
            lost commits (takeover.json, takeover.png).
  failback  after a failover and the old primary's repair, the VM protected
            back to it with a changed-block resync, then again with a full
            copy: disk bytes sent and copy time of each, both checked by a
            per-extent disk compare (failback.json, failback.png).
  scale     against guest RAM (1-8 GiB): pause and its bitmap sync, bytes
            per epoch, initial sync, the backup's memory and takeover by
            restore mode; against the number of VMs protected at once
            (1, 2, 4): epochs/s, pause p99, heartbeat gaps, false failovers
            and CPU per host (scale.json, scale.png).
  unmap     freeing a replica's image by its size, as remusdbd did on its
            event loop after a takeover and now does on a thread: munmap
            and close of a written memfd, sole and shared with QEMU
            (unmap.json, unmap.png); no VM."""
import argparse
import sys

from .. import paths
from ..bench import (baseline, commit_protection, compress, dirty, dirty_asc, failback, fork,
                     overhead, remus, scale, silence, takeover, unmap)
from .runner import run

OUT_DIR = paths.REPO / "docs" / "bench"
# The benchmarks by name, in the order --help lists them.
BENCHMARKS = {"baseline": baseline, "remus": remus, "silence": silence, "overhead": overhead,
              "compress": compress, "dirty": dirty, "dirty-asc": dirty_asc,
              "cp": commit_protection, "fork": fork, "takeover": takeover, "failback": failback,
              "scale": scale, "unmap": unmap}


def main():
    p = argparse.ArgumentParser(prog="remusdb-bench", description=__doc__)
    sub = p.add_subparsers(dest="bench", required=True)
    for bench in BENCHMARKS.values():
        bench.add_parser(sub)
    args = p.parse_args()
    result = BENCHMARKS[args.bench].run(args, OUT_DIR)
    if args.bench in ("silence", "scale") and not result["passed"]:
        sys.exit(1)


def entry():
    """The `remusdb-bench` command."""
    run(main, "remusdb-bench")


if __name__ == "__main__":
    entry()
