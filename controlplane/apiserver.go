package main

import (
	"context"
	"fmt"

	"github.com/spf13/pflag"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/rest"
	basecompatibility "k8s.io/component-base/compatibility"
	logsapi "k8s.io/component-base/logs/api/v1"
	apiserverapp "k8s.io/kubernetes/cmd/kube-apiserver/app"
	apiserveroptions "k8s.io/kubernetes/cmd/kube-apiserver/app/options"
)

// apiserverArgs are the kube-apiserver flags for a loopback-only, certificate-authenticated, RBAC-authorized server.
func apiserverArgs(c config, p pki) []string {
	args := []string{
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", c.APIServerPort),
		fmt.Sprintf("--etcd-servers=http://127.0.0.1:%d", c.EtcdClientPort),
		"--tls-cert-file=" + p.servingCert(),
		"--tls-private-key-file=" + p.servingKey(),
		"--client-ca-file=" + p.caCert(),
		"--authorization-mode=Node,RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + p.saPublicKey(),
		"--service-account-signing-key-file=" + p.saPrivateKey(),
		"--service-cluster-ip-range=" + c.ServiceCIDR,
		"--allow-privileged=true",
		// Reaching the nodes' kubelet API (kubectl logs); see kubeletclient.go.
		"--kubelet-client-certificate=" + p.clientCert(kubeletClientIdentity.file),
		"--kubelet-client-key=" + p.clientKey(kubeletClientIdentity.file),
		"--kubelet-certificate-authority=" + p.kubeletCACert(),
		"--kubelet-preferred-address-types=InternalIP", // a Node's Hostname (its name) resolves nowhere
		// The built-in reconciler publishes the advertise address as the `kubernetes` Service endpoint, and
		// EndpointSlices refuse loopback addresses; the local node publishes a reachable address itself.
		"--endpoint-reconciler-type=none",
		"--profiling=false",
		// Pods without their own tolerations are evicted 30 s after their node turns NotReady or unreachable
		// (the DefaultTolerationSeconds admission plugin's default is 300 s); docs/local.md, "Timings".
		"--default-not-ready-toleration-seconds=30",
		"--default-unreachable-toleration-seconds=30",
		fmt.Sprintf("--v=%d", c.Verbosity),
	}
	if c.AdmissionConfigFile != "" {
		// Per-plugin configuration, e.g. PodSecurity's defaults for namespaces that choose no level (issue 33).
		args = append(args, "--admission-control-config-file="+c.AdmissionConfigFile)
	}
	return args
}

// runAPIServer runs kube-apiserver until ctx is cancelled, following the steps of its cobra command but with our
// context (its own command installs a process-wide signal handler, which would fight ours).
func runAPIServer(ctx context.Context, args []string) error {
	s := apiserveroptions.NewServerRunOptions()
	fs := pflag.NewFlagSet("kube-apiserver", pflag.ContinueOnError)
	named := s.Flags()
	for _, f := range named.FlagSets {
		fs.AddFlagSet(f)
	}
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("kube-apiserver flags: %w", err)
	}
	if err := s.GenericServerRunOptions.ComponentGlobalsRegistry.Set(); err != nil {
		return err
	}
	rest.SetDefaultWarningHandler(rest.NoWarnings{})
	featureGate := s.GenericServerRunOptions.ComponentGlobalsRegistry.FeatureGateFor(basecompatibility.DefaultKubeComponent)
	if err := logsapi.ValidateAndApply(s.Logs, featureGate); err != nil {
		return err
	}
	completed, err := s.Complete(ctx)
	if err != nil {
		return err
	}
	if errs := completed.Validate(); len(errs) != 0 {
		return utilerrors.NewAggregate(errs)
	}
	return apiserverapp.Run(ctx, completed)
}
