"""DATABASE_URL with several servers (a primary and its standbys): ``project.databases``."""

from __future__ import annotations

import dj_database_url
import pytest

from project.databases import hosts_in_query, parse

MULTI = "postgresql://app:s3cret@10.0.0.1:5433,10.0.0.2:5434/site?target_session_attrs=read-write"


def test_dj_database_url_alone_cannot_parse_a_list_of_hosts():
    with pytest.raises(dj_database_url.ParseError):
        dj_database_url.parse(MULTI)


def test_several_servers_become_libpq_host_and_port_lists_in_options():
    entry = parse(MULTI, conn_max_age=0)
    assert (entry["HOST"], entry["PORT"], entry["NAME"]) == ("", "", "site")
    assert (entry["USER"], entry["PASSWORD"]) == ("app", "s3cret")
    assert entry["OPTIONS"] == {
        "host": "10.0.0.1,10.0.0.2",
        "port": "5433,5434",
        "target_session_attrs": "read-write",
    }


def test_a_host_without_a_port_takes_5432_and_ipv6_keeps_its_address():
    options = parse("postgresql://u@db-a,[::1]:6000/x")["OPTIONS"]
    assert options == {"host": "db-a,::1", "port": "5432,6000"}


def test_one_host_is_left_to_dj_database_url_unchanged():
    url = "postgresql://u@db:5432/x?sslmode=require"
    assert hosts_in_query(url) == url
    assert parse(url) == dj_database_url.parse(url)


def test_hosts_in_both_places_are_refused():
    with pytest.raises(ValueError, match="not both"):
        hosts_in_query("postgresql://u@a,b/x?host=c")


def test_django_hands_the_lists_to_psycopg_as_one_multi_host_conninfo():
    from django.db.backends.postgresql.base import DatabaseWrapper

    wrapper = DatabaseWrapper({**parse(MULTI), "TIME_ZONE": None, "ATOMIC_REQUESTS": False,
                               "AUTOCOMMIT": True, "CONN_HEALTH_CHECKS": False, "TEST": {}})
    params = wrapper.get_connection_params()
    assert (params["host"], params["port"]) == ("10.0.0.1,10.0.0.2", "5433,5434")
    assert params["target_session_attrs"] == "read-write"


def test_a_list_of_servers_followed_by_a_query_without_a_path_keeps_the_query():
    entry = parse("postgresql://u:p@[2001:db8::5],db-b:6432?sslmode=require")
    assert (entry["USER"], entry["PASSWORD"], entry["NAME"]) == ("u", "p", "")
    assert entry["OPTIONS"] == {
        "host": "2001:db8::5,db-b", "port": "5432,6432", "sslmode": "require",
    }
