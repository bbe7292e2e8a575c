package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/natsconn"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// siteReplica runs at the GPU site, behind its leaf node.
const siteReplica = "coder-gen-0"

// siteName is the GPU site's leaf server (and, with -netns, its namespace).
const siteName = "gpu-site-1"

// nsEnginePort is where the site's engine listens in its namespace.
const nsEnginePort = 8000

// operatorTries is how many times the launcher runs an operator command
// that failed, operatorPause apart. Both commands it runs may run again:
// init creates only what is absent and sets what it sets to the same
// values, import writes only the keys whose values differ. On a cluster
// just formed, on a loaded machine, creating a replicated stream can
// outlast the command's own deadline while the servers go on to create it.
const (
	operatorTries = 3
	operatorPause = time.Second
)

// operatorCommand runs `switchyard ARGS...` as an operator does, again
// after a failure, up to operatorTries times in all; a usage error (exit
// status 2) is not tried again.
func operatorCommand(ctx context.Context, switchyard string, args []string) error {
	var err error
	for try := 1; ; try++ {
		out, runErr := exec.CommandContext(ctx, switchyard, args...).CombinedOutput()
		if runErr == nil {
			return nil
		}
		err = fmt.Errorf("switchyard %s: %v: %s", strings.Join(args, " "), runErr, bytes.TrimSpace(out))
		var exit *exec.ExitError
		if try == operatorTries || (errors.As(runErr, &exit) && exit.ExitCode() == 2) {
			return err
		}
		fmt.Fprintf(os.Stderr, "cluster: try %d of %d failed, trying again: %v\n", try, operatorTries, err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (%v)", err, context.Cause(ctx))
		case <-time.After(operatorPause):
		}
	}
}

// startSwitchyard creates the bucket with three replicas, imports
// deploy/examples/table.json, and starts an engine-sim and an adapter for
// each dev replica, then the brokers, then the gateways. It returns the
// gateways' URLs.
func startSwitchyard(ctx context.Context, cfg config, n natsCluster, procs *procs) ([]gatewayURLs, error) {
	// conn is how a part connects: every server, the CA, its own creds.
	conn := func(identity string) []string {
		return []string{"--nats", n.url, "--tlsca", n.ca, "--creds", n.credsFor(identity)}
	}
	tableFile := filepath.Join(cfg.root, "deploy", "examples", "table.json")
	for _, args := range [][]string{{"table", "init", "--replicas", "3"}, {"table", "import", tableFile}} {
		if err := operatorCommand(ctx, cfg.switchyard, append(args, conn("operator")...)); err != nil {
			return nil, err
		}
	}

	// Every part that listens is handed its socket (fd:3, fd:4), which this
	// launcher keeps across the part's restarts.
	replicas := devstack.Replicas()
	procs.nextTier()
	engines := make([]string, len(replicas))
	for i, r := range replicas {
		listen, files := "fd:3", []*os.File(nil)
		if cfg.net != nil && r.ID == siteReplica {
			// At the site, beside its adapter.
			listen = fmt.Sprintf("127.0.0.1:%d", nsEnginePort)
			engines[i] = "http://" + listen
		} else {
			sock, addr, err := procs.listen()
			if err != nil {
				return nil, err
			}
			engines[i], files = "http://"+addr, []*os.File{sock}
		}
		args := []string{"engine-sim", "--listen", listen, "--model", r.Model, "--kv-blocks", strconv.Itoa(r.KVBlocks)}
		if r.MaxLoras > 0 {
			args = append(args, "--max-loras", strconv.Itoa(r.MaxLoras), "--adapters", strings.Join(r.Adapters, ","))
		}
		exe := cfg.switchyard
		if r.ID == siteReplica {
			exe, args = cfg.net.command(siteName, exe, args)
		}
		if err := procs.start("engine-"+r.ID, cfg.dir, nil, files, exe, args...); err != nil {
			return nil, err
		}
	}
	procs.nextTier()
	for i, r := range replicas {
		args := []string{"adapter", "--engine", engines[i],
			"--replica", r.ID, "--model", r.Model, "--version", r.Version, "--pool", r.Pool}
		if r.ID == siteReplica {
			// Plain NATS inside the site; the leaf connection carries
			// this replica's creds.
			args = append(args, "--nats", n.site)
		} else {
			args = append(args, conn("adapter-"+r.ID)...)
		}
		if r.MaxLoras > 0 {
			args = append(args, "--max-loras", strconv.Itoa(r.MaxLoras))
		}
		exe := cfg.switchyard
		if r.ID == siteReplica {
			exe, args = cfg.net.command(siteName, exe, args)
		}
		if err := procs.start("adapter-"+r.ID, cfg.dir, nil, nil, exe, args...); err != nil {
			return nil, err
		}
	}
	if err := waitReplicasReady(ctx, n, replicas, procs); err != nil {
		return nil, err
	}
	procs.nextTier()
	for i := range cfg.brokers {
		name := fmt.Sprintf("broker-%d", i+1)
		metricsListen, files := fmt.Sprintf("%s:%d", cfg.net.addr(name), nsMetricsPort), []*os.File(nil)
		if cfg.net == nil {
			metrics, _, err := procs.listen()
			if err != nil {
				return nil, err
			}
			metricsListen, files = "fd:3", []*os.File{metrics}
		}
		args := append([]string{"broker", "--id", name, "--state-dir", filepath.Join(cfg.dir, name),
			"--metrics-listen", metricsListen}, conn("broker")...)
		exe, args := cfg.net.command(name, cfg.switchyard, args)
		if err := procs.start(name, cfg.dir, nil, files, exe, args...); err != nil {
			return nil, err
		}
	}
	procs.nextTier()
	urls := make([]gatewayURLs, cfg.gateways)
	for i := range cfg.gateways {
		name := fmt.Sprintf("gateway-%d", i+1)
		var args []string
		var files []*os.File
		if cfg.net != nil {
			// On its front address, where clients reach it.
			front := cfg.net.parts[name].front
			listen, adminListen := fmt.Sprintf("%s:%d", front, nsGatewayPort), fmt.Sprintf("%s:%d", front, nsMetricsPort)
			args = []string{"gateway", "--listen", listen, "--admin-listen", adminListen}
			urls[i] = gatewayURLs{public: "http://" + listen, admin: "http://" + adminListen}
		} else {
			// Both gateways run on this one host: each admin listener (the
			// dashboard and /metrics) needs a port of its own.
			public, listen, err := procs.listen()
			if err != nil {
				return nil, err
			}
			admin, adminListen, err := procs.listen()
			if err != nil {
				return nil, err
			}
			args = []string{"gateway", "--listen", "fd:3", "--admin-listen", "fd:4"}
			files = []*os.File{public, admin}
			urls[i] = gatewayURLs{public: "http://" + listen, admin: "http://" + adminListen}
		}
		decide := cfg.decide
		if decide == "mixed" {
			decide = "broker"
			if i == 0 {
				decide = "local"
			}
		}
		args = append(append(args, "--state-dir", filepath.Join(cfg.dir, name), "--batch-replicas", "3", "--decide", decide), conn("gateway")...)
		exe, args := cfg.net.command(name, cfg.switchyard, args)
		if err := procs.start(name, cfg.dir, nil, files, exe, args...); err != nil {
			return nil, err
		}
	}
	// One batcher runs the Batch API's lines; its stream and buckets have
	// three replicas, as the table has. (None in network namespaces.)
	if cfg.net == nil {
		args := append([]string{"batcher", "--id", "batcher-1", "--kv-replicas", "3", "--ack-wait", "10s", "--metrics-listen", ""}, conn("batcher")...)
		if err := procs.start("batcher-1", cfg.dir, nil, nil, cfg.switchyard, args...); err != nil {
			return nil, err
		}
	}
	return urls, nil
}

