// Package kubernetes_test renders the Kubernetes manifests (the kustomize
// base and the example overlay) and checks them against the switchyard
// binary built from this checkout: every container arg is one the
// subcommand accepts, the gateway's probes are paths and ports it serves,
// every Secret and ConfigMap a pod names is in the same rendering, an
// adapter's replica id is its pod's name, and the loader's ServiceAccount may
// scale Deployments. It is its own module, so the Kubernetes API types never
// enter Switchyard's: `make test-deploy`.
package kubernetes_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// setup builds the binary, starts a gateway (`switchyard dev`) to ask which
// paths it serves, and renders the example overlay.
func setup(t *testing.T) (*checker, *rendering) {
	t.Helper()
	bin := buildSwitchyard(t)
	c := &checker{bin: bin, tmp: t.TempDir(), help: map[string]*command{}, gateway: startGateway(t, bin)}
	r, err := render(exampleTree(t, bin))
	if err != nil {
		t.Fatalf("rendering the example overlay: %v", err)
	}
	return c, r
}

// listenFile binds a loopback port and returns the listening socket as a
// file, to hand to a child process (as fd:3 when it is the first of
// exec.Cmd.ExtraFiles), and its address. The socket stays open until the
// test ends, so the port is never free for someone else to take.
func listenFile(t *testing.T) (*os.File, string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close() // the file is a duplicate of the socket
	f, err := l.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f, l.Addr().String()
}

