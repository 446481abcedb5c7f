# RemusDB-KVM top-level entry point.
#   make demo   - set everything up, boot the lab and the PostgreSQL VM, run pgbench
#   make test   - set everything up, run unit tests (ASan+UBSan), the pure-Python
#                 tests (tests/python), valgrind and the VM integration tests
#   make install - remusdbd, the CLI, the units and man pages under
#                 $(DESTDIR)$(PREFIX) (docs/packaging.md); needs only the
#                 daemon's build dependencies and pandoc, not `make setup`
# Builds (QEMU, guest image) are cached in $(REMUSDB_CACHE), outside the repo.
export REMUSDB_CACHE ?= /var/cache/remusdb
PYTHON := /usr/bin/python3

.PHONY: all setup deps qemu daemon guest-image demo test unit-test python-test lab-constants valgrind \
        integration-test fuzz bench-baseline bench-remus bench-silence lab-down clean \
        install man

all: setup

setup: deps qemu daemon guest-image

deps:
	@bash tools/setup/install-deps.sh

qemu: deps
	@bash tools/setup/build-qemu.sh

daemon: deps
	@$(MAKE) -s -C dom0-daemon USE_CCACHE=1

guest-image: deps
	@bash tools/setup/build-guest-image.sh

demo: setup
	@tools/remusdb-demo

unit-test: deps
	@$(MAKE) -s -C dom0-daemon USE_CCACHE=1 unit-test

# The Python package's own tests: no lab, no VM, no daemon (tests/python).
python-test: deps
	@$(PYTHON) -m pytest -q -p no:cacheprovider tests/python

# The product knows nothing of the lab: no lab namespace, netns or 10.77.
# address in product code (tools/check_no_lab_constants.py), and the
# check's own negative controls.
lab-constants:
	@$(PYTHON) tools/check_no_lab_constants.py
	@$(PYTHON) tools/check_no_lab_constants.py --self-test

valgrind: deps
	@$(MAKE) -s -C dom0-daemon USE_CCACHE=1 valgrind

# --durations=0: every test's setup, call and teardown time in the log,
# slowest first (where the suite's time goes).
integration-test: setup
	@$(PYTHON) -m pytest -v -rP -p no:cacheprovider --durations=0 tests/integration

# The checks before the VM tests run two at a time: the valgrind run is
# CPU-bound on one core while the ASan run mostly waits on its timers.
# --output-sync keeps each one's output together in the log.
test: setup
	@$(MAKE) -s -j2 --output-sync=target unit-test valgrind python-test lab-constants
	@$(MAKE) -s integration-test

fuzz: deps
	@$(MAKE) -s -C dom0-daemon USE_CCACHE=1 fuzz

bench-baseline: setup
	@tools/remusdb-bench baseline

bench-remus: setup
	@tools/remusdb-bench remus

bench-silence: setup
	@tools/remusdb-bench silence

lab-down:
	@tools/remusdb-lab down

# ---------------------------------------------------------------- install
# PREFIX/sbin/remusdbd, PREFIX/lib/remusdb/remusdbd-pagesrc (remusdbd looks
# there), the Python package remusdb (pyproject.toml) installed by pip in
# PREFIX/lib/python3/dist-packages with its commands (remusdb,
# remusdb-protect, remusdb-drill, ...) as console scripts in PREFIX/bin,
# the systemd template unit, libvirt's qemu hook (dist/libvirt-hook.in,
# docs/libvirt.md), man pages made from docs/man/*.md by pandoc,
# docs and examples, and the Prometheus alert rules in DATADIR/prometheus:
# data for the Prometheus server to load, not a setting of this host.
# Prometheus usually runs on another machine than the VM hosts, and
# /etc/prometheus belongs to Debian's prometheus package, which loads only
# the rule files its own prometheus.yml names (docs/deployment.md).
PREFIX ?= /usr/local
DESTDIR ?=
SYSCONFDIR ?= /etc
SBINDIR = $(PREFIX)/sbin
MANDIR = $(PREFIX)/share/man
DOCDIR ?= $(PREFIX)/share/doc/remusdb
DATADIR ?= $(PREFIX)/share/remusdb
SYSTEMDUNITDIR ?= $(PREFIX)/lib/systemd/system
# libvirt (>= 6.5) runs every executable here before it starts a domain.
LIBVIRT_HOOKDIR ?= $(SYSCONFDIR)/libvirt/hooks/qemu.d
# Generated files go here, outside the source tree's tracked files.
MAN_BUILD = dom0-daemon/build/man
MAN_PAGES = $(patsubst docs/man/%.md,$(MAN_BUILD)/%,$(wildcard docs/man/*.md))
# The Python package goes where Debian's layout (deb_system) puts it,
# PYTHON_SITE, which /usr/bin/python3 searches for PREFIX=/usr; another
# PREFIX needs it on PYTHONPATH. pip builds from the tree offline with the
# system's setuptools and leaves build/ and the egg-info there, removed
# afterwards with the record of the directory it installed from
# (direct_url.json), which would differ between builds.
PYTHON_SITE = $(PREFIX)/lib/python3/dist-packages
PIP_INSTALL = DEB_PYTHON_INSTALL_LAYOUT=deb_system $(PYTHON) -m pip install --no-deps \
	--no-build-isolation --no-index --no-cache-dir --no-compile --root-user-action=ignore \
	--disable-pip-version-check $(if $(DESTDIR),--root $(DESTDIR)) --prefix $(PREFIX)
PIP_LEFTOVERS = build tools/lib/remusdb.egg-info
DOCS = README.md docs/architecture.md docs/protocol.md docs/witness.md docs/fork.md \
       docs/drbd.md docs/operations.md docs/packaging.md docs/deployment.md

$(MAN_BUILD)/%: docs/man/%.md
	@mkdir -p $(MAN_BUILD)
	pandoc -s -f markdown-smart -t man $< -o $@

man: $(MAN_PAGES)

install: man
	$(MAKE) -C dom0-daemon install PREFIX=$(PREFIX) DESTDIR=$(DESTDIR)
	$(PIP_INSTALL) .
	rm -rf $(PIP_LEFTOVERS)
	rm -f $(DESTDIR)$(PYTHON_SITE)/remusdb-*.dist-info/direct_url.json
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
	install -m 644 docs/examples/protect-db.yml docs/examples/cluster.yml $(DESTDIR)$(DOCDIR)/examples/
	sed -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g' dist/remusdbd.conf.example \
		> $(DESTDIR)$(DOCDIR)/examples/remusdbd.conf
	chmod 644 $(DESTDIR)$(DOCDIR)/examples/remusdbd.conf
	install -d $(DESTDIR)$(DATADIR)/prometheus
	install -m 644 dist/prometheus/remusdb-alerts.yml $(DESTDIR)$(DATADIR)/prometheus/
	install -d $(DESTDIR)$(LIBVIRT_HOOKDIR)
	sed -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g' -e 's|@PYTHON_SITE@|$(PYTHON_SITE)|g' \
		dist/libvirt-hook.in > $(DESTDIR)$(LIBVIRT_HOOKDIR)/remusdb
	chmod 755 $(DESTDIR)$(LIBVIRT_HOOKDIR)/remusdb

clean:
	@$(MAKE) -s -C dom0-daemon clean
	@rm -rf $(PIP_LEFTOVERS)
