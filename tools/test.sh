#!/usr/bin/env bash
# The test command of README.md: every test of the project, in one run.
# Exits non-zero if any test fails.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --all-targets
