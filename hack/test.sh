#!/usr/bin/env bash
# `make test`'s test run: two pytest processes at once, each with its own control plane (tests/tiers.py says why
# this is safe). In front: the e2e tier and the integration modules that use what the machine has once (its output
# streams here). Beside it: the unit tier and every other integration module, then (a third process, once that one
# is done) the real-node modules that meet nothing of the e2e tier's home-made node (marker real_nodes); their output
# is kept in .build/test-beside.log and printed when all are done. Each writes a JUnit report with every test's time:
# .build/test-report.xml, .build/test-report-beside.xml and .build/test-report-real.xml. Fails if any fails.
set -uo pipefail
cd "$(dirname "$0")/.."
pytest=.venv/bin/pytest
mkdir -p .build
started=$(date +%s)
# Each process takes the ports its local servers listen on from its own range, below the kernel's ephemeral range
# (src/kanri/local/ports.py): neither process nor any outgoing connection can take a port between its probe and bind.
beside_then_real() {
	"$pytest" tests/unit tests/integration -m "not host_wide and not e2e and not real_nodes" --durations=15 \
		--junitxml=.build/test-report-beside.xml
	local unit_and_integration=$?
	# their control plane's Service range is not 10.96.0.0/16, which the home-made node's kube-proxy serves on the host
	KANRI_SERVICE_CIDR=10.97.0.0/16 "$pytest" tests/integration -m real_nodes --durations=10 \
		--junitxml=.build/test-report-real.xml
	local real=$?
	echo "=== beside: unit and integration exit $unit_and_integration, real nodes exit $real ==="
	[ "$unit_and_integration" -eq 0 ] && [ "$real" -eq 0 ]
}
KANRI_PORT_RANGE=15000-21999 beside_then_real >.build/test-beside.log 2>&1 &
beside=$!
trap 'kill -INT "$beside" $(pgrep -P "$beside") 2>/dev/null; wait "$beside"' INT TERM
# The host-wide integration modules first: they are done long before the real-node modules start beside the e2e tier
# (after the unit tier, ~30 min in), so the two never run at once.
KANRI_PORT_RANGE=22000-28999 "$pytest" tests/integration tests/e2e -m "e2e or host_wide" --durations=30 \
	--junitxml=.build/test-report.xml
front=$?
wait "$beside"
side=$?
echo
echo "=== beside the e2e tier: the unit tier, the other integration modules, then the real-node ones (.build/test-beside.log) ==="
cat .build/test-beside.log
echo "=== front (e2e and host-wide integration) exit $front, beside exit $side, both in $(( $(date +%s) - started )) s ==="
[ "$front" -eq 0 ] && [ "$side" -eq 0 ]
