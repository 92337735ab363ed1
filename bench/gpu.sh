#!/usr/bin/env bash
# BERT-large phase 1 (seq 128, bf16) on one CUDA GPU: one JSON line with seq/s eager and
# compiled, MFU against the catalog's peak, time to first step compiled cold and warm, the
# checkpoint stand-still per save, a hand-written loop's seq/s, and the same job through
# `trainmaster launch` (its summary's seq/s, MFU, stand-still and cost line), in the same run.
#
#   bench/gpu.sh [--dry] [--steps 50] [--warmup 5] [--batch 0] [--peak-tflops T]
#                [--modes eager,compile,compile_warm,profile,compile_layers,handwritten,checkpoint,launch]
#
# On a CUDA machine, first the Python already there ($PYTHON, default python3): when its torch is
# a CUDA build inside pyproject's range and the bench's other packages are there (gpu_env.py),
# it runs on them with this checkout's src/ on PYTHONPATH, installing nothing (GPU nodes often
# reach no registry). Else it names what is missing, and TRAINMASTER_WHEELS=DIR installs that
# from a folder of wheels (bench/gpu_wheels.py fills it) into .venv-gpu, beside that torch.
# No usable torch, or TRAINMASTER_GPU_INSTALL=1: .venv-gpu with torch==2.13.0 from PyPI (the
# Linux x86_64 wheel is a CUDA build) and this project. --batch 0 fits the micro-batch to the
# GPU's memory. --dry (or TRAINMASTER_GPU_DRY=1): installs nothing and runs on the CPU with
# $PYTHON (default .venv/bin/python): bert-tiny in fp32, 2 steps, to check the arguments and the
# JSON shape. The launch mode runs the CLI; it needs no more than the other modes (gpu_env.py).
#
set -euo pipefail
cd "$(dirname "$0")/.."

dry="${TRAINMASTER_GPU_DRY:-0}"
args=()
for arg in "$@"; do
  case "$arg" in
    --dry) dry=1 ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) args+=("$arg") ;;
  esac
done

# Bad arguments fail here, in a second, before anything is installed (stdlib-only parse).
python3 bench/gpu_bench.py --check-args ${args[@]+"${args[@]}"}

if [ "$dry" = 1 ]; then
  exec "${PYTHON:-.venv/bin/python}" bench/gpu_bench.py --dry ${args[@]+"${args[@]}"}
fi

if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "error: no nvidia-smi here: bench/gpu.sh needs a CUDA machine (or --dry on a CPU)" >&2
  exit 2
fi
venv=.venv-gpu
src="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
if [ "${TRAINMASTER_GPU_INSTALL:-0}" != 1 ]; then
  py="${PYTHON:-python3}"
  found=0
  "$py" bench/gpu_env.py || found=$?
  if [ "$found" = 0 ]; then
    PYTHONPATH="$src" exec "$py" bench/gpu_bench.py ${args[@]+"${args[@]}"}
  elif [ "$found" = 4 ]; then
    if [ -z "${TRAINMASTER_WHEELS:-}" ]; then exit 2; fi
    # The machine's torch stays: .venv-gpu sees $py's own site-packages (a .pth file: $py may
    # itself be a venv, whose packages --system-site-packages would not show); only what is
    # missing comes from DIR. The venv gets no pip of its own (an image's Python may lack
    # ensurepip): $py's pip installs into it (pip 22.3 and later can), resolving against what
    # it sees, the machine's too; an older pip gets the venv a pip of its own.
    [ -x "$venv/bin/python" ] || "$py" -m venv --without-pip "$venv"
    "$py" -c 'import site; print("\n".join(site.getsitepackages()))' \
      > "$("$venv/bin/python" -c 'import site; print(site.getsitepackages()[0])')/machine-site.pth"
    if "$py" -m pip --python "$venv/bin/python" --version >/dev/null 2>&1; then
      pip=("$py" -m pip --python "$venv/bin/python")
    else
      "$venv/bin/python" -m pip --version >/dev/null 2>&1 || "$venv/bin/python" -m ensurepip --default-pip >/dev/null
      pip=("$venv/bin/python" -m pip)
    fi
    missing=$("$py" bench/gpu_env.py --missing) || [ $? = 4 ] || exit 2
    read -r -a wanted <<< "$missing"
    if [ ${#wanted[@]} -gt 0 ]; then
      "${pip[@]}" install --quiet --no-index --find-links "$TRAINMASTER_WHEELS" "${wanted[@]}"
    fi
    "$venv/bin/python" bench/gpu_env.py
    PYTHONPATH="$src" exec "$venv/bin/python" bench/gpu_bench.py ${args[@]+"${args[@]}"}
  fi
  echo "gpu.sh: making $venv with torch==2.13.0 from PyPI" >&2
fi
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet "torch==2.13.0"
"$venv/bin/python" -m pip install --quiet -e .
"$venv/bin/python" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else \
'error: torch ' + torch.__version__ + ' sees no GPU (a CPU wheel, or no driver)')"
exec "$venv/bin/python" bench/gpu_bench.py ${args[@]+"${args[@]}"}
