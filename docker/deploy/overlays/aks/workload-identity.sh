#!/usr/bin/env bash
# Azure Workload Identity for the trainer pods: a managed identity that trusts the kit's service
# account ml/trainops-trainer through the cluster's OIDC issuer. Run once, then put the client id
# it prints in trainer-workload-identity.yaml. The cluster needs --enable-oidc-issuer
# --enable-workload-identity.
#   RESOURCE_GROUP=my-rg CLUSTER=my-cluster docker/deploy/overlays/aks/workload-identity.sh
# What the identity may reach is yours to grant (az role assignment create). trainops's storage
# speaks S3, which Azure Blob Storage does not: on AKS the storage root is an S3-compatible store
# (docs/deploying.md, "AKS").
set -euo pipefail
: "${RESOURCE_GROUP:?set RESOURCE_GROUP}" "${CLUSTER:?set CLUSTER}"
IDENTITY="${IDENTITY:-trainops-trainer}"

az identity create --name "$IDENTITY" --resource-group "$RESOURCE_GROUP"
issuer="$(az aks show --name "$CLUSTER" --resource-group "$RESOURCE_GROUP" \
    --query oidcIssuerProfile.issuerUrl --output tsv)"
az identity federated-credential create --name trainops-trainer --identity-name "$IDENTITY" \
    --resource-group "$RESOURCE_GROUP" --issuer "$issuer" \
    --subject system:serviceaccount:ml:trainops-trainer --audience api://AzureADTokenExchange
az identity show --name "$IDENTITY" --resource-group "$RESOURCE_GROUP" --query clientId --output tsv
