"""remusdb-bench compress: the page codecs of checkpoint compression side
by side, single-threaded, on page traces (issue 9, item 4).

A trace is a file of (previous version, current version) pairs of dirty
guest pages (format: dom0-daemon/src/codec/page_trace.h). For each trace the C
micro-benchmark dom0-daemon/bench/compress_bench.c measures encode and
decode GB/s (raw page bytes per second, best of N passes) and the
compression ratio of our XOR_RLE delta, LZ4 of the page alone, LZ4 of the
XOR of the two versions, and QEMU's XBZRLE format; and, as a fifth, what the
daemon would send for a cache hit (the delta, else LZ4, else raw).

Real traces are recorded from a guest by the daemon (page_trace_append());
until then, with no --trace, a synthetic trace is generated here and the
result says so ("synthetic": true) in the JSON and on the plot. A small
JSON file beside a generated trace marks it synthetic, so the label holds
when that trace is passed again with --trace. The
synthetic mix (SYNTHETIC_MIX) is a guess at what a database guest dirties,
not a measurement: its ratios say how the codecs rank on such pages, not
what a real guest will save.
"""
import json
import os
import platform
import struct
import subprocess
import time
from pathlib import Path
from functools import partial

from .. import output, paths
from ..lab import workload
from .plot import pyplot

PAGE = 4096
TRACE_MAGIC = b"RDBTRACE"
TRACE_VERSION = 1
BENCH_BINARY = paths.REPO / "dom0-daemon" / "build" / "compress-bench"
TRACE_DIR = Path("/var/lib/remusdb-bench")
CODECS = ("xor_rle", "lz4", "lz4_xor", "xbzrle", "asc")
TARGET_ENCODE_GBPS = 2.5
TARGET_DECODE_GBPS = 5.0

# kind -> share of the synthetic trace's records, and what it stands for.
SYNTHETIC_MIX = {
    "db_tuple_update": (0.35, "a heap page with one tuple updated: LSN, checksum, "
                              "line pointer, xmax, a new tuple in the free space"),
    "sparse_words": (0.20, "1-16 scattered 8-byte words (pointers, counters)"),
    "half_page": (0.08, "512-2048 contiguous bytes rewritten (a memcpy)"),
    "dense_rewrite": (0.12, "the whole page replaced by new compressible data "
                            "(a buffer read from disk)"),
    "random_rewrite": (0.03, "the whole page replaced by incompressible bytes"),
    "zero_to_data": (0.05, "a zero page filled with table data"),
    "data_to_zero": (0.05, "a page zeroed (freed by the guest kernel)"),
    "zero_rewritten": (0.08, "a zero page written with zeros again"),
    "identical": (0.04, "a page rewritten with the same content"),
}

WORDS = [w.encode() for w in (
    "alice bob carol dave erin frank grace heidi ivan judy mallory oscar peggy "
    "trent victor walter account balance branch teller history insert update "
    "select commit vacuum index tuple page buffer order item stock customer "
    "district warehouse payment delivery 2024-01-17 12:30:45 EUR USD NULL true "
    "false pending shipped").split()]

say = partial(output.say, "bench compress")


def add_parser(sub):
    b = sub.add_parser("compress", help="page codecs side by side: encode/decode GB/s and "
                       "compression ratio on page traces")
    b.add_argument("--trace", action="append", default=[], metavar="FILE",
                   help="a page trace (repeatable); default: generate a synthetic one")
    b.add_argument("--record-guest", action="store_true",
                   help="first record real traces from a protected guest (pgbench, then "
                   "scans) and measure those")
    b.add_argument("--records", type=int, default=16384,
                   help="records of the synthetic trace (default 16384: 128 MiB of pages)")
    b.add_argument("--seed", type=int, default=1)
    b.add_argument("--passes", type=int, default=10, help="best of N passes (default 10)")
    b.add_argument("--out", default=None, help="output stem (default docs/bench/compress)")
    return b


# ---- synthetic traces ----

