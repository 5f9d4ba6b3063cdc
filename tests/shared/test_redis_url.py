"""The Sentinel form of a Redis URL, as `STREAMPOOL_REDIS_URL` takes it, and the Redis Cluster form."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from shared.config import RedisSettings
from shared.redis_url import (
    ClusterUrl,
    SentinelUrl,
    is_cluster,
    is_sentinel,
    parse_cluster_url,
    parse_sentinel_url,
)


def test_a_sentinel_url_names_every_sentinel_the_master_and_the_database() -> None:
    url = "redis+sentinel://:s%40cret@10.0.0.1:26379,10.0.0.2:26380,sentinel-c/mymaster/2"
    assert parse_sentinel_url(url) == SentinelUrl(
        sentinels=(("10.0.0.1", 26379), ("10.0.0.2", 26380), ("sentinel-c", 26379)),
        master="mymaster",
        db=2,
        password="s@cret",
    )


def test_a_sentinel_url_without_password_or_database_uses_database_0() -> None:
    assert parse_sentinel_url("redis+sentinel://127.0.0.1:26379/streampool") == SentinelUrl(
        sentinels=(("127.0.0.1", 26379),), master="streampool"
    )


def test_a_sentinel_url_may_name_a_user_beside_the_password() -> None:
    parsed = parse_sentinel_url("redis+sentinel://app:pw@h:1/m/")
    assert (parsed.username, parsed.password, parsed.db) == ("app", "pw", 0)


def test_only_the_sentinel_scheme_is_a_sentinel_url() -> None:
    assert is_sentinel("redis+sentinel://h:26379/m")
    assert not is_sentinel("redis://127.0.0.1:6379/0")
    with pytest.raises(ValueError, match="not a Sentinel URL"):
        parse_sentinel_url("redis://127.0.0.1:6379/0")


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://h:26379", "master's name"),
        ("redis+sentinel:///m", "master's name"),
        ("redis+sentinel://h:26379/m/zero", "is a number"),
        ("redis+sentinel://h:26379/m/0/extra", "master's name"),
        ("redis+sentinel://h:port/m", "no valid port"),
        ("redis+sentinel://h:70000/m", "no valid port"),
        ("redis+sentinel://h:1,,h:2/m", "host:port pairs"),
        ("redis+sentinel://:1/m", "host:port pairs"),
    ],
)
def test_a_malformed_sentinel_url_is_refused_naming_the_form(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=says) as refused:
        parse_sentinel_url(url)
    assert "redis+sentinel://[:password@]host:port" in str(refused.value)


def test_settings_refuse_a_malformed_sentinel_url_at_start_up() -> None:
    with pytest.raises(ValidationError, match="master's name"):
        RedisSettings(redis_url="redis+sentinel://h:26379")
    assert RedisSettings(redis_url="redis+sentinel://h:26379/m").redis_url == "redis+sentinel://h:26379/m"


def test_a_cluster_url_names_its_seed_nodes_and_the_password() -> None:
    url = "redis+cluster://:s%40cret@10.0.0.1:7000,10.0.0.2:7001,node-c"
    assert parse_cluster_url(url) == ClusterUrl(
        nodes=(("10.0.0.1", 7000), ("10.0.0.2", 7001), ("node-c", 6379)), password="s@cret"
    )


def test_a_cluster_url_may_name_one_node_alone_and_a_user() -> None:
    assert parse_cluster_url("redis+cluster://127.0.0.1:7000") == ClusterUrl(nodes=(("127.0.0.1", 7000),))
    parsed = parse_cluster_url("redis+cluster://app:pw@h:1/")
    assert (parsed.nodes, parsed.username, parsed.password) == ((("h", 1),), "app", "pw")


def test_a_tls_cluster_url_takes_redis_pys_tls_options_in_its_query() -> None:
    url = "rediss+cluster://:pw@h:7000,k:7001?ssl_ca_certs=/etc/ca%20s.pem&ssl_cert_reqs=required&ssl_check_hostname=true"
    parsed = parse_cluster_url(url)
    assert parsed == ClusterUrl(
        nodes=(("h", 7000), ("k", 7001)),
        password="pw",
        tls={"ssl_ca_certs": "/etc/ca s.pem", "ssl_cert_reqs": "required", "ssl_check_hostname": True},
    )
    assert parsed.connection_options() == {"ssl": True, **(parsed.tls or {})}
    assert parse_cluster_url("rediss+cluster://h:7000").connection_options() == {"ssl": True}
    assert parse_cluster_url("redis+cluster://h:7000").connection_options() == {}


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+cluster://h:7000?ssl_ca_certs=/ca.pem", "need the rediss\\+cluster:// form"),
        ("rediss+cluster://h:7000?ssl_password=x", "not 'ssl_password'"),
        ("rediss+cluster://h:7000?ssl_cert_reqs=always", "one of none, optional, required"),
        ("rediss+cluster://h:7000?ssl_check_hostname=yes", "true or false"),
    ],
)
def test_a_cluster_urls_tls_options_are_checked(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_cluster_url(url)


def test_only_the_cluster_scheme_is_a_cluster_url() -> None:
    assert is_cluster("redis+cluster://h:7000")
    assert is_cluster("rediss+cluster://h:7000")
    assert not is_cluster("redis+sentinel://h:26379/m")
    assert not is_sentinel("redis+cluster://h:7000")
    with pytest.raises(ValueError, match="not a Redis Cluster URL"):
        parse_cluster_url("redis://127.0.0.1:6379/0")


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+cluster://", "at least one node"),
        ("redis+cluster://:pw@", "at least one node"),
        ("redis+cluster://h:7000/0", "names no database"),
        ("redis+cluster://h:7000/2", "names no database"),
        ("redis+cluster://h:port", "no valid port"),
        ("redis+cluster://h:0", "no valid port"),
        ("redis+cluster://h:1,,h:2", "host:port pairs"),
        ("redis+cluster://:1", "host:port pairs"),
    ],
)
def test_a_malformed_cluster_url_is_refused_naming_the_form(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=says) as refused:
        parse_cluster_url(url)
    assert "redis[s]+cluster://[[user]:password@]host:port[,host:port...]" in str(refused.value)
