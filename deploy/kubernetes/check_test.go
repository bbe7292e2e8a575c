package kubernetes_test

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// checker holds what the manifests are checked against: the switchyard
// binary (its -h for every subcommand) and a gateway it runs, which answers
// for the paths the gateway serves.
type checker struct {
	bin     string
	gateway string // base URL of a running gateway
	tmp     string // scratch directory
	help    map[string]*command
}

// command is what `switchyard CMD -h` prints: its usage line and every flag,
// with whether the flag takes a value.
type command struct {
	usage string
	flags map[string]bool
}

var flagLine = regexp.MustCompile(`^\s+-([A-Za-z0-9][A-Za-z0-9_-]*)(?: (\S+))?$`)

func (c *checker) command(name string) (*command, error) {
	if cmd, ok := c.help[name]; ok {
		return cmd, nil
	}
	out, err := exec.Command(c.bin, name, "-h").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("switchyard %s -h: %v\n%s", name, err, out)
	}
	lines := strings.Split(string(out), "\n")
	usage, _, _ := strings.Cut(string(out), "\n\n")
	cmd := &command{usage: usage, flags: map[string]bool{"h": false, "help": false}}
	if !strings.HasPrefix(cmd.usage, "usage: switchyard "+name) {
		return nil, fmt.Errorf("switchyard %s -h: not a switchyard subcommand:\n%s", name, out)
	}
	for _, l := range lines {
		if m := flagLine.FindStringSubmatch(l); m != nil {
			cmd.flags[m[1]] = m[2] != ""
		}
	}
	c.help[name] = cmd
	return cmd, nil
}

// invocation is a switchyard container's command line, parsed as the binary
// parses it, with $(VAR) expanded from the container's env.
type invocation struct {
	sub   string
	flags map[string]string
	pos   []string
	// fromField maps a flag to the pod field its $(VAR) comes from.
	fromField map[string]string
}

func isSwitchyard(c *corev1.Container) bool {
	name, _, _ := strings.Cut(path.Base(c.Image), ":")
	name, _, _ = strings.Cut(name, "@")
	return name == "switchyard"
}

var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

func (c *checker) parse(where string, ctr *corev1.Container) (*invocation, []error) {
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(where+": "+format, a...)) }
	if len(ctr.Command) > 0 {
		fail("sets command %q: the image's entrypoint is the switchyard binary; give the subcommand in args", ctr.Command)
	}
	if len(ctr.Args) == 0 {
		fail("no subcommand in args")
		return nil, errs
	}
	inv := &invocation{sub: ctr.Args[0], flags: map[string]string{}, fromField: map[string]string{}}
	cmd, err := c.command(inv.sub)
	if err != nil {
		fail("%v", err)
		return nil, errs
	}
	env := map[string]*corev1.EnvVar{}
	for i := range ctr.Env {
		env[ctr.Env[i].Name] = &ctr.Env[i]
	}
	expanded := make([]string, 0, len(ctr.Args))
	fields := make([]string, len(ctr.Args))
	for i, a := range ctr.Args {
		expanded = append(expanded, varRef.ReplaceAllStringFunc(a, func(ref string) string {
			name := varRef.FindStringSubmatch(ref)[1]
			e, ok := env[name]
			switch {
			case !ok:
				fail("arg %q: $(%s) is not in the container's env (Kubernetes would pass it literally)", a, name)
				return ref
			case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil:
				fields[i] = e.ValueFrom.FieldRef.FieldPath
				return "pod-field-" + strings.ReplaceAll(e.ValueFrom.FieldRef.FieldPath, ".", "-")
			case e.ValueFrom != nil:
				return "from-" + name
			default:
				return e.Value
			}
		}))
	}
	args := expanded[1:]
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			inv.pos = append(inv.pos, args[i+1:]...)
			break
		}
		if len(a) < 2 || a[0] != '-' {
			inv.pos = append(inv.pos, a)
			continue
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		takesValue, ok := cmd.flags[name]
		if !ok {
			fail("switchyard %s has no flag %q (its -h lists every flag)", inv.sub, a)
			continue
		}
		if takesValue && !hasValue {
			if i+1 == len(args) {
				fail("flag %q has no value", a)
				break
			}
			i++
			value = args[i]
		}
		inv.flags[name] = value
		if f := fields[i+1]; f != "" {
			inv.fromField[name] = f
		}
	}
	// Positional args: a verb the usage names, or none where it names none.
	if len(inv.pos) > 0 {
		verbs := regexp.MustCompile(`(?:switchyard `+regexp.QuoteMeta(inv.sub)+` |\| )([a-z][a-z-]*)`).FindAllStringSubmatch(cmd.usage, -1)
		if !slices.ContainsFunc(verbs, func(m []string) bool { return m[1] == inv.pos[0] }) {
			fail("switchyard %s takes no %q (usage: %s)", inv.sub, inv.pos[0], cmd.usage)
		}
	}
	// The binary's own parser has the last word on values (durations,
	// sizes, numbers): with -h appended it parses everything and stops.
	if out, err := exec.Command(c.bin, append(slices.Clone(expanded), "-h")...).CombinedOutput(); err != nil {
		fail("switchyard refuses the args %q: %v\n%s", ctr.Args, err, firstLine(string(out)))
	}
	return inv, errs
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

