# kanri's two entry points (see README.md): `make up` installs everything and runs the main job; `make test` runs
# every check CI runs. Both are idempotent: with nothing changed, setup takes seconds.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: setup system up down test lint typecheck unit integration controlplane bench

setup: system $(VENV)/.installed controlplane

# Debian packages the local cluster uses: nft (kube-proxy's nftables mode, the node chaos verbs' partition rules),
# openssl (each node signs its kubelet serving certificate); and prometheus for its promtool (the alert rules' checks
# and unit tests in tests/unit/test_monitoring.py). Without recommends: prometheus recommends node-exporter, a daemon.
# No prometheus daemon is left running: in these containers policy-rc.d refuses to start services (checked after an
# install: no prometheus process), and nothing here starts the server.
# Installed only when missing, so a set-up machine needs no network and no apt lock.
SYSTEM_PACKAGES := nftables openssl prometheus
system:
	@missing=$$(for p in $(SYSTEM_PACKAGES); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages: $$missing"; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing >/dev/null || \
		{ apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing >/dev/null; }; \
	fi

# Reinstall only when the declared dependencies change.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $@

# Rebuilds the Go binary only when controlplane/ (or the Go toolchain) changed.
controlplane: $(VENV)/.installed
	$(BIN)/kanri local build

up: setup
	$(BIN)/kanri up

down:
	$(BIN)/kanri local down

lint: $(VENV)/.installed
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples

typecheck: $(VENV)/.installed
	$(BIN)/mypy

test: setup lint typecheck
	$(BIN)/pytest

bench: setup
	$(BIN)/python bench/controlplane.py

# Regenerate deploy/crds/ from the API models (tests/unit/test_crds_fresh.py fails when it is stale).
.PHONY: crds
crds: $(VENV)/.installed
	$(BIN)/kanri crds --dir deploy/crds

# Regenerate deploy/monitoring/prometheusrule.yaml from alerts.yaml (tests/unit/test_monitoring.py fails when stale).
.PHONY: monitoring
monitoring: $(VENV)/.installed
	$(BIN)/python -m tests.unit.test_monitoring
