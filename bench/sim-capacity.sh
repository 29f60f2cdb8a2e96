#!/usr/bin/env bash
# The lab's own capacity: the highest request rate `weir sim`'s load generator holds on
# schedule (through weir, no rules, to the lab app answering at once; loopback only),
# with the generator's CPU use. See benches/sim_capacity.rs for the method.
#
#   bench/sim-capacity.sh                      # default rates, 4 s per step, < 60 s
#   WEIR_SIM_RATES=2000,8000 WEIR_SIM_SECONDS=6 bench/sim-capacity.sh
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo bench --bench sim_capacity "$@"
