"""Signed manifests: a checkpoint written by a holder of the key, not merely whole. Pure: no I/O.

The digests in a manifest (the SHA-256 of every artifact, and ``manifest_sha256`` of
the manifest's own bytes) catch damage. They do not catch someone who can write the
store: rewriting an artifact and its manifest consistently, checksum recomputed, is
undetectable from them. A checkpointer given ``signing_key`` signs every manifest it
commits, and refuses any manifest it uses (to load, to extend a chain, to copy, for DCP)
that is not signed by one of its keys.

``signing_key`` is one of:

* ``bytes``: an HMAC-SHA256 key (:class:`HmacSigner`; at least 16 bytes, 32 random
  bytes being the usual choice), which signs and verifies;
* a :class:`ManifestSigner`: any signer (a KMS, Ed25519), known by its ``key_id``;
* a sequence of those: the first signs, every one verifies. That is key rotation: put
  the new key first and keep the old ones while checkpoints they signed are needed.

Where the signature lives in a manifest and which bytes it covers (every byte but its
own value, with the checksum zeroed; the checksum covers the signature too) are
specified in docs/format.md, section "The signature".

Invariants:

* a reader with keys accepts a manifest only when its signature names one of its keys
  (``alg`` and ``key_id``) and verifies over the manifest's bytes with the signature's
  value emptied and the checksum zeroed. Anything else — no signature, a key it does not
  hold, a value that does not verify, a signature member that is not exactly where and
  how cairn writes it — is a :class:`~cairn.errors.SignatureError` naming the
  manifest's path, which readers treat as damage (``load_latest`` falls back past it);
* a reader without keys ignores signatures: it loads signed and unsigned checkpoints
  alike, checking digests only;
* an unsigned manifest has no ``signature`` member: it is byte for byte the manifest
  without signing;
* the same keys sign the same bytes the same way within a process (each signature is
  remembered for the bytes it signed), so a commit whose reply was lost is recognised by
  reading its bytes back, whatever the signer;
* key ids and algorithm names are short printable ASCII and values lower-case hex: the
  signature member has exactly one spelling, and key material never appears in it or in
  any message.

What signing does not defend against: deleting checkpoints (or only the newest, so that
readers load an older signed one), replaying a checkpoint signed with the same key from
another store or prefix (use one key per trust domain), and rewriting ``_latest`` or
``_writer`` (a hint and the fencing record: a reader skips what they name if it is not
signed, but a forged ``_writer`` can fence the real writer off).
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import re
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import msgspec

from cairn.errors import InvalidInputError
from cairn.format._buffer import Buffer

__all__ = [
    "HMAC_SHA256",
    "MIN_HMAC_KEY_BYTES",
    "HmacSigner",
    "ManifestSignature",
    "ManifestSigner",
    "SigningKey",
    "SigningKeys",
    "parse_hex_keys",
    "read_signature",
    "signature_field",
    "signing_keys",
    "well_formed",
]

HMAC_SHA256 = "hmac-sha256"
"""The ``alg`` of :class:`HmacSigner`'s signatures."""

MIN_HMAC_KEY_BYTES = 16
"""The shortest HMAC key accepted (128 bits): a shorter one is a mistake, not a key."""

_ALG = re.compile(r"[a-z0-9][a-z0-9._-]{0,31}")
_KEY_ID = re.compile(r"[A-Za-z0-9._:/+=@-]{1,200}")
_VALUE = re.compile(r"(?:[0-9a-f]{2}){1,1024}")
_MEMO_ENTRIES = 64


@runtime_checkable
class ManifestSigner(Protocol):
    """What signs and verifies manifests: an HMAC key (:class:`HmacSigner`), a KMS, Ed25519.

    ``alg`` names the algorithm and ``key_id`` the key, both recorded in each manifest
    it signs (short printable ASCII: letters, digits and ``._:/+=@-``; ``alg`` lower
    case); a reader picks the signer whose pair matches. ``sign`` returns the signature
    of ``data`` (at most 1024 bytes); ``verify`` says whether ``signature`` is one of
    ``data`` by this key, returning False (not raising) for a wrong one. A signer given
    to :class:`cairn.torch.CairnWriter` must pickle for ``dcp.async_save`` in process mode.
    """

    @property
    def alg(self) -> str:
        """The algorithm, as recorded in the manifest (``"hmac-sha256"``, ``"ed25519"``)."""
        ...

    @property
    def key_id(self) -> str:
        """Which key this is, as recorded in the manifest (never the key itself)."""
        ...

    def sign(self, data: bytes) -> bytes:
        """The signature of ``data``.

        Args:
            data: The bytes to sign (a manifest's canonical bytes).

        Returns:
            The signature, at most 1024 bytes.
        """
        ...

    def verify(self, data: bytes, signature: bytes) -> bool:
        """Whether ``signature`` is this key's signature of ``data``.

        Args:
            data: The signed bytes.
            signature: The signature to check.

        Returns:
            True when it is; False (never an error) for a wrong one.
        """
        ...


