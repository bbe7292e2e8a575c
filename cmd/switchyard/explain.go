package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/decider"
	"github.com/switchyard-llm/switchyard/internal/check"
	"github.com/switchyard-llm/switchyard/subjects"
)

// runExplain asks a broker for the decision it would make, without
// forwarding anything.
func runExplain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("explain", flag.ContinueOnError)
	var nf natsFlags
	nf.register(fs)
	var x decider.ExplainRequest
	tenant := fs.String("tenant", "default", "tenant")
	fs.StringVar(&x.Model, "model", "", "alias, model id or model:adapter")
	fs.StringVar(&x.Conversation, "conversation", "", "conversation id")
	fs.IntVar(&x.PromptTokens, "prompt-tokens", 0, "prompt tokens (at most 16777216)")
	fs.IntVar(&x.MaxTokens, "max-tokens", 0, "max_tokens (at most 16777216)")
	fs.StringVar(&x.Priority, "priority", "", "interactive or batch")
	fs.StringVar(&x.TTFTObjective, "ttft-objective", "", "a TTFT objective, 1ms to 10m (e.g. 800ms)")
	feats := fs.String("features", "", "comma-separated feature flags, e.g. code")
	endpoint := fs.String("endpoint", "chat", "the API: chat, completions, embeddings, responses or messages")
	fs.StringVar(&x.PreviousResponse, "previous-response", "", "a stored response id the request continues (Responses API)")
	asJSON := fs.Bool("json", false, "print the decision as JSON")
	if _, err := parseArgs(fs, args); err != nil {
		return err
	}
	if err := checked(nf.validate(),
		check.Range("prompt-tokens", x.PromptTokens, 0, 1<<24),
		check.Range("max-tokens", x.MaxTokens, 0, 1<<24),
		check.Required("model", x.Model),
		check.Wrap("tenant", *tenant, subjects.ValidToken(*tenant)),
		checkEndpoint(*endpoint),
	); err != nil {
		return err
	}
	if *feats != "" {
		x.Features = strings.Split(*feats, ",")
	}
	x.Endpoint = "/v1/" + *endpoint
	if *endpoint == "chat" {
		x.Endpoint = subjects.EndpointChat
	}
	nc, err := nf.connectOnce(ctx, "switchyard-explain")
	if err != nil {
		return err
	}
	defer nc.Close()
	body, _ := json.Marshal(x)
	subj := subjects.New(nf.prefix).Explain(*tenant)
	msg, err := nc.RequestWithContext(withTimeout(ctx, 5*time.Second), subj, body)
	if err != nil {
		// The server refuses a publish without failing the request: the
		// refusal is the connection's last error.
		if le := nc.LastError(); errors.Is(le, nats.ErrPermissionViolation) {
			return fmt.Errorf("these credentials may not publish %s (the operator's may): %w", subj, le)
		}
		return fmt.Errorf("no broker answered: %w", err)
	}
	if *asJSON {
		fmt.Fprintf(stdout, "%s\n", msg.Data)
		return nil
	}
	var d subjects.Decision
	if err := json.Unmarshal(msg.Data, &d); err != nil || d.Reason == "" && d.Code == "" {
		fmt.Fprintf(stdout, "%s\n", msg.Data)
		return errCheckFailed
	}
	printDecision(stdout, &d)
	if d.Code != "" {
		return errCheckFailed
	}
	return nil
}

// checkEndpoint accepts the short name of an endpoint Switchyard routes.
func checkEndpoint(name string) error {
	for _, e := range subjects.AllEndpoints() {
		if e == "/v1/"+name || e == "/v1/chat/completions" && name == "chat" {
			return nil
		}
	}
	return check.Wrap("endpoint", name, errors.New("want chat, completions, embeddings, responses or messages"))
}

func withTimeout(ctx context.Context, d time.Duration) context.Context {
	c, cancel := context.WithTimeout(ctx, d)
	context.AfterFunc(c, cancel)
	return c
}

