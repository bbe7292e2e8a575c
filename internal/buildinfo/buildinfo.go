// Package buildinfo says which build of switchyard is running: for
// `switchyard version` and the switchyard_build_info series every part
// serves, so that a dashboard shows which versions a rolling upgrade left
// behind.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// version is set by the linker when the build says which release it is
// (`make build`, the container image: -ldflags "-X
// github.com/switchyard-llm/switchyard/internal/buildinfo.version=v1.2.0");
// nothing writes it at run time.
var version string

// Info is what the Go toolchain stamped into the binary.
type Info struct {
	// Version is the module version: a tag (v1.2.0), a pseudo-version for
	// an untagged commit, or "(devel)" when built without version control.
	Version string `json:"version"`
	// Revision is the commit, with "-dirty" when the tree had changes; ""
	// when unknown.
	Revision  string `json:"revision"`
	GoVersion string `json:"go_version"`
}

// Read returns the running binary's build information.
func Read() Info {
	i := Info{Version: "(devel)", GoVersion: runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		if version != "" {
			i.Version = version
		}
		return i
	}
	if bi.Main.Version != "" {
		i.Version = bi.Main.Version
	}
	if version != "" {
		i.Version = version
	}
	var dirty bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			i.Revision = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if dirty && i.Revision != "" {
		i.Revision += "-dirty"
	}
	return i
}

// String is the one line `switchyard version` prints.
func (i Info) String() string {
	rev := i.Revision
	if rev == "" {
		rev = "unknown"
	}
	return fmt.Sprintf("switchyard %s (revision %s, %s %s/%s)", i.Version, rev, i.GoVersion, runtime.GOOS, runtime.GOARCH)
}

// Collector is the constant series switchyard_build_info{version, revision,
// goversion} = 1.
func (i Info) Collector() prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "switchyard_build_info",
		Help:        "Always 1; the labels say which build of switchyard this process runs.",
		ConstLabels: prometheus.Labels{"version": i.Version, "revision": i.Revision, "goversion": i.GoVersion},
	}, func() float64 { return 1 })
}
