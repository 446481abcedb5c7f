"""Where a remusdbd's event loop spends its time: perf samples of the
loop's thread over a window, each charged to the handler the loop was
running (the frame just above event_loop_run_once in its stack).

Issue 23 asks which per-VM work should leave the shared loop, chosen by
measurement. The loop's turn histogram (status "loop") says how long the
loop was held, not by whom; this says by whom. perf's own work takes CPU
on the host beside the guests, so a window profiled this way is for
attribution only, never for the pause figures."""
import collections
import functools
import re
import shutil
import subprocess
from pathlib import Path

# cpu-clock works where hardware counters do not (a nested hypervisor's
# guest); 499 Hz keeps perf's unwinding well under a core.
SAMPLE_HZ = 499
# Bytes of stack copied per sample for DWARF unwinding: the loop's stacks
# are shallow, and a deeper copy costs perf more CPU per sample.
STACK_COPY = 16384
SOURCE_DIR = Path(__file__).resolve().parents[4] / "dom0-daemon" / "src"


class Recording:
    """perf record of one thread for `seconds`, started at once and
    collected by finish() (it ends by itself: perf's `-- sleep`)."""

    def __init__(self, tid, seconds, out):
        self.out, self.seconds, self.problem, self.proc = Path(out), seconds, None, None
        perf = shutil.which("perf")
        if not perf:
            self.problem = "perf is missing (Debian: apt install linux-perf)"
            return
        self.proc = subprocess.Popen(
            [perf, "record", "-q", "-e", "cpu-clock", "-F", str(SAMPLE_HZ), "--call-graph",
             f"dwarf,{STACK_COPY}", "-t", str(tid), "-o", str(self.out), "--", "sleep",
             str(seconds)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def finish(self):
        """The attribution (attribute()), or {"problem": ...}."""
        if self.problem:
            return {"problem": self.problem}
        try:
            _, err = self.proc.communicate(timeout=self.seconds + 60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            return {"problem": f"perf record did not end {self.seconds + 60} s after its start"}
        if self.proc.returncode != 0:
            return {"problem": f"perf record exited {self.proc.returncode}: {err.strip()[-300:]}"}
        try:
            text = subprocess.run(["perf", "script", "-i", str(self.out), "-F", "ip,sym",
                                   "--no-inline"], capture_output=True, text=True,
                                  timeout=600, check=True).stdout
        except (subprocess.SubprocessError, OSError) as e:
            return {"problem": f"perf script failed: {e}"}
        finally:
            self.out.unlink(missing_ok=True)
        return attribute(text, self.seconds)


def stacks(script_text):
    """perf script's samples as lists of function names, leaf first."""
    for block in script_text.split("\n\n"):
        frames = []
        for line in block.splitlines():
            words = line.split()
            if len(words) >= 2 and re.fullmatch(r"[0-9a-f]+", words[0]):
                frames.append(re.sub(r"\+0x[0-9a-f]+$", "", words[1]))
        if frames:
            yield frames


def handler_of(frames):
    """Whom one sample's time is charged to: the handler the loop called,
    the loop's own wait, or, for a stack perf could not unwind to the loop,
    its outermost frame."""
    for i, name in enumerate(frames):
        if name.startswith("event_loop_run_once"):
            if i == 0 or any("epoll_wait" in f for f in frames[:i]):
                return "(the loop's own wait and bookkeeping)"
            return frames[i - 1]
    known = [f for f in frames if f != "[unknown]"]
    return f"(not unwound to the loop; outermost frame {known[-1] if known else '[unknown]'})"


@functools.lru_cache(maxsize=1)
def daemon_sources():
    """The daemon's C sources by path under SOURCE_DIR, read once for every
    handler looked up (none where the tree is not there, as installed)."""
    return {str(p.relative_to(SOURCE_DIR)): p.read_text(errors="replace")
            for p in sorted(SOURCE_DIR.rglob("*.c"))}


def defined_in(function):
    """The daemon's source files that define `function` (static handlers
    share names across files, so there may be several)."""
    function = re.sub(r"\.(isra|part|constprop|cold)\.?\d*.*$", "", function)
    pattern = re.compile(rf"^(static )?[a-z].*\b{re.escape(function)}\(", re.M)
    return [path for path, text in daemon_sources().items() if pattern.search(text)]


def attribute(script_text, seconds, top=12):
    """Per handler: its share of the loop thread's samples, and how much of
    a core that was; the top functions by self time."""
    by_handler, by_leaf, n = collections.Counter(), collections.Counter(), 0
    for frames in stacks(script_text):
        n += 1
        by_handler[handler_of(frames)] += 1
        by_leaf[frames[0]] += 1
    if not n:
        return {"problem": "perf recorded no samples of the loop's thread"}
    return {"samples": n, "seconds": seconds, "hz": SAMPLE_HZ,
            "loop_thread_cores": round(n / (SAMPLE_HZ * seconds), 4),
            "handlers": [{"handler": h, "share": round(c / n, 4),
                          "defined_in": defined_in(h) if not h.startswith("(") else []}
                         for h, c in by_handler.most_common()],
            "self_time": [{"function": f, "share": round(c / n, 4)}
                          for f, c in by_leaf.most_common(top)]}
