// Command kanri-controlplane runs a real Kubernetes control plane in one process: embedded etcd, kube-apiserver and
// kube-controller-manager, all on 127.0.0.1. It is kanri's test and development cluster (no Docker, kind or prebuilt
// binaries on the machines it targets).
//
// On start it generates (once) a CA, serving and client certificates and service-account keys under --data-dir,
// writes admin.kubeconfig there, and prints one JSON line {"event":"ready",...} to stdout when the API server is
// ready and the controllers run. SIGTERM or SIGINT stops it: controllers, then the API server, then etcd.
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
	"sync"
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
		ServiceCIDR: defaultServiceCIDR, Controllers: *controllers, Verbosity: *verbosity,
	})
	if err != nil {
		return err
	}
	p := pki{dir: filepath.Join(*dataDir, "pki")}
	if err := p.ensure(firstServiceIP(cfg.ServiceCIDR)); err != nil {
		return err
	}
	server := fmt.Sprintf("https://127.0.0.1:%d", cfg.APIServerPort)
	adminKubeconfig := filepath.Join(*dataDir, "admin.kubeconfig")
	kcmKubeconfig := filepath.Join(*dataDir, "controller-manager.kubeconfig")
	if err := writeKubeconfig(adminKubeconfig, server, p, adminIdentity); err != nil {
		return err
	}
	if err := writeKubeconfig(kcmKubeconfig, server, p, kcmIdentity); err != nil {
		return err
	}

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

	apiCtx, stopAPI := context.WithCancel(context.Background())
	kcmCtx, stopKCM := context.WithCancel(context.Background())
	defer stopAPI()
	defer stopKCM()
	var apiDone, kcmDone sync.WaitGroup

	apiDone.Go(func() {
		if err := runAPIServer(apiCtx, apiserverArgs(cfg, p)); err != nil && apiCtx.Err() == nil {
			stopRun(fmt.Errorf("kube-apiserver: %w", err))
		}
	})
	go func() {
		if err := <-etcd.Err(); err != nil {
			stopRun(fmt.Errorf("etcd: %w", err))
		}
	}()

	readyCtx, cancelReady := context.WithTimeout(runCtx, 3*time.Minute)
	defer cancelReady()
	if err := waitForAPIServer(readyCtx, adminKubeconfig); err != nil {
		shutdown(stopKCM, &kcmDone, stopAPI, &apiDone)
		return fmt.Errorf("API server never became ready: %w", causeOf(runCtx, err))
	}
	kcmDone.Go(func() {
		if err := runControllerManager(kcmCtx, controllerManagerArgs(cfg, p, kcmKubeconfig)); err != nil && kcmCtx.Err() == nil {
			stopRun(fmt.Errorf("kube-controller-manager: %w", err))
		}
	})
	if err := waitForControllers(readyCtx, adminKubeconfig); err != nil {
		shutdown(stopKCM, &kcmDone, stopAPI, &apiDone)
		return fmt.Errorf("controllers never became ready: %w", causeOf(runCtx, err))
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
	shutdown(stopKCM, &kcmDone, stopAPI, &apiDone)
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

// shutdown stops the controllers before the API server they talk to; etcd is closed by the caller last.
func shutdown(stopKCM context.CancelFunc, kcm *sync.WaitGroup, stopAPI context.CancelFunc, api *sync.WaitGroup) {
	stopKCM()
	waitTimeout(kcm, 30*time.Second)
	stopAPI()
	waitTimeout(api, 60*time.Second)
}

func waitTimeout(wg *sync.WaitGroup, d time.Duration) {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		klog.InfoS("component did not stop in time; continuing shutdown", "timeout", d)
	}
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
