package test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/subjects"
)

// listenFile binds a loopback port and returns the listening socket as a
// file to hand to a process (fd:3 when it is the first of its extra files),
// and its address. The test keeps the socket until it ends: a part that is
// killed and started again serves on the same one, and the port is never
// free for anyone else in between.
func listenFile(t *testing.T) (*os.File, string) {
	t.Helper()
	ln := testkit.Listen(t)
	f, err := ln.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f, ln.Addr().String()
}

// proc is a process of the production shape, killed when the test ends.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  testkit.SyncBuffer
	done chan struct{} // closed when the process has exited
}

func startProc(t *testing.T, name, bin string, args ...string) *proc {
	t.Helper()
	return startProcWith(t, name, nil, bin, args...)
}

// startProcWith is startProc handing the process files: the first is its
// fd 3, the next fd 4, and so on.
func startProcWith(t *testing.T, name string, files []*os.File, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, cmd: exec.Command(bin, args...), done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	p.cmd.ExtraFiles = files
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("%s output:\n%s", name, p.out.String())
		}
	})
	return p
}

func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// engineMetric is the sum of an engine's series name on its /metrics; 0
// when the engine does not answer (it was killed).
func engineMetric(engineURL, name string) float64 {
	v := testkit.Sum(testkit.Remote(engineURL+"/metrics"), name, nil)
	if math.IsNaN(v) {
		return 0
	}
	return v
}

func running(engineURL string) int { return int(engineMetric(engineURL, "vllm:num_requests_running")) }

// generated is how many tokens the engines have generated.
func generated(engines map[string]string) float64 {
	n := 0.0
	for _, url := range engines {
		n += engineMetric(url, "vllm:generation_tokens_total")
	}
	return n
}

// TestProductionShapeSurvivesAKilledEngine runs Switchyard as it is
// deployed: a bare nats-server, the dev table imported, a broker, a
// gateway and two engine + adapter pairs, each its own process. SIGKILL
// the engine under a stream of the `code` model, then under a non-streamed
// reading: each client gets its whole reading, the text of the
// uninterrupted one.
func TestProductionShapeSurvivesAKilledEngine(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs seven processes")
	}
	bin := binary(t)
	natsURL := bareNATS(t)
	tableFile := filepath.Join(repoRoot(), "deploy", "examples", "table.json")
	env := []string{"NATS_URL=" + natsURL, "HOME=" + t.TempDir()}
	if out, errOut, code := sy(t, env, "", "table", "import", tableFile); code != 0 {
		t.Fatalf("table import: exit %d: %s %s", code, out, errOut)
	}
	startProc(t, "broker", bin, "broker", "--nats", natsURL, "--metrics-listen", "", "--state-dir", t.TempDir())
	gwFile, gwAddr := listenFile(t)
	startProcWith(t, "gateway", []*os.File{gwFile}, bin, "gateway", "--nats", natsURL, "--listen", "fd:3", "--admin-listen", "127.0.0.1:0", "--state-dir", t.TempDir())
	gw := "http://" + gwAddr

	engines := map[string]string{}         // replica → engine URL
	engineSockets := map[string]*os.File{} // replica → its engine's socket, kept across the engine's restart
	engineProcs := map[string]*proc{}
	startEngine := func(id string) {
		engineProcs[id] = startProcWith(t, "engine "+id, []*os.File{engineSockets[id]}, bin, "engine-sim", "--model", "qwen-coder-32b", "--listen", "fd:3", "--deterministic-text")
	}
	for _, id := range []string{"coder-a", "coder-b"} {
		f, addr := listenFile(t)
		engines[id], engineSockets[id] = "http://"+addr, f
		startEngine(id)
		startProc(t, "adapter "+id, bin, "adapter", "--nats", natsURL, "--engine", engines[id], "--replica", id,
			"--model", "qwen-coder-32b", "--version", "v1.0.0", "--pool", "general")
	}
	body := func(stream bool) string {
		return `{"model":"code","max_tokens":500,"stream":` + strconv.FormatBool(stream) +
			`,"stream_options":` + map[bool]string{true: `{"include_usage":true}`, false: "null"}[stream] +
			`,"messages":[{"role":"user","content":"write a function"}]}`
	}
	// Both replicas serve before the faults.
	testkit.CheckFor(t, 60*time.Second, 10*time.Millisecond, func() error {
		seen := map[string]bool{}
		for range 20 {
			o := send(context.Background(), gw, `{"model":"code","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`)
			if o.status != 200 {
				return fmt.Errorf("not serving yet: %v", o)
			}
			seen[o.replica] = true
		}
		if !seen["coder-a"] || !seen["coder-b"] {
			return fmt.Errorf("replicas serving: %v", seen)
		}
		return nil
	})
	want := askChat(t, gw, body(true), 0, nil)
	if !want.done || want.completed != 500 {
		t.Fatalf("uninterrupted reading: done %v, %d tokens", want.done, want.completed)
	}
	killBusy := func() string {
		for id, url := range engines {
			if running(url) > 0 {
				engineProcs[id].kill()
				return id
			}
		}
		t.Error("no engine is running the request")
		return ""
	}

	var killed string
	got := askChat(t, gw, body(true), 100, func() { killed = killBusy() })
	whole(t, "stream under a SIGKILLed engine", got, want)
	t.Logf("engine of %s SIGKILLed after 100 tokens of a stream: the client got all 500, one id", killed)

	startEngine(killed)
	testkit.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		if resp, err := http.Get(engines[killed] + "/health"); err == nil {
			resp.Body.Close()
			return nil
		} else {
			return err
		}
	})
	before := generated(engines)
	done := make(chan *reading, 1)
	go func() { done <- askChat(t, gw, body(false), 0, nil) }()
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		for _, url := range engines {
			if running(url) > 0 {
				return nil
			}
		}
		return errors.New("not running yet")
	})
	testkit.CheckFor(t, 30*time.Second, 10*time.Millisecond, testkit.Cond("100 of the 500 tokens", func() bool { return generated(engines)-before >= 100 }))
	killed = killBusy()
	whole(t, "non-streamed reading under a SIGKILLed engine", <-done, want)
	t.Logf("engine of %s SIGKILLed under a non-streamed reading: the client got it whole", killed)
}

