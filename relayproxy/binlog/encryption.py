"""MariaDB binlog encryption (``encrypt_binlog=ON``), sans-I/O: the key file, the START_ENCRYPTION event, and
encrypted events turned back into the plain events a master sends its replicas.

The format, as MariaDB writes it (learnt from its sources and checked against a real 10.11 server):

- A binlog file begins, as always, with the magic and a plain FORMAT_DESCRIPTION_EVENT; a START_ENCRYPTION_EVENT
  (type 164) follows it, plain too: scheme (u8, 1), key_version (u32), nonce (12 bytes). Every later event of the
  file is encrypted.
- The key is the encryption plugin's key id 1 (``ENCRYPTION_KEY_SYSTEM_DATA``) at ``key_version``. The
  file_key_management plugin has one version per key id (1); its cipher is AES-CBC (default) or AES-CTR
  (``file_key_management_encryption_algorithm``), with a 128-, 192- or 256-bit key.
- An event at file offset P is encrypted with IV = nonce (12 bytes) + P (u32 little-endian). Before encrypting,
  the writer copies the timestamp (bytes 0-3) over the event length (bytes 9-12) and encrypts bytes 4.. of the
  event (the same length: no padding). In the file, the event's bytes 9-12 hold the length in clear (so a reader
  can step from event to event), and the four ciphertext bytes that belong there are stored in bytes 0-3.
- Without padding, AES-CBC leaves a last partial block: MariaDB XORs it with AES-ECB(key, IV) (the IV the event
  began with). AES-CTR needs nothing special.
- The CRC32 of an event (when the file has checksums) is of the plain event: it is how a wrong key shows.

A master dumping such a file to a replica decrypts every event, and sends the START_ENCRYPTION_EVENT with
LOG_EVENT_IGNORABLE_F set (its CRC32 recomputed): a replica's copy (and ``mariadb-binlog --raw
--read-from-remote-server``'s) is plain, at the same positions. ``DecryptingStream`` produces exactly that from
the file's bytes; a START_ENCRYPTION_EVENT already flagged ignorable means a plain copy, passed through.

The key file (``file_key_management_filename``): lines ``<key id>;<hex key>``, ``#`` comments and blank lines;
optionally encrypted with ``file_key_management_filekey`` in OpenSSL's ``enc`` format (``Salted__`` + 8 bytes
of salt, AES-256-CBC, key and IV from EVP_BytesToKey with SHA-1, one round, PKCS#7 padding).
"""

from __future__ import annotations

import hashlib
import struct
import zlib

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from . import constants as C
from .checksum import CRC32_RESIDUE as _CRC32_RESIDUE

BINLOG_KEY_ID = 1  # ENCRYPTION_KEY_SYSTEM_DATA: the key id every MariaDB binlog is encrypted with
NONCE_LEN = 12
START_ENCRYPTION_BODY = 1 + 4 + NONCE_LEN
ALGORITHMS = ("aes_cbc", "aes_ctr")
_SALTED = b"Salted__"
_U32 = struct.Struct("<I")
_EVENT_LEN_AT = 9
_LOG_POS_AT = 13
_FLAGS_AT = 17
_IGNORABLE = C.LOG_EVENT_IGNORABLE_F


class BinlogKeyError(Exception):
    """A key file that cannot be read, a key that is missing, or a key that does not decrypt the binlog."""


# ---------------------------------------------------------------------------------------------
# The key file