// A gateway in its namespace serves on its front address at
// nsGatewayPort, its admin listener at nsMetricsPort; a broker there serves
// /metrics at nsMetricsPort on its address.
const (
	nsGatewayPort = 8080
	nsMetricsPort = 9090
)

// gatewayURLs are a gateway's public (API) and admin (dashboard, /metrics) URLs.
type gatewayURLs struct{ public, admin string }

// waitReplicasReady waits until every replica's adapter has written itself
// ready into the table, so that the brokers start warm.
func waitReplicasReady(ctx context.Context, n natsCluster, replicas []devstack.Replica, procs *procs) error {
	nc, err := natsconn.Connect(ctx, natsconn.Options{URL: n.url, TLSCA: n.ca, Creds: n.credsFor("observer"), Name: "switchyard-cluster"})
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	var bucket jetstream.KeyValue
	missing := ""
	err = poll(ctx, 90*time.Second, procs, "replicas ready", func() bool {
		if bucket == nil {
			if bucket, err = js.KeyValue(ctx, subjects.DefaultBucket); err != nil {
				bucket = nil
				return false
			}
		}
		for _, r := range replicas {
			e, err := bucket.Get(ctx, "replicas."+r.ID)
			if err != nil {
				missing = r.ID
				return false
			}
			v, err := table.Decode(e.Key(), e.Value())
			if rep, ok := v.V.(table.Replica); err != nil || !ok || rep.State != subjects.StateReady {
				missing = r.ID
				return false
			}
		}
		return true
	})
	if err != nil {
		return fmt.Errorf("%w (%s is not ready)", err, missing)
	}
	return nil
}

// waitGateway waits until the gateway reports ready and answers an
// anonymous request, as the dev stack does.
func waitGateway(ctx context.Context, url string, procs *procs) error {
	body := []byte(`{"model":"chat-small","messages":[{"role":"user","content":"ready?"}],"max_tokens":2}`)
	c := http.Client{Timeout: 10 * time.Second}
	return poll(ctx, 60*time.Second, procs, url+" ready", func() bool {
		if !httpOK(url + "/readyz") {
			return false
		}
		resp, err := c.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var out struct {
			Choices []json.RawMessage `json:"choices"`
		}
		return resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&out) == nil && len(out.Choices) > 0
	})
}
