"""Python side of RemusDB-KVM: the lab, the VM launcher and the CLI."""
