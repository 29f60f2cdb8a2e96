#!/usr/bin/env bash
# Runs weir's fuzz targets under libFuzzer (cargo-fuzz, nightly).
#
#   scripts/fuzz.sh [--time SECONDS | --runs N] [TARGET...]
#
# Each target (all when none is named; `cargo fuzz list` in fuzz/) runs for
# SECONDS (default 60) or N executions, one after the other, on a working
# copy of its corpus (fuzz/work/NAME, seeded from fuzz/corpus/NAME), with
# one job: the machine has two cores and the runs must end by themselves.
# A crash is written to fuzz/artifacts/NAME and ends the script with 1;
# make it a regression test and copy it into fuzz/corpus/NAME.
#
# Prints one line per target: executions, seconds, executions per second,
# corpus size. `--merge` afterwards adds the working corpora's inputs that
# add coverage to fuzz/corpus, to commit.
#
# CI does not need nightly: crates/weir-fuzz's tests run every target over
# fuzz/corpus and seeded mutations of it on stable.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

mode=time value=60 merge=false targets=()
while [ $# -gt 0 ]; do
    case "$1" in
        --time) mode=time value="$2"; shift 2 ;;
        --runs) mode=runs value="$2"; shift 2 ;;
        --merge) merge=true; shift ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) targets+=("$1"); shift ;;
    esac
done

if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz (needs the nightly toolchain: rustup toolchain install nightly)" >&2
    cargo install cargo-fuzz --locked
fi
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cargo +nightly fuzz list)

if $merge; then
    for t in "${targets[@]}"; do
        [ -d "work/$t" ] || continue
        # libFuzzer's merge: adds to the first directory the inputs of the
        # others that add coverage, and keeps what is there (`cargo fuzz
        # cmin` takes no second directory: it minimised the seeds away).
        before=$(ls "corpus/$t" | wc -l)
        cargo +nightly fuzz run --release "$t" "corpus/$t" "work/$t" -- -merge=1 \
            >"work/$t.merge.log" 2>&1 || { echo "$t: merge failed, see fuzz/work/$t.merge.log" >&2; exit 1; }
        echo "$t: corpus $before -> $(ls "corpus/$t" | wc -l) files"
    done
    exit 0
fi

# `cargo fuzz run` builds what it runs (with its own flags: a separate
# `cargo fuzz build` would build everything twice).
status=0
for t in "${targets[@]}"; do
    mkdir -p "work/$t" "artifacts/$t"
    cp -n "corpus/$t"/* "work/$t"/ 2>/dev/null || true
    case "$mode" in
        time) limit=(-max_total_time="$value") ;;
        runs) limit=(-runs="$value") ;;
    esac
    log="work/$t.log"
    started=$(date +%s.%N)
    if ! cargo +nightly fuzz run --release "$t" "work/$t" -- \
        "${limit[@]}" -max_len=65536 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        >"$log" 2>&1; then
        status=1
        echo "$t: CRASH, see fuzz/$log and fuzz/artifacts/$t" >&2
    fi
    ended=$(date +%s.%N)
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
    secs=$(echo "$ended - $started" | bc)
    printf '%s: %s executions in %.0f s (%.0f/s), corpus %s files\n' \
        "$t" "$runs" "$secs" "$(echo "$runs / $secs" | bc -l)" "$(ls "work/$t" | wc -l)"
done
exit $status
