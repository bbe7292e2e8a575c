// Package auth generates Switchyard's decentralized NATS authorization: an
// operator, a system account, the Switchyard account (the routing-table
// bucket and every part's user), one account per tenant that imports only its
// own route subject, and a .creds file (user JWT + seed) per identity. Every
// user holds only the subjects its role needs (docs/security.md).
//
// A Store is a directory of keys and JWTs; Init creates what is missing, so
// it is safe to run again with more tenants.
package auth

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/switchyard-llm/switchyard/subjects"
)

// ErrRole reports an unknown role or a missing or bad id.
var ErrRole = errors.New("invalid role")

// ErrNoAuth reports a directory without an operator (run `switchyard auth init`).
var ErrNoAuth = errors.New("no Switchyard authorization here")

const (
	operatorName      = "switchyard-operator"
	systemAccount     = "SYS"
	switchyardAccount = "switchyard"
	systemUser        = "sys"
	metaFile          = "switchyard-auth.json"
	// ServerConfigFile is the nats-server configuration fragment Init writes.
	ServerConfigFile = "server.conf"
)

func tenantAccount(tenant string) string { return "tenant-" + tenant }

// Config says what Init creates. Zero values take the defaults.
type Config struct {
	// Prefix and Bucket are the deployment's subject prefix and table
	// bucket (default "llm" and "llm-routing").
	Prefix, Bucket string
	// Tenants get an account each (added to those already there).
	Tenants []string
	// Replicas get an adapter user and creds file each.
	Replicas []string
}

// meta is what a Store remembers besides keys.
type meta struct {
	Prefix  string   `json:"prefix"`
	Bucket  string   `json:"bucket"`
	Tenants []string `json:"tenants"`
}

// Store is a directory of Switchyard authorization: the keys (seeds) of the
// operator, the accounts and the users, and the JWTs the operator and the
// accounts signed. Seeds stay in it: keep it private (mode 0700).
type Store struct {
	dir  string
	meta meta
	now  func() time.Time
}

// Init opens dir, creating the operator, the accounts, their signing keys and
// the users that are missing, and writes the nats-server configuration
// fragment (ServerConfigFile).
func Init(dir string, cfg Config) (*Store, error) {
	for _, t := range cfg.Tenants {
		if err := subjects.ValidToken(t); err != nil {
			return nil, fmt.Errorf("tenant: %w", err)
		}
	}
	for _, r := range cfg.Replicas {
		if err := subjects.ValidToken(r); err != nil {
			return nil, fmt.Errorf("replica: %w", err)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	s := &Store{dir: dir, now: time.Now}
	if err := s.loadMeta(); err != nil && !errors.Is(err, ErrNoAuth) {
		return nil, err
	}
	if s.meta.Prefix == "" {
		s.meta.Prefix = orDefault(cfg.Prefix, subjects.DefaultPrefix)
		s.meta.Bucket = orDefault(cfg.Bucket, subjects.DefaultBucket)
	} else if (cfg.Prefix != "" && cfg.Prefix != s.meta.Prefix) || (cfg.Bucket != "" && cfg.Bucket != s.meta.Bucket) {
		return nil, fmt.Errorf("%s was made for prefix %q and bucket %q", dir, s.meta.Prefix, s.meta.Bucket)
	}
	for _, t := range cfg.Tenants {
		if !slices.Contains(s.meta.Tenants, t) {
			s.meta.Tenants = append(s.meta.Tenants, t)
		}
	}
	sort.Strings(s.meta.Tenants)
	if err := writeJSON(filepath.Join(dir, metaFile), s.meta); err != nil {
		return nil, err
	}
	if err := s.signAll(); err != nil {
		return nil, err
	}
	return s, nil
}

// Open opens a directory Init made.
func Open(dir string) (*Store, error) {
	s := &Store{dir: dir, now: time.Now}
	if err := s.loadMeta(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Store) loadMeta() error {
	b, err := os.ReadFile(filepath.Join(s.dir, metaFile))
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w: %s (run `switchyard auth init %s`)", ErrNoAuth, s.dir, s.dir)
	}
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, &s.meta); err != nil {
		return fmt.Errorf("%s: %w", metaFile, err)
	}
	return nil
}

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

// Tenants are the tenants with an account.
func (s *Store) Tenants() []string { return slices.Clone(s.meta.Tenants) }

// key loads the seed at rel, creating it with prefix kind when missing.
func (s *Store) key(rel string, kind nkeys.PrefixByte) (nkeys.KeyPair, error) {
	path := filepath.Join(s.dir, rel)
	seed, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		kp, err := nkeys.CreatePair(kind)
		if err != nil {
			return nil, err
		}
		if seed, err = kp.Seed(); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, err
		}
		if err := os.WriteFile(path, append(seed, '\n'), 0o600); err != nil {
			return nil, err
		}
		return kp, nil
	}
	if err != nil {
		return nil, err
	}
	kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(seed))))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", rel, err)
	}
	return kp, nil
}

