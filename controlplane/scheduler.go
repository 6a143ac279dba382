package main

import (
	"context"
	"fmt"

	"github.com/spf13/pflag"
	"k8s.io/client-go/tools/cache"
	schedapp "k8s.io/kubernetes/cmd/kube-scheduler/app"
	schedoptions "k8s.io/kubernetes/cmd/kube-scheduler/app/options"
)

// schedulerArgs run the default scheduler profile without leader election (there is one instance) and without a
// serving port (nothing scrapes it locally; readiness comes from its informers instead, see runScheduler).
func schedulerArgs(kubeconfig string) []string {
	return []string{
		"--kubeconfig=" + kubeconfig,
		"--leader-elect=false",
		"--secure-port=0",
		"--profiling=false",
	}
}

// runScheduler runs kube-scheduler until ctx is cancelled, following its cobra command with our context (its own
// installs a process-wide signal handler). synced is closed once every event handler of the scheduler has seen the
// initial list of its informer: the condition its own /readyz check `sched-handler-sync` reports, right before it
// starts scheduling.
func runScheduler(ctx context.Context, args []string, synced chan<- struct{}) error {
	opts := schedoptions.NewOptions()
	fs := pflag.NewFlagSet("kube-scheduler", pflag.ContinueOnError)
	for _, f := range opts.Flags.FlagSets {
		fs.AddFlagSet(f)
	}
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("kube-scheduler flags: %w", err)
	}
	// Feature gates and logging are process-wide and were applied by the API server already.
	informerName, err := cache.NewInformerName("kube-scheduler")
	if err != nil {
		return err
	}
	opts.InformerName = informerName
	cc, sched, err := schedapp.Setup(ctx, opts)
	if err != nil {
		return err
	}
	go func() {
		// WaitForHandlersSync only reads the handler registrations, so it may run next to the scheduler's own.
		if sched.WaitForHandlersSync(ctx) == nil {
			close(synced)
		}
	}()
	err = schedapp.Run(ctx, cc, sched)
	if ctx.Err() != nil {
		return nil // without leader election Run always returns an error, "finished without leader elect"
	}
	return err
}

// waitForScheduler waits until runScheduler reports its informers synced (closed at once when it is disabled).
func waitForScheduler(ctx context.Context, synced <-chan struct{}) error {
	select {
	case <-synced:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
