package main

import (
	"context"
	"fmt"

	"github.com/spf13/pflag"
	kcmapp "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	kcmoptions "k8s.io/kubernetes/cmd/kube-controller-manager/app/options"
)

// controllerManagerArgs run every default controller under its own service account, without leader election
// (there is one instance) and without a serving port (nothing scrapes it locally).
func controllerManagerArgs(c config, p pki, kubeconfig string) []string {
	return []string{
		"--kubeconfig=" + kubeconfig,
		"--controllers=" + c.Controllers,
		"--leader-elect=false",
		"--use-service-account-credentials=true",
		"--service-account-private-key-file=" + p.saPrivateKey(),
		"--root-ca-file=" + p.caCert(),
		"--cluster-signing-cert-file=" + p.caCert(),
		"--cluster-signing-key-file=" + p.caKey(),
		"--service-cluster-ip-range=" + c.ServiceCIDR,
		"--secure-port=0",
		// Test-cluster timings (docs/local.md, "Timings"): a node whose heartbeats (every 10 s) stop is marked
		// NotReady after 20 s instead of 50 s, checked every 2 s instead of 5 s.
		"--node-monitor-grace-period=20s",
		"--node-monitor-period=2s",
	}
}

// runControllerManager runs kube-controller-manager until ctx is cancelled, mirroring its cobra command.
func runControllerManager(ctx context.Context, args []string) error {
	s, err := kcmoptions.NewKubeControllerManagerOptions()
	if err != nil {
		return err
	}
	known, disabled, aliases := kcmapp.KnownControllers(), kcmapp.ControllersDisabledByDefault(), kcmapp.ControllerAliases()
	fs := pflag.NewFlagSet("kube-controller-manager", pflag.ContinueOnError)
	named := s.Flags(known, disabled, aliases)
	s.ParsedFlags = &named
	for _, f := range named.FlagSets {
		fs.AddFlagSet(f)
	}
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("kube-controller-manager flags: %w", err)
	}
	// Feature gates and logging are process-wide and were applied by the API server already.
	c, err := s.Config(ctx, known, disabled, aliases)
	if err != nil {
		return err
	}
	return kcmapp.Run(ctx, c.Complete())
}
