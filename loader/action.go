package loader

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/switchyard-llm/switchyard/table"
)

// Op is one load or unload of a model version.
type Op struct {
	Unload         bool
	Model, Version string
	// Action is the table's load or unload action (nil when it has none).
	Action *table.Action
}

func (op Op) verb() string {
	if op.Unload {
		return "unload"
	}
	return "load"
}

// Actions runs load and unload actions. Run returns once the action has
// been carried out (the script exited, the webhook answered, the scale was
// accepted); the load is ready only when a replica heartbeats ready.
type Actions interface {
	Run(ctx context.Context, op Op) error
}

// Standard runs the three forms of table.Action.
type Standard struct {
	// HTTP calls webhooks (nil: a client with a 30 s timeout).
	HTTP *http.Client
	// Kubernetes scales Deployments (nil: a kubernetes action fails).
	Kubernetes *Kubernetes
}

var _ Actions = (*Standard)(nil)

// Run carries out op.Action.
func (s *Standard) Run(ctx context.Context, op Op) error {
	a := op.Action
	switch {
	case a == nil:
		return fmt.Errorf("model %s has no %s action in the routing table", op.Model, op.verb())
	case len(a.Exec) > 0:
		return runExec(ctx, op, a.Exec)
	case a.Webhook != "":
		return s.webhook(ctx, op, a.Webhook)
	case a.Kubernetes != nil:
		if s.Kubernetes == nil {
			return errors.New("a kubernetes action needs the loader to run in a pod (no service account found)")
		}
		n := a.Kubernetes.Replicas
		switch {
		case op.Unload:
			n = 0
		case n == 0:
			n = 1
		}
		return s.Kubernetes.Scale(ctx, a.Kubernetes.Namespace, a.Kubernetes.Deployment, n)
	}
	return fmt.Errorf("model %s: empty %s action", op.Model, op.verb())
}

// expand replaces {model} and {version} in s.
func expand(s string, op Op, escape func(string) string) string {
	return strings.NewReplacer("{model}", escape(op.Model), "{version}", escape(op.Version)).Replace(s)
}

func same(s string) string { return s }

// runExec runs the program with {model} and {version} replaced in its
// arguments and SWITCHYARD_ACTION, SWITCHYARD_MODEL and SWITCHYARD_VERSION
// in its environment. A non-zero exit fails the action, with the end of its
// output in the error.
func runExec(ctx context.Context, op Op, argv []string) error {
	args := make([]string, len(argv))
	for i, a := range argv {
		args[i] = expand(a, op, same)
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Env = append(os.Environ(), "SWITCHYARD_ACTION="+op.verb(), "SWITCHYARD_MODEL="+op.Model, "SWITCHYARD_VERSION="+op.Version)
	var out tail
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		if msg := strings.TrimSpace(out.String()); msg != "" {
			return fmt.Errorf("%s %s: %w: %s", op.verb(), args[0], err, msg)
		}
		return fmt.Errorf("%s %s: %w", op.verb(), args[0], err)
	}
	return nil
}

// tail keeps the last 1 KiB written to it.
type tail struct{ b []byte }

func (t *tail) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > 1024 {
		t.b = t.b[len(t.b)-1024:]
	}
	return len(p), nil
}

func (t *tail) String() string { return string(t.b) }

// webhookBody is what a webhook receives.
type webhookBody struct {
	Action  string `json:"action"`
	Model   string `json:"model"`
	Version string `json:"version,omitempty"`
}

// webhook POSTs {"action", "model", "version"} to the URL; any 2xx is done.
func (s *Standard) webhook(ctx context.Context, op Op, rawURL string) error {
	u := expand(rawURL, op, url.PathEscape)
	body, _ := json.Marshal(webhookBody{Action: op.verb(), Model: op.Model, Version: op.Version})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("%s webhook: %w", op.verb(), err)
	}
	req.Header.Set("Content-Type", "application/json")
	client := s.HTTP
	if client == nil {
		client = &http.Client{Timeout: 30 * time.Second}
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("%s webhook: %w", op.verb(), err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s webhook answered %s: %s", op.verb(), resp.Status, strings.TrimSpace(string(msg)))
	}
	return nil
}