func printDecision(w io.Writer, d *subjects.Decision) {
	if d.Code != "" {
		fmt.Fprintf(w, "rejected %d %s: %s\n", d.Status, d.Code, d.Message)
	}
	fmt.Fprintf(w, "model     %s → %s %s", d.Requested, d.Model, d.Version)
	if d.Lora != "" {
		fmt.Fprintf(w, " (LoRA %s)", d.Lora)
	}
	fmt.Fprintf(w, "\npool      %s\nreplica   %s (score %.3f)\nreason    %s\ntable rev %d, decided in %s\n",
		d.Pool, d.Replica, d.Score, d.Reason, d.TableRevision, time.Duration(d.DurationNanos))
	if d.Region != "" || d.ReplicaRegion != "" {
		fmt.Fprintf(w, "region    decided in %s, replica in %s", cmp.Or(d.Region, "(none)"), cmp.Or(d.ReplicaRegion, "(none)"))
		switch {
		case d.Spilled && d.SpillPenaltySource != "":
			fmt.Fprintf(w, " (spilled; penalty %v, %s)", time.Duration(d.SpillPenaltyMillis*float64(time.Millisecond)).Round(100*time.Microsecond), d.SpillPenaltySource)
		case d.Spilled:
			fmt.Fprintf(w, " (spilled)")
		}
		fmt.Fprintln(w)
	}
	if d.Split != "" {
		if d.PrefillReplica != "" {
			fmt.Fprintf(w, "prefill   %s, decode on %s (%s: %d uncached tokens)\n", d.PrefillReplica, d.Replica, d.Split, d.UncachedTokens)
		} else {
			fmt.Fprintf(w, "prefill   on %s, served whole (%s; %d uncached tokens)\n", d.Replica, d.Split, d.UncachedTokens)
		}
	}
	if d.PrefixBlocks > 0 && d.Replica != "" {
		fmt.Fprintf(w, "prefix    %d of %d blocks matched", d.PrefixMatched, d.PrefixBlocks)
		if d.PrefixSource != "" {
			fmt.Fprintf(w, " (%s)", d.PrefixSource)
		}
		if d.KVFeedRefused != "" {
			fmt.Fprintf(w, "; not from the engine's own events: %s's KV-event feed is failing (its engine's messages refused: %s)", d.Replica, d.KVFeedRefused)
		}
		fmt.Fprintln(w)
	}
	if d.Replica != "" || d.TTFTObjectiveMillis > 0 {
		if d.NoTTFTEvidence {
			fmt.Fprintf(w, "ttft      no TTFT evidence yet")
		} else {
			fmt.Fprintf(w, "ttft      predicted %s", millisString(d.PredictedTTFTMillis))
		}
		if d.TTFTObjectiveMillis > 0 {
			fmt.Fprintf(w, ", objective %s", time.Duration(d.TTFTObjectiveMillis)*time.Millisecond)
		}
		fmt.Fprintln(w)
	}
	if len(d.Shares) > 0 {
		fmt.Fprintf(w, "shares    the pool sheds; of its tokens in flight:\n")
		for _, s := range d.Shares {
			fmt.Fprintf(w, "  tenant  %s %d tokens, %.0f%% (weight %g, fair share %.0f%%)\n", s.Tenant, s.Tokens, 100*s.Share, s.Weight, 100*s.FairShare)
		}
	}
	if d.Profile != "" {
		fmt.Fprintf(w, "profile   %s:%s\n", d.Profile, scoresString(d.Scores))
	}
	for _, a := range d.Alternatives {
		ttft := "predicted TTFT " + millisString(a.PredictedTTFTMillis)
		if a.NoTTFTEvidence {
			ttft = "no TTFT evidence yet"
		}
		fmt.Fprintf(w, "  lost    %s (score %.3f, %s): %s\n", a.Replica, a.Score, ttft, a.Why)
		if len(a.Scores) > 0 {
			fmt.Fprintf(w, "          %s\n", scoresString(a.Scores)[1:])
		}
	}
}

// scoresString renders each scorer's weight and value: " load_score 1×0.412, saturated 1×0".
func scoresString(scores []subjects.Score) string {
	var b strings.Builder
	for i, s := range scores {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, " %s %g×%.3f", s.Scorer, s.Weight, s.Value)
	}
	return b.String()
}

// millisString renders a predicted time in ms as a duration, to the ms.
func millisString(ms float64) string {
	return time.Duration(ms * float64(time.Millisecond)).Round(time.Millisecond).String()
}
