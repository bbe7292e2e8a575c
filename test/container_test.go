package test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The image definition builds with the Go go.mod asks for (the golang image
// runs its own toolchain only), a static binary (CGO off, for an image with
// no libc), and runs it as a user that is not root.
func TestContainerfileMatchesTheModule(t *testing.T) {
	read := func(p string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(repoRoot(), p))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	cf := read("deploy/container/Containerfile")
	goMod := regexp.MustCompile(`(?m)^go (\S+)$`).FindStringSubmatch(read("go.mod"))
	arg := regexp.MustCompile(`(?m)^ARG GO_VERSION=(\S+)$`).FindStringSubmatch(cf)
	if goMod == nil || arg == nil || arg[1] != goMod[1] {
		t.Errorf("Containerfile GO_VERSION %v, go.mod go %v: want the same", arg, goMod)
	}
	if !strings.Contains(cf, "CGO_ENABLED=0 go build") || !strings.Contains(cf, "./cmd/switchyard") {
		t.Error("the Containerfile does not build cmd/switchyard with CGO off")
	}
	if user := regexp.MustCompile(`(?m)^USER (\S+)$`).FindStringSubmatch(cf); user == nil || strings.HasPrefix(user[1], "0") || strings.HasPrefix(user[1], "root") {
		t.Errorf("the image runs as %v, want a user that is not root", user)
	}
}
