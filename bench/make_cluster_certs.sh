#!/usr/bin/env bash
# Makes a CA and one certificate for the loopback clusters of
# collectived_perf --hosts=H (hosts h0 .. h<H-1>): the certificate names every
# host id and 127.0.0.1, and serves as server and client certificate, so the
# daemons talk mTLS to the coordinator and TLS between each other.
#
#   bench/make_cluster_certs.sh DIR [HOSTS]      (HOSTS default 8)
#
# then give collectived_perf (or compare.py --collectived-args) the daemons'
# flags it prints:
#   '--daemon-args=--tls-cert=DIR/host.pem --tls-key=DIR/host.key --tls-client-ca=DIR/ca.pem'
# (quoted: one argument of collectived_perf), e.g.
#   compare.py --hosts 2 ... --collectived-args "$(bench/make_cluster_certs.sh DIR 2)"
set -euo pipefail
dir="${1:?usage: make_cluster_certs.sh DIR [HOSTS]}"
hosts="${2:-8}"
command -v openssl >/dev/null || { echo "openssl is needed (apt-get install openssl)" >&2; exit 1; }
mkdir -p "$dir"
cd "$dir"
names="IP:127.0.0.1,DNS:localhost"
for ((h = 0; h < hosts; ++h)); do names="$names,DNS:h$h"; done
openssl req -x509 -newkey rsa:2048 -nodes -days 7 -subj /CN=collectived-bench-ca \
  -keyout ca.key -out ca.pem 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj /CN=h0 -keyout host.key -out host.csr 2>/dev/null
printf 'subjectAltName=%s\n' "$names" > host.ext
openssl x509 -req -in host.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 7 \
  -extfile host.ext -out host.pem 2>/dev/null
echo "'--daemon-args=--tls-cert=$PWD/host.pem --tls-key=$PWD/host.key --tls-client-ca=$PWD/ca.pem'"
