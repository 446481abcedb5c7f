# RemusDB-KVM top-level entry point.
#   make demo   - set everything up, boot the lab and the PostgreSQL VM, run pgbench
#   make test   - set everything up, run unit tests (ASan+UBSan), valgrind and
#                 the VM integration tests
# Builds (QEMU, guest image) are cached in $(REMUSDB_CACHE), outside the repo.
export REMUSDB_CACHE ?= /var/cache/remusdb
PYTHON := /usr/bin/python3

.PHONY: all setup deps qemu daemon guest-image demo test unit-test valgrind \
        integration-test fuzz bench-baseline bench-remus bench-silence lab-down clean

all: setup

setup: deps qemu daemon guest-image

deps:
	@bash tools/setup/install-deps.sh

qemu: deps
	@bash tools/setup/build-qemu.sh

daemon: deps
	@$(MAKE) -s -C dom0-daemon

guest-image: deps
	@bash tools/setup/build-guest-image.sh

demo: setup
	@$(PYTHON) tools/remusdb-demo

unit-test: deps
	@$(MAKE) -s -C dom0-daemon unit-test

valgrind: deps
	@$(MAKE) -s -C dom0-daemon valgrind

integration-test: setup
	@$(PYTHON) -m pytest -v -rP -p no:cacheprovider tests/integration

test: setup unit-test valgrind integration-test

fuzz: deps
	@$(MAKE) -s -C dom0-daemon fuzz

bench-baseline: setup
	@$(PYTHON) tools/remusdb-bench baseline

bench-remus: setup
	@$(PYTHON) tools/remusdb-bench remus

bench-silence: setup
	@$(PYTHON) tools/remusdb-bench silence

lab-down:
	@$(PYTHON) tools/remusdb-lab down

clean:
	@$(MAKE) -s -C dom0-daemon clean
