"""The forms of a Redis URL that name more than one server.

A plain `redis://` (or `rediss://`, `unix://`) URL names one server and is redis-py's own. The
Sentinel form, `redis+sentinel://[:password@]host:port[,host:port...]/master[/db]`, names the
Sentinels that know which server is the master of `master` now, so that a failover needs no new
configuration. The password in it is the master's (and its replicas'); the Sentinels' own password,
if they have one, is a setting of its own (`redis_sentinel_password`), as Sentinels and the servers
they watch usually have different ones.

The cluster form, `redis+cluster://[[user]:password@]host:port[,host:port...]`, names some nodes of a
Redis Cluster (any of them, masters or replicas): a client asks them which master serves which slot,
so that one reachable node is enough, and a failover or a resharding needs no new configuration. A
cluster has database 0 alone, so the form has no database. `rediss+cluster://` is the same over TLS
(managed clusters with encryption in transit), with redis-py's TLS options of a `rediss://` URL in
its query: `ssl_ca_certs`, `ssl_cert_reqs`, `ssl_certfile`, `ssl_keyfile`, `ssl_check_hostname`.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

SENTINEL_SCHEME = "redis+sentinel://"
SENTINEL_PORT = 26379  # Sentinel's own default, for a host given without a port
FORM = "redis+sentinel://[:password@]host:port[,host:port...]/master_name[/db]"
CLUSTER_SCHEME = "redis+cluster://"
TLS_CLUSTER_SCHEME = "rediss+cluster://"
CLUSTER_PORT = 6379  # a Redis server's own default, for a node given without a port
CLUSTER_FORM = "redis[s]+cluster://[[user]:password@]host:port[,host:port...][?ssl_ca_certs=...]"
TLS_OPTIONS = ("ssl_ca_certs", "ssl_cert_reqs", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname")
CERT_REQS = ("none", "optional", "required")


@dataclass(frozen=True)
class SentinelUrl:
    """The Sentinels to ask, the name they know the master by, and how to talk to that master."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = None


@dataclass(frozen=True)
class ClusterUrl:
    """The nodes to ask for the cluster's layout, and how to talk to every node."""

    nodes: tuple[tuple[str, int], ...]
    username: str | None = None
    password: str | None = None
    tls: dict[str, str | bool] | None = None  # None: plain TCP; else redis-py's TLS options, maybe none

    def connection_options(self) -> dict[str, str | bool]:
        """The options every node's connections take for TLS (`ssl` and its settings); none without."""
        return {} if self.tls is None else {"ssl": True, **self.tls}


def is_sentinel(url: str) -> bool:
    return url.startswith(SENTINEL_SCHEME)


def parse_sentinel_url(url: str) -> SentinelUrl:
    """The parts of a `redis+sentinel://` URL; `ValueError` naming the expected form otherwise."""
    if not is_sentinel(url):
        raise ValueError(f"not a Sentinel URL (expected {FORM})")
    username, password, hosts, path = _parts(url, SENTINEL_SCHEME)
    master, _, db = path.strip("/").partition("/")
    if not hosts or not master or "/" in db:
        raise ValueError(f"a Sentinel URL needs at least one host and the master's name: {FORM}")
    if db and not db.isdigit():
        raise ValueError(f"the database of a Sentinel URL is a number, not {db!r}: {FORM}")
    return SentinelUrl(
        sentinels=tuple(_host_port(part, SENTINEL_PORT, "a Sentinel URL", FORM) for part in hosts.split(",")),
        master=unquote(master),
        db=int(db or 0),
        username=username,
        password=password,
    )


def is_cluster(url: str) -> bool:
    return url.startswith((CLUSTER_SCHEME, TLS_CLUSTER_SCHEME))


def parse_cluster_url(url: str) -> ClusterUrl:
    """The parts of a `redis+cluster://` or `rediss+cluster://` URL; `ValueError` naming the expected
    form otherwise."""
    if not is_cluster(url):
        raise ValueError(f"not a Redis Cluster URL (expected {CLUSTER_FORM})")
    tls = url.startswith(TLS_CLUSTER_SCHEME)
    rest, _, query = url.partition("?")
    username, password, hosts, path = _parts(rest, TLS_CLUSTER_SCHEME if tls else CLUSTER_SCHEME)
    if not hosts:
        raise ValueError(f"a Redis Cluster URL needs at least one node: {CLUSTER_FORM}")
    if path:
        raise ValueError(
            f"a Redis Cluster URL names no database (a cluster has 0 alone), not {path!r}: {CLUSTER_FORM}"
        )
    options = _tls_options(query)
    if options and not tls:
        raise ValueError(f"TLS options need the rediss+cluster:// form, not {url.partition(':')[0]}://")
    return ClusterUrl(
        nodes=tuple(
            _host_port(part, CLUSTER_PORT, "a Redis Cluster URL", CLUSTER_FORM) for part in hosts.split(",")
        ),
        username=username,
        password=password,
        tls=options if tls else None,
    )


def _tls_options(query: str) -> dict[str, str | bool]:
    """The TLS options of a cluster URL's query, as redis-py's connections take them."""
    options: dict[str, str | bool] = {}
    for pair in filter(None, query.split("&")):
        name, _, value = pair.partition("=")
        value = unquote(value)
        if name not in TLS_OPTIONS:
            raise ValueError(f"a Redis Cluster URL takes {', '.join(TLS_OPTIONS)} in its query, not {name!r}")
        if name == "ssl_cert_reqs" and value not in CERT_REQS:
            raise ValueError(f"ssl_cert_reqs is one of {', '.join(CERT_REQS)}, not {value!r}")
        if name == "ssl_check_hostname":
            if value not in ("true", "false"):
                raise ValueError(f"ssl_check_hostname is true or false, not {value!r}")
            options[name] = value == "true"
        else:
            options[name] = value
    return options


def _parts(url: str, scheme: str) -> tuple[str | None, str | None, str, str]:
    """A URL of several hosts, after its `scheme`: its user name and password (None for none), its
    hosts (`host:port`, a comma between) and the path after them."""
    authority, _, path = url[len(scheme) :].partition("/")
    credentials, _, hosts = authority.rpartition("@")
    username, _, password = credentials.partition(":")
    return unquote(username) or None, unquote(password) or None, hosts, path


def _host_port(part: str, default_port: int, kind: str, form: str) -> tuple[str, int]:
    host, _, port = part.strip().rpartition(":") if ":" in part else (part.strip(), "", "")
    if not host:
        raise ValueError(f"{kind} lists host:port pairs, not {part!r}: {form}")
    if port and not (port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(f"{part!r} has no valid port: {form}")
    return host, int(port) if port else default_port
