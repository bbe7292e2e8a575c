package main

import (
	"os"
	"path/filepath"
	"testing"
)

func TestEngineAPIKeyComesFromAFileOrTheEnvironment(t *testing.T) {
	t.Setenv(engineKeyEnv, " from-env \n")
	if k, err := engineAPIKey(""); err != nil || k != "from-env" {
		t.Fatalf("environment: %q %v", k, err)
	}
	dir := t.TempDir()
	good := filepath.Join(dir, "key")
	if err := os.WriteFile(good, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if k, err := engineAPIKey(good); err != nil || k != "from-file" {
		t.Fatalf("file: %q %v", k, err)
	}
	for name, body := range map[string]string{"empty": "\n", "two lines": "a\nb\n"} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := engineAPIKey(p); err == nil {
			t.Errorf("%s key file accepted", name)
		}
	}
	if _, err := engineAPIKey(filepath.Join(dir, "missing")); err == nil {
		t.Error("missing key file accepted")
	}
}
