package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/internal/check"
	"github.com/switchyard-llm/switchyard/natsconn"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table/kv"
)

// natsFlags are the connection flags every NATS command shares, named as the
// nats CLI names them.
type natsFlags struct {
	opts   natsconn.Options
	prefix string
	bucket string
}

func (f *natsFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.opts.URL, "nats", "", "NATS server URL(s) (default $NATS_URL, then the NATS context)")
	fs.StringVar(&f.opts.Context, "context", "", "NATS CLI context to use")
	fs.StringVar(&f.opts.Creds, "creds", "", "NATS credentials file")
	fs.StringVar(&f.opts.TLSCert, "tlscert", "", "TLS client certificate")
	fs.StringVar(&f.opts.TLSKey, "tlskey", "", "TLS client key")
	fs.StringVar(&f.opts.TLSCA, "tlsca", "", "TLS CA certificate")
	fs.DurationVar(&f.opts.PingInterval, "nats-ping-interval", natsconn.DefaultPingInterval,
		"how often each NATS connection checks its server for a sign of life: anything from it on the socket (a message, the answer to a ping) (100ms to 1m)")
	fs.IntVar(&f.opts.MaxPingsOut, "nats-max-pings-out", natsconn.DefaultMaxPingsOut,
		"intervals in a row with nothing from the server after which it is given up for another (1 to 100)")
	fs.StringVar(&f.prefix, "prefix", "llm", "subject prefix")
	fs.StringVar(&f.bucket, "bucket", "llm-routing", "routing-table KV bucket")
}

// validate checks the flags that become subject tokens, the bucket name and
// the liveness check's tuning.
func (f *natsFlags) validate() error {
	return check.All(
		check.Wrap("prefix", f.prefix, subjects.ValidToken(f.prefix)),
		check.Wrap("bucket", f.bucket, subjects.ValidToken(f.bucket)),
		check.Duration("nats-ping-interval", f.opts.PingInterval, natsconn.MinPingInterval, natsconn.MaxPingInterval),
		check.Range("nats-max-pings-out", f.opts.MaxPingsOut, 1, natsconn.MaxMaxPingsOut),
	)
}

func (f *natsFlags) connect(ctx context.Context, name string, log *slog.Logger, extra ...nats.Option) (*nats.Conn, error) {
	o := f.opts
	o.Name = name
	o.Logger = log
	return natsconn.Connect(ctx, o, extra...)
}

// connectOnce is connect for one-shot commands: fail at once when no server
// answers instead of retrying in the background.
func (f *natsFlags) connectOnce(ctx context.Context, name string) (*nats.Conn, error) {
	return f.connect(ctx, name, nil, nats.RetryOnFailedConnect(false), nats.MaxReconnects(0))
}

// openBucket connects once and opens the routing-table bucket. close
// releases both.
func (f *natsFlags) openBucket(ctx context.Context, name string) (bucket jetstream.KeyValue, js jetstream.JetStream, closeFn func(), err error) {
	nc, err := f.connectOnce(ctx, name)
	if err != nil {
		return nil, nil, nil, err
	}
	if js, err = jetstream.New(nc); err != nil {
		nc.Close()
		return nil, nil, nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if bucket, err = js.KeyValue(cctx, f.bucket); err != nil {
		nc.Close()
		return nil, nil, nil, fmt.Errorf("bucket %s: %w", f.bucket, err)
	}
	return bucket, js, nc.Close, nil
}

// ensureBucket is openBucket that creates the bucket with replicas when it is
// absent (kv.EnsureBucket); created says whether it did.
func (f *natsFlags) ensureBucket(ctx context.Context, name string, replicas int) (bucket jetstream.KeyValue, js jetstream.JetStream, closeFn func(), created bool, err error) {
	nc, err := f.connectOnce(ctx, name)
	if err != nil {
		return nil, nil, nil, false, err
	}
	if js, err = jetstream.New(nc); err != nil {
		nc.Close()
		return nil, nil, nil, false, err
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = js.KeyValue(cctx, f.bucket)
	created = errors.Is(err, jetstream.ErrBucketNotFound)
	if bucket, err = kv.EnsureBucket(cctx, js, f.bucket, replicas); err != nil {
		nc.Close()
		return nil, nil, nil, false, fmt.Errorf("bucket %s: %w", f.bucket, err)
	}
	return bucket, js, nc.Close, created, nil
}
