package test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/internal/iproute"
	"github.com/switchyard-llm/switchyard/internal/testkit"
)

// regionsPrefix names the namespaces and links of nsRegions: namespaces
// syreg-a and syreg-b, the host's ends of their links to the host named
// the same, and the link between them syreg-ab (in a) and syreg-ba (in b).
const regionsPrefix = "syreg"

// The link between the regions is on regionLinkNet (a has .1, b .2); see
// regionHostNet for their links to the host. Nothing routes between these
// subnets, so the gateway between the regions can only use that link.
const regionLinkNet = "10.232.3."

// regionHostNet is the subnet of region i's link to the host (the host has
// .1, the namespace .2).
func regionHostNet(i int) string { return fmt.Sprintf("10.232.%d.", i+1) }

// The ports each region's server listens on inside its namespace.
const (
	regionClientPort  = 4222
	regionMonitorPort = 8222
	regionClusterPort = 6222
	regionGatewayPort = 7222
)

// nsRegions is a NATS supercluster of two regions, each a nats-server
// process in a Linux network namespace of its own, with a JetStream of one
// domain across both. Each server is its own cluster (named after its
// region) and the two are joined by NATS gateways over a veth pair between
// the namespaces; setting that link down cuts the regions apart (packets
// dropped both ways, connections kept open and silent), setting it up
// heals them. Clients and monitoring reach each server from the host's
// namespace over a link of its own, which a cut leaves up.
type nsRegions struct {
	names [2]string  // the regions, which name the servers, clusters and gateways
	ns    [2]string  // their namespaces
	addr  [2]string  // each server's address on its link to the host
	t     *testing.T // the test Cut and Heal fail when ip does
}

// needNamespacedRegions skips t unless SWITCHYARD_SUPERCLUSTER=1 (`make
// test-supercluster`), and fails it when namespaces cannot be made (not
// root, no ip), unless SUPERCLUSTER_SKIP_OK=1, which turns that into a
// skip.
func needNamespacedRegions(t *testing.T) {
	t.Helper()
	if os.Getenv("SWITCHYARD_SUPERCLUSTER") != "1" {
		t.Skip("make test-supercluster runs this (root, network namespaces, a nats-server process per region)")
	}
	if why := namespacesUnavailable(); why != "" {
		if os.Getenv("SUPERCLUSTER_SKIP_OK") == "1" {
			t.Skip("no namespaced regions made: " + why)
		}
		t.Fatalf("no namespaced regions can be made: %s (SUPERCLUSTER_SKIP_OK=1 accepts a run without them)", why)
	}
}

// netnsRegions runs the supercluster of regions a and b (region 0 and 1)
// and waits until each has its gateway to the other up and JetStream has a
// meta leader both servers agree on. What an earlier run killed midway
// left under regionsPrefix is removed first; the servers, namespaces and
// links are removed when the test ends, and on failure the tail of each
// server's log is printed. Needs root (see needNamespacedRegions).
func netnsRegions(t *testing.T, a, b string) *nsRegions {
	t.Helper()
	bin := natsServerBinary(t)
	r := &nsRegions{names: [2]string{a, b}, t: t}
	for i := range 2 {
		r.ns[i] = regionNamespace(i)
		r.addr[i] = regionHostNet(i) + "2"
	}
	if err := cleanRegions(); err != nil {
		t.Fatalf("removing what an earlier run left: %v", err)
	}
	// Registered first, so it runs last: after the servers are gone.
	t.Cleanup(func() {
		if err := cleanRegions(); err != nil {
			t.Errorf("removing the namespaces: %v", err)
		}
	})
	if err := setupRegions(r.ns); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for i := range 2 {
		r.start(t, bin, dir, i)
	}
	took := testkit.CheckFor(t, 60*time.Second, 50*time.Millisecond, func() error {
		if !r.Linked() {
			return errors.New("the gateways are not up")
		}
		return r.agreedLeader()
	})
	t.Logf("regions %s and %s linked, JetStream meta leader elected, %v after starting", a, b, took.Round(time.Millisecond))
	return r
}

