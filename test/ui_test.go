package test

import (
	"bytes"
	"context"
	"fmt"
	"image/png"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/switchyard-llm/switchyard/devstack"
)

// chromium finds Debian's chromium. Without it the dashboard test is skipped
// on a developer's machine, but fails under CI, where `make test-deps`
// installs it.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "" {
		t.Skip("chromium is not installed: `make test-deps` installs it (as root); skipping the dashboard test")
	}
	t.Fatal("chromium is not installed, and CI is set: `make test-deps` must install it")
	return ""
}

// browser starts a headless chromium with a fresh profile and returns a tab.
func browser(t *testing.T, exe string) context.Context {
	t.Helper()
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(exe),
		chromedp.Headless,
		chromedp.NoSandbox, // chromium refuses to run as root with its sandbox
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		// Without these chromium dials out at start, and this machine has no
		// network but the loopback.
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 800),
	)
	tab, cancelTab := chromedp.NewContext(alloc, chromedp.WithErrorf(t.Logf))
	t.Cleanup(func() { cancelTab(); cancelAlloc() })
	return tab
}

// routedChat sends one chat request and returns the route headers.
func routedChat(t *testing.T, st *devstack.Stack, key, model, prompt string, maxTokens int) http.Header {
	t.Helper()
	h, err := postChat(st, key, model, prompt, maxTokens)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func postChat(st *devstack.Stack, key, model, prompt string, maxTokens int) (http.Header, error) {
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":%d}`, model, prompt, maxTokens)
	req, _ := http.NewRequest(http.MethodPost, st.GatewayURL()+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 500 {
		return nil, fmt.Errorf("%s as %q: %d %s", model, key, resp.StatusCode, b)
	}
	return resp.Header, nil
}

// decisionShown waits until a decision card names replica and reason.
func decisionShown(replica, reason string) chromedp.Action[bool] {
	return chromedp.PollFunction[bool](`(rep, reason) => [...document.querySelectorAll('#decisions .decision')].some(c =>
		c.querySelector('.d-replica')?.textContent === rep && c.querySelector('.d-reason')?.textContent === reason)`,
		chromedp.WithPollingArgs(replica, reason),
		chromedp.WithPollingInterval(50*time.Millisecond),
		chromedp.WithPollingTimeout(15*time.Second))
}

func TestDashboardInHeadlessChromium(t *testing.T) {
	exe := chromium(t)
	st := startStack(t, devstack.Config{})

	// One decision before the page opens: it arrives in the full state.
	before := routedChat(t, st, "", "chat-large", "Hello", 8)
	beforeReplica, beforeReason := before.Get("X-Switchyard-Replica"), before.Get("X-Switchyard-Reason")
	if beforeReplica == "" || beforeReason == "" {
		t.Fatalf("no route headers: %v", before)
	}

	tab := browser(t, exe)
	if err := chromedp.Do(tab,
		chromedp.EmulateViewport(1280, 800),
		chromedp.Navigate(st.GatewayURL()+"/ui"),
		chromedp.WaitVisible(`#replicas table`),
	); err != nil {
		t.Fatal(err)
	}

	t.Run("replicas", func(t *testing.T) {
		_, err := chromedp.Run(tab, chromedp.PollFunction[bool](`(ids) => {
			const text = document.querySelector('#replicas').innerText;
			return ids.every(id => text.includes(id));
		}`, chromedp.WithPollingArgs(devReplicaIDs()), chromedp.WithPollingTimeout(15*time.Second)))
		if err != nil {
			text, _ := chromedp.Run(tab, chromedp.Text(`#replicas`))
			t.Fatalf("not every dev replica is shown (%v):\n%s", err, text)
		}
		ready, err := chromedp.Run(tab, chromedp.Evaluate[int](`document.querySelectorAll('#replicas .badge.st-ready').length`))
		if err != nil || ready != len(devReplicaIDs()) {
			t.Errorf("%d replicas shown ready (%v), want %d", ready, err, len(devReplicaIDs()))
		}
	})

	t.Run("decision from before the page opened", func(t *testing.T) {
		if _, err := chromedp.Run(tab, decisionShown(beforeReplica, beforeReason)); err != nil {
			text, _ := chromedp.Run(tab, chromedp.Text(`#decisions`))
			t.Fatalf("decision %s/%s not shown (%v):\n%s", beforeReplica, beforeReason, err, text)
		}
	})

	t.Run("decision pushed live", func(t *testing.T) {
		// acme is premium: its requests go to the premium pool's one replica.
		h := routedChat(t, st, "sk-acme-dev", "chat-large", "Hello again", 4)
		rep, reason := h.Get("X-Switchyard-Replica"), h.Get("X-Switchyard-Reason")
		if rep != "l70-prem-0" {
			t.Fatalf("acme routed to %q, want l70-prem-0", rep)
		}
		if _, err := chromedp.Run(tab, decisionShown(rep, reason)); err != nil {
			text, _ := chromedp.Run(tab, chromedp.Text(`#decisions`))
			t.Fatalf("decision %s/%s not pushed (%v):\n%s", rep, reason, err, text)
		}
		tenant, err := chromedp.Run(tab, chromedp.Text(`#decisions .decision .d-tenant`))
		if err != nil || tenant != "acme" {
			t.Errorf("newest decision's tenant %q (%v), want acme on top", tenant, err)
		}
	})

	t.Run("routing table and connection", func(t *testing.T) {
		rev, err := chromedp.Run(tab, chromedp.Text(`#table-rev`))
		if err != nil || !strings.HasPrefix(rev, "revision ") {
			t.Errorf("table revision %q (%v)", rev, err)
		}
		keys, err := chromedp.Run(tab, chromedp.Text(`#table`))
		if err != nil || !strings.Contains(keys, "chat-large") || !strings.Contains(keys, "l70-gen-0") {
			t.Errorf("routing table keys not shown (%v):\n%s", err, keys)
		}
		conn, err := chromedp.Run(tab, chromedp.Text(`#conn`))
		if err != nil || conn != "live" {
			t.Errorf("connection shown as %q (%v), want live", conn, err)
		}
	})

	t.Run("cold load", func(t *testing.T) {
		// mixtral is cold: the request gets 503 and starts its load, which
		// the page shows until the replica is ready.
		if _, err := postChat(st, "", "mixtral", "Hello", 4); err == nil || !strings.Contains(err.Error(), "model_loading") {
			t.Fatalf("cold model answered %v, want 503 model_loading", err)
		}
		if _, err := chromedp.Run(tab, chromedp.PollFunction[bool](`() => {
			const l = document.querySelector('#loads .load.ready');
			return !!l && l.innerText.includes('mixtral-8x22b') && l.innerText.includes('ready in');
		}`, chromedp.WithPollingTimeout(30*time.Second))); err != nil {
			text, _ := chromedp.Run(tab, chromedp.Text(`#loads`))
			t.Fatalf("the load is not shown ready (%v):\n%s", err, text)
		}
	})

	t.Run("screenshot", func(t *testing.T) {
		out := os.Getenv("SWITCHYARD_UI_SCREENSHOT")
		if out != "" {
			// A picture worth looking at: varied decisions and some KV in use.
			busy := sampleTraffic(t, st)
			defer busy()
			if _, err := chromedp.Run(tab, chromedp.Poll[bool](
				`[...document.querySelectorAll('#replicas .pct')].some(e => parseFloat(e.textContent) >= 5)`,
				chromedp.WithPollingTimeout(15*time.Second))); err != nil {
				t.Logf("no replica reached 5%% KV usage: %v", err)
			}
		}
		shot, err := chromedp.Run(tab, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(bytes.NewReader(shot))
		if err != nil {
			t.Fatalf("screenshot is not a PNG: %v", err)
		}
		if b := img.Bounds(); b.Dx() != 1280 || b.Dy() < 400 {
			t.Errorf("screenshot is %dx%d, want 1280 wide", b.Dx(), b.Dy())
		}
		if out != "" {
			if err := os.WriteFile(out, shot, 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("dashboard screenshot written to %s", out)
		}
	})
}

// headerOverlaps lists, for the replica table as drawn, every column
// header whose text does not fit its column and every two headers whose
// cells or texts overlap: what a reader sees as one word drawn over another.
const headerOverlaps = `(() => {
	const hs = [...document.querySelectorAll('#replicas thead th')].map(th => {
		const r = document.createRange();
		r.selectNodeContents(th);
		return {name: th.textContent, cell: th.getBoundingClientRect(), text: r.getBoundingClientRect()};
	});
	const cross = (a, b) => Math.min(a.right, b.right) - Math.max(a.left, b.left) > 0.5 &&
		Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top) > 0.5;
	const out = [];
	if (hs.length === 0) out.push('no column headers');
	for (const h of hs) {
		if (h.text.left < h.cell.left - 0.5 || h.text.right > h.cell.right + 0.5)
			out.push('"' + h.name + '" is ' + h.text.width.toFixed(1) + 'px wide in a ' + h.cell.width.toFixed(1) + 'px column');
	}
	for (let i = 0; i < hs.length; i++) for (let j = i + 1; j < hs.length; j++) {
		if (cross(hs[i].cell, hs[j].cell)) out.push('the cells of "' + hs[i].name + '" and "' + hs[j].name + '" overlap');
		if (cross(hs[i].text, hs[j].text)) out.push('"' + hs[i].name + '" is drawn over "' + hs[j].name + '"');
	}
	return out;
})()`

// The replica table's column headers never overlap, whatever the window's
// width: each header's text fits its column at the common desktop widths.
func TestDashboardColumnHeadersDoNotOverlap(t *testing.T) {
	exe := chromium(t)
	st := startStack(t, devstack.Config{Replicas: devstack.ReplicasNamed("l70-gen-0", "l8-gen-0")})
	tab := browser(t, exe)
	if err := chromedp.Do(tab,
		chromedp.Navigate(st.GatewayURL()+"/ui"),
		chromedp.WaitVisible(`#replicas table`),
	); err != nil {
		t.Fatal(err)
	}
	for _, width := range []int64{1024, 1280, 1400, 1920} {
		t.Run(fmt.Sprintf("%dx1000", width), func(t *testing.T) {
			if err := chromedp.Do(tab, chromedp.EmulateViewport(width, 1000)); err != nil {
				t.Fatal(err)
			}
			problems, err := chromedp.Run(tab, chromedp.Evaluate[[]string](headerOverlaps))
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range problems {
				t.Error(p)
			}
		})
	}
}

// sampleTraffic sends a few kinds of request (LoRA, code, a rejection, a
// canary-eligible conversation) and keeps a few long generations running so
// the KV bars move. It returns a func that waits for them.
func sampleTraffic(t *testing.T, st *devstack.Stack) func() {
	t.Helper()
	routedChat(t, st, "sk-teamx-dev", "chat-small", "Summarise our notes", 8)
	routedChat(t, st, "", "auto", "```go\nfunc main() {}\n```\nExplain this code", 8)
	routedChat(t, st, "sk-intern-dev", "chat-large", "Hi", 8)
	routedChat(t, st, "", "chat-small", "Hello there", 8)
	long := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 1300) // ≈ 14k tokens
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			if _, err := postChat(st, "", "chat-large", fmt.Sprintf("%d %s", i, long), 1500); err != nil {
				t.Error(err)
			}
		})
	}
	return wg.Wait
}

// An open dashboard must not hold the gateway's shutdown: the stream ends
// when the stack stops, and the stack stops without in-flight complaints.
func TestDashboardStreamEndsWhenTheStackStops(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := devstack.Start(ctx, devstack.Config{
		Listen: "127.0.0.1:0", NATSListen: "127.0.0.1:-1", Speed: 4, DataDir: t.TempDir(),
		Replicas: devstack.ReplicasNamed("l70-gen-0"),
	})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(st.GatewayURL() + "/ui/events")
	if err != nil {
		st.Close()
		t.Fatal(err)
	}
	defer resp.Body.Close()
	first := make([]byte, len("retry: 2000\nevent: state\n"))
	if _, err := io.ReadFull(resp.Body, first); err != nil || !strings.Contains(string(first), "event: state") {
		st.Close()
		t.Fatalf("first event %q, %v", first, err)
	}
	start := time.Now()
	if err := st.Close(); err != nil {
		t.Errorf("stack stopped with errors: %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("stopping took %v with a dashboard open", d)
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil && !strings.Contains(err.Error(), "EOF") {
		t.Logf("stream ended with %v", err)
	}
}
