package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestOperatorCommandTriesAgain: a command that fails once (as `table
// init` does when a replicated stream outlasts its deadline) is run again
// and the launcher goes on; one that always fails is given up after
// operatorTries runs, with its output in the error.
func TestOperatorCommandTriesAgain(t *testing.T) {
	dir := t.TempDir()
	runs := filepath.Join(dir, "runs")
	script := filepath.Join(dir, "switchyard")
	// Each run appends a line; the script fails while it has run fewer
	// than $1 times.
	body := "#!/bin/sh\necho x >> " + runs + "\n[ $(wc -l < " + runs + ") -ge \"$1\" ] || { echo 'bucket llm-budgets: context deadline exceeded'; exit 1; }\n"
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	count := func() int {
		b, _ := os.ReadFile(runs)
		return strings.Count(string(b), "\n")
	}

	if err := operatorCommand(context.Background(), script, []string{"2"}); err != nil {
		t.Fatalf("failing once: %v", err)
	}
	if n := count(); n != 2 {
		t.Errorf("failing once: %d runs, want 2", n)
	}

	_ = os.Remove(runs)
	err := operatorCommand(context.Background(), script, []string{"99"})
	if err == nil || !strings.Contains(err.Error(), "context deadline exceeded") {
		t.Fatalf("failing always: %v, want the command's output", err)
	}
	if n := count(); n != operatorTries {
		t.Errorf("failing always: %d runs, want %d", n, operatorTries)
	}

	// A usage error is the command line's fault: once is enough.
	usage := filepath.Join(dir, "usage")
	if err := os.WriteFile(usage, []byte("#!/bin/sh\necho x >> "+runs+"\necho 'usage: switchyard table init'; exit 2\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	_ = os.Remove(runs)
	if err := operatorCommand(context.Background(), usage, nil); err == nil || !strings.Contains(err.Error(), "usage:") {
		t.Fatalf("a usage error: %v, want the command's output", err)
	}
	if n := count(); n != 1 {
		t.Errorf("a usage error: %d runs, want 1", n)
	}
}