// regionNamespace is region i's namespace, also the name of the host's end
// of its link to the host.
func regionNamespace(i int) string { return regionsPrefix + "-" + string(rune('a'+i)) }

// regionLinkEnd is region i's end of the link between the regions.
func regionLinkEnd(i int) string {
	return regionsPrefix + "-" + string(rune('a'+i)) + string(rune('a'+1-i))
}

// setupRegions makes the two namespaces, a link from the host to each and
// the link between them, all up.
func setupRegions(ns [2]string) error {
	var cmds [][]string
	for i := range 2 {
		cmds = append(cmds,
			[]string{"netns", "add", ns[i]},
			[]string{"-n", ns[i], "link", "set", "lo", "up"},
			[]string{"link", "add", ns[i], "type", "veth", "peer", "name", "host", "netns", ns[i]},
			[]string{"addr", "add", regionHostNet(i) + "1/24", "dev", ns[i]},
			[]string{"link", "set", ns[i], "up"},
			[]string{"-n", ns[i], "addr", "add", regionHostNet(i) + "2/24", "dev", "host"},
			[]string{"-n", ns[i], "link", "set", "host", "up"})
	}
	cmds = append(cmds, []string{"-n", ns[0], "link", "add", regionLinkEnd(0), "type", "veth", "peer", "name", regionLinkEnd(1), "netns", ns[1]})
	for i := range 2 {
		cmds = append(cmds,
			[]string{"-n", ns[i], "addr", "add", fmt.Sprintf("%s%d/24", regionLinkNet, i+1), "dev", regionLinkEnd(i)},
			[]string{"-n", ns[i], "link", "set", regionLinkEnd(i), "up"})
	}
	return iproute.Run(cmds)
}

