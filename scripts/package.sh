#!/usr/bin/env bash
# Builds weir's release artefacts: a static (musl), stripped x86_64 binary and
# a .deb with the default config, the systemd units, man pages and shell
# completions (cargo-deb; the package's layout is [package.metadata.deb] in
# crates/weir-cli/Cargo.toml).
#
# Usage: scripts/package.sh [--profile PROFILE] [--target TRIPLE]
#   --profile  cargo profile (default release: fat LTO, the build to ship;
#              scripts/test-package.sh uses `package-test`, a faster one)
#   --target   default x86_64-unknown-linux-musl (static). The GNU target
#              builds a dynamically linked package.
#
# Prints the .deb's path on its last line. Installs what it needs when
# missing: the target's standard library (rustup), musl-tools (apt), and
# cargo-deb (crates.io, pinned).
#
# Does not: sign, upload, or build for other architectures.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=release
target=x86_64-unknown-linux-musl
while [[ $# -gt 0 ]]; do
    case "$1" in
        --profile) profile=$2; shift 2 ;;
        --target) target=$2; shift 2 ;;
        *) echo "package: unknown argument $1" >&2; exit 2 ;;
    esac
done

CARGO_DEB_VERSION=3.8.0

say() { printf 'package: %s\n' "$*" >&2; }

if ! rustup target list --installed | grep -qx "$target"; then
    say "adding the $target standard library (rustup)"
    rustup target add "$target" >&2
fi
if [[ $target == *musl* ]] && ! command -v musl-gcc >/dev/null; then
    # ring and jemalloc have C parts, compiled for musl by musl-gcc.
    scripts/install-test-deps.sh musl-tools >&2
fi
if [[ "$(cargo deb --version 2>/dev/null || true)" != *"$CARGO_DEB_VERSION"* ]]; then
    say "installing cargo-deb $CARGO_DEB_VERSION"
    cargo install cargo-deb --locked --version "$CARGO_DEB_VERSION" >&2
fi

say "building weir ($profile, $target)"
cargo build --locked --profile "$profile" --target "$target" -p weir-cli --bin weir >&2
profile_dir=$profile
[[ $profile == dev ]] && profile_dir=debug
bin="target/$target/$profile_dir/weir"

# Man pages and completions come from the binary just built: they describe
# exactly the arguments it parses. (A musl binary runs on any x86_64 Linux.)
# Beside the binary: cargo-deb maps `target/release/` in the assets to it.
out="target/$target/$profile_dir/package"
rm -rf "$out"
"$bin" generate man "$out/man" >/dev/null
gzip -9n "$out"/man/*.1
mkdir -p "$out/completions"
"$bin" generate completions bash >"$out/completions/weir.bash"
"$bin" generate completions zsh >"$out/completions/_weir"
"$bin" generate completions fish >"$out/completions/weir.fish"

say "packaging"
mkdir -p target/package
rm -f target/package/weir_*.deb
cargo deb --locked -p weir-cli --no-build --strip --profile "$profile" --target "$target" \
    --output target/package/ >&2
ls target/package/weir_*.deb
