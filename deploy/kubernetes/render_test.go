package kubernetes_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// rendering is every object a kustomization renders to, decoded into the
// Kubernetes API types.
type rendering struct {
	deployments []*appsv1.Deployment
	services    []*corev1.Service
	pdbs        []*policyv1.PodDisruptionBudget
	hpas        []*autoscalingv2.HorizontalPodAutoscaler
	jobs        []*batchv1.Job
	configMaps  []*corev1.ConfigMap
	secrets     []*corev1.Secret
	accounts    []*corev1.ServiceAccount
	roles       []*rbacv1.Role
	bindings    []*rbacv1.RoleBinding
}

// render runs kustomize on dir as `kubectl apply -k dir` would, and decodes
// every object strictly: a field the API type does not have is an error, as
// is a kind the deployment is not expected to hold.
func render(dir string) (*rendering, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, err
	}
	out := &rendering{}
	for _, r := range m.Resources() {
		b, err := r.MarshalJSON()
		if err != nil {
			return nil, err
		}
		gvk := r.GetGvk()
		id := fmt.Sprintf("%s %s/%s", gvk.Kind, gvk.ApiVersion(), r.GetName())
		var obj any
		switch gvk.ApiVersion() + " " + gvk.Kind {
		case "apps/v1 Deployment":
			obj = add(&out.deployments)
		case "v1 Service":
			obj = add(&out.services)
		case "policy/v1 PodDisruptionBudget":
			obj = add(&out.pdbs)
		case "autoscaling/v2 HorizontalPodAutoscaler":
			obj = add(&out.hpas)
		case "batch/v1 Job":
			obj = add(&out.jobs)
		case "v1 ConfigMap":
			obj = add(&out.configMaps)
		case "v1 Secret":
			obj = add(&out.secrets)
		case "v1 ServiceAccount":
			obj = add(&out.accounts)
		case "rbac.authorization.k8s.io/v1 Role":
			obj = add(&out.roles)
		case "rbac.authorization.k8s.io/v1 RoleBinding":
			obj = add(&out.bindings)
		default:
			return nil, fmt.Errorf("%s: a kind this deployment does not use", id)
		}
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(obj); err != nil {
			return nil, fmt.Errorf("%s: %w", id, err)
		}
	}
	return out, nil
}

// add appends a new, empty object to list and returns it to decode into.
func add[T any](list *[]*T) *T {
	v := new(T)
	*list = append(*list, v)
	return v
}

// repoRoot is the main module's directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "cmd", "switchyard")); err != nil {
		t.Fatalf("not the repository root: %v", err)
	}
	return root
}

// buildSwitchyard builds the binary the manifests run, from this checkout.
func buildSwitchyard(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "switchyard")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/switchyard")
	cmd.Dir = repoRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// exampleTree copies base/ and example/ into a temporary directory and makes
// there what an operator makes before `kubectl apply -k example`: the keys
// and creds of `switchyard auth init auth` and the engine's API key. It
// returns the copy's example directory.
func exampleTree(t *testing.T, bin string) string {
	t.Helper()
	dst := t.TempDir()
	if err := os.CopyFS(dst, os.DirFS(".")); err != nil {
		t.Fatal(err)
	}
	ex := filepath.Join(dst, "example")
	run(t, bin, "auth", "init", filepath.Join(ex, "auth"))
	if err := os.MkdirAll(filepath.Join(ex, "secrets"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ex, "secrets", "vllm-api-key"), []byte("test-engine-key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return ex
}

func run(t *testing.T, bin string, args ...string) string {
	t.Helper()
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("switchyard %v: %v\n%s", args, err, out)
	}
	return string(out)
}