// cleanRegions kills what runs in the regions' namespaces (a server an
// earlier run left), deletes the links (a veth pair goes with either end)
// and the namespaces. What is not there is skipped.
func cleanRegions() error {
	var errs []error
	have := map[string]bool{}
	if out, err := exec.Command("ip", "netns", "list").Output(); err == nil {
		for l := range strings.Lines(string(out)) {
			if f := strings.Fields(l); len(f) > 0 {
				have[f[0]] = true
			}
		}
	} else {
		errs = append(errs, fmt.Errorf("ip netns list: %w", err))
	}
	for i := range 2 {
		ns := regionNamespace(i)
		if exec.Command("ip", "link", "show", "dev", ns).Run() == nil {
			errs = append(errs, iproute.Run([][]string{{"link", "del", ns}}))
		}
		if !have[ns] {
			continue
		}
		if out, err := exec.Command("ip", "netns", "pids", ns).Output(); err == nil {
			for _, f := range strings.Fields(string(out)) {
				var pid int
				if _, err := fmt.Sscan(f, &pid); err == nil && pid > 1 {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		if exec.Command("ip", "-n", ns, "link", "show", "dev", regionLinkEnd(i)).Run() == nil {
			errs = append(errs, iproute.Run([][]string{{"-n", ns, "link", "del", regionLinkEnd(i)}}))
		}
		errs = append(errs, iproute.Run([][]string{{"netns", "del", ns}}))
	}
	return errors.Join(errs...)
}

// start runs region i's server in its namespace with a configuration
// written to dir; it is killed and waited for when the test ends, and its
// log's tail printed if the test failed.
func (r *nsRegions) start(t *testing.T, bin, dir string, i int) {
	t.Helper()
	name, other := r.names[i], r.names[1-i]
	conf := fmt.Sprintf(`server_name: %q
listen: "%s:%d"
http: "%s:%d"
ping_interval: "250ms"
ping_max: 3
jetstream {
  store_dir: %q
  domain: "switchyard"
}
cluster {
  name: %q
  listen: "127.0.0.1:%d"
  # A clustered JetStream needs a route: one to a port that refuses.
  routes: ["nats://127.0.0.1:1"]
}
gateway {
  name: %q
  listen: "%s%d:%d"
  gateways: [{name: %q, urls: ["nats://%s%d:%d"]}]
}
`, name, r.addr[i], regionClientPort, r.addr[i], regionMonitorPort,
		filepath.Join(dir, name+"-js"),
		name, regionClusterPort,
		name, regionLinkNet, i+1, regionGatewayPort,
		other, regionLinkNet, 2-i, regionGatewayPort)
	confPath := filepath.Join(dir, name+".conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, name+".log")
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close() // the server holds its own descriptor
	// ip netns exec execs the server: the process started is the server.
	cmd := exec.Command("ip", "netns", "exec", r.ns[i], bin, "-c", confPath)
	cmd.Stdout, cmd.Stderr = log, log
	// Killed with the test binary, should that die before its cleanups.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start region %s's server: %v", name, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
			t.Logf("region %s's server, last lines of %s:\n%s", name, logPath, strings.Join(lines[max(0, len(lines)-40):], "\n"))
		}
	})
}

// linkStats is what each end of the link between the regions has
// received, and dropped of what it was given to send.
type linkStats struct{ received, dropped [2]uint64 }

func (r *nsRegions) linkStats() (linkStats, error) {
	var st linkStats
	for i := range 2 {
		out, err := exec.Command("ip", "-n", r.ns[i], "-j", "-s", "link", "show", "dev", regionLinkEnd(i)).Output()
		if err != nil {
			return st, fmt.Errorf("ip -s link show %s in %s: %w", regionLinkEnd(i), r.ns[i], err)
		}
		var links []struct {
			Stats struct {
				RX struct {
					Packets uint64 `json:"packets"`
				} `json:"rx"`
				TX struct {
					Dropped uint64 `json:"dropped"`
				} `json:"tx"`
			} `json:"stats64"`
		}
		if err := json.Unmarshal(out, &links); err != nil || len(links) != 1 {
			return st, fmt.Errorf("ip -s link show %s in %s: %v: %s", regionLinkEnd(i), r.ns[i], err, out)
		}
		st.received[i], st.dropped[i] = links[0].Stats.RX.Packets, links[0].Stats.TX.Dropped
	}
	return st, nil
}

// URL is region i's client URL (0: a, 1: b), reachable from the host's
// namespace whether the regions are cut apart or not.
func (r *nsRegions) URL(i int) string {
	return fmt.Sprintf("nats://%s:%d", r.addr[i], regionClientPort)
}

// Cut sets the link between the regions down: its packets are dropped both
// ways (a's end down, b's end without a carrier), the gateway connections
// stay open and carry nothing until their pings give them up.
func (r *nsRegions) Cut() { r.t.Helper(); r.setLink("down") }

// Heal sets the link between the regions up again.
func (r *nsRegions) Heal() { r.t.Helper(); r.setLink("up") }

func (r *nsRegions) setLink(state string) {
	r.t.Helper()
	if err := iproute.Run([][]string{{"-n", r.ns[0], "link", "set", regionLinkEnd(0), state}}); err != nil {
		r.t.Fatal(err)
	}
}

// Linked reports whether each region has its outbound gateway to the other
// up.
func (r *nsRegions) Linked() bool {
	return r.outbound(0) == 1 && r.outbound(1) == 1
}

// Unlinked reports whether neither region has its outbound gateway to the
// other up.
func (r *nsRegions) Unlinked() bool {
	return r.outbound(0) == 0 && r.outbound(1) == 0
}

// outbound is 1 when region i's server has an outbound gateway connection
// to the other region, 0 when it has none, -1 when its monitoring did not
// answer.
func (r *nsRegions) outbound(i int) int {
	var gz struct {
		Outbound map[string]struct {
			Connection *struct {
				IP string `json:"ip"`
			} `json:"connection"`
		} `json:"outbound_gateways"`
	}
	if err := r.monitor(i, "/gatewayz", &gz); err != nil {
		return -1
	}
	if o, ok := gz.Outbound[r.names[1-i]]; ok && o.Connection != nil {
		return 1
	}
	return 0
}

// metaLeader is the JetStream meta leader region i's server knows ("" for
// none).
func (r *nsRegions) metaLeader(i int) (string, error) {
	var jsz struct {
		Meta *struct {
			Leader string `json:"leader"`
		} `json:"meta_cluster"`
	}
	if err := r.monitor(i, "/jsz", &jsz); err != nil {
		return "", err
	}
	if jsz.Meta == nil {
		return "", nil
	}
	return jsz.Meta.Leader, nil
}

// agreedLeader is nil when both servers know the same JetStream meta
// leader.
func (r *nsRegions) agreedLeader() error {
	var leaders [2]string
	for i := range 2 {
		l, err := r.metaLeader(i)
		if err != nil {
			return err
		}
		leaders[i] = l
	}
	if leaders[0] == "" || leaders[0] != leaders[1] {
		return fmt.Errorf("no JetStream meta leader both servers agree on: %q", leaders)
	}
	return nil
}

// monitor decodes the JSON region i's server serves on its monitoring
// path.
func (r *nsRegions) monitor(i int, path string, v any) error {
	if !getJSON(fmt.Sprintf("http://%s:%d%s", r.addr[i], regionMonitorPort, path), v) {
		return fmt.Errorf("%s of region %s not read", path, r.names[i])
	}
	return nil
}

// TestNamespacedRegionsCutAndHeal runs the namespaced supercluster and
// checks what a cut of the link between the regions does: a bucket made
// from region a is read from region b and a request answered in the other
// region is answered; cut, the servers give the link up within 5 s, a
// request to the other region fails both ways while each region answers
// its own; healed, the link is up within 10 s and requests cross again.
// The times are logged, and what JetStream does across the cut.
func TestNamespacedRegionsCutAndHeal(t *testing.T) {
	needNamespacedRegions(t)
	r := netnsRegions(t, "a", "b")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	var ncs [2]*nats.Conn
	for i := range 2 {
		nc, err := nats.Connect(r.URL(i), nats.Name("region-"+r.names[i]), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		ncs[i] = nc
		// Each region answers on a subject of its own with its name.
		name := r.names[i]
		if _, err := nc.Subscribe("syreg.echo."+name, func(m *nats.Msg) { _ = m.Respond([]byte(name)) }); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	// ask sends a request from region from to region to's responder.
	ask := func(from, to int) error {
		m, err := ncs[from].Request("syreg.echo."+r.names[to], nil, 500*time.Millisecond)
		if err != nil {
			return fmt.Errorf("%s -> %s: %w", r.names[from], r.names[to], err)
		}
		if string(m.Data) != r.names[to] {
			return fmt.Errorf("%s -> %s: answered %q", r.names[from], r.names[to], m.Data)
		}
		return nil
	}
	crossBoth := func() error { return errors.Join(ask(0, 1), ask(1, 0)) }
	localBoth := func() error { return errors.Join(ask(0, 0), ask(1, 1)) }

	jsA, err := jetstream.New(ncs[0])
	if err != nil {
		t.Fatal(err)
	}
	kvA, err := jsA.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "syreg"})
	if err != nil {
		t.Fatalf("create the bucket from region a: %v", err)
	}
	if _, err := kvA.PutString(ctx, "k", "v1"); err != nil {
		t.Fatal(err)
	}
	jsB, err := jetstream.New(ncs[1])
	if err != nil {
		t.Fatal(err)
	}
	getB := func(ctx context.Context) (string, error) {
		kv, err := jsB.KeyValue(ctx, "syreg")
		if err != nil {
			return "", err
		}
		e, err := kv.Get(ctx, "k")
		if err != nil {
			return "", err
		}
		return string(e.Value()), nil
	}
	if v, err := getB(ctx); err != nil || v != "v1" {
		t.Fatalf("region b reads the key region a put: %q, %v", v, err)
	}
	testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, crossBoth)
	if err := localBoth(); err != nil {
		t.Fatal(err)
	}

	if l, err := r.metaLeader(0); err == nil {
		t.Logf("the JetStream meta leader before the cut: %s", l)
	}
	cutAt := time.Now()
	r.Cut()
	cutSeen := testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, testkit.Cond("neither region's gateway to the other up", r.Unlinked))
	t.Logf("cut: both servers gave the link up %v after it went down", cutSeen.Round(time.Millisecond))
	for _, p := range [][2]int{{0, 1}, {1, 0}} {
		err := ask(p[0], p[1])
		if !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, nats.ErrTimeout) {
			t.Errorf("across the cut: want no responders or a timeout, got %v", err)
		} else {
			t.Logf("across the cut: %v", err)
		}
	}
	if err := localBoth(); err != nil {
		t.Errorf("each region answering its own while cut apart: %v", err)
	}
	// Nothing crosses the cut either way: neither end of the link
	// receives a packet while it is down, though both servers keep trying.
	cutStats, err := r.linkStats()
	if err != nil {
		t.Fatal(err)
	}
	// JetStream's meta group spans both regions: two servers, a quorum of
	// two, so neither side keeps a meta leader while cut apart.
	var noLeader [2]time.Duration
	_, err = testkit.Poll(30*time.Second, 100*time.Millisecond, func() error {
		var errs []error
		for i := range 2 {
			if noLeader[i] > 0 {
				continue
			}
			if l, err := r.metaLeader(i); err != nil || l != "" {
				errs = append(errs, fmt.Errorf("region %s's meta leader: %q, %v", r.names[i], l, err))
				continue
			}
			noLeader[i] = time.Since(cutAt)
		}
		return errors.Join(errs...)
	})
	for i := range 2 {
		if noLeader[i] > 0 {
			t.Logf("cut: region %s has no JetStream meta leader %v after the cut", r.names[i], noLeader[i].Round(time.Millisecond))
		}
	}
	if err != nil {
		t.Logf("cut: %v %v after the cut", err, time.Since(cutAt).Round(time.Millisecond))
	}
	getCtx, getCancel := context.WithTimeout(ctx, 2*time.Second)
	e, err := kvA.Get(getCtx, "k")
	getCancel()
	if err != nil {
		t.Logf("cut: region a reading its own bucket: %v", err)
	} else {
		t.Logf("cut: region a reads its own bucket: %q", e.Value())
	}
	getCtx, getCancel = context.WithTimeout(ctx, 2*time.Second)
	v, err := getB(getCtx)
	getCancel()
	t.Logf("cut: region b reading region a's bucket: %q, %v", v, err)

	st, err := r.linkStats()
	if err != nil {
		t.Fatal(err)
	}
	if st.received != cutStats.received {
		t.Errorf("packets crossed the cut: received by each end %v once the cut was seen, %v before healing", cutStats.received, st.received)
	}
	t.Logf("cut: packets received by each end of the link %v over %v, dropped sending %v", st.received, time.Since(cutAt).Round(time.Millisecond), [2]uint64{st.dropped[0] - cutStats.dropped[0], st.dropped[1] - cutStats.dropped[1]})

	healAt := time.Now()
	r.Heal()
	healSeen := testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, testkit.Cond("each region's gateway to the other up", r.Linked))
	t.Logf("heal: both servers have the link up %v after it came up", healSeen.Round(time.Millisecond))
	testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, crossBoth)
	t.Logf("heal: requests cross both ways %v after the link came up", time.Since(healAt).Round(time.Millisecond))
	testkit.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		getCtx, getCancel := context.WithTimeout(ctx, time.Second)
		defer getCancel()
		if v, err := getB(getCtx); err != nil || v != "v1" {
			return fmt.Errorf("region b reading region a's bucket: %q, %v", v, err)
		}
		return nil
	})
	t.Logf("heal: region b reads region a's bucket %v after the link came up", time.Since(healAt).Round(time.Millisecond))
	testkit.CheckFor(t, 30*time.Second, 100*time.Millisecond, r.agreedLeader)
	t.Logf("heal: a JetStream meta leader both regions agree on %v after the link came up", time.Since(healAt).Round(time.Millisecond))
}
