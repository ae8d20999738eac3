"""The home page's sentence when run notes cannot be written: no connection to write them."""

from trainops.reports.notes_check import notes_problem


def test_a_missing_connection_is_one_sentence_with_the_command():
    def missing(conn_id):
        raise LookupError(conn_id)

    said = notes_problem("trainops_airflow_api", lookup=missing)
    assert said.startswith("Run notes (a rejection's reason, a failure's) are not written: ")
    assert "airflow connections add trainops_airflow_api --conn-type http" in said


def test_a_connection_that_is_there_says_nothing():
    assert notes_problem("trainops_airflow_api", lookup=lambda conn_id: object()) is None


def test_the_api_servers_own_lookup_finds_an_environment_connection(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_TRAINOPS_AIRFLOW_API", '{"conn_type": "http", "host": "http://a:8080"}')
    assert notes_problem("trainops_airflow_api") is None
    assert notes_problem("trainops_no_such_connection") is not None


def test_the_connection_is_the_one_airflows_config_names(monkeypatch):
    from trainops.reports.notes_check import notes_conn_id

    monkeypatch.setenv("AIRFLOW__TRAINOPS__AIRFLOW_API_CONN_ID", "my_api")
    assert notes_conn_id() == "my_api"
