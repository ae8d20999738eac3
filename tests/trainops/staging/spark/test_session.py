"""Where the Spark engine runs: the pure decision (no Spark started)."""

import pytest

from trainops.staging.spark.session import DEFAULT_MASTER, remote_from_connection, session_settings


def test_local_mode_is_the_default_and_keeps_the_ui_off():
    settings = session_settings(env={})
    assert (settings["mode"], settings["url"]) == ("local", DEFAULT_MASTER)
    assert settings["conf"]["spark.ui.enabled"] == "false"
    assert (
        session_settings(spark_master="local[2]", conf={"spark.ui.enabled": "true"}, env={})["conf"][
            "spark.ui.enabled"
        ]
        == "true"
    )


def test_spark_remote_or_the_environment_names_a_connect_server():
    connect = session_settings(env={"SPARK_REMOTE": "sc://env:15002"})
    assert (connect["mode"], connect["url"]) == ("connect", "sc://env:15002")
    # the session's own SQL settings travel (UTC above all), the server's static ones do not
    assert connect["conf"]["spark.sql.session.timeZone"] == "UTC"
    assert "spark.ui.enabled" not in connect["conf"]
    chosen = session_settings(spark_remote="sc://arg:15002", env={"SPARK_REMOTE": "sc://env:15002"})
    assert chosen["url"] == "sc://arg:15002"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"spark_remote": "http://x:15002"}, "must be a Spark Connect URL such as 'sc://"),
        ({"spark_remote": "sc://x", "spark_master": "local[2]"}, "are both set: use spark_remote"),
    ],
)
def test_bad_settings_are_refused_naming_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        session_settings(env={}, **kwargs)


def test_an_airflow_connection_names_the_server():
    assert remote_from_connection("spark", "spark-connect", None) == "sc://spark-connect:15002"
    assert remote_from_connection("spark", "sc://h:1/;token=x", 5) == "sc://h:1/;token=x"
    with pytest.raises(ValueError, match="connection 'spark' has no host"):
        remote_from_connection("spark", "", 15002)
