"""``DATABASE_URL`` to a Django ``DATABASES`` entry, multi-host URLs included (failover).

libpq takes several servers in one URL, ``postgresql://user@host1:5432,host2:5432/db``, and with
``target_session_attrs=read-write`` connects to whichever accepts writes: after a failover, the
promoted standby. dj-database-url cannot parse a list of hosts in the URL's authority (it raises
``ParseError``), but passes query parameters it does not know to ``OPTIONS``, and Django hands
``OPTIONS`` to psycopg as libpq keywords. So ``parse`` moves the hosts and ports into the query
(``?host=host1,host2&port=5432,5432``, libpq's other spelling of the same URL) and leaves
everything else to dj-database-url. A URL with one host is passed through unchanged.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import dj_database_url


def parse(url: str, **kwargs: Any) -> dict[str, Any]:
    """Return the ``DATABASES`` entry of ``url`` (``dj_database_url.parse`` with ``kwargs``).

    A URL naming several servers (``host1:port1,host2:port2`` in its authority; a host without
    a port takes 5432) gets ``OPTIONS`` ``host`` and ``port``, comma-separated lists in the same
    order, and empty ``HOST`` and ``PORT``. Raises ValueError for a URL whose hosts are given
    both ways (in the authority and as a ``host`` query parameter).
    """
    return dj_database_url.parse(hosts_in_query(url), **kwargs)


def hosts_in_query(url: str) -> str:
    """Return ``url`` with a list of servers in its authority moved to ``host``/``port`` query
    parameters; any other URL unchanged. Raises ValueError as ``parse`` does."""
    # The authority is cut out by hand: urlsplit refuses a list of servers with an IPv6 one in
    # it ("db-a,[::1]:6000") since Python 3.14, as RFC 3986 does.
    scheme, _, rest = url.partition("://")
    end = min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest))
    userinfo, _, hostlist = rest[:end].rpartition("@")
    if "," not in hostlist:
        return url
    parts = urlsplit(f"{scheme}://host{rest[end:]}")
    query = parse_qsl(parts.query, keep_blank_values=True)
    if any(key in ("host", "port") for key, _ in query):
        raise ValueError("a database URL gives its hosts in the authority or in ?host=, not both")
    hosts, ports = [], []
    for server in hostlist.split(","):
        host, port = _split_server(server)
        hosts.append(host)
        ports.append(port)
    query = [("host", ",".join(hosts)), ("port", ",".join(ports)), *query]
    netloc = f"{userinfo}@" if userinfo else ""
    return urlunsplit((scheme, netloc, parts.path, urlencode(query, safe=",/"), ""))


def _split_server(server: str) -> tuple[str, str]:
    """``host:port``, ``host`` or ``[v6]:port`` to ``(host, port)``; the port defaults to 5432."""
    if server.startswith("["):
        host, _, rest = server[1:].partition("]")
        return host, rest.removeprefix(":") or "5432"
    host, _, port = server.partition(":")
    return host, port or "5432"
