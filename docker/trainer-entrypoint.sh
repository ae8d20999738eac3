#!/bin/sh
# Entrypoint of the trainer image, for `docker run` by hand:
#   docker run IMAGE train --config s3://...            (python -m trainer train ...)
#   docker run IMAGE --nproc-per-node=8 -m trainer ...  (python -m torch.distributed.run ...)
#   docker run IMAGE python -m trainer evaluate ...     (run as given)
# Kubernetes pods bypass it: trainops sets the container's `command` (the whole argument list,
# `python -m torch.distributed.run ... -m trainer train ...`), which replaces this ENTRYPOINT.
# So nothing here may be needed in a pod: the trainer creates $TRAINOPS_CACHE_DIR itself
# (trainer/data.py, cache_dir), and the mkdir below only fails early on a bad mount.
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
