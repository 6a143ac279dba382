package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki holds the paths of every certificate and key the control plane uses. All of it is generated on the first
// start and reused afterwards, so a restart with the same data dir keeps the identities clients already trust.
type pki struct {
	dir string
}

func (p pki) path(name string) string { return filepath.Join(p.dir, name) }

func (p pki) caCert() string             { return p.path("ca.crt") }
func (p pki) caKey() string              { return p.path("ca.key") }
func (p pki) servingCert() string        { return p.path("apiserver.crt") }
func (p pki) servingKey() string         { return p.path("apiserver.key") }
func (p pki) saPublicKey() string        { return p.path("sa.pub") }
func (p pki) saPrivateKey() string       { return p.path("sa.key") }
func (p pki) clientCert(n string) string { return p.path(n + ".crt") }
func (p pki) clientKey(n string) string  { return p.path(n + ".key") }

// clientIdentity is a certificate-authenticated user: CN is the user name, O the groups. Its certificate is
// pki/<file>.crt and its kubeconfig <data-dir>/<file>.kubeconfig.
type clientIdentity struct {
	file   string
	user   string
	groups []string
}

// The components' users are the ones the API server's bootstrap RBAC already binds to their roles
// (system:kube-controller-manager, system:kube-scheduler, system:node-proxier for system:kube-proxy).
var (
	adminIdentity     = clientIdentity{file: "admin", user: "kanri-admin", groups: []string{"system:masters"}}
	kcmIdentity       = clientIdentity{file: "controller-manager", user: "system:kube-controller-manager"}
	schedulerIdentity = clientIdentity{file: "scheduler", user: "system:kube-scheduler"}
	proxyIdentity     = clientIdentity{file: "proxy", user: "system:kube-proxy"}
)

// clientIdentities get a certificate and a kubeconfig on every start (only what is missing is generated).
var clientIdentities = []clientIdentity{adminIdentity, kcmIdentity, schedulerIdentity, proxyIdentity}

// kubeconfig is where the control plane writes this identity's kubeconfig.
func (id clientIdentity) kubeconfig(dataDir string) string {
	return filepath.Join(dataDir, id.file+".kubeconfig")
}

const certValidity = 10 * 365 * 24 * time.Hour

// ensure creates whatever is missing. Existing files are never rewritten.
func (p pki) ensure(serviceIP net.IP) error {
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		return err
	}
	if !exists(p.caCert()) {
		if err := p.writeCA(); err != nil {
			return fmt.Errorf("certificate authority: %w", err)
		}
	}
	ca, caKey, err := loadPair(p.caCert(), p.caKey())
	if err != nil {
		return fmt.Errorf("load CA: %w", err)
	}
	if !exists(p.servingCert()) {
		tmpl := leafTemplate("kube-apiserver", nil)
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.DNSNames = []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
			"kubernetes.default.svc.cluster.local"}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1"), serviceIP}
		if err := p.writeLeaf(tmpl, ca, caKey, p.servingCert(), p.servingKey()); err != nil {
			return fmt.Errorf("serving certificate: %w", err)
		}
	}
	for _, id := range clientIdentities {
		if exists(p.clientCert(id.file)) {
			continue
		}
		tmpl := leafTemplate(id.user, id.groups)
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
		if err := p.writeLeaf(tmpl, ca, caKey, p.clientCert(id.file), p.clientKey(id.file)); err != nil {
			return fmt.Errorf("client certificate %s: %w", id.user, err)
		}
	}
	if !exists(p.saPrivateKey()) {
		if err := p.writeServiceAccountKeys(); err != nil {
			return fmt.Errorf("service-account keys: %w", err)
		}
	}
	return nil
}

func (p pki) writeCA() error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{CommonName: "kanri-local-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(certValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	return writePair(p.caCert(), der, p.caKey(), key)
}

func (p pki) writeLeaf(tmpl *x509.Certificate, ca *x509.Certificate, caKey crypto.Signer, certPath, keyPath string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	return writePair(certPath, der, keyPath, key)
}

// writeServiceAccountKeys makes the RSA pair that signs service-account tokens (RS256 is what every verifier accepts).
func (p pki) writeServiceAccountKeys() error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return err
	}
	if err := writePEM(p.saPublicKey(), "PUBLIC KEY", pub, 0o644); err != nil {
		return err
	}
	return writePEM(p.saPrivateKey(), "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(key), 0o600)
}

func leafTemplate(cn string, orgs []string) *x509.Certificate {
	return &x509.Certificate{
		SerialNumber: randomSerial(),
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(certValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
	}
}

func randomSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err)
	}
	return n
}

func writePair(certPath string, der []byte, keyPath string, key *ecdsa.PrivateKey) error {
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	// Key first: a certificate without its key would make ensure() skip regenerating a broken pair.
	if err := writePEM(keyPath, "EC PRIVATE KEY", keyDER, 0o600); err != nil {
		return err
	}
	return writePEM(certPath, "CERTIFICATE", der, 0o644)
}

func writePEM(path, blockType string, der []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	data := pem.EncodeToMemory(&pem.Block{Type: blockType, Bytes: der})
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func loadPair(certPath, keyPath string) (*x509.Certificate, crypto.Signer, error) {
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, nil, err
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, nil, errors.New("not PEM")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, err
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, nil, err
	}
	return cert, key, nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
