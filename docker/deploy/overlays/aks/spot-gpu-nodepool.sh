#!/usr/bin/env bash
# An AKS Spot node pool of GPU nodes for the training jobs, scaling from zero. A node pool is not
# a Kubernetes object, so kustomize cannot make it: run this once per cluster.
#   RESOURCE_GROUP=my-rg CLUSTER=my-cluster docker/deploy/overlays/aks/spot-gpu-nodepool.sh
# AKS labels and taints Spot nodes kubernetes.azure.com/scalesetpriority=spot by itself; the GPU
# taint added here keeps pods without GPUs off. A job with spot=True and spot_flavour "aks" (or
# "auto") selects the label and tolerates both taints. Eviction policy Delete: an evicted node is
# gone, not deallocated, so it bills nothing. --spot-max-price -1: pay up to the on-demand price,
# never evicted for price.
set -euo pipefail
: "${RESOURCE_GROUP:?set RESOURCE_GROUP}" "${CLUSTER:?set CLUSTER}"

args=(
    aks nodepool add
    --resource-group "$RESOURCE_GROUP"
    --cluster-name "$CLUSTER"
    --name "${POOL:-gpuspot}"
    --priority Spot
    --eviction-policy Delete
    --spot-max-price -1
    --node-vm-size "${VM_SIZE:-Standard_NC96ads_A100_v4}"
    --node-taints nvidia.com/gpu=present:NoSchedule
    --node-count 0
    --enable-cluster-autoscaler
    --min-count 0
    --max-count "${MAX_NODES:-4}"
)
az "${args[@]}"
