package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"time"
)

// How the API server and the kubelets (the local nodes) trust each other for `kubectl logs`:
//
//   - The API server presents a client certificate signed by the cluster CA with the user name kubeadm gives it,
//     kube-apiserver-kubelet-client. A node accepts that user without asking anyone (kubeadm binds it to
//     system:kubelet-api-admin; the nodes hard-wire the same grant) and checks every other client with a
//     TokenReview or its certificate, then a SubjectAccessReview, as a kubelet in Webhook mode does.
//   - The kubelets' serving certificates come from a CA of their own, kubelet-ca: a node signs its certificate when
//     it starts, for the addresses it has then (the control plane cannot know them in advance). The API server
//     verifies it with --kubelet-certificate-authority. A separate CA, not the cluster's, so the key the nodes
//     hold can mint nothing but kubelet serving certificates: no client identity at all.

// kubeletClientIdentity is the API server's user towards kubelets (its kubeadm name).
var kubeletClientIdentity = clientIdentity{file: "apiserver-kubelet-client", user: "kube-apiserver-kubelet-client"}

func (p pki) kubeletCACert() string { return p.path("kubelet-ca.crt") }
func (p pki) kubeletCAKey() string  { return p.path("kubelet-ca.key") }

// ensureKubelet creates what is missing: the API server's kubelet client certificate (signed by the cluster CA)
// and the kubelet serving CA. Existing files are never rewritten.
func (p pki) ensureKubelet(ca *x509.Certificate, caKey crypto.Signer) error {
	id := kubeletClientIdentity
	if !exists(p.clientCert(id.file)) {
		tmpl := leafTemplate(id.user, id.groups)
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
		if err := p.writeLeaf(tmpl, ca, caKey, p.clientCert(id.file), p.clientKey(id.file)); err != nil {
			return fmt.Errorf("client certificate %s: %w", id.user, err)
		}
	}
	if !exists(p.kubeletCACert()) {
		if err := p.writeKubeletCA(); err != nil {
			return fmt.Errorf("kubelet serving CA: %w", err)
		}
	}
	return nil
}

// writeKubeletCA makes the CA the nodes sign their serving certificates with. Its key is readable by root only,
// like every key here (the nodes run as root).
func (p pki) writeKubeletCA() error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{CommonName: "kanri-local-kubelet-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(certValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true, // it signs leaves only
		// It may only vouch for servers: a certificate it signs is no client identity anywhere.
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	return writePair(p.kubeletCACert(), der, p.kubeletCAKey(), key)
}