func pub(kp nkeys.KeyPair) string {
	p, _ := kp.PublicKey() // a key pair made or parsed here always has one
	return p
}

func (s *Store) operatorKeys() (id, signing nkeys.KeyPair, err error) {
	if id, err = s.key("operator.nk", nkeys.PrefixByteOperator); err != nil {
		return nil, nil, err
	}
	signing, err = s.key("operator-signing.nk", nkeys.PrefixByteOperator)
	return id, signing, err
}

func (s *Store) accountKeys(name string) (id, signing nkeys.KeyPair, err error) {
	if id, err = s.key(filepath.Join("accounts", name+".nk"), nkeys.PrefixByteAccount); err != nil {
		return nil, nil, err
	}
	signing, err = s.key(filepath.Join("accounts", name+"-signing.nk"), nkeys.PrefixByteAccount)
	return id, signing, err
}

func (s *Store) userKey(name string) (nkeys.KeyPair, error) {
	return s.key(filepath.Join("users", name+".nk"), nkeys.PrefixByteUser)
}

func (s *Store) accountNames() []string {
	names := []string{systemAccount, switchyardAccount}
	for _, t := range s.meta.Tenants {
		names = append(names, tenantAccount(t))
	}
	return names
}

// signAll signs the operator and every account, keeping each account's
// revocations, and writes the server configuration fragment.
func (s *Store) signAll() error {
	opID, opSigning, err := s.operatorKeys()
	if err != nil {
		return err
	}
	sysID, _, err := s.accountKeys(systemAccount)
	if err != nil {
		return err
	}
	oc := jwt.NewOperatorClaims(pub(opID))
	oc.Name = operatorName
	oc.SystemAccount = pub(sysID)
	oc.SigningKeys.Add(pub(opSigning))
	oc.StrictSigningKeyUsage = true
	opJWT, err := oc.Encode(opID)
	if err != nil {
		return err
	}
	if err := writeFile(filepath.Join(s.dir, "operator.jwt"), opJWT); err != nil {
		return err
	}
	for _, name := range s.accountNames() {
		ac, err := s.accountClaims(name)
		if err != nil {
			return err
		}
		if err := s.saveAccount(name, ac, opSigning); err != nil {
			return err
		}
	}
	return s.writeServerConfig(opJWT, pub(sysID))
}

// accountClaims builds an account's claims afresh, with the revocations of
// its current JWT.
func (s *Store) accountClaims(name string) (*jwt.AccountClaims, error) {
	id, signing, err := s.accountKeys(name)
	if err != nil {
		return nil, err
	}
	ac := jwt.NewAccountClaims(pub(id))
	ac.Name = name
	ac.SigningKeys.Add(pub(signing))
	if old, err := s.loadAccount(name); err == nil {
		ac.Revocations = old.Revocations
	}
	switch {
	case name == switchyardAccount:
		ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
		// Direct tenants reach the brokers only through this export; a
		// streamed answer keeps its mapping alive past the longest request.
		ac.Exports.Add(&jwt.Export{
			Name:              "route",
			Subject:           jwt.Subject(subjects.New(s.meta.Prefix).Route("*")),
			Type:              jwt.Service,
			TokenReq:          true,
			ResponseType:      jwt.ResponseTypeStream,
			ResponseThreshold: importThreshold,
		})
	case strings.HasPrefix(name, "tenant-"):
		tenant := strings.TrimPrefix(name, "tenant-")
		imp, err := s.routeImport(tenant, pub(id))
		if err != nil {
			return nil, err
		}
		ac.Imports.Add(imp)
	}
	return ac, nil
}

