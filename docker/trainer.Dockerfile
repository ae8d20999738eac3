# syntax=docker/dockerfile:1
# The trainer image: torchrun + the FSDP trainer (`pip install .[trainer]`), never Airflow.
#   docker build -f docker/trainer.Dockerfile -t trainops-trainer:latest .
#
# Base: PyTorch's CUDA runtime image (Ubuntu, Python and a CUDA build of torch in /opt/conda).
# Keep its torch equal to the pin in constraints.txt (torch==2.13.0, which a +cuXXX build
# satisfies), so pip keeps the CUDA build instead of fetching another torch.
ARG BASE_IMAGE=pytorch/pytorch:2.13.0-cuda12.8-cudnn9-runtime
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Only what building the distribution needs (tests/trainer_extra checks the same set).
WORKDIR /tmp/trainops-src
COPY pyproject.toml constraints.txt README.md ./
COPY trainer/ trainer/
COPY plugins/trainops/ plugins/trainops/
RUN python -m pip install -c constraints.txt ".[trainer]" \
    && python -c "import trainer.train, trainer.models.builder, trainer.export.folder" \
    && if python -c "import airflow" 2>/dev/null; then echo "airflow must not be in the trainer image" >&2; exit 1; fi \
    && cd / && rm -rf /tmp/trainops-src

# A non-root user (uid 10001; pods may also set runAsUser: 10001, runAsNonRoot: true) and a
# writable node-local scratch for the shard cache and checkpoint staging.
RUN groupadd --gid 10001 trainer \
    && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/trainer --shell /usr/sbin/nologin trainer \
    && mkdir -p /var/cache/trainops \
    && chown 10001:10001 /var/cache/trainops
ENV HOME=/home/trainer \
    TRAINOPS_CACHE_DIR=/var/cache/trainops

COPY --chmod=0755 docker/trainer-entrypoint.sh /usr/local/bin/trainer-entrypoint
USER 10001:10001
WORKDIR /home/trainer

# The entrypoint serves `docker run` by hand (`docker run IMAGE train --config ...`). Kubernetes pods
# never use it: trainops sets the container's `command` to the whole argument list, e.g.
#   ["python", "-m", "torch.distributed.run", "--nnodes=2", ..., "-m", "trainer", "train", "--config", "s3://..."]
# which replaces ENTRYPOINT and CMD, so the pods must not depend on anything it does (the trainer
# creates $TRAINOPS_CACHE_DIR itself). User model builders: bake them into an image FROM this one
# and put their folder on PYTHONPATH.
ENTRYPOINT ["/usr/local/bin/trainer-entrypoint"]
CMD ["python", "-m", "trainer", "--help"]
