"""The doctor's Airflow API check, against a small stand-in API server (httpx's MockTransport)
that issues tokens for one user and answers reads only with a token."""

from types import SimpleNamespace

import httpx

from trainops.doctor import checks
from trainops.doctor.airflow_api import api_check


def conn(**kw):
    base = {"conn_id": "trainops_airflow_api", "host": "http://airflow:8080", "schema": None, "port": None}
    return SimpleNamespace(**{**base, "login": "admin", "password": "pw", "extra_dejson": {}, **kw})


def api_server(requests):
    def handle(request: httpx.Request) -> httpx.Response:
        requests.append((request.method, request.url.path))
        if request.url.path == "/auth/token":
            body = request.read()
            ok = b'"admin"' in body and b'"pw"' in body
            return httpx.Response(201, json={"access_token": "t0k"}) if ok else httpx.Response(401, json={})
        if request.headers.get("Authorization") != "Bearer t0k":
            return httpx.Response(401, json={"detail": "Not authenticated"})
        return httpx.Response(200, json={"dags": [], "total_entries": 0})

    return httpx.MockTransport(handle)


def test_a_working_connection_passes():
    seen = []
    line = api_check("trainops_airflow_api", get_connection=lambda _: conn(), transport=api_server(seen))
    assert line.status == checks.PASS and "http://airflow:8080" in line.detail
    assert seen == [("POST", "/auth/token"), ("GET", "/api/v2/dags")]


def test_a_missing_connection_fails_with_the_command_that_makes_it():
    def missing(conn_id):
        raise LookupError(conn_id)

    line = api_check("trainops_airflow_api", get_connection=missing)
    assert line.status == checks.FAIL and "note" in line.detail
    assert line.fix.startswith("airflow connections add trainops_airflow_api")


def test_wrong_credentials_fail_naming_the_connection():
    line = api_check("x", get_connection=lambda _: conn(password="nope"), transport=api_server([]))
    assert line.status == checks.FAIL and "401" in line.detail and "'x'" in line.fix


def test_a_given_token_is_used_as_it_is():
    seen = []
    line = api_check(
        "x", get_connection=lambda _: conn(extra_dejson={"token": "t0k"}), transport=api_server(seen)
    )
    assert line.status == checks.PASS and seen == [("GET", "/api/v2/dags")]


def test_an_unreachable_server_fails_without_a_traceback():
    def refuse(request):
        raise httpx.ConnectError("connection refused", request=request)

    line = api_check("x", get_connection=lambda _: conn(), transport=httpx.MockTransport(refuse))
    assert line.status == checks.FAIL and "ConnectError" in line.detail


def test_a_connection_without_a_host_fails():
    line = api_check("x", get_connection=lambda _: conn(host=""))
    assert line.status == checks.FAIL and "no host" in line.detail


def test_a_token_reply_that_is_not_json_fails_without_a_traceback():
    page = httpx.MockTransport(lambda request: httpx.Response(200, text="<html>login</html>"))
    line = api_check("x", get_connection=lambda _: conn(), transport=page)
    assert line.status == checks.FAIL and "no token" in line.detail
