#!/usr/bin/env bash
# Workload Identity for trainops on GKE: two Google service accounts, what each may do on the
# bucket, and which Kubernetes service accounts may act as them. Run once, before
# `kubectl apply -k docker/deploy/overlays/gke`.
#   PROJECT_ID=my-project BUCKET=my-trainops-bucket docker/deploy/overlays/gke/workload-identity.sh
# trainops-trainer: the job pods (the kit's service account ml/trainops-trainer, annotated in
# trainer-workload-identity.yaml). trainops-airflow: the Helm chart's worker, triggerer and API
# server (annotate them in values.yaml with iam.gke.io/gcp-service-account instead of the EKS
# role). trainops speaks S3: on GCS it also needs an HMAC key (docs/deploying.md, "GKE").
set -euo pipefail
: "${PROJECT_ID:?set PROJECT_ID}" "${BUCKET:?set BUCKET}"
POOL="${PROJECT_ID}.svc.id.goog"

bind() {  # bind GOOGLE_SA NAMESPACE/KSA...
    local gsa="$1@${PROJECT_ID}.iam.gserviceaccount.com"
    shift
    gcloud iam service-accounts create "${gsa%%@*}" --project="$PROJECT_ID"
    gcloud storage buckets add-iam-policy-binding "gs://${BUCKET}" \
        --member="serviceAccount:${gsa}" --role=roles/storage.objectUser
    for ksa in "$@"; do
        gcloud iam service-accounts add-iam-policy-binding "$gsa" --project="$PROJECT_ID" \
            --role=roles/iam.workloadIdentityUser --member="serviceAccount:${POOL}[${ksa}]"
    done
}

bind trainops-trainer ml/trainops-trainer
bind trainops-airflow airflow/airflow-worker airflow/airflow-triggerer airflow/airflow-api-server
