# gangrun's build, demo and test entry points. `make demo` and `make test` install what
# is missing first (scripts/install-deps.sh), so both work on a fresh Debian machine;
# each target installs only what it needs.

GO        ?= go
PYTHON    ?= /usr/bin/python3
BIN       := bin/gangrun
CONSUL    := $(CURDIR)/.tools/bin/consul
# go-nvml's cgo bindings print pages of deprecation warnings without this.
export CGO_CFLAGS := -Wno-deprecated-declarations
export CGO_ENABLED := 1
# Tests find their real dependencies through these.
export GANGRUN_CONSUL := $(CONSUL)
export GANGRUN_PYTHON := $(PYTHON)
# torch 2.x from PyPI (requirements/torch2.txt) in a virtual environment cached outside
# the clone (scripts/install-torch2.sh): the PyTorch tests whose outcome can differ
# between versions run on both interpreters, and the torchrun comparisons use its torchrun.
PYTHON2   ?= $(shell scripts/install-torch2.sh --path)
export GANGRUN_PYTHON2 := $(PYTHON2)
# The trainers whose own saves the checkpoint tests cut short (requirements/trainers.txt:
# transformers, accelerate, DeepSpeed, Lightning), a directory of packages cached outside
# the clone that runs on PYTHON2 through PYTHONPATH (scripts/install-trainers.sh).
TRAINERS  ?= $(shell scripts/install-trainers.sh --path)
export GANGRUN_TRAINERS := $(TRAINERS)
# The Slurm clients whose own code drives the Slurm commands in the client tests
# (requirements/clients.txt: submitit, dask-jobqueue; Lightning's SLURMEnvironment is
# among the trainers), a directory cached the same way (scripts/install-clients.sh).
CLIENTS   ?= $(shell scripts/install-clients.sh --path)
export GANGRUN_CLIENTS := $(CLIENTS)

# The release version is the VERSION file's (the root package embeds it); the commit is
# given to the binary here, since Go records none where GOFLAGS has -buildvcs=false.
VERSION   := $(shell cat VERSION)
COMMIT    ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null)$(shell git diff --quiet HEAD -- 2>/dev/null || echo -dirty)
LDFLAGS   := -X github.com/gangrun/gangrun.commit=$(COMMIT)

# Where `make install` puts gangrun (docs/operations.md, "Install"): DESTDIR stages it
# in a tree (packages, tests), PREFIX the rest. The agent's settings always go under
# SYSCONFDIR/gangrun (/etc/gangrun), the systemd unit where systemd looks for a PREFIX
# (/usr/local/lib/systemd/system; /usr/lib/systemd/system for a package).
DESTDIR    ?=
PREFIX     ?= /usr/local
BINDIR     ?= $(PREFIX)/bin
SYSCONFDIR ?= /etc
UNITDIR    ?= $(PREFIX)/lib/systemd/system
DOCDIR     ?= $(PREFIX)/share/doc/gangrun
# The Slurm command names installed in BINDIR as links to gangrun, which answers to
# them by argv[0] (docs/slurm.md; `gangrun slurm-links DIR` makes the same links).
# Empty it (make install SLURM_LINKS=) on a host whose real Slurm must keep them.
SLURM_LINKS := sbatch srun salloc squeue scancel scontrol sacct sinfo sstat sprio sshare sattach
# The Debian package's version (scripts/package-deb.sh): unset, the script takes the
# release version (VERSION) on the commit tagged vVERSION with a clean tree, else
# VERSION+git.COMMIT (a build after that release, sorting after it).
DEB_VERSION ?=

# What each target installs (scripts/install-deps.sh components). The demo runs on one
# machine with the embedded coordinator: Debian's torch only, no Consul build. The tests start
# Consul dev agents and real PyTorch (Debian's 1.13 and PyPI's 2.x, with the trainers over 2.x), and use ip, a real
# Prometheus server (and promtool), headless Chromium, useradd, munged, a real Slurm (the Slurm front end's
# comparisons) and Environment Modules; the benchmarks Consul and PyTorch.
DEMO_DEPS  := torch
TEST_DEPS  := torch torch2 trainers clients consul iproute2 prometheus chromium passwd munge slurm modules
BENCH_DEPS := torch consul

.PHONY: all build tag install uninstall deb deps demo test test-short bench fuzz lint clean

all: build

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/gangrun
	@$(BIN) version

# Tags the commit checked out as release v$(VERSION) (an annotated tag; push it
# yourself): refused on a tree with changes, or when the tag exists. Raise VERSION in a
# commit of its own first; docs/operations.md ("Upgrades") says what a release promises.
tag:
	@git diff --quiet HEAD -- || { echo "make tag: the tree has uncommitted changes"; exit 1; }
	@! git rev-parse -q --verify "refs/tags/v$(VERSION)" >/dev/null || { echo "make tag: v$(VERSION) exists: raise VERSION first"; exit 1; }
	git tag -a "v$(VERSION)" -m "gangrun $(VERSION)"

