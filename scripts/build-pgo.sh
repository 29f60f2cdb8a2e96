#!/usr/bin/env bash
# Builds weir profile-guided (PGO) into target/pgo/weir: the way to build the
# binary you deploy. See bench/README.md ("Profile-guided build").
#
# Usage: scripts/build-pgo.sh
#
# 1. builds weir instrumented (-Cprofile-generate) into target/pgo/train;
# 2. bench/pgo_train.py drives it with a mix of traffic on loopback (nginx as
#    the upstream, wrk as the clients) and stops it, which writes the profile;
# 3. llvm-profdata merges the profile, and the release build is made again
#    with it (-Cprofile-use) into target/pgo/opt.
#
# Why: with a thousand busy connections weir's request path no longer fits
# the 32 KiB instruction cache, and every request fetches most of its code
# again. The profile lets LLVM put the code requests run next to each other
# and the code they skip out of the way: a fifth fewer instructions and half
# the instruction-cache misses per request (bench/README.md).
#
# Installs nginx, wrk and, when no llvm-profdata of rustc's LLVM version is at
# hand, Debian's llvm-N package for it. (cargo-pgo does these steps too, but
# needs rustup's llvm-tools component, which is not reachable everywhere we
# build.)
set -euo pipefail
cd "$(dirname "$0")/.."

# nghttp2-client: h2load, for the mix's HTTP/2.
scripts/install-test-deps.sh nginx wrk nghttp2-client
if ! command -v python3 >/dev/null 2>&1; then
    scripts/install-test-deps.sh python3
fi

# The profile format follows LLVM's version: the tool must match rustc's.
llvm_major=$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
host=$(rustc -vV | sed -n 's/^host: //p')
profdata=""
for candidate in "$(rustc --print sysroot)/lib/rustlib/$host/bin/llvm-profdata" \
                 "llvm-profdata-$llvm_major"; do
    if command -v "$candidate" >/dev/null 2>&1; then
        profdata=$candidate
        break
    fi
done
if [[ -z "$profdata" ]]; then
    scripts/install-test-deps.sh "llvm-$llvm_major"
    profdata="llvm-profdata-$llvm_major"
fi

target="${CARGO_TARGET_DIR:-target}/pgo"
# No binary of an earlier build is left to be taken for this one's.
rm -f "$target/weir"
rm -rf "$target/profiles"
mkdir -p "$target/profiles"
# Absolute: rustc writes and reads it from the crates' own directories.
profiles=$(cd "$target/profiles" && pwd)

echo "pgo: building instrumented weir (target/pgo/train)"
RUSTFLAGS="-Cprofile-generate=$profiles" \
    cargo build --release --bin weir --quiet --target-dir "$target/train"

echo "pgo: training"
python3 bench/pgo_train.py --weir-bin "$target/train/release/weir"
shopt -s nullglob
raw=("$profiles"/*.profraw)
if [[ ${#raw[@]} -eq 0 ]]; then
    echo "pgo: the instrumented weir wrote no profile" >&2
    exit 1
fi
"$profdata" merge -o "$profiles/weir.profdata" "${raw[@]}"

echo "pgo: building weir with the profile (target/pgo/opt)"
RUSTFLAGS="-Cprofile-use=$profiles/weir.profdata" \
    cargo build --release --bin weir --quiet --target-dir "$target/opt"
cp "$target/opt/release/weir" "$target/weir"
echo "pgo: $target/weir"
