#!/usr/bin/env bash
# The runtime on this machine's NVIDIA GPUs (issue 28): the NCCL path through a kill and a hang
# (R = 1 and R = 2 ranks a group where the GPUs allow), kill -> commit, and the failure-free
# step against plain DDP on NCCL. bench/gpu_check.py does the runs and says what runs at which
# GPU count; it prints one JSON object at the end and exits 1 when the runtime (or the DDP
# baseline) failed on the GPUs. With no GPU: one line, exit 0. Not part of `make test` (nor of
# `make bench`). From a clone: `bash bench/gpu_check.sh [--repeats 3] [--budget-s 210]`; the
# measured part stays under 5 minutes (--budget-s) once the venv exists.
#
# torch: the venv is made as the Makefile makes it (requirements.lock pins torch==2.13.0; from
# PyPI that pin is a CUDA build on Linux x86-64, so on a GPU machine nothing more is needed).
# Only when the venv's torch is a CPU build (torch.version.cuda is None: e.g. pip reads a
# CPU-only index there) is it replaced by the same pinned version from PyPI's default index,
# constrained by the lock. A CUDA build that sees no GPU is reported (exit 1), not reinstalled.
set -euo pipefail
here=${BASH_SOURCE[0]}
[[ $here == */* ]] && cd "${here%/*}/.." || cd ..

# Is there a GPU? Only nvidia-smi and bash builtins here, so that this answer costs nothing.
gpus=0
if command -v nvidia-smi >/dev/null 2>&1 && listing=$(nvidia-smi -L 2>/dev/null); then
    while IFS= read -r line; do
        [[ $line == "GPU "* ]] && gpus=$((gpus + 1))
    done <<<"$listing"
fi
if ((gpus == 0)); then
    echo "gpu_check: no NVIDIA GPU here (nvidia-smi missing, failing or listing none):" \
         "nothing checked"
    exit 0
fi
echo "gpu_check: nvidia-smi lists $gpus GPU(s)" >&2

PYTHON=${PYTHON:-python3}
if command -v make >/dev/null 2>&1; then
    make -s PYTHON="$PYTHON" .venv/.installed  # the Makefile's own rule
elif [[ ! -e .venv/.installed ]]; then          # no make (a bare CUDA image): the same steps
    "$PYTHON" -m venv .venv
    .venv/bin/pip install -q --upgrade pip
    .venv/bin/pip install -q -c requirements.lock -e '.[test,bench,train,guard]'
    touch .venv/.installed
fi
py=.venv/bin/python
if [[ -z $("$py" -c 'import torch; print(torch.version.cuda or "")') ]]; then
    pin=$(grep -m1 '^torch==' requirements.lock)
    echo "gpu_check: the venv's torch ($("$py" -c 'import torch; print(torch.__version__)')) is" \
         "a CPU build: installing $pin from https://pypi.org/simple" >&2
    .venv/bin/pip uninstall -q -y torch
    .venv/bin/pip install -q -c requirements.lock --index-url https://pypi.org/simple "$pin"
fi
seen=$("$py" -c 'import torch; print(torch.cuda.device_count())')
if ((seen == 0)); then
    echo "gpu_check: nvidia-smi lists $gpus GPU(s) but torch" \
         "$("$py" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)')" \
         "sees none (driver too old for this CUDA? CUDA_VISIBLE_DEVICES?): nothing checked" >&2
    exit 1
fi
exec "$py" bench/gpu_check.py "$@"
