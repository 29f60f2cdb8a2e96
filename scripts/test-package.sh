#!/usr/bin/env bash
# The package test (scripts/test.sh runs it; CI through it): builds the .deb
# as scripts/package.sh does, installs it with dpkg on this machine, and
# checks what an operator would touch:
#   - the binary is static and stripped (when the musl target could be had);
#   - the files are where Debian puts them (config as a conffile, units, man
#     pages, completions, docs) and the unit says Type=notify, ExecReload and
#     socket activation;
#   - the packaged `weir check` accepts the packaged config, `weir --version`
#     names a commit, `weir` user exists, the service is enabled;
#   - the packaged binary, as the `weir` user, serves a request to an app on
#     loopback with the packaged config (its address moved to loopback);
#   - `dpkg --purge` removes it all.
#
# Builds with the `package-test` profile (unoptimised: the shipped build's
# optimisation takes minutes more on two cores and changes no file in the
# package but the binary's speed). Needs root for dpkg (sudo when not root); refuses to touch a
# `weir` package it did not install. Everything it starts listens on 127.0.0.1 and is stopped on
# exit.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { printf 'test-package: FAIL: %s\n' "$*" >&2; exit 1; }
ok() { printf 'test-package: ok: %s\n' "$*"; }

root=()
if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || fail "needs root (or sudo) to install the package with dpkg"
    root=(sudo)
fi
if dpkg-query -W -f='${Status}' weir 2>/dev/null | grep -q installed; then
    fail "a weir package is already installed; remove it first (dpkg --purge weir)"
fi

target=x86_64-unknown-linux-musl
static=yes
if ! rustup target list --installed | grep -qx "$target" \
    && ! rustup target add "$target"; then
    # The one part this machine may not be able to fetch; everything else is
    # still tested, and the log says plainly what was not.
    echo "test-package: NOT TESTED: a static build (rustup could not fetch the $target standard library); packaging the GNU build" >&2
    target=x86_64-unknown-linux-gnu
    static=no
fi
deb=$(scripts/package.sh --profile package-test --target "$target" | tail -1)
[[ -f $deb ]] || fail "scripts/package.sh made no .deb ($deb)"
ok "built $deb ($(du -h "$deb" | cut -f1))"

work=$(mktemp -d)
app_pid= weir_pid=
cleanup() {
    [[ -n $weir_pid ]] && kill "$weir_pid" 2>/dev/null || true
    [[ -n $app_pid ]] && kill "$app_pid" 2>/dev/null || true
    "${root[@]}" dpkg --purge weir >/dev/null 2>&1 || true
    "${root[@]}" rm -rf "$work"
}
trap cleanup EXIT

# ---- the package's contents ----
contents=$(dpkg-deb --contents "$deb")
for f in ./usr/bin/weir ./etc/weir/weir.toml \
    ./usr/lib/systemd/system/weir.service ./usr/lib/systemd/system/weir.socket \
    ./usr/share/man/man1/weir.1.gz ./usr/share/man/man1/weir-run.1.gz \
    ./usr/share/man/man1/weir-check.1.gz \
    ./usr/share/bash-completion/completions/weir \
    ./usr/share/zsh/vendor-completions/_weir \
    ./usr/share/fish/vendor_completions.d/weir.fish \
    ./usr/share/doc/weir/configuration.md ./usr/share/doc/weir/alerts.yml \
    ./usr/share/doc/weir/grafana/weir.json \
    ./usr/share/doc/weir/examples/mediawiki.toml; do
    grep -q " $f\$" <<<"$contents" || fail "the package lacks $f"
done
ok "every file is in the package"
dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles | grep -qx /etc/weir/weir.toml \
    || fail "/etc/weir/weir.toml is not a conffile (an upgrade would overwrite the operator's edits)"
ok "the config is a conffile"

mkdir "$work/x"
dpkg-deb -x "$deb" "$work/x"
unit="$work/x/usr/lib/systemd/system/weir.service"
for line in "Type=notify" 'ExecReload=/bin/kill -HUP $MAINPID' \
    "ExecStart=/usr/bin/weir run -c /etc/weir/weir.toml" "Wants=network-online.target weir.socket"; do
    grep -qxF "$line" "$unit" || fail "weir.service lacks '$line'"
done
grep -qx "ListenStream=0.0.0.0:8080" "$work/x/usr/lib/systemd/system/weir.socket" \
    || fail "weir.socket does not listen where the default config does"
ok "the units: Type=notify, ExecReload, socket activation"

bin="$work/x/usr/bin/weir"
readelf -S "$bin" | grep -q '\.symtab' && fail "the packaged binary is not stripped"
ok "stripped ($(du -h "$bin" | cut -f1))"
if [[ $static == yes ]]; then
    readelf -l "$bin" | grep -q INTERP && fail "the musl binary asks for a dynamic loader"
    readelf -d "$bin" | grep -q NEEDED && fail "the musl binary needs shared libraries"
    ok "static: no dynamic loader, no shared library"
