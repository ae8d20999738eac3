#!/usr/bin/env bash
# A GKE Spot node pool of GPU nodes for the training jobs, scaling from zero. A node pool is not
# a Kubernetes object, so kustomize cannot make it: run this once per cluster.
#   PROJECT_ID=my-project CLUSTER=my-cluster LOCATION=us-central1 docker/deploy/overlays/gke/spot-gpu-nodepool.sh
# GKE labels Spot nodes cloud.google.com/gke-spot=true and taints GPU nodes
# nvidia.com/gpu=present:NoSchedule by itself; the spot taint added here keeps pods that did not
# ask for spot off. A job with spot=True and spot_flavour "gke" (or "auto") selects the label and
# tolerates both taints. --workload-metadata=GKE_METADATA lets the pods use Workload Identity.
set -euo pipefail
: "${PROJECT_ID:?set PROJECT_ID}" "${CLUSTER:?set CLUSTER}" "${LOCATION:?set LOCATION}"

args=(
    container node-pools create "${POOL:-trainops-gpu-spot}"
    --project="$PROJECT_ID"
    --cluster="$CLUSTER"
    --location="$LOCATION"
    --spot
    --machine-type="${MACHINE_TYPE:-a2-highgpu-8g}"
    --accelerator="type=${GPU_TYPE:-nvidia-tesla-a100},count=${GPUS_PER_NODE:-8},gpu-driver-version=latest"
    --node-taints=cloud.google.com/gke-spot=true:NoSchedule
    --num-nodes=0
    --enable-autoscaling
    --min-nodes=0
    --max-nodes="${MAX_NODES:-4}"
    --workload-metadata=GKE_METADATA
)
gcloud "${args[@]}"
