"""process_alive (remusdb.vm_layout) as the lab's restart of a killed
remusdbd needs it: a process whose main thread has exited while another
thread still runs holds its files, its listening sockets too, so it is
alive; a zombie with no thread left is not. Real processes, no lab."""
import subprocess
import sys
import time

from remusdb.vm_layout import process_alive

# The main thread leaves by the exit system call (60 on x86_64), which ends
# only the calling thread, as a killed process's main thread may go first;
# the other thread runs on for 1.5 s, then the process is gone.
LEADER_FIRST = """
import ctypes, threading, time
threading.Thread(target=time.sleep, args=(1.5,)).start()
print("ready", flush=True)
ctypes.CDLL(None).syscall(60, 0)
"""


def state(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0]


def test_a_process_whose_main_thread_exited_first_is_alive_until_its_last_thread():
    p = subprocess.Popen([sys.executable, "-c", LEADER_FIRST], stdout=subprocess.PIPE)
    try:
        assert p.stdout.readline() == b"ready\n"
        deadline = time.monotonic() + 1.0
        while state(p.pid) != "Z" and time.monotonic() < deadline:
            time.sleep(0.01)
        # the main thread's entry says zombie, and the other thread runs
        assert state(p.pid) == "Z"
        assert process_alive(p.pid)
        # the last thread leaves: the process is gone, though not yet reaped
        deadline = time.monotonic() + 5.0
        while process_alive(p.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not process_alive(p.pid)
        assert state(p.pid) == "Z"
    finally:
        p.kill()
        p.wait()
    assert not process_alive(p.pid)


def test_a_running_process_is_alive_and_a_missing_one_is_not():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        assert process_alive(p.pid)
    finally:
        p.kill()
        p.wait()
    assert not process_alive(p.pid)