def _text(rng, n):
    out = bytearray()
    while len(out) < n:
        out += WORDS[int(rng.integers(len(WORDS)))] + b" "
    return bytes(out[:n])


def _tuple(rng):
    """A pgbench_accounts-like row: header, ints, blank-padded filler."""
    header = struct.pack("<IIIHHHHB", int(rng.integers(1 << 20, 1 << 24)), 0, 0,
                         int(rng.integers(1 << 16)), int(rng.integers(1 << 8)),
                         int(rng.integers(300)), 0x0902, 24)
    body = struct.pack("<iii", int(rng.integers(1 << 20)), int(rng.integers(100)),
                       int(rng.integers(-50000, 50000)))
    filler = _text(rng, int(rng.integers(0, 40))).ljust(84, b" ")
    return header + body + filler


def _heap_page(rng, np):
    """A PostgreSQL heap page half: header, line pointers, rows from the end,
    zeros in between."""
    page = np.zeros(PAGE, dtype=np.uint8)
    n = int(rng.integers(3, 28))
    upper = PAGE
    for i in range(n):
        t = _tuple(rng)
        upper -= len(t)
        page[upper:upper + len(t)] = np.frombuffer(t, dtype=np.uint8)
        page[24 + 4 * i:28 + 4 * i] = np.frombuffer(
            struct.pack("<I", upper | len(t) << 17), dtype=np.uint8)
    page[0:24] = np.frombuffer(struct.pack("<QHHHHHHI", int(rng.integers(1 << 40)), 0, 0,
                                           24 + 4 * n, upper, PAGE, 0x2004, 0),
                               dtype=np.uint8)
    return page, n, upper


