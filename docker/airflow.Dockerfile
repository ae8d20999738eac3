# syntax=docker/dockerfile:1
# The Airflow image: the official Airflow image + trainops (`.[airflow]`), never torch.
#   docker build -f docker/airflow.Dockerfile -t trainops-airflow:latest .
#   docker build -f docker/airflow.Dockerfile --target dev -t trainops-airflow:dev .
#
# Stages:
#   base     the official image + trainops + the DAGs.
#   dev      base + the trainer (CPU torch), so the `local` cluster backend trains inside this
#            container; docker/compose.yaml runs it. Production trains in the trainer image.
#   airflow  the default (last) target: scheduler, DAG processor, triggerer, API server, workers.
#
# Keep the base image's Airflow equal to the pin in constraints.txt (apache-airflow==3.3.2): the
# build stops if they differ instead of letting pip move Airflow. The build context is limited
# by the allowlist in airflow.Dockerfile.dockerignore, and no credential enters the image:
# connections come from the environment or a secrets backend at run time.
ARG AIRFLOW_IMAGE=apache/airflow:3.3.2-python3.11

FROM ${AIRFLOW_IMAGE} AS base

SHELL ["/bin/bash", "-o", "pipefail", "-e", "-u", "-c"]
ENV PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The official image installs Python packages as its non-root `airflow` user (pip refuses root).
USER airflow

# Build inputs only (tests/deploy/test_docker.py checks this set against the dockerignore).
COPY --chown=airflow:0 pyproject.toml constraints.txt README.md /tmp/trainops-src/
COPY --chown=airflow:0 trainer/ /tmp/trainops-src/trainer/
COPY --chown=airflow:0 plugins/trainops/ /tmp/trainops-src/plugins/trainops/
# The tested set (-c constraints.txt), Airflow held at the image's version, and no torch: the
# check after the install fails the build if anything pulled it in.
RUN cd /tmp/trainops-src \
    && airflow_version="$(sed -n 's/^apache-airflow==//p' constraints.txt)" \
    && image_version="$(python -c 'import airflow; print(airflow.__version__)')" \
    && if [ "${image_version}" != "${airflow_version}" ]; then \
           echo "the base image has Airflow ${image_version} but constraints.txt pins ${airflow_version}:" \
                "build from apache/airflow:${airflow_version}-python3.11" >&2; \
           exit 1; \
       fi \
    && pip install -c constraints.txt "apache-airflow==${airflow_version}" ".[airflow]" \
    && python -c "import trainops.operators, trainops.plugin, trainer.contract, trainer.storage" \
    && if python -c "import torch" 2>/dev/null; then echo "torch must not be in the Airflow image" >&2; exit 1; fi \
    && cd / && rm -rf /tmp/trainops-src

# The plugin and the provider metadata come from the installed distribution's entry points, so
# plugins/ is not copied: a second copy there would only be shadowed by the installed package.
COPY --chown=airflow:0 dags/ /opt/airflow/dags/


FROM base AS dev

# The trainer's extra with PyTorch's CPU wheel of the torch version that constraints.txt pins
# (PyPI's Linux wheel would pull gigabytes of CUDA libraries). Installed editable from
# /opt/trainops, so compose can mount ../plugins and ../trainer over it for live edits.
USER root
RUN install -d -o airflow -g 0 /opt/trainops
USER airflow
COPY --chown=airflow:0 pyproject.toml constraints.txt README.md /opt/trainops/
COPY --chown=airflow:0 trainer/ /opt/trainops/trainer/
COPY --chown=airflow:0 plugins/trainops/ /opt/trainops/plugins/trainops/
RUN cd /opt/trainops \
    && airflow_version="$(sed -n 's/^apache-airflow==//p' constraints.txt)" \
    && torch_version="$(sed -n 's/^torch==//p' constraints.txt)" \
    && pip install --no-deps --index-url https://download.pytorch.org/whl/cpu "torch==${torch_version}" \
    && pip install -c constraints.txt "apache-airflow==${airflow_version}" -e ".[airflow,trainer]" \
    && rm -rf trainops.egg-info \
    && python -c "import torch, trainer.train, trainer.export.folder, trainops.operators; print('torch', torch.__version__)"


FROM base AS airflow
