// Command kanri-controlplane runs a real Kubernetes control plane in one process: embedded etcd, kube-apiserver,
// kube-controller-manager and kube-scheduler, all on 127.0.0.1. It is kanri's test and development cluster (no
// Docker, kind or prebuilt binaries on the machines it targets).
//
// On start it generates (once) a CA, serving and client certificates and service-account keys under --data-dir,
// writes admin.kubeconfig there, and prints one JSON line {"event":"ready",...} to stdout when the API server is
// ready, the controllers run and the scheduler has synced. SIGTERM or SIGINT stops it: scheduler and controllers,
// then the API server, then etcd.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == proxySubcommand {
		if err := runKubeProxy(os.Args[2:]); err != nil {
			fmt.Fprintf(os.Stderr, "kanri-controlplane kube-proxy: %v\n", err)
			os.Exit(1)
		}
		return
	}
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "kanri-controlplane: %v\n", err)
		emit(map[string]any{"event": "failed", "error": err.Error()})
		os.Exit(1)
	}
}

// emit prints one machine-readable JSON line on stdout; stdout carries nothing else.
func emit(fields map[string]any) {
	line, _ := json.Marshal(fields)
	fmt.Fprintln(os.Stdout, string(line))
}

func run() error {
	var (
		dataDir     = flag.String("data-dir", "", "directory for etcd data, certificates and kubeconfigs (required)")
		apiPort     = flag.Int("apiserver-port", 0, "kube-apiserver port on 127.0.0.1 (0: remembered or free)")
		etcdPort    = flag.Int("etcd-client-port", 0, "etcd client port on 127.0.0.1 (0: remembered or free)")
		peerPort    = flag.Int("etcd-peer-port", 0, "etcd peer port on 127.0.0.1 (0: remembered or free)")
		controllers = flag.String("controllers", "*", "kube-controller-manager --controllers value")
		verbosity   = flag.Int("v", 0, "klog verbosity of the API server and controllers")
		parentPID   = flag.Int("parent-pid", 0, "stop when this process exits (0: run until signalled)")
		withSched   = flag.Bool("scheduler", true, "run kube-scheduler (false: something else binds pods to nodes)")
		admission   = flag.String("admission-control-config-file", "",
			"kube-apiserver --admission-control-config-file (empty: the plugins' own defaults)")
	)
	flag.Parse()
	if *dataDir == "" {
		return errors.New("--data-dir is required")
	}
	started := time.Now()
	if err := os.MkdirAll(*dataDir, 0o700); err != nil {
		return err
	}
	unlock, err := lockDataDir(*dataDir)
	if err != nil {
		return err
	}
	defer unlock()

	cfg, err := loadConfig(*dataDir, config{
		APIServerPort: *apiPort, EtcdClientPort: *etcdPort, EtcdPeerPort: *peerPort,
		ServiceCIDR: defaultServiceCIDR, Controllers: *controllers, Verbosity: *verbosity, Scheduler: *withSched,
		AdmissionConfigFile: *admission,
	})
	if err != nil {
		return err
	}
	p := pki{dir: filepath.Join(*dataDir, "pki")}
	if err := p.ensure(firstServiceIP(cfg.ServiceCIDR)); err != nil {
		return err
	}
	server := fmt.Sprintf("https://127.0.0.1:%d", cfg.APIServerPort)
	for _, id := range clientIdentities {
		if err := writeKubeconfig(id.kubeconfig(*dataDir), server, p, id); err != nil {
			return err
		}
	}
	adminKubeconfig := adminIdentity.kubeconfig(*dataDir)

	// Everything that should stop the control plane cancels runCtx with its cause: a signal, the parent's exit, or
	// a component failing.
	runCtx, stopRun := context.WithCancelCause(context.Background())
	defer stopRun(nil)
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		sig := <-signals
		stopRun(&stopRequest{fmt.Sprintf("signal %s", sig)})
		<-signals
		klog.Flush()
		os.Exit(2) // a second signal means "now"
	}()
	if *parentPID > 0 {
		go watchParent(*parentPID, stopRun)
	}

	etcd, err := startEtcd(filepath.Join(*dataDir, "etcd"), cfg.EtcdClientPort, cfg.EtcdPeerPort, "warn")
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	defer etcd.Close()

	// Shutdown order: the API server's clients first, then the API server; etcd is closed last (deferred).
	api := newComponent("kube-apiserver", 60*time.Second)
	kcm := newComponent("kube-controller-manager", 30*time.Second)
	scheduler := newComponent("kube-scheduler", 30*time.Second)
	components := []*component{scheduler, kcm, api}
	defer stopAll(components...)

	api.start(func(ctx context.Context) error { return runAPIServer(ctx, apiserverArgs(cfg, p)) }, stopRun)
	go func() {
		if err := <-etcd.Err(); err != nil {
			stopRun(fmt.Errorf("etcd: %w", err))
		}
	}()

	readyCtx, cancelReady := context.WithTimeout(runCtx, 3*time.Minute)
	defer cancelReady()
	if err := waitForAPIServer(readyCtx, adminKubeconfig); err != nil {
		stopAll(components...)
		return fmt.Errorf("API server never became ready: %w", causeOf(runCtx, err))
	}
	kcm.start(func(ctx context.Context) error {
		return runControllerManager(ctx, controllerManagerArgs(cfg, p, kcmIdentity.kubeconfig(*dataDir)))
	}, stopRun)
	schedulerSynced := make(chan struct{})
	if cfg.Scheduler {
		scheduler.start(func(ctx context.Context) error {
			return runScheduler(ctx, schedulerArgs(schedulerIdentity.kubeconfig(*dataDir)), schedulerSynced)
		}, stopRun)
	} else {
		close(schedulerSynced)
	}
	if err := waitForControllers(readyCtx, adminKubeconfig); err != nil {
		stopAll(components...)
		return fmt.Errorf("controllers never became ready: %w", causeOf(runCtx, err))
	}
	if err := waitForScheduler(readyCtx, schedulerSynced); err != nil {
		stopAll(components...)
		return fmt.Errorf("kube-scheduler never became ready: %w", causeOf(runCtx, err))
	}
	cancelReady()

	emit(map[string]any{
		"event": "ready", "server": server, "kubeconfig": adminKubeconfig, "pid": os.Getpid(),
		"seconds": time.Since(started).Seconds(),
	})

	<-runCtx.Done()
	cause := context.Cause(runCtx)
	var request *stopRequest
	var runErr error
	if errors.As(cause, &request) {
		klog.InfoS("stopping", "reason", request.reason)
	} else {
		runErr = cause
		klog.ErrorS(runErr, "a component failed; stopping the rest")
	}
	stopAll(components...)
	etcd.Close()
	emit(map[string]any{"event": "stopped", "seconds": time.Since(started).Seconds()})
	return runErr
}

// stopRequest is the cause of a requested stop (signal, parent gone), as opposed to a failure.
type stopRequest struct{ reason string }

func (s *stopRequest) Error() string { return s.reason }

// causeOf prefers the reason the run was stopped over the bare "context canceled" of a wait cut short by it.
func causeOf(runCtx context.Context, err error) error {
	if cause := context.Cause(runCtx); cause != nil {
		return cause
	}
	return err
}

// watchParent reports when the given process is gone, so a test session that dies never leaves a cluster behind.
func watchParent(pid int, stop context.CancelCauseFunc) {
	for {
		if err := unix.Kill(pid, 0); errors.Is(err, unix.ESRCH) || os.Getppid() != pid {
			stop(&stopRequest{fmt.Sprintf("parent %d exited", pid)})
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// lockDataDir makes a second control plane on the same data dir fail at once instead of corrupting it.
func lockDataDir(dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("data dir %s is in use by another control plane", dir)
	}
	return func() { f.Close() }, nil
}