def decrypt_key_file(data: bytes, secret: bytes, *, source: str = "the key file") -> bytes:
    """The plain text of a key file encrypted with ``file_key_management_filekey`` (OpenSSL ``Salted__``)."""
    if not data.startswith(_SALTED) or len(data) < 16 + 16 or (len(data) - 16) % 16:
        raise BinlogKeyError(f"{source} is not an OpenSSL 'Salted__' AES-256-CBC file (file_key_management_filekey)")
    salt = data[8:16]
    derived = b""
    block = b""
    while len(derived) < 48:  # EVP_BytesToKey(aes-256-cbc, sha1, salt, secret, 1 round): 32 bytes key + 16 IV
        block = hashlib.sha1(block + secret + salt).digest()
        derived += block
    decryptor = Cipher(algorithms.AES(derived[:32]), modes.CBC(derived[32:48])).decryptor()
    plain = decryptor.update(data[16:]) + decryptor.finalize()
    pad = plain[-1]
    if not 1 <= pad <= 16 or plain[-pad:] != bytes([pad]) * pad:
        raise BinlogKeyError(f"{source} does not decrypt with the given file key (file_key_management_filekey)")
    return plain[:-pad]


def parse_key_file(data: bytes, *, source: str = "the key file", filekey: bytes | None = None) -> dict[int, bytes]:
    """Key id -> key from a file_key_management key file (decrypted first when ``filekey`` is given or the file
    starts with ``Salted__``)."""
    if data.startswith(_SALTED):
        if filekey is None:
            raise BinlogKeyError(
                f"{source} is encrypted (it starts with 'Salted__'): give its file key "
                "(the server's file_key_management_filekey)"
            )
        data = decrypt_key_file(data, filekey, source=source)
    elif filekey is not None:
        raise BinlogKeyError(f"{source} is not encrypted (no 'Salted__' header) but a file key was given")
    keys: dict[int, bytes] = {}
    for number, raw in enumerate(data.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(b"#"):
            continue
        where = f"{source} line {number}"
        ident, sep, hexkey = line.partition(b";")
        if not sep or not ident.isdigit():
            raise BinlogKeyError(f"{where}: expected '<key id>;<hex key>'")
        key_id = int(ident)
        if not 1 <= key_id <= 0xFFFFFFFF:
            raise BinlogKeyError(f"{where}: key id {key_id} is out of range (1 to 4294967295)")
        hexkey = hexkey.strip()
        try:
            key = bytes.fromhex(hexkey.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            raise BinlogKeyError(f"{where}: key {key_id} is not hexadecimal") from None
        if len(key) not in (16, 24, 32):
            raise BinlogKeyError(f"{where}: key {key_id} has {len(key) * 8} bits; AES needs 128, 192 or 256")
        if key_id in keys:
            raise BinlogKeyError(f"{where}: key id {key_id} appears twice")
        keys[key_id] = key
    return keys


# ---------------------------------------------------------------------------------------------
# Events


def start_encryption_fields(event) -> tuple[int, int, bytes]:
    """(scheme, key_version, nonce) of a START_ENCRYPTION_EVENT (the whole event, header included)."""
    if len(event) < C.HEADER_LEN + START_ENCRYPTION_BODY:
        raise BinlogKeyError(f"START_ENCRYPTION_EVENT of {len(event)} bytes is too short")
    body = C.HEADER_LEN
    return event[body], _U32.unpack_from(event, body + 1)[0], bytes(event[body + 5 : body + 5 + NONCE_LEN])


def ignorable_copy(event, checksum_len: int) -> bytes:
    """The START_ENCRYPTION_EVENT as a master sends it to replicas: LOG_EVENT_IGNORABLE_F set, CRC32 recomputed."""
    out = bytearray(event)
    flags = int.from_bytes(out[_FLAGS_AT : _FLAGS_AT + 2], "little") | _IGNORABLE
    out[_FLAGS_AT : _FLAGS_AT + 2] = flags.to_bytes(2, "little")
    if checksum_len:
        out[-4:] = _U32.pack(zlib.crc32(memoryview(out)[:-4]))
    return bytes(out)


class EventDecryptor:
    """Decrypts the events of one binlog file, from its START_ENCRYPTION_EVENT and the key file's keys."""

    def __init__(self, start_event, keys: dict[int, bytes], *, algorithm: str = "aes_cbc", checksum_len: int = 4,
                 key_source: str = "the key file", file: str = "the binlog"):
        scheme, key_version, nonce = start_encryption_fields(start_event)
        if scheme != 1:
            raise BinlogKeyError(f"{file}: START_ENCRYPTION_EVENT has scheme {scheme}; only scheme 1 is known")
        if algorithm not in ALGORITHMS:
            raise BinlogKeyError(f"unknown binlog encryption algorithm {algorithm!r} (one of {', '.join(ALGORITHMS)})")
        if key_version != 1:
            raise BinlogKeyError(
                f"{file} is encrypted with version {key_version} of key id {BINLOG_KEY_ID}; a file_key_management "
                f"key file ({key_source}) has only version 1 of each key (another key management plugin wrote it?)"
            )
        key = keys.get(BINLOG_KEY_ID)
        if key is None:
            raise BinlogKeyError(
                f"{file} is encrypted with key id {BINLOG_KEY_ID} (the server's binlog key), which is not in "
                f"{key_source} (it has key ids {', '.join(map(str, sorted(keys))) or 'none'})"
            )
        self.file = file
        self.key_source = key_source
        self.algorithm = algorithm
        self.checksum_len = checksum_len
        self.nonce = nonce
        self.key_version = key_version
        self._aes = algorithms.AES(key)
        self._ecb = Cipher(self._aes, modes.ECB())

    def decrypt(self, offset: int, event) -> bytes:
        """The plain event for the encrypted ``event`` (whole, as stored) at file ``offset``.

        Raises BinlogKeyError when the result is not the event that was encrypted there (its CRC32 or its
        log_pos do not match): a wrong key, or damaged bytes."""
        n = len(event)
        if n < C.HEADER_LEN:
            raise BinlogKeyError(f"{self.file}: encrypted event at offset {offset} has {n} bytes, less than a header")
        view = memoryview(event)
        # The ciphertext as encrypted: bytes 4..8 of the event, then the four stored at 0..3, then 13.. on.
        stream = b"".join((view[4:_EVENT_LEN_AT], view[0:4], view[_EVENT_LEN_AT + 4 :]))
        iv = self.nonce + _U32.pack(offset & 0xFFFFFFFF)
        if self.algorithm == "aes_ctr":
            decryptor = Cipher(self._aes, modes.CTR(iv)).decryptor()
            plain = decryptor.update(stream) + decryptor.finalize()
        else:
            whole = len(stream) & ~15
            plain = b""
            if whole:
                decryptor = Cipher(self._aes, modes.CBC(iv)).decryptor()
                plain = decryptor.update(stream[:whole]) + decryptor.finalize()
            if whole < len(stream):
                encryptor = self._ecb.encryptor()
                mask = encryptor.update(iv) + encryptor.finalize()
                tail = stream[whole:]
                plain += (int.from_bytes(tail, "little") ^ int.from_bytes(mask[: len(tail)], "little")).to_bytes(
                    len(tail), "little")
        # plain is the event from byte 4 on, with the timestamp where the length was: put both back.
        out = b"".join((plain[5:9], plain[0:5], _U32.pack(n), plain[9:]))
        log_pos = _U32.unpack_from(out, _LOG_POS_AT)[0]
        if self.checksum_len and zlib.crc32(out) != _CRC32_RESIDUE:
            why = "its CRC32 does not match after decryption"
        elif log_pos and log_pos != (offset + n) & 0xFFFFFFFF:
            why = f"its log_pos is {log_pos} after decryption, not {offset + n}"
        else:
            return out
        raise BinlogKeyError(
            f"{self.file}: the event at offset {offset} does not decrypt with key id {BINLOG_KEY_ID} from "
            f"{self.key_source} ({why}): the wrong key (or algorithm {self.algorithm}), or a damaged file"
        )


class DecryptingStream:
    """A binlog file's bytes in order from offset 0 in, the plain file out (as a master would send it).

    ``feed(data)`` returns the plain bytes of the events the data completed (magic and FORMAT_DESCRIPTION as
    they are, the START_ENCRYPTION_EVENT as an ignorable copy, every later event decrypted); an incomplete
    event waits for more. A file without START_ENCRYPTION_EVENT (or with one already flagged ignorable) passes
    through unchanged. ``keys`` is needed only when the file turns out encrypted.
    """

    def __init__(self, keys: dict[int, bytes] | None, *, algorithm: str = "aes_cbc",
                 key_source: str = "the key file", file: str = "the binlog"):
        self.keys = keys
        self.algorithm = algorithm
        self.key_source = key_source
        self.file = file
        self.offset = 0  # file offset of the first byte not yet returned
        self.encrypted = False  # a START_ENCRYPTION_EVENT (not ignorable) was seen
        self.decryptor: EventDecryptor | None = None
        self._buf = bytearray()
        self.flushed = b""  # after feed raised BinlogKeyError: the plain bytes it decrypted before the failure
        self._checksum_len = 0
        self._events = 0  # events seen (the FDE is the first)

    @property
    def pending(self) -> int:
        """Bytes fed but not yet returned (an incomplete event)."""
        return len(self._buf)

    def take_pending(self) -> bytes:
        """The incomplete event's bytes as stored (the end of the input: a cut last event), and forget them."""
        rest = bytes(self._buf)
        self._buf = bytearray()
        self.offset += len(rest)
        return rest

    def feed(self, data) -> bytes:
        buf = self._buf
        buf += data
        out = []
        pos = 0
        if self.offset == 0:
            if len(buf) < 4:
                return b""
            if bytes(buf[:4]) != C.BINLOG_MAGIC:
                raise BinlogKeyError(f"{self.file} is not a binlog file (magic {bytes(buf[:4]).hex()})")
            out.append(bytes(buf[:4]))
            pos = 4
            self.offset = 4
        while len(buf) - pos >= C.HEADER_LEN:
            n = _U32.unpack_from(buf, pos + _EVENT_LEN_AT)[0]
            if n < C.HEADER_LEN:
                raise BinlogKeyError(f"{self.file}: impossible event length {n} at offset {self.offset}")
            if len(buf) - pos < n:
                break
            event = memoryview(buf)[pos : pos + n]
            try:
                out.append(self._event(event))
            except BinlogKeyError:
                self.flushed = b"".join(out)  # the plain events before the failure
                raise
            finally:
                event.release()
            pos += n
            self.offset += n
        if pos:
            del buf[:pos]
        return b"".join(out)

    def _event(self, event: memoryview) -> bytes:
        offset = self.offset
        self._events += 1
        if self.decryptor is not None:
            return self.decryptor.decrypt(offset, event)
        type_code = event[4]
        if type_code == C.FORMAT_DESCRIPTION_EVENT:
            from .events import FormatDescription  # the FDE says whether events carry a CRC32

            self._checksum_len = FormatDescription.parse(event, 0, len(event)).checksum_len
        elif type_code == C.MARIA_START_ENCRYPTION_EVENT:
            flags = int.from_bytes(event[_FLAGS_AT : _FLAGS_AT + 2], "little")
            if flags & _IGNORABLE:
                return bytes(event)  # a replica's (or a relay's) plain copy: nothing follows encrypted
            if self.keys is None:
                raise BinlogKeyError(
                    f"{self.file} is encrypted (encrypt_binlog=ON, START_ENCRYPTION_EVENT at offset {offset}): "
                    "give the server's key file (file_key_management_filename)"
                )
            self.decryptor = EventDecryptor(event, self.keys, algorithm=self.algorithm,
                                            checksum_len=self._checksum_len, key_source=self.key_source,
                                            file=self.file)
            self.encrypted = True
            return ignorable_copy(event, self._checksum_len)
        return bytes(event)


def decrypt_binlog(data: bytes, keys: dict[int, bytes] | None, **kwargs) -> bytes:
    """A whole binlog file's bytes, decrypted (see DecryptingStream); an incomplete last event is left out."""
    return DecryptingStream(keys, **kwargs).feed(data)

