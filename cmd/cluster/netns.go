package main

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"

	"github.com/switchyard-llm/switchyard/internal/iproute"
)

// network puts parts in Linux network namespaces of their own (-netns),
// each with an address of its own on a bridge in the host's namespace, so
// that a part can be cut off by setting its link down: its packets are
// dropped, its connections stay open and carry nothing, as in a network
// partition. The back bridge carries NATS: the servers, the GPU site's leaf
// node, the brokers and the gateways each have a link there, and the
// host's namespace (this launcher, the hub's adapters and engines) has the
// bridge's address. Gateways have a second link, on the front bridge, where
// clients reach them, so a gateway can be cut from NATS and still be asked.
// The GPU site's adapter and engine run inside the site's namespace and
// reach its server on the namespace's loopback, as on the site's own
// network. No namespace routes between the bridges.
type network struct {
	prefix string
	parts  map[string]*nsPart
}

// nsPart is one part's namespace.
type nsPart struct {
	ns    string // the namespace's name
	addr  string // its address on the back bridge
	front string // a gateway's address on the front bridge ("" for the others)
	back  string // the host's end of its back link, set down to cut it off
	fend  string // the host's end of a gateway's front link
}

// The bridges' subnets; the host's namespace has .1 on each.
const (
	backNet  = "10.231.0."
	frontNet = "10.231.1."
)

func (n *network) backBridge() string  { return n.prefix + "-back" }
func (n *network) frontBridge() string { return n.prefix + "-front" }

// addr is the back address of part, or 127.0.0.1 without namespaces.
func (n *network) addr(part string) string {
	if n == nil {
		return "127.0.0.1"
	}
	return n.parts[part].addr
}

// command is how exe args runs as part: inside its namespace (ip netns exec
// execs the program, so the process is the one started).
func (n *network) command(part, exe string, args []string) (string, []string) {
	if n == nil {
		return exe, args
	}
	return "ip", append([]string{"netns", "exec", n.parts[part].ns, exe}, args...)
}

// setupNetwork removes what a killed run under prefix left, then makes the
// bridges and a namespace for each of parts (gateways are the parts named
// gateway-N).
func setupNetwork(prefix string, parts []string) (*network, error) {
	if err := cleanNetwork(prefix); err != nil {
		return nil, err
	}
	n := &network{prefix: prefix, parts: map[string]*nsPart{}}
	for i, br := range []string{n.backBridge(), n.frontBridge()} {
		addr := fmt.Sprintf("%s1/24", []string{backNet, frontNet}[i])
		if err := iproute.Run([][]string{
			{"link", "add", br, "type", "bridge"},
			{"addr", "add", addr, "dev", br},
			{"link", "set", br, "up"},
		}); err != nil {
			return nil, err
		}
	}
	for i, name := range parts {
		p := &nsPart{ns: prefix + "-" + name, addr: fmt.Sprintf("%s%d", backNet, 11+i),
			back: fmt.Sprintf("%s%db", prefix, i)}
		if strings.HasPrefix(name, "gateway-") {
			p.front, p.fend = fmt.Sprintf("%s%d", frontNet, 11+i), fmt.Sprintf("%s%df", prefix, i)
		}
		n.parts[name] = p
		cmds := [][]string{
			{"netns", "add", p.ns},
			{"-n", p.ns, "link", "set", "lo", "up"},
		}
		link := func(hostEnd, inside, br, addr string) {
			cmds = append(cmds,
				[]string{"link", "add", hostEnd, "type", "veth", "peer", "name", inside, "netns", p.ns},
				[]string{"link", "set", hostEnd, "master", br, "up"},
				[]string{"-n", p.ns, "addr", "add", addr + "/24", "dev", inside},
				[]string{"-n", p.ns, "link", "set", inside, "up"})
		}
		link(p.back, "back", n.backBridge(), p.addr)
		if p.front != "" {
			link(p.fend, "front", n.frontBridge(), p.front)
		}
		if err := iproute.Run(cmds); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// cut sets part's back link down: its packets to and from every NATS server
// (for a NATS server or the GPU site, every peer and client) are dropped.
// heal sets it up again.
func (n *network) cut(part string) error  { return n.setLink(part, "down") }
func (n *network) heal(part string) error { return n.setLink(part, "up") }

func (n *network) setLink(part, state string) error {
	if n == nil {
		return errors.New("no namespaces: run with -netns")
	}
	p, ok := n.parts[part]
	if !ok {
		return fmt.Errorf("no part %q in a namespace", part)
	}
	return iproute.Run([][]string{{"link", "set", p.back, state}})
}

// cleanNetwork deletes the namespaces and links named with prefix (the
// veth pairs go with their namespaces).
func cleanNetwork(prefix string) error {
	var errs []error
	if out, err := exec.Command("ip", "netns", "list").Output(); err == nil {
		for _, l := range strings.Split(string(out), "\n") {
			if f := strings.Fields(l); len(f) > 0 && strings.HasPrefix(f[0], prefix+"-") {
				errs = append(errs, iproute.Run([][]string{{"netns", "del", f[0]}}))
			}
		}
	} else {
		errs = append(errs, fmt.Errorf("ip netns list: %w", err))
	}
	if out, err := exec.Command("ip", "-o", "link", "show").Output(); err == nil {
		for _, l := range strings.Split(string(out), "\n") {
			f := strings.Fields(l)
			if len(f) < 2 {
				continue
			}
			name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
			if ownLink(prefix, name) {
				// A veth may have gone with its namespace meanwhile.
				if err := iproute.Run([][]string{{"link", "del", name}}); err != nil && !strings.Contains(err.Error(), "Cannot find device") {
					errs = append(errs, err)
				}
			}
		}
	} else {
		errs = append(errs, fmt.Errorf("ip link show: %w", err))
	}
	return errors.Join(errs...)
}

// validPrefix: the names made from a prefix stay within Linux's 15
// characters for a link, and the cleanup never reaches a link of the host's.
func validPrefix(prefix string) bool {
	if len(prefix) < 2 || len(prefix) > 8 || prefix[0] < 'a' || prefix[0] > 'z' {
		return false
	}
	for _, c := range prefix {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// ownLink says whether a link is one setupNetwork makes under prefix: its
// two bridges and the host ends <prefix><N>b and <prefix><N>f. Nothing
// else is deleted, whatever its name begins with.
func ownLink(prefix, name string) bool {
	if name == prefix+"-back" || name == prefix+"-front" {
		return true
	}
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok || len(rest) < 2 || (rest[len(rest)-1] != 'b' && rest[len(rest)-1] != 'f') {
		return false
	}
	for _, c := range rest[:len(rest)-1] {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