class HmacSigner:
    """HMAC-SHA256 with a secret ``key`` of at least :data:`MIN_HMAC_KEY_BYTES` bytes.

    Its ``key_id`` is derived from the key (16 hex digits of a SHA-256 of it, which says
    nothing about the key that a signature would not), so the same key has the same id
    everywhere and rotation needs no naming.

    Args:
        key: The secret key (bytes, bytearray or memoryview), at least
            :data:`MIN_HMAC_KEY_BYTES` bytes.

    Raises:
        InvalidInputError: ``key`` is not bytes, or is too short.
    """

    alg = HMAC_SHA256

    def __init__(self, key: bytes) -> None:
        if isinstance(key, bytearray | memoryview):
            key = bytes(key)
        if not isinstance(key, bytes):
            raise InvalidInputError(f"an HMAC key must be bytes, got {type(key).__name__}")
        if len(key) < MIN_HMAC_KEY_BYTES:
            raise InvalidInputError(
                f"an HMAC key must be at least {MIN_HMAC_KEY_BYTES} bytes, got {len(key)} "
                "(32 random bytes: os.urandom(32), or `openssl rand -hex 32` for the CLI)"
            )
        self._key = key
        self.key_id = hashlib.sha256(b"cairn hmac key id\0" + key).hexdigest()[:16]

    def __repr__(self) -> str:
        return f"HmacSigner(key_id={self.key_id!r})"

    def sign(self, data: bytes) -> bytes:
        """HMAC-SHA256 of ``data``.

        Args:
            data: The bytes to sign.

        Returns:
            The 32-byte digest.
        """
        return hmac.digest(self._key, data, "sha256")

    def verify(self, data: bytes, signature: bytes) -> bool:
        """Whether ``signature`` is the HMAC of ``data`` (compared in constant time).

        Args:
            data: The signed bytes.
            signature: The signature to check.

        Returns:
            True when it is the HMAC of ``data`` by this key.
        """
        return hmac.compare_digest(self.sign(data), signature)


SigningKey = bytes | ManifestSigner
"""One key: HMAC key bytes, or a signer."""