// logBatchState logs what a stuck batch's lines wait in: the items
// stream's consumers (pending, delivered and not acknowledged, pull
// requests waiting) and the end of the batcher's log.
func logBatchState(t *testing.T, run *clusterRun, js jetstream.JetStream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if s, err := js.Stream(ctx, subjects.ItemsStream); err != nil {
		t.Logf("%s: %v", subjects.ItemsStream, err)
	} else {
		leader := func(c *jetstream.ClusterInfo) string {
			if c == nil {
				return "(not clustered)"
			}
			return c.Leader
		}
		t.Logf("%s: %d messages, leader %s", subjects.ItemsStream, s.CachedInfo().State.Msgs, leader(s.CachedInfo().Cluster))
		for ci := range s.ListConsumers(ctx).Info() {
			t.Logf("consumer %s: leader %s, pending %d, ack pending %d, redelivered %d, waiting pulls %d, delivered %d, ack floor %d",
				ci.Name, leader(ci.Cluster), ci.NumPending, ci.NumAckPending, ci.NumRedelivered, ci.NumWaiting,
				ci.Delivered.Stream, ci.AckFloor.Stream)
		}
	}
	b, err := os.ReadFile(filepath.Join(run.dir, "logs", "batcher-1.log"))
	if err != nil {
		t.Log(err)
		return
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	t.Logf("the last lines of batcher-1's log:\n%s", strings.Join(lines[max(0, len(lines)-40):], "\n"))
}

// clusterBatchPhase runs a 2,000-line batch through the production shape
// (run's first gateway) and, mid-batch, SIGKILLs the NATS node
// leading the items stream and broker-1, restarting both: the batch
// completes with exactly 2,000 results, no custom_id twice. `make
// test-cluster` runs it after the other faults; it returns the fault
// table's note.
func clusterBatchPhase(t *testing.T, run *clusterRun, js jetstream.JetStream, command func(string)) string {
	t.Helper()
	oc := openai.NewClient(option.WithBaseURL(run.gateways[0]+"/v1/"), option.WithAPIKey("sk-acme-dev"), option.WithMaxRetries(3))
	c := &oc
	// The faults go in once 300 of the 2,000 lines are answered. Right
	// after the frozen node, the Batch API may answer 503 for seconds
	// while the batch runs on: one that ended before it could be seen
	// past 300 lines leaves no batch to place the faults in, and another
	// is created (at most three in all).
	var b *openai.Batch
	for try := 1; ; try++ {
		b = startBatch(t, c)
		ended := false
		testkit.CheckFor(t, 3*time.Minute, 200*time.Millisecond, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			got, err := c.Batches.Get(ctx, b.ID, option.WithMaxRetries(0))
			if err != nil {
				return err
			}
			switch got.Status {
			case "completed", "failed", "expired", "cancelled":
				if got.ErrorFileID != "" {
					n := 0
					for id, l := range fileLines(t, c, got.ErrorFileID) {
						if n++; n > 3 {
							break
						}
						t.Logf("error line %s: %v", id, l)
					}
				}
				if try == 3 || got.Status != "completed" {
					t.Fatalf("the batch ended %s with %+v before 300 lines were seen answered", got.Status, got.RequestCounts)
				}
				t.Logf("batch %d ended %s with %+v before 300 lines were seen answered; another", try, got.Status, got.RequestCounts)
				ended = true
				return nil
			}
			if got.RequestCounts.Completed < 300 {
				return fmt.Errorf("%s, %d of 2000 answered", got.Status, got.RequestCounts.Completed)
			}
			return nil
		})
		if !ended {
			break
		}
	}
	// The items stream's leader (an election may still be running after
	// the faults before this one).
	var leader string
	testkit.CheckFor(t, 30*time.Second, 200*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := js.Stream(ctx, subjects.ItemsStream)
		if err != nil {
			return err
		}
		info, err := s.Info(ctx)
		if err != nil {
			return err
		}
		if info.Cluster == nil || info.Cluster.Leader == "" {
			return fmt.Errorf("%s has no leader", subjects.ItemsStream)
		}
		leader = info.Cluster.Leader
		return nil
	})
	mid, _ := c.Batches.Get(context.Background(), b.ID)
	command("kill " + leader)
	command("kill broker-1")
	command("start " + leader)
	command("start broker-1")
	if _, perr := testkit.Poll(5*time.Minute, 200*time.Millisecond, batchEnded(c, b.ID, &b)); perr != nil {
		t.Errorf("the batch 5 minutes after the faults: %v", perr)
		logBatchState(t, run, js)
		return "batch not completed"
	}
	if b.Status != "completed" || b.RequestCounts.Completed+b.RequestCounts.Failed != 2000 {
		t.Errorf("the batch after the faults: %s %+v", b.Status, b.RequestCounts)
		return "batch not completed"
	}
	// Every line once, in the output or (a line that failed its tries
	// across the faults) in the error file: none lost, none twice.
	out := fileLines(t, c, b.OutputFileID)
	if b.ErrorFileID != "" {
		for id := range fileLines(t, c, b.ErrorFileID) {
			if out[id] != nil {
				t.Errorf("%s is in the output and the error file", id)
			}
			out[id] = map[string]any{}
		}
	}
	if len(out) != 2000 {
		t.Errorf("the batch has %d results, want 2000", len(out))
	}
	return fmt.Sprintf("%s and broker-1 SIGKILLed at %d of 2000 lines; 2000 results (%d failed), none twice",
		leader, mid.RequestCounts.Completed, b.RequestCounts.Failed)
}

// startBatch creates the phase's 2,000-line batch. The phase follows a
// frozen NATS node: until JetStream has settled, the Files and Batch APIs
// answer 503 with Retry-After, as they should; a client retries, and the
// table's own bound applies.
func startBatch(t *testing.T, c *openai.Client) *openai.Batch {
	t.Helper()
	var b *openai.Batch
	if _, err := testkit.Poll(routingBound, time.Second, func() (err error) {
		b, err = createBatch(c, batchLines(2000, "chat-large"))
		if err != nil && !isStatus(err, http.StatusServiceUnavailable) {
			t.Fatal(err)
		}
		return err
	}); err != nil {
		t.Fatalf("the batch could not be created within %v: %v", routingBound, err)
	}
	return b
}