# The binary, the agent's systemd unit, its settings files (never over an operator's:
# an existing agent.conf or agent.env is kept) and the operations guide with the
# settings example. As root for a node: make && sudo make install.
install: build
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSCONFDIR)/gangrun $(DESTDIR)$(DOCDIR)/examples
	install -m 0755 $(BIN) $(DESTDIR)$(BINDIR)/gangrun
	for n in $(SLURM_LINKS); do ln -sf gangrun $(DESTDIR)$(BINDIR)/$$n; done
	sed -e 's|@BINDIR@|$(BINDIR)|g' -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g' -e 's|@DOCDIR@|$(DOCDIR)|g' \
	  packaging/gangrun-agent.service.in > $(DESTDIR)$(UNITDIR)/gangrun-agent.service.tmp
	chmod 0644 $(DESTDIR)$(UNITDIR)/gangrun-agent.service.tmp
	mv -f $(DESTDIR)$(UNITDIR)/gangrun-agent.service.tmp $(DESTDIR)$(UNITDIR)/gangrun-agent.service
	for f in agent.conf agent.env; do \
	  install -m 0644 packaging/$$f $(DESTDIR)$(DOCDIR)/examples/$$f; \
	  if [ -e $(DESTDIR)$(SYSCONFDIR)/gangrun/$$f ]; then echo "kept $(DESTDIR)$(SYSCONFDIR)/gangrun/$$f (this release's example: $(DESTDIR)$(DOCDIR)/examples/$$f)"; \
	  else install -m 0644 packaging/$$f $(DESTDIR)$(SYSCONFDIR)/gangrun/$$f; fi; \
	done
	install -m 0644 docs/operations.md $(DESTDIR)$(DOCDIR)/operations.md

# What install put there, but the settings under SYSCONFDIR/gangrun (the operator's).
uninstall:
	rm -f $(DESTDIR)$(BINDIR)/gangrun $(DESTDIR)$(UNITDIR)/gangrun-agent.service
	for n in $(SLURM_LINKS); do rm -f $(DESTDIR)$(BINDIR)/$$n; done
	rm -rf $(DESTDIR)$(DOCDIR)

# The Debian package of the same files, in dist/ (scripts/package-deb.sh).
deb: build
	DEB_VERSION=$(DEB_VERSION) scripts/package-deb.sh dist

# Everything any target needs.
deps:
	scripts/install-deps.sh $(sort $(DEMO_DEPS) $(TEST_DEPS) $(BENCH_DEPS))

# The main job: 2 workers of a real PyTorch DDP trainer for 200 steps; one rank fails at
# step 130 on the first attempt, gangrun stops the gang and resumes it from step 120,
# warm: --warm-delay 0s starts the standbys with the workers (attempt 0 fails within the
# default 5 s on a fast machine, which would restart it cold).
demo: build
	scripts/install-deps.sh $(DEMO_DEPS)
	rm -rf demo-run
	$(BIN) run --nproc-per-node 2 --checkpoint-dir demo-run/ckpt --log-dir demo-run/logs \
	  --restart-backoff 1s --warm-delay 0s -- \
	  $(PYTHON) scripts/examples/train_ddp.py --steps 200 --ckpt-every 20 --fail-at-step 130

test:
	scripts/install-deps.sh $(TEST_DEPS)
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 40m ./...

# Quick loop while developing: no race detector, no install step.
test-short:
	$(GO) test -count=1 -short ./...

bench: build
	scripts/install-deps.sh $(BENCH_DEPS)
	benchmarks/run.sh

# Each fuzz target for 30 s (go test runs one -fuzz target per invocation).
fuzz:
	$(GO) test ./hostlist -run '^$$' -fuzz FuzzExpand -fuzztime 30s
	$(GO) test ./hostlist -run '^$$' -fuzz FuzzCompress -fuzztime 30s
	$(GO) test ./bench -run '^$$' -fuzz FuzzParse -fuzztime 30s -fuzzminimizetime 2s
	$(GO) test ./checkpoint -run '^$$' -fuzz FuzzLatest -fuzztime 30s
	$(GO) test ./checkpoint -run '^$$' -fuzz FuzzReadPickle -fuzztime 30s
	$(GO) test ./topology -run '^$$' -fuzz FuzzParseNCCLList -fuzztime 30s
	$(GO) test ./topology -run '^$$' -fuzz FuzzParseCPUList -fuzztime 30s
	$(GO) test ./topology -run '^$$' -fuzz FuzzDecode -fuzztime 30s
	$(GO) test ./topology -run '^$$' -fuzz FuzzParseNvidiaSMI -fuzztime 30s -fuzzminimizetime 2s
	$(GO) test ./policy -run '^$$' -fuzz FuzzParse -fuzztime 30s
	$(GO) test ./internal/jsonfile -run '^$$' -fuzz FuzzDecode -fuzztime 30s
	$(GO) test ./internal/quote -run '^$$' -fuzz FuzzQ -fuzztime 30s
	$(GO) test ./internal/schema -run '^$$' -fuzz FuzzOf -fuzztime 30s
	$(GO) test ./internal/flagfile -run '^$$' -fuzz FuzzParse -fuzztime 30s
	$(GO) test ./job -run '^$$' -fuzz FuzzParseTime -fuzztime 30s
	$(GO) test ./job -run '^$$' -fuzz FuzzScriptOptions -fuzztime 30s
	$(GO) test ./cmd/gangrun -run '^$$' -fuzz FuzzFlags -fuzztime 30s
	$(GO) test ./internal/tcpstore -run '^$$' -fuzz FuzzServe -fuzztime 30s
	$(GO) test ./cmd/gangrun -run '^$$' -fuzz FuzzExpandArgs -fuzztime 30s
	$(GO) test ./launcher -run '^$$' -fuzz FuzzParseStd -fuzztime 30s
	$(GO) test ./rendezvous -run '^$$' -fuzz FuzzParseC10dURL -fuzztime 30s

clean:
	rm -rf bin demo-run dist