// routeImport is a tenant account's one import, with the activation token
// the Switchyard account signs for exactly that tenant's subject.
func (s *Store) routeImport(tenant, tenantPub string) (*jwt.Import, error) {
	syID, _, err := s.accountKeys(switchyardAccount)
	if err != nil {
		return nil, err
	}
	subject := jwt.Subject(subjects.New(s.meta.Prefix).Route(tenant))
	act := jwt.NewActivationClaims(tenantPub)
	act.Name = "route " + tenant
	act.ImportSubject = subject
	act.ImportType = jwt.Service
	token, err := act.Encode(syID)
	if err != nil {
		return nil, err
	}
	return &jwt.Import{Name: "route", Subject: subject, Account: pub(syID), Token: token, Type: jwt.Service}, nil
}

func (s *Store) saveAccount(name string, ac *jwt.AccountClaims, opSigning nkeys.KeyPair) error {
	var vr jwt.ValidationResults
	ac.Validate(&vr)
	if errs := vr.Errors(); len(errs) > 0 {
		return fmt.Errorf("account %s: %w", name, errors.Join(errs...))
	}
	token, err := ac.Encode(opSigning)
	if err != nil {
		return err
	}
	return writeFile(filepath.Join(s.dir, "accounts", name+".jwt"), token)
}

func (s *Store) loadAccount(name string) (*jwt.AccountClaims, error) {
	b, err := os.ReadFile(filepath.Join(s.dir, "accounts", name+".jwt"))
	if err != nil {
		return nil, err
	}
	return jwt.DecodeAccountClaims(strings.TrimSpace(string(b)))
}

// AccountJWTs returns every account's public key and JWT.
func (s *Store) AccountJWTs() (map[string]string, error) {
	out := map[string]string{}
	for _, name := range s.accountNames() {
		b, err := os.ReadFile(filepath.Join(s.dir, "accounts", name+".jwt"))
		if err != nil {
			return nil, err
		}
		token := strings.TrimSpace(string(b))
		ac, err := jwt.DecodeAccountClaims(token)
		if err != nil {
			return nil, fmt.Errorf("account %s: %w", name, err)
		}
		out[ac.Subject] = token
	}
	return out, nil
}

// Operator returns the operator's claims, and the system account's public key.
func (s *Store) Operator() (*jwt.OperatorClaims, string, error) {
	b, err := os.ReadFile(filepath.Join(s.dir, "operator.jwt"))
	if err != nil {
		return nil, "", err
	}
	oc, err := jwt.DecodeOperatorClaims(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, "", err
	}
	return oc, oc.SystemAccount, nil
}

// Creds mints a creds file (user JWT + seed) for r. A tenant needs an
// account: run Init with it first.
func (s *Store) Creds(r Role) ([]byte, error) {
	if r.Kind == RoleTenant && !slices.Contains(s.meta.Tenants, r.ID) {
		return nil, fmt.Errorf("%w: tenant %q has no account here (run `switchyard auth init %s --tenants %s`)", ErrRole, r.ID, s.dir, r.ID)
	}
	g := permissions(r, s.meta.Prefix, s.meta.Bucket)
	return s.creds(r.Name(), r.account(), func(uc *jwt.UserClaims) {
		uc.Pub.Allow.Add(g.pub...)
		uc.Sub.Allow.Add(g.sub...)
		uc.Resp = g.resp
	})
}

// SystemCreds mints creds for the system account's user, which pushes
// account updates (revocations) to running servers.
func (s *Store) SystemCreds() ([]byte, error) {
	return s.creds(systemUser, systemAccount, func(*jwt.UserClaims) {})
}

