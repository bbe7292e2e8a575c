#!/bin/sh
# Makes a private CA and one certificate per NATS server with openssl:
#
#   deploy/nats/make-certs.sh DIR nats-1 nats-2 nats-3
#
# writes DIR/ca.pem, DIR/ca-key.pem and, for each name, DIR/NAME.pem and
# DIR/NAME-key.pem. Each server certificate names its host (DNS:NAME) plus
# EXTRA_SANS (e.g. EXTRA_SANS=DNS:nats-1.example.com,IP:10.0.0.11) and serves
# both as a server and as a client certificate, because cluster routes are
# verified both ways. An existing CA in DIR is reused, so more servers can be
# added later. Clients need only ca.pem (switchyard --tlsca, nats --tlsca).
# Keep ca-key.pem off the servers.
set -eu
[ $# -ge 2 ] || { echo "usage: $0 DIR NAME..." >&2; exit 2; }
dir=$1
shift
days=${DAYS:-825}
mkdir -p "$dir"
umask 077
if [ ! -f "$dir/ca.pem" ]; then
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days "$days" \
		-subj "/CN=Switchyard NATS CA" -keyout "$dir/ca-key.pem" -out "$dir/ca.pem" \
		-addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
fi
for name in "$@"; do
	sans="DNS:$name${EXTRA_SANS:+,$EXTRA_SANS}"
	ext=$(mktemp)
	printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=%s\n' "$sans" >"$ext"
	openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$name" \
		-keyout "$dir/$name-key.pem" -out "$dir/$name.csr" 2>/dev/null
	openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca-key.pem" -CAcreateserial \
		-days "$days" -extfile "$ext" -out "$dir/$name.pem" 2>/dev/null
	rm -f "$dir/$name.csr" "$ext"
	echo "$dir/$name.pem ($sans)"
done
chmod 644 "$dir/ca.pem"
