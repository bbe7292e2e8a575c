package loader

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// Where a pod finds its service account (the Kubernetes documentation's
// "Accessing the API from within a Pod").
const (
	serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"
	tokenFile         = serviceAccountDir + "/token"
	caFile            = serviceAccountDir + "/ca.crt"
)

// Kubernetes scales Deployments through the API server's scale
// subresource, PATCH /apis/apps/v1/namespaces/<ns>/deployments/<name>/scale.
//
// It is plain net/http, not client-go: the loader makes one kind of call,
// a merge patch of spec.replicas, against a subresource that has been
// stable since apps/v1. client-go would add k8s.io/api, apimachinery,
// klog and their dozens of transitive modules to every Switchyard binary
// for that call. What client-go's in-cluster config does that matters here
// is reproduced: the service account's CA, and its token re-read on every
// call, because projected tokens rotate.
type Kubernetes struct {
	// Server is the API server's base URL (https://host:port).
	Server string
	// Token returns the bearer token for a call.
	Token func() (string, error)
	// HTTP is the client, trusting the API server's CA.
	HTTP *http.Client
}

// InCluster is the API server of the pod the loader runs in, with the pod's
// service account; nil outside a pod.
func InCluster() *Kubernetes {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return nil
	}
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return nil
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return &Kubernetes{
		Server: "https://" + net.JoinHostPort(host, port),
		Token: func() (string, error) {
			b, err := os.ReadFile(tokenFile)
			return strings.TrimSpace(string(b)), err
		},
		HTTP: &http.Client{Transport: tr, Timeout: 30 * time.Second},
	}
}

// Scale sets the Deployment's replicas. The service account needs "patch"
// on deployments/scale in the namespace.
func (k *Kubernetes) Scale(ctx context.Context, namespace, deployment string, replicas int) error {
	u := k.Server + "/apis/apps/v1/namespaces/" + url.PathEscape(namespace) + "/deployments/" + url.PathEscape(deployment) + "/scale"
	body, _ := json.Marshal(map[string]any{"spec": map[string]int{"replicas": replicas}})
	req, err := http.NewRequestWithContext(ctx, http.MethodPatch, u, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/merge-patch+json")
	req.Header.Set("Accept", "application/json")
	if k.Token != nil {
		tok, err := k.Token()
		if err != nil {
			return fmt.Errorf("kubernetes: service account token: %w", err)
		}
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := k.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("kubernetes: scale %s/%s: %w", namespace, deployment, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode/100 != 2 {
		// The API server explains a refusal in a Status object.
		var st struct {
			Message string `json:"message"`
		}
		_ = json.Unmarshal(b, &st)
		return fmt.Errorf("kubernetes: scale %s/%s to %d: %s: %s", namespace, deployment, replicas, resp.Status, st.Message)
	}
	var scale struct {
		Spec struct {
			Replicas int `json:"replicas"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(b, &scale); err != nil {
		return fmt.Errorf("kubernetes: scale %s/%s: unreadable answer: %w", namespace, deployment, err)
	}
	if scale.Spec.Replicas != replicas {
		return fmt.Errorf("kubernetes: scale %s/%s: asked for %d replicas, the API server has %d", namespace, deployment, replicas, scale.Spec.Replicas)
	}
	return nil
}
