"""The dashboard's security rules, in one place (README "Dashboard"):

- where it may listen: a loopback address, or any other with a token (`check_bind`);
- who may read it: with a token, a request carrying it (`Authorization: Bearer T`, basic auth
  with T as the password, or `?token=T` once, which sets a cookie holding an HMAC of it and
  sends the browser on without the token in its address bar); without one, a request whose
  `Host` is a loopback name (a page of another site that resolves its name to 127.0.0.1, DNS
  rebinding, is refused);
- what a form may do: POST only, with a CSRF token (an HMAC of a random per-browser cookie,
  SameSite=Strict) and, when the browser sends one, an `Origin` of the dashboard itself.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Mapping

from ..errors import ConfigError

AUTH_COOKIE = "queasy_auth"
CSRF_COOKIE = "queasy_csrf"
#: Host header names a dashboard without a token answers (besides loopback addresses)
LOOPBACK_NAMES = ("localhost", "localhost.")
#: headers of every response: no script, style or frame from anywhere but the dashboard
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
        "form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",  # no-referrer would make a form's Origin "null"
    "Cache-Control": "no-store",
}


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or name, a port or [brackets] stripped) is this machine only."""
    name = host.strip().strip("[]").lower()
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The name of a Host header without its port ("[::1]:8080" -> "::1")."""
    header = header.strip()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def check_bind(host: str, token: str | None) -> None:
    """ConfigError unless the dashboard may listen on `host`: a loopback address, or any other
    with a token (its pages show job data, errors and tracebacks, read-only or not)."""
    if not host:
        raise ConfigError("--host must not be empty")
    if token is not None and len(token) < 16:
        raise ConfigError("the dashboard token must be at least 16 characters")
    if not is_loopback(host) and token is None:
        raise ConfigError(
            f"refusing to serve the dashboard on {host} without a token: anyone who reaches it "
            "would see job data and tracebacks; give --token (or $QUEASY_DASHBOARD_TOKEN), "
            "or keep the default --host 127.0.0.1 behind an SSH tunnel or a proxy"
        )


class Guard:
    """The checks of one dashboard process: its token (None: none) and a random secret that
    signs its cookies (a restart makes them invalid)."""

    def __init__(self, token: str | None) -> None:
        self.token = token
        self.secret = secrets.token_bytes(32)

    def _sign(self, what: str, value: str) -> str:
        mac = hmac.new(self.secret, f"{what}:{value}".encode(), hashlib.sha256)
        return mac.hexdigest()

    # ------------------------------------------------------------------ who may read

    def auth_cookie(self) -> str:
        """The value of the cookie that stands for the token (never the token itself)."""
        assert self.token is not None
        return self._sign("auth", self.token)

    def token_matches(self, given: str | None) -> bool:
        if self.token is None or not given:
            return False
        return hmac.compare_digest(given.encode(), self.token.encode())

    def authorized(self, headers: Mapping[str, str], cookies: Mapping[str, str]) -> bool:
        """Whether a request may be answered: no token needed, or it carries the token (a
        header) or the cookie the token set."""
        if self.token is None:
            return True
        cookie = cookies.get(AUTH_COOKIE)
        if cookie and hmac.compare_digest(cookie.encode(), self.auth_cookie().encode()):
            return True
        scheme, _, value = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer":
            return self.token_matches(value.strip())
        if scheme.lower() == "basic":
            try:
                decoded = base64.b64decode(value.strip(), validate=True).decode()
            except ValueError:
                return False
            return self.token_matches(decoded.partition(":")[2])
        return False

    def host_allowed(self, host_header: str) -> bool:
        """Without a token only loopback Host names are answered (DNS rebinding)."""
        return self.token is not None or is_loopback(host_name(host_header))

    # ------------------------------------------------------------------ what a form may do

    @staticmethod
    def new_csrf_cookie() -> str:
        return secrets.token_urlsafe(24)

    def csrf_token(self, cookie: str) -> str:
        """The token a form of a browser with this CSRF cookie carries."""
        return self._sign("csrf", cookie)

    def csrf_ok(self, cookie: str | None, token: str | None) -> bool:
        if not cookie or not token:
            return False
        return hmac.compare_digest(token.encode(), self.csrf_token(cookie).encode())

    @staticmethod
    def origin_ok(origin: str | None, scheme: str, host: str) -> bool:
        """A POST's Origin, when the browser sends one, must be the dashboard's own."""
        return origin is None or origin == f"{scheme}://{host}"
