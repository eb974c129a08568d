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

# The release version is the VERSION file's (the root package embeds it); the commit is
# given to the binary here, since Go records none where GOFLAGS has -buildvcs=false.
VERSION   := $(shell cat VERSION)
COMMIT    ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null)$(shell git diff --quiet HEAD -- 2>/dev/null || echo -dirty)
LDFLAGS   := -X github.com/gangrun/gangrun.commit=$(COMMIT)

# What each target installs (scripts/install-deps.sh components). The demo runs on one
# machine with the embedded coordinator: torch only, no Consul build. The tests start
# Consul dev agents and real PyTorch, and use ip, a real Prometheus server (and
# promtool), headless Chromium and useradd; the benchmarks Consul and PyTorch.
DEMO_DEPS  := torch
TEST_DEPS  := torch consul iproute2 prometheus chromium passwd munge
BENCH_DEPS := torch consul

.PHONY: all build tag deps demo test test-short bench fuzz lint clean

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

# Everything any target needs.
deps:
	scripts/install-deps.sh $(sort $(DEMO_DEPS) $(TEST_DEPS) $(BENCH_DEPS))

# The main job: 2 workers of a real PyTorch DDP trainer for 200 steps; one rank fails at
# step 130 on the first attempt, gangrun stops the gang and resumes it from step 120.
demo: build
	scripts/install-deps.sh $(DEMO_DEPS)
	rm -rf demo-run
	$(BIN) run --nproc-per-node 2 --checkpoint-dir demo-run/ckpt --log-dir demo-run/logs \
	  --restart-backoff 1s -- \
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
	$(GO) test ./job -run '^$$' -fuzz FuzzParseTime -fuzztime 30s
	$(GO) test ./job -run '^$$' -fuzz FuzzScriptOptions -fuzztime 30s
	$(GO) test ./cmd/gangrun -run '^$$' -fuzz FuzzFlags -fuzztime 30s

clean:
	rm -rf bin demo-run
