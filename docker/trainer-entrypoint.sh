#!/bin/sh
# Entrypoint of the trainer image. Pods pass the run contract's argument list as the
# container's args (Kubernetes `args:` replaces CMD and keeps this ENTRYPOINT):
#   python -m torch.distributed.run --nnodes=... -m trainer train --config s3://...
#   python -m trainer evaluate --config s3://...
# Shorthands: `train|evaluate|export ...` runs `python -m trainer ...`, and arguments
# starting with `-` go to torchrun (`python -m torch.distributed.run ...`).
set -eu

# Node-local scratch (shard cache, checkpoint staging); mount an emptyDir here for big runs.
mkdir -p "${TRAINOPS_CACHE_DIR:?TRAINOPS_CACHE_DIR must be set}"

if [ "$#" -eq 0 ]; then
    set -- python -m trainer --help
fi
case "$1" in
    train|evaluate|export|presets) exec python -m trainer "$@" ;;
    -*) exec python -m torch.distributed.run "$@" ;;
    *) exec "$@" ;;
esac
