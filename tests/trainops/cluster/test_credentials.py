"""Does this look like a credential: by name, by value, by a random token under a hinting name;
and what a location, a switch or the project's own variables are (no credential)."""

import pytest

from tests.trainops.cluster.credential_cases import CREDENTIAL_IDS, CREDENTIALS
from trainops.cluster.credentials import (
    MASK,
    credential_name,
    credential_reason,
    literal_credentials,
    mask_env,
    mask_text,
    without_userinfo,
)


@pytest.mark.parametrize("name,value,secret", CREDENTIALS, ids=CREDENTIAL_IDS)
def test_every_reviewed_credential_is_one_and_its_reason_never_quotes_it(name, value, secret):
    reason = credential_reason(name, value)
    assert reason is not None and secret not in reason and value not in reason


@pytest.mark.parametrize(
    "name",
    [
        "PASS",
        "DB_PASS",
        "PASSWD",
        "MYSQL_PWD",
        "PGPASSWORD",
        "MINIO_ROOT_PASSWORD",
        "SMTP_PASSWORD_2",
        "KEYSTORE_PASSPHRASE",
        "SECRET",
        "CLIENT_SECRET",
        "DJANGO_SECRET_KEY",
        "TOKEN",
        "NPM_TOKEN",
        "GHTOKEN",
        "SLACK_BOT_TOKEN2",
        "GITHUB_PAT",
        "ADO_PAT_2",
        "APIKEY",
        "STRIPE_API_KEY",
        "ANTHROPIC_APIKEY",
        "AZURE_STORAGE_ACCOUNT_KEY",
        "AZURE_STORAGE_CONNECTION_STRING",
        "DB_CONN_STR",
        "SSH_PRIVATE_KEY",
        "GCP_CREDENTIALS",
        "REGISTRY_CREDS",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY_2",
        "accessKey",
        "Authorization",
    ],
)
def test_names_with_any_prefix_and_suffix_say_credential(name):
    assert credential_name(name)
    assert credential_reason(name, "plain-words") == "by its name"


@pytest.mark.parametrize(
    "name",
    [
        "PATH",
        "PWD",
        "OLDPWD",
        "PASSED",
        "BYPASS_PROXY",
        "TOKENIZERS_PARALLELISM",
        "MAX_TOKENS",
        "eval_tokens",
        "KEYBOARD",
        "NODE_KEY",
        "AWS_REGION",
        "AWS_ENDPOINT_URL_S3",
        "TRAINOPS_ATTEMPT",
        "NCCL_IB_HCA",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "PYTHONUNBUFFERED",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
        "HF_HOME",
        "HF_HUB_ENABLE_HF_TRANSFER",
        "WANDB_PROJECT",
    ],
)
def test_ordinary_names_do_not(name):
    assert not credential_name(name)


@pytest.mark.parametrize(
    "value,reason",
    [
        ("postgres://app:pw-123@db:5432/app", "a URL with a password"),
        ("redis://:pw-123@cache:6379/0", "a URL with a password"),
        ("https://Zx8aP0qL3mN7vB2cR5tY@git.example.com/repo", "a URL with a password"),  # a token as user
        ("AKIAIOSFODNN7EXAMPLE", "well-known format"),
        ("hf_0010abcdefghijklmnopqrstuvwxyzABCD", "well-known format"),
        ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3Bl\n", "well-known format"),
        ("Server=db;Database=app;User Id=sa;Password=pw-123;", "well-known format"),
        ("https://acct.blob.core.windows.net/c?sv=2022&sig=abcDEF123%3D", "well-known format"),
    ],
)
def test_values_are_credentials_whatever_the_name(value, reason):
    found = credential_reason("SOME_SETTING", value)
    assert found is not None and reason in found and "pw-123" not in found


def test_a_random_token_under_a_hinting_name_is_one_but_a_word_or_a_path_is_not():
    assert credential_reason("SENTRY_DSN", "https://examplePublicKey@o0.ingest.sentry.io/0") is None
    assert "random-looking token" in (credential_reason("HMAC_KEY", "Zx8aP0qL3mN7vB2cR5tY") or "")
    assert "random-looking token" in (credential_reason("BASIC_AUTH", "dXNlcjpwYXNzd29yZDEyMw==") or "")
    assert credential_reason("HMAC_KEY", "sha256") is None
    assert credential_reason("CACHE_KEY", "/var/cache/trainops/k1") is None
    assert credential_reason("RUN_ID", "Zx8aP0qL3mN7vB2cR5tY") is None  # no hint in the name


@pytest.mark.parametrize(
    "name,value",
    [
        ("HF_TOKEN_PATH", "/var/run/secrets/hf/token"),
        ("AWS_SHARED_CREDENTIALS_FILE", "/var/run/secrets/aws/credentials"),
        ("GOOGLE_APPLICATION_CREDENTIALS", "/var/run/secrets/gcp/key.json"),
        ("OAUTH_TOKEN_URL", "https://login.example.com/oauth/token"),
        ("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1"),
        ("DB_PASSWORD", ""),
        ("AWS_ENDPOINT_URL_S3", "http://minio.storage:9000/path?owner=a@b.example"),
    ],
)
def test_a_location_a_switch_or_nothing_is_no_credential(name, value):
    assert credential_reason(name, value) is None


def test_a_location_name_with_a_secret_for_its_value_still_is_one():
    assert credential_reason("HF_TOKEN_PATH", "hf-token-not-a-path") == "by its name"
    assert credential_reason("GOOGLE_APPLICATION_CREDENTIALS", '{"private_key": "x"}') == "by its name"
    assert "URL with a password" in (credential_reason("TOKEN_URL", "https://u:pw@login.example.com") or "")


def test_mask_env_masks_only_the_credentials():
    env = {"AWS_REGION": "eu-west-1", "DB_PASS": "p", "S3": "http://u:pw@minio:9000"}
    assert literal_credentials(env).keys() == {"DB_PASS", "S3"}
    assert mask_env(env) == {"AWS_REGION": "eu-west-1", "DB_PASS": MASK, "S3": MASK}


def test_mask_text_keeps_the_user_and_host_and_masks_passwords_and_known_tokens():
    text = "see https://user:SECRET-3@minio.local/x, http://h:9/x?e=a@b and AKIAIOSFODNN7EXAMPLE"
    assert mask_text(text) == "see https://user:***@minio.local/x, http://h:9/x?e=a@b and ***"


def test_without_userinfo_keeps_scheme_host_port_path_and_query():
    assert without_userinfo("http://admin:pw@minio.storage:9000/base?x=1") == (
        "http://minio.storage:9000/base?x=1",
        True,
    )
    assert without_userinfo("https://token@s3.example.com") == ("https://s3.example.com", True)
    assert without_userinfo("http://minio.storage:9000") == ("http://minio.storage:9000", False)