// podRefs checks that every Secret and ConfigMap a pod names, and every key
// it takes from one, is in the rendering, and that mounts name volumes.
func podRefs(where string, spec *corev1.PodSpec, r *rendering) []error {
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(where+": "+format, a...)) }
	secret := func(name, key, what string) {
		i := slices.IndexFunc(r.secrets, func(s *corev1.Secret) bool { return s.Name == name })
		if i < 0 {
			fail("%s: Secret %q is not in the rendering", what, name)
			return
		}
		_, inData := r.secrets[i].Data[key]
		_, inString := r.secrets[i].StringData[key]
		if key != "" && !inData && !inString {
			fail("%s: Secret %q has no key %q", what, name, key)
		}
	}
	configMap := func(name, key, what string) {
		i := slices.IndexFunc(r.configMaps, func(c *corev1.ConfigMap) bool { return c.Name == name })
		if i < 0 {
			fail("%s: ConfigMap %q is not in the rendering", what, name)
			return
		}
		_, inData := r.configMaps[i].Data[key]
		_, inBinary := r.configMaps[i].BinaryData[key]
		if key != "" && !inData && !inBinary {
			fail("%s: ConfigMap %q has no key %q", what, name, key)
		}
	}
	volumes := map[string]*corev1.Volume{}
	for i := range spec.Volumes {
		v := &spec.Volumes[i]
		volumes[v.Name] = v
		what := "volume " + v.Name
		switch {
		case v.Secret != nil:
			secret(v.Secret.SecretName, "", what)
			for _, it := range v.Secret.Items {
				secret(v.Secret.SecretName, it.Key, what)
			}
		case v.ConfigMap != nil:
			configMap(v.ConfigMap.Name, "", what)
			for _, it := range v.ConfigMap.Items {
				configMap(v.ConfigMap.Name, it.Key, what)
			}
		}
	}
	for _, ctr := range allContainers(spec) {
		cw := "container " + ctr.Name
		for _, ef := range ctr.EnvFrom {
			if ef.SecretRef != nil {
				secret(ef.SecretRef.Name, "", cw+" envFrom")
			}
			if ef.ConfigMapRef != nil {
				configMap(ef.ConfigMapRef.Name, "", cw+" envFrom")
			}
		}
		for _, e := range ctr.Env {
			if e.ValueFrom == nil {
				continue
			}
			if s := e.ValueFrom.SecretKeyRef; s != nil {
				secret(s.Name, s.Key, cw+" env "+e.Name)
			}
			if c := e.ValueFrom.ConfigMapKeyRef; c != nil {
				configMap(c.Name, c.Key, cw+" env "+e.Name)
			}
		}
		for _, m := range ctr.VolumeMounts {
			v, ok := volumes[m.Name]
			if !ok {
				fail("%s mounts volume %q, which the pod does not have", cw, m.Name)
				continue
			}
			if m.SubPath != "" && v.Secret != nil {
				secret(v.Secret.SecretName, m.SubPath, cw+" subPath")
			}
			if m.SubPath != "" && v.ConfigMap != nil {
				configMap(v.ConfigMap.Name, m.SubPath, cw+" subPath")
			}
		}
	}
	return errs
}

func allContainers(spec *corev1.PodSpec) []*corev1.Container {
	var out []*corev1.Container
	for i := range spec.InitContainers {
		out = append(out, &spec.InitContainers[i])
	}
	for i := range spec.Containers {
		out = append(out, &spec.Containers[i])
	}
	return out
}