// startGateway runs `switchyard dev` (the gateway on an embedded NATS) until
// the test ends and returns the gateway's base URL once it answers.
func startGateway(t *testing.T, bin string) string {
	t.Helper()
	ln, addr := listenFile(t)
	cmd := exec.Command(bin, "dev", "--listen", "fd:3", "--nats-listen", "127.0.0.1:-1", "--data", t.TempDir())
	cmd.ExtraFiles = []*os.File{ln}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	base := "http://" + addr
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		if resp, err := http.Get(base + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return base
			}
		}
		select {
		case err := <-done:
			t.Fatalf("switchyard dev exited: %v\n%s", err, out.String())
		case <-ctx.Done():
			t.Fatalf("the gateway of switchyard dev did not answer /healthz\n%s", out.String())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func TestExampleOverlayLinesUpWithTheBinary(t *testing.T) {
	c, r := setup(t)
	if errs := c.check(r); len(errs) > 0 {
		t.Fatal(errors.Join(errs...))
	}
	t.Logf("%d Deployments, %d Services, %d PodDisruptionBudgets, %d autoscalers, %d Jobs, %d ConfigMaps, %d Secrets, %d ServiceAccounts, %d Roles, %d RoleBindings",
		len(r.deployments), len(r.services), len(r.pdbs), len(r.hpas), len(r.jobs), len(r.configMaps), len(r.secrets),
		len(r.accounts), len(r.roles), len(r.bindings))

	t.Run("a manifest with an unknown flag fails", func(t *testing.T) {
		r := mutate(t, c, func(r *rendering) {
			ctr := container(t, r, "switchyard-gateway", "gateway")
			ctr.Args = append(ctr.Args, "--listen-address=:8080")
		})
		wantError(t, c.check(r), `switchyard gateway has no flag "--listen-address=:8080"`)
	})
	t.Run("a loader flag the binary does not know fails", func(t *testing.T) {
		r := mutate(t, c, func(r *rendering) {
			ctr := container(t, r, "switchyard-loader", "loader")
			ctr.Args = append(ctr.Args, "--kubeconfig=/etc/kube/config")
		})
		wantError(t, c.check(r), `switchyard loader has no flag "--kubeconfig=/etc/kube/config"`)
	})
	t.Run("a loader whose ServiceAccount has no binding fails", func(t *testing.T) {
		r := mutate(t, c, func(r *rendering) {
			deployment(t, r, "switchyard-loader").Spec.Template.Spec.ServiceAccountName = "switchyard-scaler"
			r.accounts = append(r.accounts, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "switchyard-scaler", Namespace: "switchyard"}})
		})
		wantError(t, c.check(r), `no RoleBinding binds its ServiceAccount "switchyard-scaler"`)
	})
	t.Run("a loader whose ServiceAccount is not in the rendering fails", func(t *testing.T) {
		r := mutate(t, c, func(r *rendering) {
			r.accounts = nil
		})
		wantError(t, c.check(r), `ServiceAccount "switchyard-loader" is not in the rendering`)
	})
	t.Run("a Role without patch on deployments/scale fails", func(t *testing.T) {
		r := mutate(t, c, func(r *rendering) {
			for _, ro := range r.roles {
				for i := range ro.Rules {
					ro.Rules[i].Verbs = slices.DeleteFunc(ro.Rules[i].Verbs, func(v string) bool { return v == "patch" })
				}
			}
		})
		wantError(t, c.check(r), "does not grant [patch] on apps deployments/scale")
	})
	t.Run("a verb the subcommand does not have fails", func(t *testing.T) {
		r := mutate(t, c, func(r *rendering) {
			r.jobs[0].Spec.Template.Spec.InitContainers[0].Args[1] = "create"
		})
		wantError(t, c.check(r), `switchyard table takes no "create"`)
	})
	t.Run("a flag value the binary refuses fails", func(t *testing.T) {
		r := mutate(t, c, func(r *rendering) {
			ctr := container(t, r, "vllm-llama-3-8b", "adapter")
			ctr.Args = slices.Replace(ctr.Args, slices.Index(ctr.Args, "--drain-grace=60s"), slices.Index(ctr.Args, "--drain-grace=60s")+1, "--drain-grace=60")
		})
		wantError(t, c.check(r), "switchyard refuses the args")
	})
	t.Run("a wrong probe path fails", func(t *testing.T) {
		r := mutate(t, c, func(r *rendering) {
			container(t, r, "switchyard-gateway", "gateway").ReadinessProbe.HTTPGet.Path = "/ready"
		})
		wantError(t, c.check(r), `the gateway does not serve "/ready"`)
	})
	t.Run("a probe on a port the gateway does not listen on fails", func(t *testing.T) {
		r := mutate(t, c, func(r *rendering) {
			ctr := container(t, r, "switchyard-gateway", "gateway")
			ctr.Args = slices.Replace(ctr.Args, 1, 2, "--listen=:8081")
		})
		wantError(t, c.check(r), "but the gateway listens on 8081")
	})
	t.Run("a missing Secret fails", func(t *testing.T) {
		r := mutate(t, c, func(r *rendering) {
			r.secrets = slices.DeleteFunc(r.secrets, func(s *corev1.Secret) bool { return strings.HasPrefix(s.Name, "switchyard-broker-creds") })
		})
		wantError(t, c.check(r), `volume creds: Secret "switchyard-broker-creds-`)
	})
	t.Run("a missing Secret key fails", func(t *testing.T) {
		r := mutate(t, c, func(r *rendering) {
			v := &deployment(t, r, "vllm-llama-3-8b").Spec.Template.Spec.Containers[0].Env[1]
			v.ValueFrom.SecretKeyRef.Key = "token"
		})
		wantError(t, c.check(r), `has no key "token"`)
	})
	t.Run("a replica id not from the pod name fails", func(t *testing.T) {
		r := mutate(t, c, func(r *rendering) {
			ctr := container(t, r, "vllm-llama-3-8b", "adapter")
			i := slices.IndexFunc(ctr.Env, func(e corev1.EnvVar) bool { return e.Name == "POD_NAME" })
			ctr.Env[i] = corev1.EnvVar{Name: "POD_NAME", Value: "llama-0"}
		})
		wantError(t, c.check(r), "does not come from the pod name")
	})
	t.Run("an engine that stops before the adapter drained fails", func(t *testing.T) {
		r := mutate(t, c, func(r *rendering) {
			container(t, r, "vllm-llama-3-8b", "vllm").Lifecycle = nil
		})
		wantError(t, c.check(r), "has no preStop")
	})
	t.Run("an engine whose preStop waits on another port fails", func(t *testing.T) {
		r := mutate(t, c, func(r *rendering) {
			ctr := container(t, r, "vllm-llama-3-8b", "adapter")
			ctr.Args[slices.Index(ctr.Args, "--metrics-listen=:9102")] = "--metrics-listen=:9103"
		})
		wantError(t, c.check(r), "the preStop does not wait on the adapter's port 9103")
	})
	t.Run("scraping the gateway's API port fails", func(t *testing.T) {
		r := mutate(t, c, func(r *rendering) {
			deployment(t, r, "switchyard-gateway").Spec.Template.Annotations["prometheus.io/port"] = "8080"
		})
		wantError(t, c.check(r), `prometheus.io/port "8080"`)
	})
	t.Run("a scrape annotation on a port nothing serves fails", func(t *testing.T) {
		r := mutate(t, c, func(r *rendering) {
			deployment(t, r, "switchyard-broker").Spec.Template.Annotations["prometheus.io/port"] = "9090"
		})
		wantError(t, c.check(r), `prometheus.io/port "9090"`)
	})
}

