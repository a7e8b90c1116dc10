#!/usr/bin/env bash
# The main job on a built-in default. Grows into plan -> run -> validate -> report as the
# pieces land; for now it lists the GPU catalog.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/megapilot gpus
