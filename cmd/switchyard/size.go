package main

import (
	"flag"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/switchyard-llm/switchyard/internal/check"
)

// parseSize reads sizes such as 8MiB, 512KiB, 1MB or 1048576; 0 is allowed
// (a Config's "default").
func parseSize(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"B", 1}}
	t := strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range units {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64/mult {
		return 0, fmt.Errorf("invalid size %q", s)
	}
	return n * mult, nil
}

// sizeValue is a flag holding a size in bytes, written with a unit.
type sizeValue struct{ p *int64 }

func (v sizeValue) String() string {
	if v.p == nil {
		return ""
	}
	return check.FormatSize(*v.p)
}

func (v sizeValue) Set(s string) error {
	n, err := parseSize(s)
	if err != nil {
		return err
	}
	*v.p = n
	return nil
}

// sizeVar defines a size flag. Its usage should name the value `size` (in
// backquotes), so that help reads "-name size".
func sizeVar(fs *flag.FlagSet, p *int64, name string, def int64, usage string) {
	*p = def
	fs.Var(sizeValue{p}, name, usage)
}
