package gateway

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http/httptest"
	"testing"

	"github.com/switchyard-llm/switchyard/table"
)

// TestTenantOfIsASubjectToken: a key's tenant goes out as a subject token,
// so a table that maps a key to a wildcard or a dotted name (one not
// written through the table's codec) is refused, not published on.
func TestTenantOfIsASubjectToken(t *testing.T) {
	keyed := func(tenant string) *table.Snapshot {
		sum := sha256.Sum256([]byte("k"))
		return &table.Snapshot{Keys: map[string]table.Key{hex.EncodeToString(sum[:]): {Tenant: tenant}}}
	}
	r := httptest.NewRequest("GET", "/v1/models", nil)
	r.Header.Set("Authorization", "Bearer k")
	var g Gateway
	if got, e := g.tenantOf(r, keyed("team-x")); e != nil || got != "team-x" {
		t.Fatalf("team-x: %q %v", got, e)
	}
	for _, bad := range []string{"a.b", "*", ">", "a b", ""} {
		if got, e := g.tenantOf(r, keyed(bad)); e == nil || e.Status != 400 {
			t.Errorf("tenant %q: got %q %v, want a 400", bad, got, e)
		}
	}
}