// TestCanaryOverlayLinesUpWithTheBinary renders the example with a second
// engine Deployment: the new engine image as model version v1.1.0 in the
// canary pool, beside the old one.
func TestCanaryOverlayLinesUpWithTheBinary(t *testing.T) {
	bin := buildSwitchyard(t)
	c := &checker{bin: bin, tmp: t.TempDir(), help: map[string]*command{}, gateway: startGateway(t, bin)}
	r, err := render(filepath.Join(filepath.Dir(exampleTree(t, bin)), "canary"))
	if err != nil {
		t.Fatalf("rendering the canary overlay: %v", err)
	}
	if errs := c.check(r); len(errs) > 0 {
		t.Fatal(errors.Join(errs...))
	}
	old, canary := deployment(t, r, "vllm-llama-3-8b"), deployment(t, r, "vllm-llama-3-8b-v1-1")
	for _, tc := range []struct {
		d               *appsv1.Deployment
		version, pool   string
		engineImageTail string
	}{{old, "v1.0.0", "general", ":v0.11.0"}, {canary, "v1.1.0", "canary", ":v0.11.1"}} {
		args := container(t, r, tc.d.Name, "adapter").Args
		if !slices.Contains(args, "--version="+tc.version) || !slices.Contains(args, "--pool="+tc.pool) {
			t.Errorf("%s: adapter args %q, want version %s in pool %s", tc.d.Name, args, tc.version, tc.pool)
		}
		if img := container(t, r, tc.d.Name, "vllm").Image; !strings.HasSuffix(img, tc.engineImageTail) {
			t.Errorf("%s: engine image %s, want tag %s", tc.d.Name, img, tc.engineImageTail)
		}
		if img := container(t, r, tc.d.Name, "adapter").Image; !strings.HasPrefix(img, "registry.example.com/switchyard:") {
			t.Errorf("%s: adapter image %s is not the overlay's", tc.d.Name, img)
		}
	}
	if canary.Spec.Selector.MatchLabels["app.kubernetes.io/name"] == old.Spec.Selector.MatchLabels["app.kubernetes.io/name"] {
		t.Errorf("the canary's selector %v selects the old Deployment's pods", canary.Spec.Selector.MatchLabels)
	}
}

func TestBaseRendersStrictly(t *testing.T) {
	r, err := render("base")
	if err != nil {
		t.Fatal(err)
	}
	if len(r.deployments) != 3 || len(r.jobs) != 1 || len(r.secrets) != 0 {
		t.Fatalf("base: %d Deployments, %d Jobs, %d Secrets; want 3, 1 and none (an overlay makes the Secrets)", len(r.deployments), len(r.jobs), len(r.secrets))
	}
	if len(r.accounts) != 1 || len(r.roles) != 1 || len(r.bindings) != 1 {
		t.Fatalf("base: %d ServiceAccounts, %d Roles, %d RoleBindings; want the loader's one each", len(r.accounts), len(r.roles), len(r.bindings))
	}

	t.Run("a field the API type does not have fails", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "base")
		if err := os.CopyFS(dir, os.DirFS("base")); err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(dir, "gateway.yaml")
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		typo := strings.Replace(string(b), "readinessProbe:", "readinesProbe:", 1)
		if typo == string(b) {
			t.Fatal("gateway.yaml has no readinessProbe")
		}
		if err := os.WriteFile(f, []byte(typo), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err = render(dir)
		if err == nil || !strings.Contains(err.Error(), `unknown field "readinesProbe"`) {
			t.Fatalf("rendered with a misspelt field: %v", err)
		}
	})
}

