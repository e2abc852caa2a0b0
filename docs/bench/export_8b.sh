#!/usr/bin/env bash
# The Llama-3-8B shape (random bf16 weights) exported on the GPU machine: checkpoint written on
# the GPU, then the CPU export with its time, peak RSS and bytes on disk. Logs go to $OUT.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
nproc; free -g | head -2; df -h /tmp | tail -1
python3 -c "import torch, transformers, onnx, onnxscript; print(torch.__version__, transformers.__version__, onnx.__version__, onnxscript.__version__)"
python3 docs/bench/peak.py python3 -c "
import torch
from flashspec_export.config import TargetConfig
TargetConfig.from_name('llama3-8b-shape').build(seed=0, device='cuda', dtype=torch.bfloat16).save_pretrained('/tmp/ckpt8b')
" 2>&1 | tail -3
du -sb /tmp/ckpt8b
python3 docs/bench/peak.py python3 scripts/export.py --target /tmp/ckpt8b --draft ngram \
    --max-len 64 --out /tmp/x8b --force 2>&1 | grep -v Warning | tail -8
ls -l /tmp/x8b
