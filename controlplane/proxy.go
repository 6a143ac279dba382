package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	proxyapp "k8s.io/kubernetes/cmd/kube-proxy/app"
)

// proxySubcommand is the first argument that turns this binary into kube-proxy: `kanri-controlplane kube-proxy
// [--parent-pid=N] <kube-proxy flags>`.
//
// kube-proxy runs as a process of its own, started by the local node, rather than as a goroutine of the control
// plane: its nftables table (`kube-proxy`) is machine-wide state of the host's network namespace, so exactly one may
// run per machine — the one of the node that holds the machine's pod network — while several control planes run at
// once (every test session starts its own). Its life is the pod network's: the node starts it after the bridge and
// stops it, and deletes its tables, before removing the bridge.
const proxySubcommand = "kube-proxy"

// runKubeProxy runs the real kube-proxy command (k8s.io/kubernetes/cmd/kube-proxy/app) with args. --parent-pid,
// ours, is taken out first: the proxy exits when that process is gone, so a node killed with SIGKILL does not leave
// it running (the next node start deletes the rules it left).
func runKubeProxy(args []string) error {
	rest := make([]string, 0, len(args))
	for _, arg := range args {
		if value, ok := strings.CutPrefix(arg, "--parent-pid="); ok {
			pid, err := strconv.Atoi(value)
			if err != nil {
				return fmt.Errorf("--parent-pid: %w", err)
			}
			go watchParent(pid, func(cause error) {
				fmt.Fprintf(os.Stderr, "kube-proxy: stopping: %v\n", cause)
				os.Exit(0)
			})
			continue
		}
		rest = append(rest, arg)
	}
	cmd := proxyapp.NewProxyCommand()
	cmd.SetArgs(rest)
	return cmd.ExecuteContext(context.Background())
}
