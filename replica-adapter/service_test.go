package adapter_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/subjects"
)

// TestMetadataNamesTheDetectedFlavor: an engine that is not up when its
// adapter starts is detected later; the micro metadata and replicas.<id>
// name the flavor read, not "auto".
func TestMetadataNamesTheDetectedFlavor(t *testing.T) {
	e := newEnv(t)
	e.eng.health.Store(http.StatusServiceUnavailable)
	e.eng.metrics.Store("")
	e.start(e.config())
	// While the service is added again, for a moment nothing answers.
	flavor := func() (string, error) {
		resp, err := e.nc.Request("$SRV.INFO."+subjects.AdapterService, nil, 5*time.Second)
		if err != nil {
			return "", err
		}
		var info micro.Info
		if err := json.Unmarshal(resp.Data, &info); err != nil {
			t.Fatal(err)
		}
		return info.Metadata["flavor"], nil
	}
	if f, err := flavor(); f != "auto" {
		t.Fatalf("flavor %q (%v) before the engine answered, want auto", f, err)
	}
	e.eng.metrics.Store("vllm/metrics-idle.txt")
	testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		if f, err := flavor(); f != "vllm" {
			return fmt.Errorf("metadata flavor %q (%v)", f, err)
		}
		return nil
	})

	e.eng.health.Store(http.StatusOK)
	e.waitReady("r-1")
	if r, _ := e.replica("r-1"); r.Flavor != "vllm" {
		t.Fatalf("replicas.r-1 flavor %q", r.Flavor)
	}
	// The service answers requests after it was added again.
	e.eng.handle(streamSSE(t))
	msgs := untilEnd(t, e.request("r-1", chatHeaders("after"), `{"model":"sim-model","stream":true}`))
	if st := msgs[0].Header.Get(subjects.HdrStatus); st != "" && st != "200" {
		t.Fatalf("status %s", st)
	}
}
