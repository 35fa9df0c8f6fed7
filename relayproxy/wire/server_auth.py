"""Server side of the connection phase, sans-I/O: the HandshakeV10 greeting, parsing the client's SSLRequest /
HandshakeResponse41, and authentication against the relay's accounts (mysql_native_password, caching_sha2_password
with its fast path, full authentication over TLS and with the RSA key), AuthSwitchRequest included
(protocol-reference §3.2-3.4).

Passwords never appear in a repr, a log line or an error message; the ERR a client gets for a failed login is
MySQL's 1045 whatever the reason (wrong password, unknown user, TLS required), so that it tells an attacker
nothing, while `AuthRejected.reason` tells the operator's log what happened.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from .accounts import CACHING_SHA2_PASSWORD, NATIVE_PASSWORD, DownstreamUser, find_user
from .auth import (
    AUTH_MORE_DATA,
    AUTH_SWITCH_REQUEST,
    CACHING_SHA2_FAST_AUTH_SUCCESS,
    CACHING_SHA2_PERFORM_FULL_AUTH,
    CACHING_SHA2_REQUEST_PUBLIC_KEY,
    SCRAMBLE_LENGTH,
)
from .errors import ER_ACCESS_DENIED_ERROR, ER_HANDSHAKE_ERROR, ER_NOT_SUPPORTED_AUTH_MODE
from .handshake import MARIADB_VERSION_PREFIX, PROTOCOL_VERSION
from .packets import (
    CHARSET_UTF8MB4_GENERAL_CI,
    CLIENT_CONNECT_ATTRS,
    CLIENT_CONNECT_WITH_DB,
    CLIENT_DEPRECATE_EOF,
    CLIENT_FOUND_ROWS,
    CLIENT_IGNORE_SIGPIPE,
    CLIENT_IGNORE_SPACE,
    CLIENT_INTERACTIVE,
    CLIENT_LONG_FLAG,
    CLIENT_LONG_PASSWORD,
    CLIENT_MULTI_RESULTS,
    CLIENT_PLUGIN_AUTH,
    CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA,
    CLIENT_PROTOCOL_41,
    CLIENT_PS_MULTI_RESULTS,
    CLIENT_RESERVED,
    CLIENT_SECURE_CONNECTION,
    CLIENT_SSL,
    CLIENT_TRANSACTIONS,
    SERVER_STATUS_AUTOCOMMIT,
    MySQLError,
    ProtocolError,
    read_lenenc_bytes,
    read_lenenc_int,
)
from .results import ErrorResponse

# utf8mb4_0900_ai_ci: what a MySQL 8 server announces.
CHARSET_UTF8MB4_0900_AI_CI = 255

SSL_REQUEST_LENGTH = 32
_RESPONSE_HEAD = struct.Struct("<IIB23s")
_GREETING_HEAD = struct.Struct("<I8sBHBHHB10s")
_MAJOR = re.compile(r"(\d+)\.")

# Capabilities the relay offers. Not offered, on purpose: COMPRESS (a replica does not need it), LOCAL_FILES and
# MULTI_STATEMENTS (attack surface, and the SQL layer answers one statement at a time), SESSION_TRACK (changes the
# OK packet layout for no benefit here), QUERY_ATTRIBUTES and OPTIONAL_RESULTSET_METADATA (change COM_QUERY and
# result set layouts). MULTI_RESULTS is offered because libmysqlclient always asks for it; we never send more
# than one result.
BASE_CAPABILITIES = (
    CLIENT_LONG_PASSWORD
    | CLIENT_FOUND_ROWS
    | CLIENT_LONG_FLAG
    | CLIENT_CONNECT_WITH_DB
    | CLIENT_IGNORE_SPACE
    | CLIENT_PROTOCOL_41
    | CLIENT_INTERACTIVE
    | CLIENT_IGNORE_SIGPIPE
    | CLIENT_TRANSACTIONS
    | CLIENT_RESERVED
    | CLIENT_SECURE_CONNECTION
    | CLIENT_MULTI_RESULTS
    | CLIENT_PS_MULTI_RESULTS
    | CLIENT_PLUGIN_AUTH
    | CLIENT_CONNECT_ATTRS
    | CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA
    | CLIENT_DEPRECATE_EOF
)
# Flags that decide how the client lays out its HandshakeResponse41: read it with client & server flags, as the
# client writes it with what both sides support.
_LAYOUT_FLAGS = (
    CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA
    | CLIENT_SECURE_CONNECTION
    | CLIENT_CONNECT_WITH_DB
    | CLIENT_PLUGIN_AUTH
    | CLIENT_CONNECT_ATTRS
)


class HandshakeError(MySQLError):
    """The client's handshake packet is malformed or asks for something we cannot do: MySQL's ER_HANDSHAKE_ERROR
    1043 "Bad handshake", with what was wrong appended."""

    def __init__(self, detail: str) -> None:
        super().__init__(ER_HANDSHAKE_ERROR, "08S01", f"Bad handshake: {detail}")


# -- greeting -----------------------------------------------------------------------------------------------------


def generate_scramble() -> bytes:
    """20 random bytes for the greeting, drawn like MySQL's generate_user_salt: 7-bit, never NUL (clients treat the
    scramble as a C string in places) and never '$' (the separator of MySQL's stored sha2 hashes)."""
    alphabet = bytes(b for b in range(1, 128) if b != ord("$"))
    return bytes(secrets.choice(alphabet) for _ in range(SCRAMBLE_LENGTH))


def server_capabilities(*, tls: bool) -> int:
    """What the greeting offers: BASE_CAPABILITIES, plus CLIENT_SSL when a TLS certificate is configured."""
    return BASE_CAPABILITIES | (CLIENT_SSL if tls else 0)


def default_auth_plugin(flavour: str) -> str:
    """The greeting's plugin: caching_sha2_password like a MySQL 8 server, mysql_native_password like MariaDB (a
    MariaDB replica answers it without an extra round trip; AuthSwitchRequest covers other accounts)."""
    return NATIVE_PASSWORD if flavour == "mariadb" else CACHING_SHA2_PASSWORD


def greeting_version(version: str, flavour: str) -> str:
    """The version string to announce. A MariaDB >= 10 master announces "5.5.5-10.x.y-MariaDB..." (RPL_VERSION_HACK)
    so that old replicas, which read the major version from the first digit, do not take it for MySQL 1.x; MariaDB
    client libraries strip the prefix again. MySQL versions go as they are."""
    match = _MAJOR.match(version)
    if (
        flavour == "mariadb"
        and not version.startswith(MARIADB_VERSION_PREFIX)
        and match is not None
        and int(match.group(1)) >= 10
    ):
        return MARIADB_VERSION_PREFIX + version
    return version


def greeting_charset(version: str, flavour: str) -> int:
    """utf8mb4_0900_ai_ci (255) for MySQL 8+, like the real server; utf8mb4_general_ci (45) otherwise, which every
    client knows. Clients pick their own character set in the response anyway."""
    match = _MAJOR.match(version)
    if flavour == "mysql" and match is not None and int(match.group(1)) >= 8:
        return CHARSET_UTF8MB4_0900_AI_CI
    return CHARSET_UTF8MB4_GENERAL_CI


def build_greeting(
    *,
    server_version: str,
    connection_id: int,
    scramble: bytes,
    capabilities: int,
    auth_plugin: str,
    charset: int = CHARSET_UTF8MB4_GENERAL_CI,
    status: int = SERVER_STATUS_AUTOCOMMIT,
) -> bytes:
    """The HandshakeV10 payload (protocol-reference §3.2). CLIENT_LONG_PASSWORD stays set, so MariaDB clients do
    not look for extended capabilities in the reserved bytes (we have none to offer)."""
    if len(scramble) != SCRAMBLE_LENGTH:
        raise ValueError(f"the scramble must be {SCRAMBLE_LENGTH} bytes, got {len(scramble)}")
    version = server_version.encode("utf-8")
    if b"\0" in version:
        raise ValueError("server version contains a NUL byte")
    head = _GREETING_HEAD.pack(
        connection_id & 0xFFFFFFFF,
        scramble[:8],
        0,  # filler
        capabilities & 0xFFFF,
        charset & 0xFF,
        status & 0xFFFF,
        (capabilities >> 16) & 0xFFFF,
        SCRAMBLE_LENGTH + 1,  # auth-plugin-data length, the NUL included
        b"\0" * 10,
    )
    return b"".join(
        (bytes((PROTOCOL_VERSION,)), version, b"\0", head, scramble[8:], b"\0", auth_plugin.encode("ascii"), b"\0")
    )


# -- the client's answer ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SslRequest:
    """The client wants TLS: the TLS handshake follows, then the full HandshakeResponse41."""

    capabilities: int
    max_packet: int
    charset: int


@dataclass(frozen=True, slots=True)
class HandshakeResponse:
    """A parsed HandshakeResponse41. `capabilities` are the client's own flags (negotiation is the caller's
    business); `auth_plugin` is None when the client did not name one (no CLIENT_PLUGIN_AUTH)."""

    capabilities: int
    max_packet: int
    charset: int
    user: str
    # Not in the repr: for mysql_clear_password-style clients it could be the password itself.
    auth_response: bytes = field(repr=False)
    database: str | None = None
    auth_plugin: str | None = None
    connect_attrs: dict[str, str] = field(default_factory=dict)
    mariadb_capabilities: int = 0


def parse_handshake_response(payload: bytes, server_caps: int) -> SslRequest | HandshakeResponse:
    """Parse the client's first packet (protocol-reference §3.3), laid out per client & `server_caps`.

    Raises HandshakeError (1043) naming what is wrong: too short, pre-4.1 client, truncated fields."""
    payload = bytes(payload)
    if len(payload) < SSL_REQUEST_LENGTH:
        raise HandshakeError(f"the client's handshake response is {len(payload)} bytes, at least 32 expected")
    caps, max_packet, charset, filler = _RESPONSE_HEAD.unpack_from(payload)
    if not caps & CLIENT_PROTOCOL_41:
        raise HandshakeError("the client does not speak protocol 4.1 (CLIENT_PROTOCOL_41), which is required")
    if len(payload) == SSL_REQUEST_LENGTH and caps & CLIENT_SSL:
        return SslRequest(caps, max_packet, charset)
    layout = caps & (server_caps | ~_LAYOUT_FLAGS)
    pos = SSL_REQUEST_LENGTH
    end = payload.find(b"\0", pos)
    if end < 0:
        raise HandshakeError("the user name in the handshake response has no NUL terminator")
    user = payload[pos:end].decode("utf-8", "replace")
    pos = end + 1
    try:
        if layout & CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA:
            auth_response, pos = read_lenenc_bytes(payload, pos)
        elif layout & CLIENT_SECURE_CONNECTION:
            if pos >= len(payload):
                raise ProtocolError("missing auth response length")
            length = payload[pos]
            auth_response = payload[pos + 1 : pos + 1 + length]
            if len(auth_response) != length:
                raise ProtocolError("auth response runs past the packet end")
            pos += 1 + length
        else:
            end = payload.find(b"\0", pos)
            end = len(payload) if end < 0 else end
            auth_response, pos = payload[pos:end], end + 1
    except ProtocolError as exc:
        raise HandshakeError(f"truncated auth response for user {user!r} ({exc.message})") from None
    database = None
    if layout & CLIENT_CONNECT_WITH_DB and pos < len(payload):
        end = payload.find(b"\0", pos)
        end = len(payload) if end < 0 else end
        database = payload[pos:end].decode("utf-8", "replace") or None
        pos = end + 1
    plugin = None
    if layout & CLIENT_PLUGIN_AUTH and pos < len(payload):
        # Some clients omit the NUL after the last field; take what is there.
        end = payload.find(b"\0", pos)
        end = len(payload) if end < 0 else end
        plugin = payload[pos:end].decode("ascii", "replace") or None
        pos = end + 1
    attrs: dict[str, str] = {}
    if layout & CLIENT_CONNECT_ATTRS and pos < len(payload):
        attrs = _parse_connect_attrs(payload, pos, user)
    return HandshakeResponse(
        capabilities=caps,
        max_packet=max_packet,
        charset=charset,
        user=user,
        auth_response=auth_response,
        database=database,
        auth_plugin=plugin,
        connect_attrs=attrs,
        mariadb_capabilities=int.from_bytes(filler[19:23], "little"),
    )


def _parse_connect_attrs(payload: bytes, pos: int, user: str) -> dict[str, str]:
    try:
        total, pos = read_lenenc_int(payload, pos)
        end = pos + total
        if end > len(payload):
            raise ProtocolError(f"{total} bytes announced, {len(payload) - pos} present")
        attrs: dict[str, str] = {}
        while pos < end:
            key, pos = read_lenenc_bytes(payload, pos)
            value, pos = read_lenenc_bytes(payload, pos)
            if pos > end:
                raise ProtocolError("an attribute runs past the attributes' announced length")
            attrs[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    except ProtocolError as exc:
        raise HandshakeError(f"malformed connection attributes from user {user!r}: {exc.message}") from None
    return attrs


# -- RSA key for caching_sha2_password full authentication without TLS ---------------------------------------------


class RsaKeyPair:
    """The server's RSA key: its public half goes to clients that ask (0x02), the private half decrypts the
    password they send back. Generated at start-up unless a PEM private key file is configured, like MySQL's
    caching_sha2_password_auto_generate_rsa_keys."""

    def __init__(self, private_key: rsa.RSAPrivateKey) -> None:
        self._key = private_key
        self.public_pem: bytes = private_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def __repr__(self) -> str:
        return f"<RsaKeyPair {self._key.key_size} bits>"

    @classmethod
    def generate(cls, bits: int = 2048) -> RsaKeyPair:
        return cls(rsa.generate_private_key(public_exponent=65537, key_size=bits))

    @classmethod
    def from_pem(cls, pem: bytes, password: bytes | None = None) -> RsaKeyPair:
        key = serialization.load_pem_private_key(pem, password=password)
        if not isinstance(key, rsa.RSAPrivateKey):
            raise ValueError(f"the key is a {type(key).__name__}, an RSA private key is needed")
        return cls(key)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> RsaKeyPair:
        """Load a PEM private key; ValueError naming the file when it is unreadable or not an RSA key."""
        try:
            return cls.from_pem(Path(path).read_bytes())
        except OSError as exc:
            raise ValueError(f"cannot read RSA private key file {os.fspath(path)!r}: {exc.strerror or exc}") from None
        except (ValueError, TypeError) as exc:
            raise ValueError(f"RSA private key file {os.fspath(path)!r}: {exc}") from None

    @property
    def ciphertext_length(self) -> int:
        return (self._key.key_size + 7) // 8

    def decrypt(self, ciphertext: bytes) -> bytes:
        """RSA-OAEP with SHA-1 and MGF1/SHA-1, what MySQL clients use; ValueError when it does not decrypt."""
        return self._key.decrypt(
            ciphertext, padding.OAEP(mgf=padding.MGF1(algorithm=hashes.SHA1()), algorithm=hashes.SHA1(), label=None)
        )


# -- password checks ----------------------------------------------------------------------------------------------


def _xor(data: bytes, key: bytes) -> bytes:
    return bytes(a ^ key[i % len(key)] for i, a in enumerate(data))


def native_password_stage2(password: str) -> bytes:
    """SHA1(SHA1(password)): what MySQL stores for mysql_native_password."""
    return hashlib.sha1(hashlib.sha1(password.encode("utf-8")).digest()).digest()


def sha2_password_stage2(password: str) -> bytes:
    """SHA256(SHA256(password)): what caching_sha2_password keeps in its fast-auth cache."""
    return hashlib.sha256(hashlib.sha256(password.encode("utf-8")).digest()).digest()


def verify_native_password(response: bytes, scramble: bytes, password: str) -> bool:
    """The client sent SHA1(pw) XOR SHA1(scramble + SHA1(SHA1(pw))); an empty response means no password."""
    if not response:
        return password == ""
    if len(response) != 20 or not password:
        return False
    stored = native_password_stage2(password)
    candidate = _xor(response, hashlib.sha1(scramble + stored).digest())
    return hmac.compare_digest(hashlib.sha1(candidate).digest(), stored)


def verify_sha2_scramble(response: bytes, scramble: bytes, stage2: bytes) -> bool:
    """The client sent SHA256(pw) XOR SHA256(SHA256(SHA256(pw)) + scramble)."""
    if len(response) != 32:
        return False
    candidate = _xor(response, hashlib.sha256(stage2 + scramble).digest())
    return hmac.compare_digest(hashlib.sha256(candidate).digest(), stage2)


def _same_password(received: bytes, password: str) -> bool:
    return hmac.compare_digest(received, password.encode("utf-8"))


class Sha2Cache:
    """caching_sha2_password's cache: SHA256(SHA256(password)) of accounts that completed full authentication since
    start-up, which lets their next logins take the fast path. An entry only counts while it matches the account's
    current password, so a changed password falls back to full authentication as in MySQL."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], bytes] = {}

    def __repr__(self) -> str:
        return f"<Sha2Cache {len(self._entries)} accounts>"

    def __len__(self) -> int:
        return len(self._entries)

    def remember(self, user: DownstreamUser) -> None:
        self._entries[(user.name, user.host)] = sha2_password_stage2(user.password)

    def lookup(self, user: DownstreamUser) -> bytes | None:
        """The cached digest, if there is one and it is still the account's password."""
        cached = self._entries.get((user.name, user.host))
        if cached is None:
            return None
        if not hmac.compare_digest(cached, sha2_password_stage2(user.password)):
            del self._entries[(user.name, user.host)]
            return None
        return cached

    def forget(self, name: str | None = None) -> None:
        """Drop one account's entries (all when name is None), e.g. after its password changed."""
        if name is None:
            self._entries.clear()
        else:
            for key in [k for k in self._entries if k[0] == name]:
                del self._entries[key]


# -- the state machine --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SendAuthPackets:
    """Send these payloads (in order, consecutive sequence ids), then feed the client's next packet to receive()."""

    packets: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class AuthAccepted:
    """Authentication succeeded: send `packets` (e.g. caching_sha2's fast-auth success), then an OK packet."""

    user: DownstreamUser
    plugin: str
    packets: tuple[bytes, ...] = ()


@dataclass(frozen=True, slots=True)
class AuthRejected:
    """Send `error` and close. `reason` is for the server's log only: the client sees MySQL's terse 1045."""

    error: ErrorResponse
    reason: str


AuthStep = SendAuthPackets | AuthAccepted | AuthRejected

_FAST_AUTH_SUCCESS = bytes((AUTH_MORE_DATA, CACHING_SHA2_FAST_AUTH_SUCCESS))
_PERFORM_FULL_AUTH = bytes((AUTH_MORE_DATA, CACHING_SHA2_PERFORM_FULL_AUTH))


class ServerAuthentication:
    """Authenticates one client against the relay's accounts.

    `start(response)` takes the HandshakeResponse41, `receive(payload)` every later client packet; both return
    the next step. The flow follows MySQL's server:

    * the account's plugin decides; a client that answered the greeting with another plugin gets an
      AuthSwitchRequest (same scramble);
    * mysql_native_password: one SHA1 scramble check;
    * caching_sha2_password: the 32-byte scramble is checked against the fast-auth cache (hit: 0x01 0x03, OK);
      otherwise 0x01 0x04 asks for full authentication: over TLS the client sends the password in clear, else it
      asks for the RSA public key (0x02) and sends the password RSA-OAEP-encrypted, XORed with the scramble;
      success puts the account in the cache;
    * an unknown user (or one not allowed from this host) goes through the same steps with a random password, so
      the replies do not reveal which accounts exist; it always ends in 1045;
    * an account with tls="required" connecting without TLS is refused after its password checked out, with
      1045, as MySQL does for an account created with REQUIRE SSL (3159 is MySQL's answer to the server-wide
      require_secure_transport, which the relay does not have).
    """

    def __init__(
        self,
        users: Iterable[DownstreamUser] | Callable[[str, str], DownstreamUser | None],
        *,
        scramble: bytes,
        client_host: str,
        secure: bool,
        rsa_key: RsaKeyPair,
        sha2_cache: Sha2Cache,
        default_plugin: str = CACHING_SHA2_PASSWORD,
    ) -> None:
        self.default_plugin = default_plugin  # for users configured with plugin "auto"
        self._lookup = users if callable(users) else _lookup_in(list(users))
        self.scramble = scramble
        self.client_host = client_host
        self.secure = secure
        self._rsa = rsa_key
        self._cache = sha2_cache
        self._user: DownstreamUser | None = None
        self._known = False
        self._user_name = ""
        self._plugin = ""
        self._state = "start"
        self._password_used = False

    def __repr__(self) -> str:
        return f"<ServerAuthentication user={self._user_name!r} plugin={self._plugin!r} state={self._state}>"

    @property
    def user_name(self) -> str:
        return self._user_name

    @property
    def plugin(self) -> str:
        """The plugin in use (after start())."""
        return self._plugin

    @property
    def done(self) -> bool:
        return self._state == "done"

    def start(self, response: HandshakeResponse) -> AuthStep:
        if self._state != "start":
            raise RuntimeError("start() called twice")
        self._user_name = response.user
        user = self._lookup(response.user, self.client_host)
        self._known = user is not None
        # An unknown account gets a throwaway one with a password nobody knows: the same exchange, then 1045.
        # Same plugin as real accounts get by default, so the exchange does not reveal that the account is unknown.
        # Its name is a placeholder: the client's may be one no account could have (over 255 bytes), and
        # the 1045 quotes the name the client sent, not this one.
        self._user = user or DownstreamUser("?", secrets.token_urlsafe(24), self.default_plugin)
        # "auto": what a master of the relay's flavour uses (MariaDB replicas cannot do caching_sha2_password).
        self._plugin = self._user.plugin if self._user.plugin != "auto" else self.default_plugin
        client_plugin = response.auth_plugin
        if client_plugin is None and response.capabilities & CLIENT_SECURE_CONNECTION:
            client_plugin = NATIVE_PASSWORD  # a 4.1 client without plugin support answers with the SHA1 scramble
        if client_plugin == self._plugin:
            return self._check(response.auth_response)
        if not response.capabilities & CLIENT_PLUGIN_AUTH:
            self._state = "done"
            return AuthRejected(
                ErrorResponse(
                    ER_NOT_SUPPORTED_AUTH_MODE,
                    "08004",
                    "Client does not support authentication protocol requested by server; consider upgrading "
                    "MySQL client",
                ),
                f"account needs {self._plugin}, the client cannot switch plugins (no CLIENT_PLUGIN_AUTH)",
            )
        self._state = "switched"
        switch = bytes((AUTH_SWITCH_REQUEST,)) + self._plugin.encode("ascii") + b"\0" + self.scramble + b"\0"
        return SendAuthPackets((switch,))

    def receive(self, payload: bytes) -> AuthStep:
        state = self._state
        payload = bytes(payload)
        if state == "switched":
            return self._check(payload)
        if state == "full_auth":
            return self._full_auth(payload)
        if state == "awaiting_rsa":
            return self._rsa_password(payload)
        raise RuntimeError(f"receive() in state {state}")

    # -- plugins -------------------------------------------------------------------------------------------------

    def _check(self, data: bytes) -> AuthStep:
        """The plugin's first data: answer to the greeting scramble or to the AuthSwitchRequest."""
        user = self._user
        assert user is not None
        if self._plugin == NATIVE_PASSWORD:
            self._password_used = bool(data)
            if verify_native_password(data, self.scramble, user.password):
                return self._accept(())
            return self._reject("wrong password" if self._known else "unknown user")
        # caching_sha2_password. libmysqlclient sends a single NUL for an empty password.
        if not data or data == b"\0":
            self._password_used = False
            if user.password == "" and self._known:
                return self._accept(())
            return self._reject("no password given" if self._known else "unknown user")
        self._password_used = True
        cached = self._cache.lookup(user) if self._known else None
        if cached is not None and verify_sha2_scramble(data, self.scramble, cached):
            return self._accept((_FAST_AUTH_SUCCESS,))
        if len(data) != 32:
            return self._reject(f"malformed caching_sha2_password scramble ({len(data)} bytes, 32 expected)")
        # Not cached, or the scramble did not match the cache: ask for the password itself, as MySQL does.
        self._state = "full_auth"
        return SendAuthPackets((_PERFORM_FULL_AUTH,))

    def _full_auth(self, payload: bytes) -> AuthStep:
        if self.secure:
            return self._verify_cleartext(payload[:-1] if payload.endswith(b"\0") else payload)
        if payload == CACHING_SHA2_REQUEST_PUBLIC_KEY:
            self._state = "awaiting_rsa"
            return SendAuthPackets((bytes((AUTH_MORE_DATA,)) + self._rsa.public_pem,))
        if len(payload) == self._rsa.ciphertext_length:
            # A client configured with our public key encrypts right away.
            return self._rsa_password(payload)
        # Most likely a cleartext password on an unencrypted connection: never look at it.
        return self._reject(
            "caching_sha2_password full authentication without TLS needs the RSA-encrypted password; the client "
            f"sent {len(payload)} bytes that are neither a public key request nor a {self._rsa.ciphertext_length}"
            "-byte ciphertext"
        )

    def _rsa_password(self, payload: bytes) -> AuthStep:
        try:
            plain = self._rsa.decrypt(payload)
        except ValueError:
            return self._reject("the RSA-encrypted password does not decrypt with the server's key")
        password = _xor(plain, self.scramble)
        return self._verify_cleartext(password[:-1] if password.endswith(b"\0") else password)

    def _verify_cleartext(self, password: bytes) -> AuthStep:
        user = self._user
        assert user is not None
        if self._known and _same_password(password, user.password):
            step = self._accept(())
            if isinstance(step, AuthAccepted):
                self._cache.remember(user)
            return step
        return self._reject("wrong password" if self._known else "unknown user")

    # -- outcomes ------------------------------------------------------------------------------------------------

    def _accept(self, packets: tuple[bytes, ...]) -> AuthStep:
        user = self._user
        if user is None or not self._known:
            return self._reject("unknown user")
        if user.tls == "required" and not self.secure:
            return self._reject(f"account {user.account} requires TLS and the client connected without it")
        self._state = "done"
        return AuthAccepted(user, self._plugin, packets)

    def _reject(self, reason: str) -> AuthRejected:
        self._state = "done"
        using = "YES" if self._password_used else "NO"
        message = f"Access denied for user '{self._user_name}'@'{self.client_host}' (using password: {using})"
        return AuthRejected(ErrorResponse(ER_ACCESS_DENIED_ERROR, "28000", message), reason)


def _lookup_in(users: list[DownstreamUser]) -> Callable[[str, str], DownstreamUser | None]:
    def lookup(name: str, host: str) -> DownstreamUser | None:
        return find_user(users, name, host)

    return lookup


__all__ = [
    "AuthAccepted",
    "AuthRejected",
    "AuthStep",
    "BASE_CAPABILITIES",
    "HandshakeError",
    "HandshakeResponse",
    "RsaKeyPair",
    "SendAuthPackets",
    "ServerAuthentication",
    "Sha2Cache",
    "SslRequest",
    "build_greeting",
    "default_auth_plugin",
    "generate_scramble",
    "greeting_charset",
    "greeting_version",
    "parse_handshake_response",
    "server_capabilities",
    "verify_native_password",
    "verify_sha2_scramble",
]
