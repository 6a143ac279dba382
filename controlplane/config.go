package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
)

const defaultServiceCIDR = "10.96.0.0/16"

// config is what must stay the same across restarts of one data dir (clients hold kubeconfigs naming the port).
type config struct {
	APIServerPort  int    `json:"apiserverPort"`
	EtcdClientPort int    `json:"etcdClientPort"`
	EtcdPeerPort   int    `json:"etcdPeerPort"`
	ServiceCIDR    string `json:"serviceCIDR"`
	Controllers    string `json:"-"`
	Verbosity      int    `json:"-"`
	Scheduler      bool   `json:"-"`
	// AdmissionConfigFile is the caller's, given on every start (kanri.local.controlplane writes the Pod Security
	// defaults there), so it is not remembered.
	AdmissionConfigFile string `json:"-"`
}

// loadConfig merges flags with what the data dir remembers: an explicit flag wins, then the remembered value, then
// a free port. The result is written back so the next start reuses it.
func loadConfig(dataDir string, flags config) (config, error) {
	path := filepath.Join(dataDir, "config.json")
	var saved config
	if data, err := os.ReadFile(path); err == nil {
		if err := json.Unmarshal(data, &saved); err != nil {
			return config{}, fmt.Errorf("%s: %w", path, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return config{}, err
	}
	c := flags
	for _, port := range []struct{ flag, saved *int }{
		{&c.APIServerPort, &saved.APIServerPort},
		{&c.EtcdClientPort, &saved.EtcdClientPort},
		{&c.EtcdPeerPort, &saved.EtcdPeerPort},
	} {
		if *port.flag != 0 {
			continue
		}
		if *port.saved != 0 {
			*port.flag = *port.saved
			continue
		}
		free, err := freePort()
		if err != nil {
			return config{}, err
		}
		*port.flag = free
	}
	if saved.ServiceCIDR != "" {
		c.ServiceCIDR = saved.ServiceCIDR
	}
	data, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return config{}, err
	}
	return c, os.WriteFile(path, data, 0o600)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// firstServiceIP is the ClusterIP of the `kubernetes` Service, which the serving certificate must name.
func firstServiceIP(cidr string) net.IP {
	_, n, err := net.ParseCIDR(cidr)
	if err != nil {
		panic(err)
	}
	ip := n.IP.To4()
	return net.IPv4(ip[0], ip[1], ip[2], ip[3]+1)
}