// mountOf is the volume mount a file path of the container lies under (the
// deepest), or nil.
func mountOf(ctr *corev1.Container, file string) *corev1.VolumeMount {
	var best *corev1.VolumeMount
	for i := range ctr.VolumeMounts {
		m := &ctr.VolumeMounts[i]
		if (file == m.MountPath || strings.HasPrefix(file, strings.TrimSuffix(m.MountPath, "/")+"/")) &&
			(best == nil || len(m.MountPath) > len(best.MountPath)) {
			best = m
		}
	}
	return best
}

// fileFlags are the flags whose value is a file or directory the container
// must have mounted.
var fileFlags = []string{"creds", "engine-api-key-file", "state-dir", "out", "tlsca", "tlscert", "tlskey", "tls-cert", "tls-key"}

// portOf is the port number of a listen address (":8080", "0.0.0.0:9101").
func portOf(addr string) (int, error) {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(p)
}

// containerPort resolves a probe's or Service's port (a number or a port
// name) among the pod's containers.
func containerPort(spec *corev1.PodSpec, p intstr.IntOrString) (int, bool) {
	for _, ctr := range allContainers(spec) {
		for _, cp := range ctr.Ports {
			if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
				return int(cp.ContainerPort), true
			}
		}
	}
	return 0, false
}

// serves reports whether the running gateway has a handler for p.
func (c *checker) serves(p string) (bool, error) {
	resp, err := http.Get(c.gateway + p)
	if err != nil {
		return false, err
	}
	resp.Body.Close()
	return resp.StatusCode != http.StatusNotFound, nil
}

// check is every check of a rendering against the binary.
func (c *checker) check(r *rendering) []error {
	var errs []error
	type pod struct {
		where  string
		meta   map[string]string // annotations
		labels map[string]string
		spec   *corev1.PodSpec
	}
	var pods []pod
	for _, d := range r.deployments {
		pods = append(pods, pod{"Deployment " + d.Name, d.Spec.Template.Annotations, d.Spec.Template.Labels, &d.Spec.Template.Spec})
		sel, err := metav1Selector(d.Spec.Selector)
		if err != nil || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			errs = append(errs, fmt.Errorf("Deployment %s: the selector does not select its own pods", d.Name))
		}
	}
	for _, j := range r.jobs {
		pods = append(pods, pod{"Job " + j.Name, j.Spec.Template.Annotations, j.Spec.Template.Labels, &j.Spec.Template.Spec})
	}
	subs := map[string][]string{} // subcommand -> where it runs
	for _, p := range pods {
		errs = append(errs, podRefs(p.where, p.spec, r)...)
		invs := map[*corev1.Container]*invocation{}
		for _, ctr := range allContainers(p.spec) {
			if !isSwitchyard(ctr) {
				continue
			}
			where := p.where + " container " + ctr.Name
			inv, perrs := c.parse(where, ctr)
			errs = append(errs, perrs...)
			if inv == nil {
				continue
			}
			invs[ctr] = inv
			subs[inv.sub] = append(subs[inv.sub], p.where)
			for _, f := range fileFlags {
				if v, ok := inv.flags[f]; ok && mountOf(ctr, v) == nil {
					errs = append(errs, fmt.Errorf("%s: --%s %s is on no volume the container mounts", where, f, v))
				}
			}
		}
		errs = append(errs, c.checkPod(p.where, p.meta, p.spec, invs)...)
	}
	for _, s := range []string{"gateway", "broker", "adapter", "loader"} {
		if len(subs[s]) == 0 {
			errs = append(errs, fmt.Errorf("no pod runs switchyard %s", s))
		}
	}
	errs = append(errs, c.checkTableJob(r)...)
	errs = append(errs, checkSelectors(r)...)
	errs = append(errs, checkLoaderRBAC(r)...)
	return errs
}