class ManifestSignature(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A manifest's ``signature`` member: the algorithm, the key, and the value (hex)."""

    alg: str
    key_id: str
    value: str


class SigningKeys:
    """The keys of a checkpointer: the first signs, every one verifies (rotation)."""

    def __init__(self, signers: Sequence[ManifestSigner]) -> None:
        if not signers:
            raise InvalidInputError("signing_key: an empty sequence of keys")
        seen: set[tuple[str, str]] = set()
        for signer in signers:
            alg, key_id = signer.alg, signer.key_id
            if not isinstance(alg, str) or not _ALG.fullmatch(alg):
                raise InvalidInputError(f"signer {signer!r}: alg {alg!r:.80} is not a short name")
            if not isinstance(key_id, str) or not _KEY_ID.fullmatch(key_id):
                raise InvalidInputError(
                    f"signer {signer!r}: key_id {key_id!r:.80} is not 1 to 200 characters "
                    "of letters, digits and ._:/+=@-"
                )
            if (alg, key_id) in seen:
                raise InvalidInputError(f"signing_key: key {key_id!r} ({alg}) is given twice")
            seen.add((alg, key_id))
        self.signers = tuple(signers)
        self._signed: collections.OrderedDict[bytes, str] = collections.OrderedDict()

    def __repr__(self) -> str:
        return f"SigningKeys({', '.join(self.key_ids)})"

    @property
    def signer(self) -> ManifestSigner:
        """The key that signs: the first."""
        return self.signers[0]

    @property
    def key_ids(self) -> tuple[str, ...]:
        """Every key's id, the signing one first."""
        return tuple(signer.key_id for signer in self.signers)

    def find(self, signature: ManifestSignature) -> ManifestSigner | None:
        """The key that made ``signature`` (by ``alg`` and ``key_id``), or None."""
        for signer in self.signers:
            if signer.alg == signature.alg and signer.key_id == signature.key_id:
                return signer
        return None

    def placeholder(self) -> ManifestSignature:
        """The signature member as signed: the signing key's, with an empty value."""
        return ManifestSignature(alg=self.signer.alg, key_id=self.signer.key_id, value="")

    def sign(self, data: bytes) -> str:
        """The signing key's signature of ``data``, in hex; the same for the same bytes."""
        memo = hashlib.sha256(data).digest()
        value = self._signed.get(memo)
        if value is not None:
            return value
        signature = self.signer.sign(data)
        if not isinstance(signature, bytes) or not 0 < len(signature) <= 1024:
            raise InvalidInputError(
                f"signer {self.signer!r} returned {type(signature).__name__} "
                f"{len(signature) if isinstance(signature, bytes) else ''}: not a "
                "signature of 1 to 1024 bytes"
            )
        value = signature.hex()
        self._signed[memo] = value
        while len(self._signed) > _MEMO_ENTRIES:
            self._signed.popitem(last=False)
        return value


def _one_signer(key: object) -> ManifestSigner:
    if isinstance(key, bytes | bytearray | memoryview):
        return HmacSigner(bytes(key))
    if isinstance(key, ManifestSigner):
        return key
    if isinstance(key, str):
        raise InvalidInputError(
            "signing_key must be bytes, not str (for a key written in hex: bytes.fromhex(...))"
        )
    raise InvalidInputError(
        f"signing_key must be bytes, a ManifestSigner or a sequence of them, got "
        f"{type(key).__name__}"
    )


def signing_keys(
    value: SigningKey | Sequence[SigningKey] | SigningKeys | None,
) -> SigningKeys | None:
    """The keys ``signing_key=value`` means (None: none); :class:`InvalidInputError` if bad."""
    if value is None or isinstance(value, SigningKeys):
        return value
    single = (bytes, bytearray, memoryview, str, ManifestSigner)
    if isinstance(value, Sequence) and not isinstance(value, single):
        return SigningKeys([_one_signer(key) for key in value])
    return SigningKeys([_one_signer(value)])


def parse_hex_keys(text: str, what: str) -> list[bytes]:
    """The keys of ``text``: hex, several separated by commas; ``what`` names the source.

    A malformed key raises :class:`InvalidInputError` naming ``what`` and the key's
    position, never its value.
    """
    parts = [part.strip() for part in text.split(",")]
    keys: list[bytes] = []
    for number, part in enumerate(parts, 1):
        where = f"{what}: key {number} of {len(parts)}" if len(parts) > 1 else what
        try:
            key = bytes.fromhex(part)
        except ValueError:
            raise InvalidInputError(f"{where} is not hex (two hex digits a byte)") from None
        if len(key) < MIN_HMAC_KEY_BYTES:
            raise InvalidInputError(
                f"{where} is {len(key)} bytes, under the {MIN_HMAC_KEY_BYTES} bytes an HMAC "
                "key needs (`openssl rand -hex 32` makes one)"
            )
        keys.append(key)
    return keys


def signature_field(signature: ManifestSignature) -> bytes:
    """The exact bytes of the ``signature`` member in a manifest cairn wrote.

    A member of the top-level object, as ``msgspec.json.format(..., indent=2)`` spells
    it, from the newline before it to its closing brace. Its names and values need no
    escaping (they are checked to be plain ASCII), so this is its only spelling.
    """
    return (
        b'\n  "signature": {\n    "alg": "'
        + signature.alg.encode()
        + b'",\n    "key_id": "'
        + signature.key_id.encode()
        + b'",\n    "value": "'
        + signature.value.encode()
        + b'"\n  }'
    )


def well_formed(signature: ManifestSignature) -> bool:
    """Whether ``signature`` has the form cairn writes (names, and a hex value)."""
    return bool(
        _ALG.fullmatch(signature.alg)
        and _KEY_ID.fullmatch(signature.key_id)
        and _VALUE.fullmatch(signature.value)
    )


class _SignatureProbe(msgspec.Struct):
    signature: ManifestSignature | None = None


_probe = msgspec.json.Decoder(_SignatureProbe)


def read_signature(data: Buffer) -> ManifestSignature | None:
    """The ``signature`` member of manifest bytes, unverified; None if there is none.

    For showing whether a checkpoint is signed: bytes that are not a manifest, or whose
    signature member is malformed, have none. Verification is
    :func:`cairn.format.manifest.decode_manifest`'s, with keys.
    """
    try:
        return _probe.decode(data).signature
    except (msgspec.DecodeError, RecursionError):
        return None