func (s *Store) creds(user, account string, set func(*jwt.UserClaims)) ([]byte, error) {
	ukp, err := s.userKey(user)
	if err != nil {
		return nil, err
	}
	accID, accSigning, err := s.accountKeys(account)
	if err != nil {
		return nil, err
	}
	uc := jwt.NewUserClaims(pub(ukp))
	uc.Name = user
	uc.IssuerAccount = pub(accID)
	uc.IssuedAt = s.now().Unix()
	set(uc)
	var vr jwt.ValidationResults
	uc.Validate(&vr)
	if errs := vr.Errors(); len(errs) > 0 {
		return nil, fmt.Errorf("user %s: %w", user, errors.Join(errs...))
	}
	token, err := uc.Encode(accSigning)
	if err != nil {
		return nil, err
	}
	seed, err := ukp.Seed()
	if err != nil {
		return nil, err
	}
	return jwt.FormatUserConfig(token, seed)
}

// Revoke revokes every creds file of r issued until now by re-signing its
// account's JWT with the user in its revocations, and rewrites the server
// configuration. It returns the account's public key and new JWT, which
// running servers learn with PushAccount. A creds file minted afterwards
// works again.
func (s *Store) Revoke(r Role) (accountPub, accountJWT string, err error) {
	if r.Kind == RoleTenant && !slices.Contains(s.meta.Tenants, r.ID) {
		return "", "", fmt.Errorf("%w: tenant %q has no account here", ErrRole, r.ID)
	}
	ukp, err := s.userKey(r.Name())
	if err != nil {
		return "", "", err
	}
	name := r.account()
	ac, err := s.accountClaims(name)
	if err != nil {
		return "", "", err
	}
	// A JWT issued in the same second as the revocation is revoked too.
	ac.RevokeAt(pub(ukp), s.now())
	_, opSigning, err := s.operatorKeys()
	if err != nil {
		return "", "", err
	}
	if err := s.saveAccount(name, ac, opSigning); err != nil {
		return "", "", err
	}
	if err := s.signAll(); err != nil {
		return "", "", err
	}
	jwts, err := s.AccountJWTs()
	if err != nil {
		return "", "", err
	}
	return ac.Subject, jwts[ac.Subject], nil
}

// WriteCreds writes r's creds to dir/<role name>.creds (mode 0600) and
// returns the path.
func (s *Store) WriteCreds(dir string, r Role) (string, error) {
	b, err := s.Creds(r)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	path := filepath.Join(dir, r.Name()+".creds")
	return path, os.WriteFile(path, b, 0o600)
}

// WriteAllCreds writes a creds file for every fixed role, the replicas and
// every tenant with an account into dir, and the system user's next to the
// keys (it can change accounts on a running server).
func (s *Store) WriteAllCreds(dir string, replicas []string) error {
	roles := []Role{{Kind: RoleOperator}, {Kind: RoleGateway}, {Kind: RoleGatewayRelay}, {Kind: RoleBroker}, {Kind: RoleObserver}, {Kind: RoleLoader}, {Kind: RoleBatcher}}
	for _, id := range replicas {
		roles = append(roles, Role{Kind: RoleAdapter, ID: id})
	}
	for _, t := range s.meta.Tenants {
		roles = append(roles, Role{Kind: RoleTenant, ID: t})
	}
	for _, r := range roles {
		if _, err := s.WriteCreds(dir, r); err != nil {
			return fmt.Errorf("%s: %w", r.Name(), err)
		}
	}
	sys, err := s.SystemCreds()
	if err != nil {
		return err
	}
	return os.WriteFile(s.SystemCredsPath(), sys, 0o600)
}

// SystemCredsPath is where WriteAllCreds puts the system user's creds.
func (s *Store) SystemCredsPath() string { return filepath.Join(s.dir, systemUser+".creds") }

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

func writeFile(path, content string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(content+"\n"), 0o600)
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return writeFile(path, string(b))
}
