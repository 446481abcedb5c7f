"""Python side of RemusDB-KVM. The product's modules (protection, fork,
control, libvirt, qmp, ...) live here; the subpackages hold the lab
(lab), the failover drills (drill), the benchmarks (bench) and the
commands (cli)."""
