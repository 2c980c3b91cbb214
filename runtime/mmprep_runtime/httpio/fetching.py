"""Fetching images named by http(s) URLs, safely (the vLLM render API's ``image_url`` parts).

A URL in a request body is an attacker's choice, and the server sits inside a cluster: every fetch
is held to what ``FetchSettings`` allows.
- http and https only; bounded redirects, each hop checked again like the first URL;
- every address a name resolves to is checked before connecting, and the connection goes to the
  checked address (the resolver below is the connector's, so a second lookup cannot return
  something else: no DNS rebinding between check and connect). Loopback, private, link-local
  (cloud metadata at 169.254.169.254), multicast, reserved and unspecified addresses are refused
  unless an allow-list network contains them;
- connect and read timeouts, and a size cap checked against Content-Length and again while reading.

Fetching is asynchronous on the event loop (``Engine.serve``'s fetch stage): it never holds a
processor worker or blocks the loop. Each failure is a ``errors.RequestError`` (4xx) naming the URL
and what went wrong.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import urllib.parse
from collections.abc import Iterable
from typing import Any, Final

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from mmprep_runtime import errors
from mmprep_runtime.settings import FetchSettings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_REDIRECTS: Final = frozenset({301, 302, 303, 307, 308})
_CHUNK: Final = 256 * 1024


def is_public(address: IPAddress) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return not (
        address.is_private
        or address.is_loopback
        or address.is_link_local
        or address.is_multicast
        or address.is_reserved
        or address.is_unspecified
    )


def address_allowed(address: IPAddress, allowed: Iterable[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> bool:
    return is_public(address) or any(address in network for network in allowed)


class FetchRefused(errors.RequestError):
    """The URL may not be fetched: scheme, or an address that is not public."""

    code = "fetch_refused"


class FetchFailed(errors.RequestError):
    """The URL could not be fetched: an error status, no connection, a redirect loop."""

    code = "fetch_failed"


class FetchTimedOut(errors.RequestError):
    """The server at the URL did not answer in time (the client's URL, so a 4xx)."""

    status = 408
    code = "fetch_timeout"


class _CheckingResolver(AbstractResolver):
    """The connector's resolver: resolves, then refuses the name if any address is not allowed."""

    def __init__(self, settings: FetchSettings) -> None:
        self._settings = settings

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, family=family)
        except socket.gaierror as exc:
            raise FetchFailed(f"cannot resolve host {host!r}: {exc.strerror}") from None
        results: list[ResolveResult] = []
        for family_, _, proto, _, sockaddr in infos:
            ip, port_ = sockaddr[0], sockaddr[1]
            if not isinstance(ip, str) or not isinstance(port_, int):
                continue  # not an IP address (getaddrinfo's AF_INET/AF_INET6 answers always are)
            address = ipaddress.ip_address(ip)
            if not address_allowed(address, self._settings.allowed_networks):
                raise FetchRefused(
                    f"host {host!r} resolves to {address}, which is not a public address; "
                    "such URLs are refused unless an allowed network contains them"
                )
            results.append(
                ResolveResult(
                    hostname=host, host=str(address), port=port_, family=family_, proto=proto, flags=socket.AI_NUMERICHOST
                )
            )
        return results

    async def close(self) -> None:
        return None


class Fetcher:
    """One HTTP client for image URLs (connection pooling), created and closed with the app."""

    def __init__(self, settings: FetchSettings) -> None:
        self.settings = settings
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                resolver=_CheckingResolver(self.settings), limit=64, ttl_dns_cache=None, use_dns_cache=False
            )
            timeout = aiohttp.ClientTimeout(
                total=self.settings.connect_timeout_s + self.settings.read_timeout_s,
                sock_connect=self.settings.connect_timeout_s,
                sock_read=self.settings.read_timeout_s,
            )
            # trust_env=False: a proxy from the environment would fetch for us and skip the checks.
            self._session = aiohttp.ClientSession(connector=connector, timeout=timeout, trust_env=False, auto_decompress=False)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _check_url(self, url: str, what: str) -> urllib.parse.SplitResult:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise FetchRefused(f"{what}: only http and https URLs are fetched, got scheme {parts.scheme!r}")
        if not parts.hostname:
            raise FetchRefused(f"{what}: URL {url!r} has no host")
        try:
            literal: IPAddress | None = ipaddress.ip_address(parts.hostname)
        except ValueError:
            literal = None
        # A literal address never reaches the resolver: checked here.
        if literal is not None and not address_allowed(literal, self.settings.allowed_networks):
            raise FetchRefused(
                f"{what}: {parts.hostname} is not a public address; such URLs are refused unless an allowed network contains them"
            )
        return parts

    async def fetch(self, url: str, what: str) -> bytes:
        """The body at ``url`` after at most ``max_redirects`` redirects, within the size cap."""
        settings = self.settings
        current = url
        for _ in range(settings.max_redirects + 1):
            self._check_url(current, what)
            try:
                async with self._client().get(current, allow_redirects=False) as response:
                    if response.status in _REDIRECTS:
                        location = response.headers.get("Location")
                        if not location:
                            raise FetchFailed(f"{what}: {current} answered {response.status} without a Location")
                        current = urllib.parse.urljoin(current, location)
                        continue
                    if response.status != 200:
                        raise FetchFailed(f"{what}: {current} answered HTTP {response.status} {response.reason or ''}".rstrip())
                    return await self._read_capped(response, what, current)
            except errors.RequestError:
                raise
            except TimeoutError:
                raise FetchTimedOut(
                    f"{what}: {current} did not answer within {settings.connect_timeout_s:g} s to connect / "
                    f"{settings.read_timeout_s:g} s to read"
                ) from None
            except aiohttp.ClientConnectorError as exc:
                cause = exc.__cause__ or exc.os_error
                if isinstance(cause, errors.RequestError):
                    raise cause from None
                raise FetchFailed(f"{what}: cannot connect to {current}: {exc.os_error.strerror or exc}") from None
            except aiohttp.ClientError as exc:
                raise FetchFailed(f"{what}: fetching {current} failed: {type(exc).__name__}: {exc}") from None
        raise FetchFailed(f"{what}: {url} redirects more than {settings.max_redirects} times")

    async def _read_capped(self, response: Any, what: str, url: str) -> bytes:
        cap = self.settings.max_bytes
        if response.content_length is not None and response.content_length > cap:
            raise errors.MediaTooLarge(f"{what}: {url} is {response.content_length} bytes, over the cap of {cap}")
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.content.iter_chunked(_CHUNK):
            size += len(chunk)
            if size > cap:
                raise errors.MediaTooLarge(f"{what}: {url} is over the cap of {cap} bytes")
            chunks.append(chunk)
        return b"".join(chunks)
