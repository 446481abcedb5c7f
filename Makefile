# RemusDB-KVM top-level entry point.
#   make demo   - set everything up, boot the lab and the PostgreSQL VM, run pgbench
#   make test   - set everything up, run unit tests (ASan+UBSan), valgrind and
#                 the VM integration tests
#   make install - remusdbd, the CLI, the units and man pages under
#                 $(DESTDIR)$(PREFIX) (docs/packaging.md); needs only the
#                 daemon's build dependencies and pandoc, not `make setup`
# Builds (QEMU, guest image) are cached in $(REMUSDB_CACHE), outside the repo.
export REMUSDB_CACHE ?= /var/cache/remusdb
PYTHON := /usr/bin/python3

.PHONY: all setup deps qemu daemon guest-image demo test unit-test valgrind \
        integration-test fuzz bench-baseline bench-remus bench-silence lab-down clean \
        install man

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

# --durations=0: every test's setup, call and teardown time in the log,
# slowest first (where the suite's time goes).
integration-test: setup
	@$(PYTHON) -m pytest -v -rP -p no:cacheprovider --durations=0 tests/integration

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

# ---------------------------------------------------------------- install
# PREFIX/sbin/remusdbd, PREFIX/lib/remusdb/remusdbd-pagesrc (remusdbd looks
# there), PREFIX/bin/{remusdb,remusdb-protect,remusdb-drill} with their
# library in PREFIX/lib/remusdb/python (the scripts look there when they
# have no lib/ beside them), the systemd template unit, man pages made
# from docs/man/*.md by pandoc, docs and examples.
PREFIX ?= /usr/local
DESTDIR ?=
SYSCONFDIR ?= /etc
BINDIR = $(PREFIX)/bin
SBINDIR = $(PREFIX)/sbin
PKGLIBDIR = $(PREFIX)/lib/remusdb
MANDIR = $(PREFIX)/share/man
DOCDIR ?= $(PREFIX)/share/doc/remusdb
SYSTEMDUNITDIR ?= $(PREFIX)/lib/systemd/system
# Generated files go here, outside the source tree's tracked files.
MAN_BUILD = dom0-daemon/build/man
MAN_PAGES = $(patsubst docs/man/%.md,$(MAN_BUILD)/%,$(wildcard docs/man/*.md))
CLI_SCRIPTS = remusdb remusdb-protect remusdb-drill
DOCS = README.md docs/architecture.md docs/protocol.md docs/witness.md docs/fork.md \
       docs/drbd.md docs/operations.md docs/packaging.md

$(MAN_BUILD)/%: docs/man/%.md
	@mkdir -p $(MAN_BUILD)
	pandoc -s -f markdown-smart -t man $< -o $@

man: $(MAN_PAGES)

install: man
	$(MAKE) -C dom0-daemon install PREFIX=$(PREFIX) DESTDIR=$(DESTDIR)
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(PKGLIBDIR)/python/remusdb
	for s in $(CLI_SCRIPTS); do install -m 755 tools/$$s $(DESTDIR)$(BINDIR)/$$s; done
	install -m 644 tools/lib/remusdb/*.py $(DESTDIR)$(PKGLIBDIR)/python/remusdb/
	install -d $(DESTDIR)$(SYSTEMDUNITDIR)
	sed -e 's|@SBINDIR@|$(SBINDIR)|g' -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g' \
		dist/remusdbd@.service.in > $(DESTDIR)$(SYSTEMDUNITDIR)/remusdbd@.service
	chmod 644 $(DESTDIR)$(SYSTEMDUNITDIR)/remusdbd@.service
	install -d $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man8
	for m in $(MAN_PAGES); do \
		n=$$(basename $$m); install -m 644 $$m $(DESTDIR)$(MANDIR)/man$${n##*.}/$$n; \
	done
	install -d $(DESTDIR)$(DOCDIR)/examples
	install -m 644 $(DOCS) $(DESTDIR)$(DOCDIR)/
	install -m 644 docs/examples/protect-db.yml $(DESTDIR)$(DOCDIR)/examples/
	sed -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g' dist/remusdbd.conf.example \
		> $(DESTDIR)$(DOCDIR)/examples/remusdbd.conf
	chmod 644 $(DESTDIR)$(DOCDIR)/examples/remusdbd.conf

clean:
	@$(MAKE) -s -C dom0-daemon clean
