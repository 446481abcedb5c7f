"""Where a protected VM's checkpoint pause goes, by QEMU's own clock.

QEMU traces each COLO checkpoint's steps (migration/colo.c,
colo_do_checkpoint_transaction; trace-events colo_send_message,
colo_receive_message, colo_vm_state_change). With the lab's QEMU logging
to its -D file with timestamps (vm.LOG_TIMESTAMPS), enabling those events
through QMP puts one stamped line per step in that file. A checkpoint's
steps, and the phases between them:

  request   QEMU sends CHECKPOINT_REQUEST (the guest runs)
  A         ... our CHECKPOINT_REPLY read by QEMU: our loop's answer
  B         ... the guest stopped (vm_stop_force_state: the vCPUs stop)
  C         ... VMSTATE_SEND sent
  D         ... VMSTATE_SIZE sent: the RAM pages written to us, then the
              device state saved into QEMU's buffer
  E         ... VMSTATE_RECEIVED read: the device state written to us,
              read, parsed and answered by our loop
  F         ... VMSTATE_LOADED read
  G         ... the guest runs again (vm_start)

The guest's pause is B's end to G's end; ours (status's pause_ms) is our
REPLY to our LOADED, about B through F.
"""

import math
import re

# QEMU 7.2's trace-events (migration/trace-events): the three that mark a checkpoint.
EVENTS = ("colo_send_message", "colo_receive_message", "colo_vm_state_change")

# (event, the text its line carries) for each step, in the order they come
STEPS = (("colo_send_message", "'checkpoint-request'"),
         ("colo_receive_message", "'checkpoint-reply'"),
         ("colo_vm_state_change", "'run' => 'stop'"),
         ("colo_send_message", "'vmstate-send'"),
         ("colo_send_message", "'vmstate-size'"),
         ("colo_receive_message", "'vmstate-received'"),
         ("colo_receive_message", "'vmstate-loaded'"),
         ("colo_vm_state_change", "'stop' => 'run'"))
PHASES = ("A_reply", "B_stop", "C_send", "D_ram", "E_device", "F_loaded", "G_start")

# "PID@SECONDS.MICROS:event text": the log backend's line with -msg timestamp=on
LINE = re.compile(r"^\d+@(\d+\.\d+):(\w+) (.*)$")


def enable(qmp):
    """Turns the events on in a running QEMU (qmp: a lab QMP connection)."""
    for name in EVENTS:
        qmp.command("trace-event-set-state", name=name, enable=True)


def checkpoints(lines):
    """Each whole checkpoint in the log's lines: its steps' times (seconds
    since the epoch), in STEPS order. A checkpoint cut short (the log's
    start, QEMU leaving COLO) is left out."""
    out, cur = [], None
    for line in lines:
        m = LINE.match(line)
        if not m:
            continue
        t, event, text = float(m.group(1)), m.group(2), m.group(3)
        step = next((i for i, (e, mark) in enumerate(STEPS) if e == event and mark in text),
                    None)
        if step is None:
            continue
        if step == 0:
            cur = [t] + [None] * (len(STEPS) - 1)
        elif cur is not None:
            if cur[step] is not None or cur[step - 1] is None:
                cur = None  # out of order: not one checkpoint's
                continue
            cur[step] = t
            if step == len(STEPS) - 1:
                out.append(cur)
                cur = None
    return out


def percentile(values, p):
    """The nearest-rank percentile (as the daemon's sample rings give it)."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s), max(1, math.ceil(p / 100 * len(s)))) - 1]


def summary(lines, since, until):
    """p50 and p99 of each phase, of the guest's pause (stopped to
    running) and of ours (REPLY read to LOADED read), in ms, over the
    checkpoints requested in [since, until] (time.time() values)."""
    cps = [c for c in checkpoints(lines) if since <= c[0] <= until]
    if not cps:
        return {"checkpoints": 0}
    out = {"checkpoints": len(cps)}

    def put(name, values):
        out[f"{name}_ms_p50"] = round(percentile(values, 50), 3)
        out[f"{name}_ms_p99"] = round(percentile(values, 99), 3)
    for i, name in enumerate(PHASES):
        put(name, [(c[i + 1] - c[i]) * 1000 for c in cps])
    put("guest_pause", [(c[7] - c[2]) * 1000 for c in cps])
    put("reply_to_loaded", [(c[6] - c[1]) * 1000 for c in cps])
    return out


def read_summary(path, since, until):
    """summary() of the QEMU log at path; None when it cannot be read."""
    try:
        with open(path, errors="replace") as f:
            return summary(f, since, until)
    except OSError:
        return None
