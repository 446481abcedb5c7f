"""The lab: network namespaces that play the hosts, database VMs started
and stopped in them, the etcd witness, and the client host's workloads."""
