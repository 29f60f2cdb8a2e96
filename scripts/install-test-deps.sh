#!/usr/bin/env bash
# Installs the Debian packages weir's tests and benchmarks run against, and only
# those that are missing: nginx, haproxy, wrk, redis-server, chromium,
# prometheus (for promtool), dnsmasq-base (a DNS server for the crawler
# reverse-DNS tests: the binary only, no service), iproute2 (`ss`: a test
# reads what a stopped Redis was sent), and the clients the challenge must
# never break (lynx, w3m, newsboat, wget, curl).
#
# Usage: scripts/install-test-deps.sh [PACKAGE...]   (default: all of the above)
#
# Idempotent: when everything is installed it changes nothing and touches no
# network. It never starts a service: Debian's maintainer scripts would start
# nginx/haproxy/redis on their default ports, so a policy-rc.d that exits 101
# is put in place first (if none exists). Tests start each server themselves,
# with their own config, pid file and loopback port.
#
# Does not: configure or start anything, upgrade installed packages, or work on
# anything but Debian/Ubuntu (it says so and fails instead).
set -euo pipefail

ALL_PACKAGES=(nginx haproxy wrk redis-server chromium prometheus dnsmasq-base iproute2 lynx w3m newsboat wget curl)
if [[ $# -gt 0 ]]; then
    wanted=("$@")
else
    wanted=("${ALL_PACKAGES[@]}")
fi

installed() {
    # "install ok installed" only; a removed-but-configured package is missing.
    [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" == "install ok installed" ]]
}

missing=()
for pkg in "${wanted[@]}"; do
    if ! installed "$pkg"; then
        missing+=("$pkg")
    fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
    echo "install-test-deps: all present (${wanted[*]})"
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-test-deps: missing ${missing[*]} and apt-get is not available; install them by hand" >&2
    exit 1
fi

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then
        sudo_cmd=(sudo)
    else
        echo "install-test-deps: missing ${missing[*]}; run as root (or install sudo)" >&2
        exit 1
    fi
fi

# Without this, installing nginx/haproxy/redis-server starts them on ports 80 and
# 6379 (or fails noisily without an init system). Never overwrite an existing one.
if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\n# Created by weir scripts/install-test-deps.sh: apt must not start services.\nexit 101\n' \
        | "${sudo_cmd[@]}" tee /usr/sbin/policy-rc.d >/dev/null
    "${sudo_cmd[@]}" chmod 755 /usr/sbin/policy-rc.d
fi

echo "install-test-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
log=$(mktemp -t weir-apt.XXXXXX)
trap 'rm -f "$log"' EXIT
# Quiet unless something goes wrong: then the whole apt log is shown.
if ! "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >"$log" 2>&1 \
    || ! "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends "${missing[@]}" >>"$log" 2>&1; then
    cat "$log" >&2
    echo "install-test-deps: apt-get failed installing ${missing[*]}" >&2
    exit 1
fi

for pkg in "${missing[@]}"; do
    if ! installed "$pkg"; then
        cat "$log" >&2
        echo "install-test-deps: $pkg still not installed after apt-get" >&2
        exit 1
    fi
done
echo "install-test-deps: installed ${missing[*]}"
