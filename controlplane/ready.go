package main

import (
	"context"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

func adminClient(kubeconfig string) (*kubernetes.Clientset, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.Timeout = 5 * time.Second
	return kubernetes.NewForConfig(cfg)
}

// waitForAPIServer polls /readyz until every readiness check of the API server passes.
func waitForAPIServer(ctx context.Context, kubeconfig string) error {
	client, err := adminClient(kubeconfig)
	if err != nil {
		return err
	}
	return poll(ctx, func() (bool, error) {
		body, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil && string(body) == "ok", nil
	})
}

// waitForControllers waits until the service-account controller has created the `default` ServiceAccount: pods
// cannot be admitted in a namespace before it exists, so this is when the cluster is usable.
func waitForControllers(ctx context.Context, kubeconfig string) error {
	client, err := adminClient(kubeconfig)
	if err != nil {
		return err
	}
	return poll(ctx, func() (bool, error) {
		_, err := client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, nil
	})
}

func poll(ctx context.Context, done func() (bool, error)) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, err := done()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}
