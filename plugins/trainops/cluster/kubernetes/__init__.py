"""The Kubernetes backend: JobSpec -> manifests (Indexed Job, PyTorchJob, TrainJob), the job
state read from the API, and the backend that submits, watches and deletes through the
cncf-kubernetes provider's hook.

Airflow imports every ``.py`` under the plugins folder as a top-level module, so this package
must stay behind ``plugins/.airflowignore``: as a top-level ``kubernetes`` it would shadow the
Kubernetes client.
"""
