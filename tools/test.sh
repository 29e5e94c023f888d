#!/usr/bin/env bash
# The test command of README.md: every test of the project, in one run.
# Exits non-zero if any test fails.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --all-targets
# Interop with Linux rxe in a qemu VM (needs root; prints SKIPPED without it, and
# fails instead when ROCE_REQUIRE_ROOT=1, as in CI). First the harness's self-test:
# a step whose frames are all dropped must fail and have its frame named.
tools/rxe-interop --self-test
tools/rxe-interop
# roce-xdp against rxe in two VMs, one short round: every step must give its figure
# (the ratios are printed, not checked: benchmarks are not timed tests).
tools/rxe-interop --bench --quick
# Bounded fuzzing of the wire parser, the engine and decode (60 s each, seeded from
# tests/data); a crash fails the run.
tools/fuzz-ci 60