// checkPod checks a pod's switchyard containers against the ports and paths
// they serve, and an adapter against the engine beside it.
func (c *checker) checkPod(where string, ann map[string]string, spec *corev1.PodSpec, invs map[*corev1.Container]*invocation) []error {
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(where+": "+format, a...)) }
	var scrapePorts []int // the ports switchyard serves /metrics on in this pod
	for ctr, inv := range invs {
		switch inv.sub {
		case "gateway":
			listen := cmp(inv.flags["listen"], ":8080")
			port, err := portOf(listen)
			if err != nil {
				fail("gateway --listen %q: %v", listen, err)
				continue
			}
			// /metrics is on the admin listener only; its default,
			// 127.0.0.1:9102, is out of Prometheus's reach.
			if a := inv.flags["admin-listen"]; a != "" {
				if h, p, err := net.SplitHostPort(a); err == nil && !isLoopback(h) {
					n, _ := strconv.Atoi(p)
					scrapePorts = append(scrapePorts, n)
				}
			}
			probes := []struct {
				name  string
				probe *corev1.Probe
				want  string
			}{{"readinessProbe", ctr.ReadinessProbe, "/readyz"}, {"livenessProbe", ctr.LivenessProbe, "/healthz"}}
			for _, pr := range probes {
				if pr.probe == nil || pr.probe.HTTPGet == nil {
					fail("gateway has no HTTP %s", pr.name)
					continue
				}
				g := pr.probe.HTTPGet
				if g.Path != pr.want {
					fail("gateway %s on %q, want %s", pr.name, g.Path, pr.want)
				}
				if ok, err := c.serves(g.Path); err != nil || !ok {
					fail("gateway %s: the gateway does not serve %q (%v)", pr.name, g.Path, err)
				}
				if p, ok := containerPort(spec, g.Port); !ok || p != port {
					fail("gateway %s on port %s, but the gateway listens on %d (--listen %s)", pr.name, g.Port.String(), port, listen)
				}
			}
		case "broker", "loader", "adapter":
			if m, ok := inv.flags["metrics-listen"]; ok && m != "" {
				if p, err := portOf(m); err == nil {
					scrapePorts = append(scrapePorts, p)
				}
			}
		}
		if inv.sub == "adapter" {
			errs = append(errs, checkAdapter(where, spec, ctr, inv, invs)...)
		}
	}
	if ann["prometheus.io/scrape"] == "true" && len(invs) > 0 {
		p, err := strconv.Atoi(ann["prometheus.io/port"])
		if err != nil || !slices.Contains(scrapePorts, p) {
			fail("prometheus.io/port %q is not a port switchyard serves /metrics on here (%v)", ann["prometheus.io/port"], scrapePorts)
		}
		if ann["prometheus.io/path"] != "/metrics" {
			fail("prometheus.io/path %q, want /metrics", ann["prometheus.io/path"])
		}
		if gw := gatewayListenPort(invs); gw != 0 && p == gw {
			fail("prometheus.io/port %d is the gateway's API port: it serves /metrics on --admin-listen only", p)
		}
	}
	return errs
}

func isLoopback(host string) bool {
	ip := net.ParseIP(host)
	return host == "localhost" || ip != nil && ip.IsLoopback()
}

// gatewayListenPort is the port of the pod's gateway --listen, 0 without one.
func gatewayListenPort(invs map[*corev1.Container]*invocation) int {
	for _, inv := range invs {
		if inv.sub == "gateway" {
			p, _ := portOf(cmp(inv.flags["listen"], ":8080"))
			return p
		}
	}
	return 0
}

