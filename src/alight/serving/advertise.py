"""The URL other machines use to reach a server (its *advertised* URL).

A server binds an address (`host`); what runners and agents elsewhere connect to may differ: a
wildcard bind (0.0.0.0, ::) listens everywhere but is no address to connect to, and behind NAT
or a DNS name the reachable URL is known only to the user. So: the user's `advertise_url` when
given, else the bound address, or for a wildcard bind this machine's routable address (the source
address of its default route, found without sending a packet; else an address its name resolves
to; else loopback, with a warning).
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from urllib.parse import urlsplit

from alight.errors import ConfigError

logger = logging.getLogger(__name__)

# Documentation addresses (RFC 5737, RFC 3849): a UDP socket "connected" to one picks the source
# address of the default route; connecting a UDP socket sends nothing, so no network is needed.
PROBE_V4 = "203.0.113.1"
PROBE_V6 = "2001:db8::1"


def is_wildcard(host: str) -> bool:
    """True for the bind-all addresses: "", 0.0.0.0, :: (listening everywhere, reachable nowhere by that name)."""
    host = host.strip("[]")
    if not host:
        return True
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def url_of(host: str, port: int) -> str:
    """`http://host:port`, an IPv6 address in brackets."""
    host = host.strip("[]")
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def check_advertise_url(url: str, name: str = "advertise_url") -> str:
    """`url` without a trailing slash; ConfigError (one line naming `name`) unless it is
    http(s)://HOST:PORT with a host other machines can connect to (not a wildcard address)."""
    parsed = urlsplit(url.strip())
    try:
        port = parsed.port
    except ValueError:
        port = None
    well_formed = (
        parsed.scheme in ("http", "https")
        and bool(parsed.hostname)
        and port is not None
        and port > 0
        and parsed.path in ("", "/")
        and not (parsed.query or parsed.fragment or parsed.username or parsed.password)
    )
    if not well_formed:
        raise ConfigError(f"bad {name} {url!r}: expected http://HOST:PORT or https://HOST:PORT")
    assert parsed.hostname is not None
    if is_wildcard(parsed.hostname):
        raise ConfigError(
            f"bad {name} {url!r}: {parsed.hostname} means every address when binding, it is no address to"
            " connect to; give this machine's name or routable address"
        )
    return f"{parsed.scheme}://{parsed.netloc}"


def _usable(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    return not (ip.is_loopback or ip.is_unspecified or ip.is_link_local or ip.is_multicast)


def routable_address(ipv6: bool = False) -> str | None:
    """This machine's address other machines most likely reach: the source address of its default
    route (IPv4; then IPv6 when `ipv6`), else a non-loopback address its host name resolves to;
    None when there is none. Sends nothing over the network."""
    probes = [(socket.AF_INET, PROBE_V4)] + ([(socket.AF_INET6, PROBE_V6)] if ipv6 else [])
    for family, probe in probes:
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as sock:
                sock.connect((probe, 9))
                address = str(sock.getsockname()[0])
        except OSError:  # no route (no default gateway), or no such address family
            continue
        if _usable(address):
            return address
    try:
        family = socket.AF_UNSPEC if ipv6 else socket.AF_INET
        infos = socket.getaddrinfo(socket.gethostname(), None, family=family, type=socket.SOCK_STREAM)
    except OSError:
        infos = []
    for info in infos:
        address = str(info[4][0])
        if _usable(address):
            return address
    return None


def advertised_url(host: str, port: int, advertise_url: str | None = None, *, what: str = "server") -> str:
    """The URL of a server bound to `host:port` that clients on other machines use: `advertise_url`
    (checked), else the bound address, or for a wildcard bind this machine's routable address
    (falling back, with a warning, to loopback)."""
    if advertise_url:
        return check_advertise_url(advertise_url)
    if not is_wildcard(host):
        return url_of(host, port)
    ipv6 = ":" in host
    address = routable_address(ipv6=ipv6)
    if address is None:
        address = local_host(host)
        logger.warning(
            "the %s listens on every address (%s), but this machine has no routable address to tell other"
            " machines (no default route; its name resolves to loopback only): advertising %s; set its"
            " advertise_url to the URL other machines use",
            what,
            host or "0.0.0.0",
            address,
        )
    return url_of(address, port)


def local_host(host: str) -> str:
    """The address this machine connects to for a server bound to `host`: loopback for a wildcard."""
    if not is_wildcard(host):
        return host
    return "::1" if ":" in host else "127.0.0.1"
