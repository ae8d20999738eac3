"""Literal credentials a job's environment must never carry as plain values: the names a hostile
review saw printed by ``render-job``, the usual credential variables of the services a training
job talks to, and an S3 endpoint with a password in its userinfo.

Each case is ``(name, value, secret)``: ``secret`` is the part that must never be shown (the
whole value, or the URL's password).
"""

ENDPOINT_PASSWORD = "minio-pw-0013"

CREDENTIALS = [
    # what render-job printed as plain values
    ("PASSWORD", "hunter2-pw", "hunter2-pw"),
    ("SECRET", "s3cr3t-value-0001", "s3cr3t-value-0001"),
    ("API_KEY", "api-key-value-0002", "api-key-value-0002"),
    ("DB_PASS", "db-pass-0003", "db-pass-0003"),
    ("PGPASSWORD", "pg-pass-0004", "pg-pass-0004"),
    ("GITHUB_PAT", "ghp_0005abcdefghijklmnopqrstuvwxyzABCDEF", "ghp_0005abcdefghijklmnopqrstuvwxyzABCDEF"),
    (
        "AZURE_STORAGE_CONNECTION_STRING",
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=Zm9vYmFyYmF6cXV4MDAwNQ==",
        "Zm9vYmFyYmF6cXV4MDAwNQ==",
    ),
    (
        "AWS_SECRET_ACCESS_KEY_2",
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    ),
    # the usual credential variables of databases, model hubs, trackers and clouds
    ("DB_PASSWORD", "db-password-0006", "db-password-0006"),
    ("MY_TOKEN", "my-token-0007", "my-token-0007"),
    ("SERVICE_SECRET", "service-secret-0008", "service-secret-0008"),
    ("OPENAI_API_KEY", "sk-proj-0009abcdefghijklmnopqrstuvwxyz", "sk-proj-0009abcdefghijklmnopqrstuvwxyz"),
    ("HF_TOKEN", "hf_0010abcdefghijklmnopqrstuvwxyzABCD", "hf_0010abcdefghijklmnopqrstuvwxyzABCD"),
    ("WANDB_API_KEY", "0011b7c3d9e5f1a2b4c6d8e0f2a4b6c8d0e2f4a6", "0011b7c3d9e5f1a2b4c6d8e0f2a4b6c8d0e2f4a6"),
    ("AWS_SESSION_TOKEN", "FwoGZXIvYXdzEJr0012wEaDOEXAMPLEsession", "FwoGZXIvYXdzEJr0012wEaDOEXAMPLEsession"),
    ("AWS_ACCESS_KEY_ID", "AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE"),
    # a value that is a credential under a name that is not one
    ("AWS_ENDPOINT_URL_S3", f"http://minio-admin:{ENDPOINT_PASSWORD}@minio.storage:9000", ENDPOINT_PASSWORD),
]
CREDENTIAL_IDS = [name for name, _, _ in CREDENTIALS]