func cmp(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// checkAdapter checks an adapter sidecar: its replica id is the pod's name,
// its creds are minted for that id by an init container into a volume it
// mounts, it reaches the engine on the pod's loopback, and the pod gives it
// time to drain before the engine stops.
func checkAdapter(where string, spec *corev1.PodSpec, ctr *corev1.Container, inv *invocation, invs map[*corev1.Container]*invocation) []error {
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(where+" adapter: "+format, a...)) }
	if inv.fromField["replica"] != "metadata.name" {
		fail("--replica %q does not come from the pod name (env valueFrom fieldRef metadata.name)", inv.flags["replica"])
	}
	u, err := url.Parse(inv.flags["engine"])
	if err != nil || u.Hostname() != "127.0.0.1" {
		fail("--engine %q: the engine is reached on the pod's loopback, http://127.0.0.1:PORT", inv.flags["engine"])
	} else if p, _ := strconv.Atoi(u.Port()); !hasPort(spec, ctr, p) {
		fail("--engine %q: no other container of the pod has port %d", inv.flags["engine"], p)
	}
	// Creds: minted by `switchyard auth creds --role adapter --replica
	// $(POD_NAME) --out F` in an init container, on a volume both mount.
	credsMount := mountOf(ctr, inv.flags["creds"])
	minted := false
	for i := range spec.InitContainers {
		ic := &spec.InitContainers[i]
		mi := invs[ic]
		if mi == nil || mi.sub != "auth" || len(mi.pos) == 0 || mi.pos[0] != "creds" {
			continue
		}
		out := mountOf(ic, mi.flags["out"])
		if mi.flags["role"] == "adapter" && mi.fromField["replica"] == "metadata.name" && out != nil && credsMount != nil &&
			out.Name == credsMount.Name && path.Base(mi.flags["out"]) == path.Base(inv.flags["creds"]) {
			minted = true
		}
	}
	if !minted {
		fail("--creds %q is not minted for this pod's replica id by an init container (auth creds --role adapter --replica $(POD_NAME) --out)", inv.flags["creds"])
	}
	drain, err := time.ParseDuration(cmp(inv.flags["drain-grace"], "30s"))
	if err != nil {
		fail("--drain-grace: %v", err)
	}
	if spec.TerminationGracePeriodSeconds == nil || time.Duration(*spec.TerminationGracePeriodSeconds)*time.Second <= drain {
		fail("terminationGracePeriodSeconds must exceed --drain-grace %s", drain)
	}
	for i := range spec.Containers {
		eng := &spec.Containers[i]
		if eng == ctr || isSwitchyard(eng) {
			continue
		}
		if eng.Lifecycle == nil || eng.Lifecycle.PreStop == nil {
			fail("engine container %s has no preStop: it would stop while the adapter drains", eng.Name)
		} else if ml, err := portOf(inv.flags["metrics-listen"]); err != nil {
			fail("no --metrics-listen: the engine's preStop has no port to wait on for the adapter's exit")
		} else if h := eng.Lifecycle.PreStop.Exec; h == nil || !strings.Contains(strings.Join(h.Command, " "), strconv.Itoa(ml)) {
			fail("engine container %s: the preStop does not wait on the adapter's port %d", eng.Name, ml)
		}
		if strings.Contains(eng.Image, "vllm") && !slices.ContainsFunc(eng.Env, func(e corev1.EnvVar) bool {
			return e.Name == "VLLM_ENABLE_RESPONSES_API_STORE" && e.Value == "1"
		}) {
			fail("vLLM container %s lacks VLLM_ENABLE_RESPONSES_API_STORE=1 (stateful Responses)", eng.Name)
		}
	}
	if f := inv.flags["engine-api-key-file"]; f != "" {
		m := mountOf(ctr, f)
		if m == nil || !slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name && v.Secret != nil }) {
			fail("--engine-api-key-file %s is not on a Secret volume", f)
		}
	}
	return errs
}

func hasPort(spec *corev1.PodSpec, except *corev1.Container, port int) bool {
	for _, c := range allContainers(spec) {
		if c != except && slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return int(p.ContainerPort) == port }) {
			return true
		}
	}
	return false
}

// checkTableJob checks that a Job creates the bucket with three replicas and
// imports a table the binary validates, from a ConfigMap in the rendering.
func (c *checker) checkTableJob(r *rendering) []error {
	var errs []error
	initOK, importOK := false, false
	for _, j := range r.jobs {
		spec := &j.Spec.Template.Spec
		for _, ctr := range allContainers(spec) {
			if !isSwitchyard(ctr) || len(ctr.Args) < 2 || ctr.Args[0] != "table" {
				continue
			}
			inv, _ := c.parse("", ctr) // reported by check
			if inv == nil || len(inv.pos) == 0 {
				continue
			}
			switch inv.pos[0] {
			case "init":
				initOK = initOK || inv.flags["replicas"] == "3"
			case "import":
				if len(inv.pos) != 2 {
					continue
				}
				m := mountOf(ctr, inv.pos[1])
				var cm *corev1.ConfigMap
				for _, v := range spec.Volumes {
					if m != nil && v.Name == m.Name && v.ConfigMap != nil {
						if i := slices.IndexFunc(r.configMaps, func(x *corev1.ConfigMap) bool { return x.Name == v.ConfigMap.Name }); i >= 0 {
							cm = r.configMaps[i]
						}
					}
				}
				if cm == nil {
					errs = append(errs, fmt.Errorf("Job %s: table import %s reads no ConfigMap of the rendering", j.Name, inv.pos[1]))
					continue
				}
				key := path.Base(inv.pos[1])
				f := filepath.Join(c.tmp, "table-"+key)
				if err := os.WriteFile(f, []byte(cm.Data[key]), 0o600); err != nil {
					errs = append(errs, err)
					continue
				}
				if out, err := exec.Command(c.bin, "table", "validate", f).CombinedOutput(); err != nil {
					errs = append(errs, fmt.Errorf("ConfigMap %s key %s: switchyard table validate: %v\n%s", cm.Name, key, err, out))
					continue
				}
				importOK = true
			}
		}
	}
	if !initOK {
		errs = append(errs, errors.New("no Job runs switchyard table init --replicas 3"))
	}
	if !importOK {
		errs = append(errs, errors.New("no Job imports a valid routing table from a ConfigMap"))
	}
	return errs
}