def _pointer_page(rng, np):
    """Kernel-like structures: pointers, small integers, zeros."""
    words = np.zeros(PAGE // 8, dtype=np.uint64)
    kind = rng.integers(0, 3, size=PAGE // 8)
    ptrs = np.uint64(0xffff888000000000) + (rng.integers(0, 1 << 30, size=PAGE // 8,
                                                          dtype=np.uint64) << np.uint64(6))
    small = rng.integers(0, 4096, size=PAGE // 8, dtype=np.uint64)
    words[kind == 0] = ptrs[kind == 0]
    words[kind == 1] = small[kind == 1]
    return words.view(np.uint8).copy()


def _content(rng, np):
    r = rng.random()
    if r < 0.5:
        return _heap_page(rng, np)[0]
    if r < 0.8:
        return _pointer_page(rng, np)
    return np.frombuffer(_text(rng, PAGE), dtype=np.uint8).copy()


def _pair(kind, rng, np):
    zero = np.zeros(PAGE, dtype=np.uint8)
    if kind == "db_tuple_update":
        prev, n, upper = _heap_page(rng, np)
        cur = prev.copy()
        cur[0:8] = rng.integers(0, 256, 8, dtype=np.uint8)          # LSN
        cur[8:10] = rng.integers(0, 256, 2, dtype=np.uint8)         # checksum
        t = _tuple(rng)
        new_upper = upper - len(t)
        if new_upper > 24 + 4 * (n + 1):
            cur[new_upper:upper] = np.frombuffer(t, dtype=np.uint8)
            cur[24 + 4 * n:28 + 4 * n] = rng.integers(0, 256, 4, dtype=np.uint8)
            cur[12:16] = rng.integers(0, 256, 4, dtype=np.uint8)    # pd_lower/upper
        old = int(rng.integers(upper, PAGE - 8))
        cur[old + 4:old + 8] = rng.integers(0, 256, 4, dtype=np.uint8)  # xmax
        return prev, cur
    if kind == "sparse_words":
        prev = _content(rng, np)
        cur = prev.copy()
        for _ in range(int(rng.integers(1, 17))):
            at = int(rng.integers(0, PAGE // 8)) * 8
            cur[at:at + 8] = rng.integers(0, 256, 8, dtype=np.uint8)
        return prev, cur
    if kind == "half_page":
        prev = _content(rng, np)
        cur = prev.copy()
        n = int(rng.integers(512, 2049))
        at = int(rng.integers(0, PAGE - n + 1))
        cur[at:at + n] = np.frombuffer(_text(rng, n), dtype=np.uint8)
        return prev, cur
    if kind == "dense_rewrite":
        return _content(rng, np), _content(rng, np)
    if kind == "random_rewrite":
        return _content(rng, np), rng.integers(0, 256, PAGE, dtype=np.uint8)
    if kind == "zero_to_data":
        return zero, _heap_page(rng, np)[0]
    if kind == "data_to_zero":
        return _content(rng, np), zero
    if kind == "zero_rewritten":
        return zero, zero
    if kind == "identical":
        prev = _content(rng, np)
        return prev, prev.copy()
    raise ValueError(kind)


def generate_trace(path, records, seed):
    """Writes a synthetic trace; returns the count of records of each kind."""
    import numpy as np
    rng = np.random.default_rng(seed)
    kinds = list(SYNTHETIC_MIX)
    shares = np.array([SYNTHETIC_MIX[k][0] for k in kinds])
    chosen = rng.choice(len(kinds), size=records, p=shares / shares.sum())
    counts = {k: 0 for k in kinds}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(TRACE_MAGIC + struct.pack(">II", TRACE_VERSION, PAGE))
        for i, k in enumerate(chosen):
            kind = kinds[int(k)]
            counts[kind] += 1
            prev, cur = _pair(kind, rng, np)
            # Block 0 like pc.ram, pages spread like a 1 GiB guest's.
            f.write(struct.pack(">HQ", 0, int(rng.integers(0, 1 << 18))))
            f.write(prev.tobytes())
            f.write(cur.tobytes())
    tmp.rename(path)
    # The trace itself cannot say it is synthetic; this file beside it does,
    # so that the label follows the trace when it is passed with --trace.
    workload.save_json(sidecar(path), {"synthetic": True, "seed": seed, "records": records,
                                       "counts": counts, "mix": _mix_json()})
    return counts


def sidecar(path):
    return Path(str(path) + ".json")


def _mix_json():
    return {k: {"share": share, "stands_for": what} for k, (share, what) in SYNTHETIC_MIX.items()}


# ---- the run ----

def build():
    subprocess.run(["make", "-s", "-C", str(paths.REPO / "dom0-daemon"), "build/compress-bench"],
                   check=True)


def cpu_model():
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def run(args, out_dir):
    build()
    # Other work on this 2-core machine (a lab VM) slows single passes;
    # the load is recorded so a reader can tell.
    loadavg = Path("/proc/loadavg").read_text().split()[:3]
    if args.record_guest:
        from . import trace_record  # boots a VM: only when asked
        traces = trace_record.record(TRACE_DIR) + [Path(t) for t in args.trace]
    elif args.trace:
        traces = [Path(t) for t in args.trace]
    else:
        path = TRACE_DIR / f"synthetic-{args.records}-seed{args.seed}.trace"
        say(f"generating a synthetic trace of {args.records} records into {path}")
        generate_trace(path, args.records, args.seed)
        traces = [path]
    results = []
    for path in traces:
        say(f"measuring {path}")
        out = subprocess.run([str(BENCH_BINARY), "--passes", str(args.passes), str(path)],
                             check=True, capture_output=True, text=True).stdout
        r = json.loads(out)
        side = json.loads(sidecar(path).read_text()) if sidecar(path).exists() else {}
        r["synthetic"] = bool(side.get("synthetic"))
        if r["synthetic"]:
            r["synthetic_mix"] = side.get("mix")
            r["synthetic_counts"] = side.get("counts")
            r["seed"] = side.get("seed")
        elif side.get("workload"):
            r["origin"] = f"recorded from the guest under {side['workload']}"
            r["recorded"] = side
        else:
            r["origin"] = "given with --trace, no synthetic marker beside it"
        results.append(r)
        for name in CODECS:
            c = r["codecs"][name]
            say(f"  {name:8} encode {c['encode_gbps']:6.2f} GB/s  decode "
                f"{c['decode_gbps']:6.2f} GB/s per core (wall {c['encode_gbps_wall']:.2f}/"
                f"{c['decode_gbps_wall']:.2f})  ratio {c['ratio']:5.2f}  "
                f"raw fallbacks {c['raw_fallback_pages']}")
    result = {
        "benchmark": "compress",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "synthetic": all(r["synthetic"] for r in results),
        "note": ("synthetic trace(s): the page mix is a guess, not recorded from a guest; "
                 "ratios rank the codecs, they do not predict a real guest's savings")
                if any(r["synthetic"] for r in results) else "traces recorded from a guest or given with --trace",
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "single_threaded": True,
                    "loadavg_at_start": [float(x) for x in loadavg]},
        "method": ("best of N passes over the whole trace, codecs taking turns in each "
                   "pass; *_gbps: raw page bytes per second of the thread's CPU time (per "
                   "core), *_gbps_wall: per wall-clock second; every codec falls back to "
                   "the raw page when not smaller, fallback copy timed; decode in place "
                   "into the previous version (LZ4 alone: into the page); per-page framing "
                   "on the wire not counted"),
        "targets": {"encode_gbps": TARGET_ENCODE_GBPS, "decode_gbps": TARGET_DECODE_GBPS},
        "traces": results,
    }
    xr = [r["codecs"]["xor_rle"] for r in results]
    result["xor_rle_meets_targets"] = all(
        c["encode_gbps"] >= TARGET_ENCODE_GBPS and c["decode_gbps"] >= TARGET_DECODE_GBPS
        for c in xr)
    stem = args.out or str(out_dir / "compress")
    workload.save_json(stem + ".json", result)
    plot(result, stem + ".png")
    say(f"xor_rle meets the targets (encode >= {TARGET_ENCODE_GBPS}, decode >= "
        f"{TARGET_DECODE_GBPS} GB/s): {result['xor_rle_meets_targets']}; "
        f"wrote {stem}.json and {stem}.png")
    return result


def plot(result, path):
    plt = pyplot()
    labels = {"xor_rle": "XOR+RLE\n(ours)", "lz4": "LZ4\n(page)", "lz4_xor": "LZ4 of\nXOR",
              "xbzrle": "XBZRLE\n(QEMU fmt)", "asc": "ASC hit:\nXOR+RLE,\nelse LZ4"}
    colors = {"xor_rle": "#1f77b4", "lz4": "#ff7f0e", "lz4_xor": "#2ca02c",
              "xbzrle": "#9467bd", "asc": "#17becf"}
    traces = result["traces"]
    width = 0.8 / len(traces)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.3))
    panels = (("encode_gbps", "encode GB/s (1 core)", result["targets"]["encode_gbps"]),
              ("decode_gbps", "decode GB/s (1 core)", result["targets"]["decode_gbps"]),
              ("ratio", "compression ratio (raw / sent)", None))
    for ax, (key, title, target) in zip(axes, panels):
        for t, r in enumerate(traces):
            for i, name in enumerate(CODECS):
                v = r["codecs"][name][key]
                x = i - 0.4 + width * (t + 0.5)
                ax.bar(x, v, width=width * 0.9, color=colors[name],
                       alpha=1.0 if t == 0 else 0.6)
                ax.text(x, v, f"{v:.2f}", ha="center", va="bottom", fontsize=7)
        if target:
            ax.axhline(target, color="#d62728", linestyle="--", linewidth=1,
                       label=f"target {target} GB/s")
            ax.legend(fontsize=8, loc="upper right")
        ax.set_xticks(range(len(CODECS)), [labels[c] for c in CODECS], fontsize=8)
        ax.set_title(title, fontsize=10)
    kind = ("SYNTHETIC trace (page mix guessed, not recorded)" if result["synthetic"]
            else "traces given with --trace")
    records = ", ".join(str(r["records"]) for r in traces)
    fig.suptitle(f"Page codecs, single-threaded, best of {traces[0]['passes']} passes; "
                 f"{kind}; {records} pages; {result['machine']['cpu']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
