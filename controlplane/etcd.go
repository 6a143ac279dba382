package main

import (
	"fmt"
	"net/url"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// startEtcd runs a single-member etcd in this process. Both listeners bind to loopback only.
func startEtcd(dir string, clientPort, peerPort int, logLevel string) (*embed.Etcd, error) {
	cfg := embed.NewConfig()
	cfg.Name = "kanri-local"
	cfg.Dir = dir
	clientURL := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", clientPort)}
	peerURL := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", peerPort)}
	cfg.ListenClientUrls = []url.URL{clientURL}
	cfg.AdvertiseClientUrls = []url.URL{clientURL}
	cfg.ListenPeerUrls = []url.URL{peerURL}
	cfg.AdvertisePeerUrls = []url.URL{peerURL}
	cfg.InitialCluster = fmt.Sprintf("%s=%s", cfg.Name, peerURL.String())
	cfg.ListenMetricsUrls = nil
	cfg.LogLevel = logLevel
	// The API server compacts etcd itself every five minutes; keep a little headroom against growth between.
	cfg.AutoCompactionMode = "revision"
	cfg.AutoCompactionRetention = "10000"

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, err
	}
	select {
	case <-e.Server.ReadyNotify():
		return e, nil
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("etcd failed while starting: %w", err)
	case <-time.After(60 * time.Second):
		e.Server.Stop()
		e.Close()
		return nil, fmt.Errorf("etcd was not ready within 60s")
	}
}
