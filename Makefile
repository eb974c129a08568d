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

VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X main.version=$(VERSION)

# What each target installs (scripts/install-deps.sh components). The demo runs on one
# machine with the embedded coordinator: Debian's torch only, no Consul build. The tests start
# Consul dev agents and real PyTorch (Debian's 1.13 and PyPI's 2.x), and use ip, a real Prometheus server (and
# promtool), headless Chromium and useradd; the benchmarks Consul and PyTorch.
DEMO_DEPS  := torch
TEST_DEPS  := torch torch2 consul iproute2 prometheus chromium passwd munge
BENCH_DEPS := torch consul

.PHONY: all build deps demo test test-short bench fuzz lint clean

all: build

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/gangrun

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
	$(GO) test ./bench -run '^$$' -fuzz FuzzParse -fuzztime 30s
	$(GO) test ./checkpoint -run '^$$' -fuzz FuzzLatest -fuzztime 30s
	$(GO) test ./topology -run '^$$' -fuzz FuzzParseNCCLList -fuzztime 30s
	$(GO) test ./topology -run '^$$' -fuzz FuzzParseCPUList -fuzztime 30s
	$(GO) test ./topology -run '^$$' -fuzz FuzzDecode -fuzztime 30s
	$(GO) test ./internal/tcpstore -run '^$$' -fuzz FuzzServe -fuzztime 30s
	$(GO) test ./cmd/gangrun -run '^$$' -fuzz FuzzExpandArgs -fuzztime 30s
	$(GO) test ./launcher -run '^$$' -fuzz FuzzParseStd -fuzztime 30s
	$(GO) test ./rendezvous -run '^$$' -fuzz FuzzParseC10dURL -fuzztime 30s

clean:
	rm -rf bin demo-run