fi

# ---- install ----
"${root[@]}" dpkg -i "$deb" >"$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log" >&2; fail "dpkg -i"; }
ok "dpkg -i"
dpkg-query -W -f='${Status}' weir | grep -q "install ok installed" || fail "dpkg does not list weir as installed"
/usr/bin/weir --version | grep -Eq '^weir [0-9.]+ \(commit ([0-9a-f]{12}|unknown), built [0-9]{4}-[0-9]{2}-[0-9]{2}\)$' \
    || fail "weir --version: $(/usr/bin/weir --version)"
check=$(/usr/bin/weir check -c /etc/weir/weir.toml 2>&1) || fail "the packaged weir check refuses the packaged config: $check"
grep -q "ok (1 listeners, 1 pools" <<<"$check" || fail "weir check: $check"
grep -q warning <<<"$check" && fail "weir check warns about the packaged config: $check"
ok "packaged weir check: $check"
getent passwd weir >/dev/null || fail "no weir user"
[[ $(stat -c %U /var/lib/weir) == weir ]] || fail "/var/lib/weir is not the weir user's"
[[ -L /etc/systemd/system/multi-user.target.wants/weir.service ]] \
    || fail "weir.service is not enabled (no multi-user.target.wants link)"
ok "user weir, service enabled"
zcat /usr/share/man/man1/weir.1.gz | grep -q '^\.SH SIGNALS' || fail "weir.1 has no SIGNALS section"
bash -c 'source /usr/share/bash-completion/completions/weir && complete -p weir' | grep -q _weir \
    || fail "the bash completion does not register"
ok "man page and bash completion"

# ---- run it: the packaged binary and config, as the weir user ----
app_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mkdir "$work/www" && echo "served by the app" >"$work/www/index.html"
python3 -m http.server --bind 127.0.0.1 --directory "$work/www" "$app_port" >"$work/app.log" 2>&1 &
app_pid=$!
sed -e 's/^address = "0.0.0.0:8080"/address = "127.0.0.1:0"/' \
    -e "s/127.0.0.1:8081/127.0.0.1:$app_port/" \
    -e "s#/var/lib/weir/limits.snapshot#$work/run/limits.snapshot#" \
    /etc/weir/weir.toml >"$work/weir.toml"
cat >>"$work/weir.toml" <<EOF

[admin]
address = "127.0.0.1:0"
EOF
mkdir "$work/run" && "${root[@]}" chown weir:weir "$work/run" && chmod 755 "$work"
# setpriv execs weir itself (runuser would stand between it and SIGTERM).
"${root[@]}" setpriv --reuid weir --regid weir --init-groups /usr/bin/weir run -c "$work/weir.toml" --ready-file "$work/run/ready.json" \
    --upgrade-socket "$work/run/upgrade.sock" >"$work/weir.log" 2>&1 &
weir_pid=$!
for _ in $(seq 100); do [[ -s $work/run/ready.json ]] && break; sleep 0.1; done
[[ -s $work/run/ready.json ]] || { cat "$work/weir.log" >&2; fail "the packaged weir did not report ready"; }
listen=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["listeners"][0])' "$work/run/ready.json")
admin=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["admin"])' "$work/run/ready.json")
body=$(python3 - "$listen" <<'EOF'
import sys, urllib.request
print(urllib.request.urlopen(f"http://{sys.argv[1]}/", timeout=5).read().decode().strip())
EOF
) || fail "a request through the packaged weir failed"
[[ $body == "served by the app" ]] || fail "through weir: '$body'"
python3 - "$admin" <<'EOF' || fail "the packaged weir's /metrics"
import sys, urllib.request
text = urllib.request.urlopen(f"http://{sys.argv[1]}/metrics", timeout=5).read().decode()
assert "weir_build_info" in text, text[:500]
EOF
kill -TERM "$weir_pid"
wait "$weir_pid" || fail "weir did not exit 0 on SIGTERM: $(tail -5 "$work/weir.log")"
weir_pid=
ok "the packaged weir served a request as the weir user and drained on SIGTERM"

# ---- remove ----
"${root[@]}" dpkg --purge weir >"$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log" >&2; fail "dpkg --purge"; }
for gone in /usr/bin/weir /etc/weir/weir.toml /var/lib/weir /usr/lib/systemd/system/weir.service \
    /etc/systemd/system/multi-user.target.wants/weir.service; do
    [[ -e $gone || -L $gone ]] && fail "$gone is still there after dpkg --purge"
done
ok "dpkg --purge removed it"
echo "test-package: all passed"