// TestNATSValues checks the values for the official NATS chart: a
// three-node cluster with JetStream, the authorization included from the
// Secret the overlay makes, and room for the gateway's largest body.
func TestNATSValues(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("nats", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Config struct {
			Cluster struct {
				Enabled  bool `json:"enabled"`
				Replicas int  `json:"replicas"`
			} `json:"cluster"`
			JetStream struct {
				Enabled bool `json:"enabled"`
			} `json:"jetstream"`
			Merge map[string]any `json:"merge"`
		} `json:"config"`
		PodTemplate struct {
			Patch []struct {
				Value corev1.Volume `json:"value"`
			} `json:"patch"`
		} `json:"podTemplate"`
		Container struct {
			Patch []struct {
				Value corev1.VolumeMount `json:"value"`
			} `json:"patch"`
		} `json:"container"`
	}
	if err := yaml.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	if !v.Config.Cluster.Enabled || v.Config.Cluster.Replicas != 3 || !v.Config.JetStream.Enabled {
		t.Errorf("want a 3-node cluster with JetStream: %+v", v.Config)
	}
	include, _ := v.Config.Merge["00$include"].(string)
	// The chart puts nats.conf in /etc/nats-config; includes are relative to it.
	conf := filepath.Clean(filepath.Join("/etc/nats-config", include))
	mounted := false
	for _, m := range v.Container.Patch {
		for _, vol := range v.PodTemplate.Patch {
			if m.Value.Name == vol.Value.Name && vol.Value.Secret != nil && filepath.Dir(conf) == m.Value.MountPath {
				mounted = vol.Value.Secret.SecretName == "switchyard-nats-auth" && filepath.Base(conf) == "server.conf"
			}
		}
	}
	if !mounted {
		t.Errorf("the NATS servers do not include server.conf from the Secret switchyard-nats-auth (include %q)", include)
	}
	if mp, _ := v.Config.Merge["max_payload"].(float64); mp < 8<<20+64<<10 {
		t.Errorf("max_payload %v: below the gateway's default --max-body (8 MiB) plus headers", v.Config.Merge["max_payload"])
	}

	// The Secret is one the example overlay makes, from the file auth init writes.
	bin := buildSwitchyard(t)
	r, err := render(exampleTree(t, bin))
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(r.secrets, func(s *corev1.Secret) bool { return s.Name == "switchyard-nats-auth" })
	if i < 0 || !strings.Contains(string(r.secrets[i].Data["server.conf"]), "resolver_preload") {
		t.Errorf("the example overlay makes no Secret switchyard-nats-auth holding server.conf with the resolver preload")
	}
}

// mutate renders the example again and changes it.
func mutate(t *testing.T, c *checker, f func(*rendering)) *rendering {
	t.Helper()
	r, err := render(exampleTree(t, c.bin))
	if err != nil {
		t.Fatal(err)
	}
	f(r)
	return r
}

func deployment(t *testing.T, r *rendering, name string) *appsv1.Deployment {
	t.Helper()
	for _, d := range r.deployments {
		if d.Name == name {
			return d
		}
	}
	t.Fatalf("no Deployment %s", name)
	return nil
}

func container(t *testing.T, r *rendering, deploy, name string) *corev1.Container {
	t.Helper()
	spec := &deployment(t, r, deploy).Spec.Template.Spec
	for _, c := range allContainers(spec) {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("Deployment %s has no container %s", deploy, name)
	return nil
}

func wantError(t *testing.T, errs []error, want string) {
	t.Helper()
	for _, e := range errs {
		if strings.Contains(e.Error(), want) {
			return
		}
	}
	t.Errorf("no error contains %q; got %d: %v", want, len(errs), fmt.Sprint(errors.Join(errs...)))
}

// TestEveryPartExportsToTheCollector: in the example, the gateways, the
// brokers and the adapters all get the collector's endpoint and a sampler
// from the ConfigMap switchyard-otel, and nothing but OTEL_* variables
// from it.
func TestEveryPartExportsToTheCollector(t *testing.T) {
	r, err := render(exampleTree(t, buildSwitchyard(t)))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range [][2]string{{"switchyard-gateway", "gateway"}, {"switchyard-broker", "broker"}, {"vllm-llama-3-8b", "adapter"}} {
		env := map[string]string{}
		for _, ef := range container(t, r, p[0], p[1]).EnvFrom {
			if ef.ConfigMapRef == nil || !strings.HasPrefix(ef.ConfigMapRef.Name, "switchyard-otel") {
				continue
			}
			i := slices.IndexFunc(r.configMaps, func(c *corev1.ConfigMap) bool { return c.Name == ef.ConfigMapRef.Name })
			if i < 0 {
				t.Fatalf("%s: ConfigMap %s is not in the rendering", p[1], ef.ConfigMapRef.Name)
			}
			for k, v := range r.configMaps[i].Data {
				if !strings.HasPrefix(k, "OTEL_") {
					t.Errorf("%s: switchyard-otel holds %s, not an OpenTelemetry variable", p[1], k)
				}
				env[k] = v
			}
		}
		if u := env["OTEL_EXPORTER_OTLP_ENDPOINT"]; !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
			t.Errorf("%s: OTEL_EXPORTER_OTLP_ENDPOINT %q, want the collector's URL", p[1], u)
		}
		if env["OTEL_TRACES_SAMPLER"] == "" || env["OTEL_EXPORTER_OTLP_PROTOCOL"] != "http/protobuf" {
			t.Errorf("%s: sampler %q, protocol %q", p[1], env["OTEL_TRACES_SAMPLER"], env["OTEL_EXPORTER_OTLP_PROTOCOL"])
		}
	}
}
