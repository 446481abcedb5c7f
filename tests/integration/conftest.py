"""Integration tests boot the real guest under the real (patched) QEMU in
the lab's namespaces.  One VM is booted per module and shared."""
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[2] / "tools"
sys.path.insert(0, str(TOOLS / "lib"))

from remusdb import netns, vm, witness  # noqa: E402


@pytest.fixture(scope="session")
def lab():
    netns.down()
    netns.up()
    witness.start(members=1)  # protection arbitrates through etcd
    yield netns
    netns.down()


@pytest.fixture(scope="module")
def db_vm(lab):
    name = "itest"
    vm.start(name, "primary", fresh=True, wait_timeout=400)
    yield {"name": name, "host": "primary", "ip": vm.DEFAULT_IP}
    vm.stop(name, "primary")
