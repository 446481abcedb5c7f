"""A guest with two vCPUs (multi-threaded TCG here, KVM where it boots)
under pgbench: protected, its memory equal page for page on the backup
at held checkpoints, and forked from its backup into a read replica that
also runs two vCPUs. (Its power-loss drill is test_remus.py's.)

What a vCPU count changes for checkpointing is the device state (one CPU
section per vCPU) and the dirty pages two CPUs make at once; the image
check compares every page's XXH3-64 on both sides, so a page a second
vCPU wrote and the checkpoint missed is caught."""
import subprocess
from contextlib import closing
from pathlib import Path

from remusdb import fork, guest_agent, protection
from remusdb.drill.lab import forget_ownership, stop_vm_everywhere
from remusdb.lab import netns, vm, workload
from pgbench_load import PgbenchLoad
from polling import wait_for

REPO = Path(__file__).resolve().parents[2]
# The 2-vCPU power-loss drill's VM (test_remus.py): its saved guest serves both.
NAME = "dsmp"
CHECKS = 2


def vcpus_online(host, name):
    with closing(guest_agent.GuestAgent(vm.vm_files(host, name)["qga"], 10.0)) as ga:
        return sum(1 for c in ga.command("guest-get-vcpus") if c.get("online"))


def test_two_vcpu_guest_keeps_its_image_and_forks(lab):
    stop_vm_everywhere(NAME)
    forget_ownership(NAME)
    vm.start(NAME, "primary", from_saved=True, cpus=2, wait_timeout=400)
    vm.ensure_daemon("backup")
    bench, clones = None, []
    try:
        assert vcpus_online("primary", NAME) == 2
        protection.protect(NAME, "10.77.0.2:7788", 50)
        protection.wait_protected(NAME, timeout=300)
        bench = PgbenchLoad(vm.DEFAULT_IP, clients=4)
        bench.wait_connected()
        wait_for(lambda: protection.primary_protection("primary", NAME)["epochs"] > 20, 60,
                 "epochs under the load")
        for i in range(CHECKS):
            cli = subprocess.run([str(REPO / "tools" / "remusdb"), "check-image", NAME],
                                 capture_output=True, text=True, timeout=180)
            print(f"check-image {i}:", cli.stdout.strip(), cli.stderr.strip()[-400:])
            assert cli.returncode == 0 and ", 0 differ" in cli.stdout, (cli.stdout, cli.stderr)
        p = protection.primary_protection("primary", NAME)
        print("dirty pages per epoch:", p["dirty_pages_per_epoch_mean"], "epochs:", p["epochs"])
        assert p["dirty_pages_per_epoch_mean"] > 0, p
        report = fork.fork(NAME, 1, hosts=["primary"], role="replica",
                           connect_via=netns.client_call,
                           on_registered=clones.append)
        clones = report["clones"]
        c = clones[0]
        print("clone:", {k: c[k] for k in ("name", "host", "ip", "running_s", "first_query_s")})
        assert workload.psql(c["ip"], "SELECT pg_is_in_recovery()") == "t"
        assert vcpus_online(c["host"], c["name"]) == 2
        load = bench.finish()
        bench = None
        print(f"load: {load['runs']} pgbench runs, {load['transactions']} transactions")
        assert load.get("exit_code") == 0 and load.get("transactions"), load.get("output")
    finally:
        if bench:
            bench.finish()
        if clones:
            fork.stop_clones(clones)
            try:
                fork.release(NAME)
            except Exception as e:  # cleanup goes on; the assertion above said what failed
                print("release:", e)
        stop_vm_everywhere(NAME)
