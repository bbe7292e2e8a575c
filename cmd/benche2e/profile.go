package main

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

// profilePart is the share of a CPU profile's samples whose stack passes
// through a part of the process.
type profilePart struct {
	Part  string  `json:"part"`
	Focus string  `json:"focus"`
	Share float64 `json:"share_percent"`
}

// parts are pprof -focus expressions on function names.
var parts = []profilePart{
	{Part: "gateway (`gateway`: HTTP in, parse, relay)", Focus: `switchyard/gateway\.`},
	{Part: "broker (`broker`, `broker/policy`)", Focus: `switchyard/broker[./]`},
	{Part: "adapter (`replica-adapter`: engine call, chunks out)", Focus: `switchyard/replica-adapter\.`},
	{Part: "decision sampling (broker publishes every explained decision at the dev table's decision_sample 1.0)", Focus: `switchyard/broker\.\(\*Broker\)\.(sample|publishLoop)`},
	{Part: "dashboard (`ui`, decodes every decision)", Focus: `switchyard/ui\.`},
	{Part: "embedded NATS server", Focus: `nats-server/v2/server\.`},
	{Part: "NATS client (nats.go)", Focus: `nats-io/nats%2ego\.`},
	{Part: "net/http server connections (gateway side)", Focus: `net/http\.\(\*conn\)\.serve`},
	{Part: "net/http client connections (adapter → engine)", Focus: `net/http\.\(\*persistConn\)`},
	{Part: "encoding/json", Focus: `encoding/json\.`},
	{Part: "garbage collector (background and assists)", Focus: `runtime\.gcBgMarkWorker|runtime\.gcAssistAlloc|runtime\.bgsweep`},
	{Part: "scheduler: goroutine park and find work", Focus: `runtime\.schedule$|runtime\.findRunnable`},
	{Part: "socket and epoll syscalls", Focus: `syscall\.Syscall|syscall\.RawSyscall6|runtime\.netpoll`},
	{Part: "futex (thread sleep and wake)", Focus: `runtime\.futex`},
}

var (
	showing = regexp.MustCompile(`Showing nodes accounting for \S+, ([0-9.]+)% of`)
	total   = regexp.MustCompile(`Total samples = (\S+)`)
)

// profileTotal is the CPU time the profile's samples stand for.
func profileTotal(top string) string {
	if m := total.FindStringSubmatch(top); m != nil {
		return m[1]
	}
	return "?"
}

func goTool() string {
	if g := os.Getenv("GO"); g != "" {
		return g
	}
	return "go"
}

// profileParts asks pprof for each part's share.
func profileParts(path string) []profilePart {
	var out []profilePart
	for _, p := range parts {
		b, err := exec.Command(goTool(), "tool", "pprof", "-top", "-nodecount=1000000", "-focus="+p.Focus, path).Output()
		if err != nil {
			return nil
		}
		m := showing.FindSubmatch(b)
		if m == nil {
			p.Share = 0 // nothing matched: pprof prints no such line
		} else if p.Share, err = strconv.ParseFloat(string(m[1]), 64); err != nil {
			return nil
		}
		out = append(out, p)
	}
	return out
}

// profileTop is `go tool pprof -top` of the profile, flat then cumulative.
func profileTop(path string) string {
	var out strings.Builder
	for _, args := range [][]string{{"-top", "-nodecount=25"}, {"-top", "-cum", "-nodecount=40"}} {
		b, err := exec.Command(goTool(), append(append([]string{"tool", "pprof"}, args...), path)...).Output()
		if err != nil {
			return fmt.Sprintf("(go tool pprof failed: %v)\n", err)
		}
		out.Write(b)
		out.WriteString("\n")
	}
	return out.String()
}
