"""Client side of MySQL/MariaDB authentication as a sans-I/O state machine: the server's auth packets in, the next
packet to send (or "done") out. Plugins: mysql_native_password, caching_sha2_password, sha256_password,
client_ed25519 (MariaDB) and mysql_clear_password (TLS only); AuthSwitchRequest to any of them.

The password never appears in a repr, a log line or an exception message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from pymysql import _auth as pymysql_auth

from .handshake import HandshakeV10
from .errors import CR_AUTH_PLUGIN_CANNOT_LOAD, CR_AUTH_PLUGIN_ERR
from .packets import EOF_HEADER, ERR_HEADER, OK_HEADER, MySQLError, OkPacket, ProtocolError, parse_err, parse_ok

AUTH_MORE_DATA = 0x01
AUTH_SWITCH_REQUEST = EOF_HEADER
SCRAMBLE_LENGTH = 20
ED25519_NONCE_LENGTH = 32

# caching_sha2_password AuthMoreData codes and the client's public-key requests (sql/auth/sha2_password.cc).
CACHING_SHA2_FAST_AUTH_SUCCESS = 0x03
CACHING_SHA2_PERFORM_FULL_AUTH = 0x04
CACHING_SHA2_REQUEST_PUBLIC_KEY = b"\x02"
SHA256_REQUEST_PUBLIC_KEY = b"\x01"
# OAEP padding takes 41 bytes of the modulus; MySQL's client refuses longer passwords the same way.
_OAEP_OVERHEAD = 41


class AuthenticationError(MySQLError):
    """Authentication cannot proceed on the client side: unsupported plugin, secure transport or key missing.

    (A wrong password is the server's ERR 1045, raised as a plain MySQLError.)"""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code, "HY000", message)


# -- what the state machine asks the caller to do ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SendAuthData:
    """Write `data` as the next packet (sequence id: one after the server's last packet)."""

    # Not in the repr: depending on the plugin this is a cleartext password.
    data: bytes = field(repr=False)


@dataclass(frozen=True, slots=True)
class AwaitServer:
    """Nothing to send: read the server's next packet (e.g. the OK after caching_sha2's fast-auth success)."""


@dataclass(frozen=True, slots=True)
class AuthSucceeded:
    """The server accepted us; the connection is in the command phase."""

    ok: OkPacket


AuthStep = SendAuthData | AwaitServer | AuthSucceeded
AWAIT_SERVER = AwaitServer()


# -- plugins -----------------------------------------------------------------------------------------------------


class _Credentials:
    """What the plugins need to know about this connection. Keeps the password out of every repr."""

    __slots__ = ("password", "request_public_key", "secure", "server_public_key")

    def __init__(
        self, password: bytes, secure: bool, server_public_key: bytes | None, request_public_key: bool
    ) -> None:
        self.password = password
        self.secure = secure
        self.server_public_key = server_public_key
        self.request_public_key = request_public_key

    def __repr__(self) -> str:
        return f"<credentials secure={self.secure} public_key={'yes' if self.server_public_key else 'no'}>"


class _Plugin:
    """One authentication method: `start` answers the plugin's first data (greeting scramble or AuthSwitchRequest
    data), `more_data` answers an AuthMoreData packet (None: nothing to send, wait for the server)."""

    name: ClassVar[str]

    def __init__(self, creds: _Credentials) -> None:
        self.creds = creds

    def start(self, data: bytes) -> bytes:
        raise NotImplementedError

    def more_data(self, data: bytes) -> bytes | None:
        raise ProtocolError(f"{self.name}: unexpected AuthMoreData packet ({len(data)} bytes) from the server")


def _scramble20(plugin: str, data: bytes) -> bytes:
    # Servers send the 20-byte scramble plus a NUL (21 bytes); a MySQL client insists on at least the 20.
    if len(data) < SCRAMBLE_LENGTH:
        raise ProtocolError(f"{plugin}: server scramble is {len(data)} bytes, {SCRAMBLE_LENGTH} expected")
    return data[:SCRAMBLE_LENGTH]


def _rsa_encrypt(plugin: str, password: bytes, scramble: bytes, pem: bytes) -> bytes:
    """RSA-OAEP(SHA-1) of (password + NUL) XOR scramble, as sha256_password and caching_sha2_password expect."""
    try:
        key = serialization.load_pem_public_key(pem)
    except (ValueError, UnsupportedAlgorithm):
        raise AuthenticationError(CR_AUTH_PLUGIN_ERR, f"{plugin}: the server's public key is not a PEM key") from None
    if not isinstance(key, rsa.RSAPublicKey):
        raise AuthenticationError(CR_AUTH_PLUGIN_ERR, f"{plugin}: the server's public key is not an RSA key")
    if len(password) + 1 + _OAEP_OVERHEAD >= key.key_size // 8:
        raise AuthenticationError(
            CR_AUTH_PLUGIN_ERR, f"{plugin}: password too long to encrypt with a {key.key_size}-bit RSA key"
        )
    # PyMySQL's helper does exactly the client's xor_string (NUL included) + OAEP/MGF1 with SHA-1.
    encrypted: bytes = pymysql_auth.sha2_rsa_encrypt(password, scramble, pem)
    return encrypted


class _NativePassword(_Plugin):
    name = "mysql_native_password"

    def start(self, data: bytes) -> bytes:
        scramble = _scramble20(self.name, data)
        if not self.creds.password:
            return b""
        response: bytes = pymysql_auth.scramble_native_password(self.creds.password, scramble)
        return response


class _Sha256Password(_Plugin):
    """sha256_password: cleartext over TLS, else RSA with a configured or requested public key."""

    name = "sha256_password"
    request_key = SHA256_REQUEST_PUBLIC_KEY

    def __init__(self, creds: _Credentials) -> None:
        super().__init__(creds)
        self.scramble = b""
        self.awaiting_key = False

    def start(self, data: bytes) -> bytes:
        self.scramble = _scramble20(self.name, data)
        if not self.creds.password:
            return b"\0"
        return self.send_password()

    def send_password(self) -> bytes:
        creds = self.creds
        if creds.secure:
            return creds.password + b"\0"
        if creds.server_public_key:
            return _rsa_encrypt(self.name, creds.password, self.scramble, creds.server_public_key)
        if not creds.request_public_key:
            raise AuthenticationError(
                CR_AUTH_PLUGIN_ERR,
                f"{self.name}: authentication requires a secure connection (TLS) or the server's RSA public key "
                "(server_public_key), and requesting the key from the server is disabled",
            )
        self.awaiting_key = True
        return self.request_key

    def more_data(self, data: bytes) -> bytes | None:
        if not self.awaiting_key:
            return super().more_data(data)
        self.awaiting_key = False
        return _rsa_encrypt(self.name, self.creds.password, self.scramble, data)


class _CachingSha2Password(_Sha256Password):
    """caching_sha2_password: SHA-256 scramble first; the server answers fast-auth success (0x03, then OK) or
    perform-full-auth (0x04), after which the password goes as sha256_password would send it."""

    name = "caching_sha2_password"
    request_key = CACHING_SHA2_REQUEST_PUBLIC_KEY

    def __init__(self, creds: _Credentials) -> None:
        super().__init__(creds)
        self.fast_auth_answered = False

    def start(self, data: bytes) -> bytes:
        self.scramble = _scramble20(self.name, data)
        if not self.creds.password:
            return b"\0"  # what libmysqlclient sends; the server takes it (or an empty packet) as "no password"
        response: bytes = pymysql_auth.scramble_caching_sha2(self.creds.password, self.scramble)
        return response

    def more_data(self, data: bytes) -> bytes | None:
        if self.awaiting_key:
            return super().more_data(data)
        if self.fast_auth_answered or len(data) != 1:
            return _Plugin.more_data(self, data)
        self.fast_auth_answered = True
        if data[0] == CACHING_SHA2_FAST_AUTH_SUCCESS:
            return None
        if data[0] == CACHING_SHA2_PERFORM_FULL_AUTH:
            return self.send_password()
        raise ProtocolError(f"{self.name}: unknown fast-auth result 0x{data[0]:02x}")


class _Ed25519(_Plugin):
    """MariaDB client_ed25519: sign the server's 32-byte nonce with a key derived from SHA-512(password)."""

    name = "client_ed25519"

    def start(self, data: bytes) -> bytes:
        if len(data) != ED25519_NONCE_LENGTH:
            raise ProtocolError(f"{self.name}: nonce is {len(data)} bytes, {ED25519_NONCE_LENGTH} expected")
        try:
            import nacl.bindings  # noqa: F401  (PyMySQL's ed25519_password needs it)
        except ImportError:
            raise AuthenticationError(
                CR_AUTH_PLUGIN_CANNOT_LOAD, f"{self.name}: needs the PyNaCl package (pip install pynacl)"
            ) from None
        signature: bytes = pymysql_auth.ed25519_password(self.creds.password, data)
        return signature


class _ClearPassword(_Plugin):
    """mysql_clear_password (PAM, LDAP): the password itself, so only over TLS."""

    name = "mysql_clear_password"

    def start(self, data: bytes) -> bytes:
        if not self.creds.secure:
            raise AuthenticationError(
                CR_AUTH_PLUGIN_ERR, f"{self.name}: refusing to send a cleartext password without TLS"
            )
        return self.creds.password + b"\0"


PLUGINS: dict[str, type[_Plugin]] = {
    plugin.name: plugin for plugin in (_NativePassword, _CachingSha2Password, _Sha256Password, _Ed25519, _ClearPassword)
}
# Plugins that can answer the 20-byte greeting scramble directly, saving a round trip when the server defaults to them.
_GREETING_PLUGINS = ("mysql_native_password", "caching_sha2_password", "sha256_password")


# -- the state machine -------------------------------------------------------------------------------------------


class ClientAuthentication:
    """Authenticates one connection.

    Call `initial_response(handshake)` for the plugin name and data of the HandshakeResponse41, then `receive()`
    every packet the server sends until it returns AuthSucceeded. `receive` raises the server's MySQLError for an
    ERR packet (1045 for a wrong password), AuthenticationError when the client cannot go on, ProtocolError for a
    packet that makes no sense.

    `secure` says the transport is TLS (cleartext passwords allowed). Without it, sha256/caching_sha2 full
    authentication encrypts the password with `server_public_key` (PEM) or, if `request_public_key`, with a key
    requested from the server -- which a man in the middle could substitute, hence the switch.
    """

    def __init__(
        self,
        password: str | bytes,
        *,
        secure: bool,
        server_public_key: bytes | None = None,
        request_public_key: bool = True,
    ) -> None:
        raw = password.encode("utf-8") if isinstance(password, str) else bytes(password)
        self._creds = _Credentials(raw, secure, server_public_key, request_public_key)
        self._plugin: _Plugin | None = None
        self._done = False
        self._switches = 0

    def __repr__(self) -> str:
        plugin = self._plugin.name if self._plugin else None
        return f"<ClientAuthentication plugin={plugin} done={self._done} {self._creds!r}>"

    @property
    def plugin_name(self) -> str | None:
        """The plugin in use (after initial_response / an AuthSwitchRequest)."""
        return self._plugin.name if self._plugin else None

    @property
    def done(self) -> bool:
        return self._done

    def initial_response(self, handshake: HandshakeV10) -> tuple[str, bytes]:
        """(plugin name, auth response) for the HandshakeResponse41.

        The server's default plugin is used when it can answer the greeting scramble; otherwise (e.g. a server
        defaulting to client_ed25519, whose nonce only comes in an AuthSwitchRequest) mysql_native_password, and
        the server switches us to the account's plugin."""
        if self._plugin is not None:
            raise RuntimeError("initial_response() called twice")
        name = handshake.auth_plugin_name
        if name not in _GREETING_PLUGINS:
            name = "mysql_native_password"
        self._plugin = PLUGINS[name](self._creds)
        return name, self._plugin.start(handshake.auth_plugin_data)

    def receive(self, payload: bytes) -> AuthStep:
        """The step after the server's packet `payload`."""
        if self._done:
            raise ProtocolError("authentication packet after authentication succeeded")
        if self._plugin is None:
            raise RuntimeError("initial_response() must come first")
        if not payload:
            raise ProtocolError("empty packet during authentication")
        header = payload[0]
        if header == OK_HEADER:
            ok = parse_ok(payload)
            self._done = True
            return AuthSucceeded(ok)
        if header == ERR_HEADER:
            self._done = True
            raise parse_err(payload)
        if header == AUTH_SWITCH_REQUEST:
            return SendAuthData(self._switch(bytes(payload)))
        if header == AUTH_MORE_DATA:
            reply = self._plugin.more_data(bytes(payload[1:]))
            return AWAIT_SERVER if reply is None else SendAuthData(reply)
        raise ProtocolError(f"unexpected packet 0x{header:02x} ({len(payload)} bytes) during authentication")

    def _switch(self, payload: bytes) -> bytes:
        if len(payload) == 1:
            # A bare 0xFE asks for the pre-4.1 scramble (mysql_old_password), broken since 2004.
            raise AuthenticationError(
                CR_AUTH_PLUGIN_CANNOT_LOAD, "server asked for mysql_old_password, which is insecure and not supported"
            )
        self._switches += 1
        if self._switches > 4:
            raise ProtocolError("server switched authentication plugins more than 4 times")
        end = payload.find(b"\0", 1)
        if end < 0:
            raise ProtocolError("AuthSwitchRequest without a NUL after the plugin name")
        name = payload[1:end].decode("ascii", "replace")
        plugin_class = PLUGINS.get(name)
        if plugin_class is None:
            raise AuthenticationError(
                CR_AUTH_PLUGIN_CANNOT_LOAD,
                f"server asked for authentication plugin {name!r}, which this client does not support "
                f"(supported: {', '.join(PLUGINS)})",
            )
        self._plugin = plugin_class(self._creds)
        return self._plugin.start(payload[end + 1 :])
