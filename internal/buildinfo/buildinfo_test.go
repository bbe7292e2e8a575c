package buildinfo_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-llm/switchyard/internal/buildinfo"
)

func TestCollectorCarriesTheBuild(t *testing.T) {
	i := buildinfo.Info{Version: "v1.2.3", Revision: "abc123-dirty", GoVersion: "go1.26.8"}
	reg := prometheus.NewRegistry()
	reg.MustRegister(i.Collector())
	mfs, err := reg.Gather()
	if err != nil || len(mfs) != 1 || mfs[0].GetName() != "switchyard_build_info" || len(mfs[0].GetMetric()) != 1 {
		t.Fatalf("gathered %v, %v", mfs, err)
	}
	m := mfs[0].GetMetric()[0]
	got := map[string]string{}
	for _, l := range m.GetLabel() {
		got[l.GetName()] = l.GetValue()
	}
	want := map[string]string{"version": "v1.2.3", "revision": "abc123-dirty", "goversion": "go1.26.8"}
	if len(got) != len(want) || got["version"] != want["version"] || got["revision"] != want["revision"] || got["goversion"] != want["goversion"] {
		t.Errorf("labels %v, want %v", got, want)
	}
	if v := m.GetGauge().GetValue(); v != 1 {
		t.Errorf("value %v, want 1", v)
	}
}

func TestReadNamesTheToolchain(t *testing.T) {
	i := buildinfo.Read()
	if !strings.HasPrefix(i.GoVersion, "go") || i.Version == "" {
		t.Errorf("Read() = %+v", i)
	}
	if s := i.String(); !strings.HasPrefix(s, "switchyard "+i.Version+" (revision ") {
		t.Errorf("String() = %q", s)
	}
}
