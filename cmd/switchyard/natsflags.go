package main

import (
	"context"
	"flag"
	"log/slog"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/natsconn"
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
	fs.StringVar(&f.prefix, "prefix", "llm", "subject prefix")
	fs.StringVar(&f.bucket, "bucket", "llm-routing", "routing-table KV bucket")
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
