"""The JSON codec of a manifest's root: encoding, its checksum and signature, strict decoding.

Invariant: the same manifest always encodes to the same bytes, ending with the checksum
of those exact bytes (and, with keys, a signature spliced in before it); decoding
returns a manifest only when every byte is as a writer of this format wrote it, and
raises :class:`CorruptManifestError` (or :class:`SignatureError`, with keys) naming the
path for anything else. See docs/format.md, sections "Encoding", "The checksum" and
"The signature".
"""

from __future__ import annotations

import functools
import hashlib
import re
from typing import Any, TypeVar

import msgspec

from cairn.errors import (
    CorruptManifestError,
    InvalidCheckpointDataError,
    InvalidInputError,
    NewerFormatError,
    SignatureError,
    UnsupportedManifestVersionError,
)
from cairn.format._buffer import Buffer
from cairn.format._checks import SHA256_HEX, check_manifest, check_part_records
from cairn.format._schema import SUPPORTED_VERSIONS, CheckpointManifest
from cairn.format.features import FEATURE_NAME, VERSION, WRITER_VERSION, unknown_features
from cairn.format.ids import CheckpointId
from cairn.format.layout import short_repr
from cairn.format.signing import ManifestSignature, SigningKeys, signature_field, well_formed

__all__ = [
    "HeaderPart",
    "ManifestHeader",
    "check_requires",
    "dec_hook",
    "decode_header",
    "decode_record",
    "decode_root",
    "enc_hook",
    "encode_root",
    "newer_features",
    "peeked_id",
]

_Record = TypeVar("_Record")

_ZERO_DIGEST = "0" * 64


class _StoredManifest(CheckpointManifest, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The manifest as stored: the features it uses and its writer's version (computed
    when encoding), its signature, if signed, and the checksum of its own bytes, none of
    them public. (Fields are written in this order: the checksum last.)"""

    requires: tuple[str, ...] = ()
    written_by: str | None = None
    signature: ManifestSignature | None = None
    manifest_sha256: str | None = None


def _checksum_field(digest: str) -> bytes:
    return b'"manifest_sha256": "' + digest.encode() + b'"'


class _Peek(msgspec.Struct):
    """The top-level members a reader looks at before decoding strictly, any type: a
    newer writer's manifest may hold members and values this decoder would refuse."""

    version: Any = msgspec.UNSET
    checkpoint_id: Any = None
    requires: Any = ()
    written_by: Any = None
    signature: Any = None
    manifest_sha256: Any = None


def enc_hook(value: object) -> object:
    """msgspec encoding of the types cairn adds (a CheckpointId is its text)."""
    if isinstance(value, CheckpointId):
        return str(value)
    raise NotImplementedError(f"cannot encode {type(value).__name__}")


def dec_hook(kind: type, value: object) -> object:
    """msgspec decoding of the types cairn adds; an invalid id is a validation error.

    Anything but a string where an id belongs (a number, a list, an object) is a
    ``TypeError``, and a malformed string an :class:`InvalidInputError` (a ``ValueError``):
    msgspec turns both into a ``ValidationError`` naming the JSON path.
    """
    if kind is CheckpointId:
        if not isinstance(value, str):
            raise TypeError(f"Expected a checkpoint id string, got `{type(value).__name__}`")
        return _parse_id(value)
    raise NotImplementedError(f"cannot decode {kind!r}")  # a type cairn never declares


_parse_id = functools.lru_cache(maxsize=1024)(CheckpointId.parse)
"""CheckpointId.parse, remembered: a manifest names few owners many times (each carried
entry names its own), and parsing one takes 11 µs, most of decoding 100,000 entries."""


_encoder = msgspec.json.Encoder(enc_hook=enc_hook, order="deterministic")
_decoder = msgspec.json.Decoder(_StoredManifest, dec_hook=dec_hook)
_peek_decoder = msgspec.json.Decoder(_Peek)


def encode_root(
    manifest: CheckpointManifest, keys: SigningKeys | None, limit: int, requires: tuple[str, ...]
) -> bytes:
    """Human-readable, deterministic JSON of ``manifest`` as it is, ending with its own
    checksum; signed when ``keys`` are given. ``requires`` are the features it uses
    (:func:`cairn.format.features.features_of` the manifest it stands for: a root's own
    entries do not show its parts'); with any, this cairn's version is ``written_by``.
    Over ``limit`` bytes: :class:`InvalidCheckpointDataError`."""
    fields = msgspec.structs.asdict(manifest)
    placeholder = None if keys is None else keys.placeholder()
    stored = _StoredManifest(
        **fields,
        requires=requires,
        written_by=VERSION if requires else None,
        signature=placeholder,
        manifest_sha256=_ZERO_DIGEST,
    )
    body = msgspec.json.format(_encoder.encode(stored), indent=2) + b"\n"
    if keys is not None and placeholder is not None:
        body = _sign(body, keys, placeholder)
    if len(body) > limit:
        entries = sum(len(op.partitions) for op in manifest.operators.values())
        held = (
            f"{entries} artifact entries"
            if not manifest.parts
            else f"{len(manifest.parts)} parts of {len(manifest.operators)} operator(s)"
        )
        files = len(manifest.file_entries())
        raise InvalidCheckpointDataError(
            f"the manifest of checkpoint {manifest.checkpoint_id} would be {len(body)} bytes "
            f"({held}, {files} directory files, {len(manifest.source_offsets)} sources), "
            f"over the limit of {limit} bytes: save fewer partitions or "
            "directory files per checkpoint, or a full snapshot to shorten the chains"
        )
    zeroed = _checksum_field(_ZERO_DIGEST)
    return body.replace(zeroed, _checksum_field(hashlib.sha256(body).hexdigest()))


def _sign(body: bytes, keys: SigningKeys, placeholder: ManifestSignature) -> bytes:
    """``body`` (its signature's value empty, its checksum zeroed) with the value put in."""
    field = signature_field(placeholder)
    start = body.find(field)
    # The member is top-level (two spaces in, after a newline that no JSON string holds):
    # nothing else in a manifest cairn encodes can spell it.
    assert start >= 0, "the signature member"
    assert body.find(field, start + 1) < 0, "one signature member"
    value = keys.sign(body)
    signed = signature_field(msgspec.structs.replace(placeholder, value=value))
    return body[:start] + signed + body[start + len(field) :]


def decode_record(
    decoder: msgspec.json.Decoder[_Record], path: str, data: Buffer, what: str, limit: int
) -> _Record:
    """Decode one small JSON record read from ``path`` (a pointer, a writer record, ...).

    Anything damaged — over ``limit`` bytes (refused unparsed), not JSON, nested too
    deeply, of the wrong shape — is a :class:`CorruptManifestError` naming ``path``.
    """
    size = memoryview(data).nbytes
    if size > limit:
        raise CorruptManifestError(path, f"{what} of {size} bytes is not one")
    try:
        return decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise CorruptManifestError(path, f"unreadable {what}: {exc}") from None
    except RecursionError:
        raise CorruptManifestError(path, f"unreadable {what}: nested too deeply") from None


def decode_root(
    path: str, data: Buffer, keys: SigningKeys | None, limit: int
) -> CheckpointManifest:
    """The manifest at ``path`` as stored (a root with ``parts`` has its operators'
    entry lists empty, once its part records are checked), from ``data`` of at most
    ``limit`` bytes (more is refused unparsed): see
    :func:`cairn.format.manifest.decode_root`."""
    size = memoryview(data).nbytes
    if size > limit:
        raise CorruptManifestError(path, f"it is {size} bytes, over the limit of {limit} bytes")
    peek = _peek(path, data)
    if peek.version is msgspec.UNSET:
        raise CorruptManifestError(path, "no 'version' field")
    check_requires(path, data, peek, keys)
    if peek.version not in SUPPORTED_VERSIONS or isinstance(peek.version, bool):
        raise UnsupportedManifestVersionError(path, peek.version, SUPPORTED_VERSIONS)
    try:
        stored = _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise CorruptManifestError(path, str(exc)) from None
    except RecursionError:
        raise CorruptManifestError(path, "its JSON is nested too deeply") from None
    checksum = None
    if stored.manifest_sha256 is not None:
        checksum = _verify_checksum(path, data, stored.manifest_sha256)
    fields = msgspec.structs.asdict(stored)
    for stored_only in ("requires", "written_by", "signature", "manifest_sha256"):
        del fields[stored_only]
    manifest = CheckpointManifest(**fields)
    try:
        check_manifest(manifest, stored=True)
        check_part_records(manifest, limit)
    except InvalidInputError as exc:
        raise CorruptManifestError(path, str(exc)) from None
    if keys is not None:
        _verify_signature(path, data, stored.signature, checksum, keys)
    return manifest


def _peek(path: str, data: Buffer) -> _Peek:
    """The members of :class:`_Peek`, whatever their types; a body that is not a JSON
    object is damage."""
    try:
        return _peek_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise CorruptManifestError(path, f"not a JSON object: {exc}") from None
    except RecursionError:
        raise CorruptManifestError(path, "its JSON is nested too deeply") from None


def newer_features(
    path: str, requires: object, written_by: object
) -> tuple[tuple[str, ...], str | None]:
    """The names in ``requires`` this cairn does not know, and ``written_by``, as read
    (any type) from a manifest or part at ``path``; either one malformed (not a list of
    feature names, not a version) is a :class:`CorruptManifestError`."""
    if not isinstance(requires, list | tuple) or not all(
        isinstance(name, str) and FEATURE_NAME.fullmatch(name) for name in requires
    ):
        raise CorruptManifestError(
            path, f"requires is not a list of feature names: {short_repr(requires)}"
        )
    if written_by is not None and not (
        isinstance(written_by, str) and WRITER_VERSION.fullmatch(written_by)
    ):
        raise CorruptManifestError(path, f"written_by is not a version: {short_repr(written_by)}")
    return unknown_features(requires), written_by


def peeked_id(value: object) -> str | None:
    """The checkpoint id a manifest or part names, as text; None if it names none."""
    if not isinstance(value, str):
        return None
    try:
        return str(_parse_id(value))
    except InvalidInputError:
        return None


def check_requires(path: str, data: Buffer, peek: _Peek, keys: SigningKeys | None) -> None:
    """Raise :class:`NewerFormatError` when the manifest ``data`` (read from ``path``,
    ``peek`` its top level) requires a feature this cairn does not know, once its checksum
    and, with ``keys``, its signature verify: damage, or a manifest nobody with a key
    wrote, is never taken for a newer format."""
    unknown, written_by = newer_features(path, peek.requires, peek.written_by)
    if not unknown:
        return
    checksum = None
    if peek.manifest_sha256 is not None:
        if not isinstance(peek.manifest_sha256, str):
            raise CorruptManifestError(path, "its manifest_sha256 field is damaged")
        checksum = _verify_checksum(path, data, peek.manifest_sha256)
    if keys is not None:
        _verify_signature(path, data, _peeked_signature(path, peek.signature), checksum, keys)
    raise NewerFormatError(path, peeked_id(peek.checkpoint_id), unknown, written_by)


def _peeked_signature(path: str, value: object) -> ManifestSignature | None:
    """The ``signature`` member read as any type, as a :class:`ManifestSignature`."""
    if value is None:
        return None
    try:
        return msgspec.convert(value, ManifestSignature)
    except msgspec.ValidationError:
        raise SignatureError(path, "its signature member is not one cairn writes") from None


class HeaderPart(msgspec.Struct, frozen=True):
    """How many entries a part of a large manifest holds (see :class:`ManifestHeader`)."""

    entries: int = 0


class ManifestHeader(msgspec.Struct, frozen=True):
    """The members of a manifest that rank it among others (``writer_generation``,
    ``epoch``, ``checkpoint_id``), its ``name``, and how many entries each of its parts
    holds: what a catalog reads of every manifest, decoding nothing else and checking
    nothing else (a manifest whose header decodes may still be damaged)."""

    checkpoint_id: CheckpointId
    epoch: int
    writer_generation: int | None = None
    name: str | None = None
    parts: tuple[HeaderPart, ...] = ()


_header_decoder = msgspec.json.Decoder(ManifestHeader, dec_hook=dec_hook)


def decode_header(path: str, data: Buffer, keys: SigningKeys | None, limit: int) -> ManifestHeader:
    """The :class:`ManifestHeader` of the manifest ``data`` read from ``path``: see
    :func:`cairn.format.manifest.decode_header`."""
    size = memoryview(data).nbytes
    if size > limit:
        raise CorruptManifestError(path, f"it is {size} bytes, over the limit of {limit} bytes")
    check_requires(path, data, _peek(path, data), keys)
    try:
        return _header_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise CorruptManifestError(path, str(exc)) from None
    except RecursionError:
        raise CorruptManifestError(path, "its JSON is nested too deeply") from None


_CHECKSUM_FIELD = re.compile(rb'"manifest_sha256": "([^"]*)"')
"""Any ``manifest_sha256`` field: compiled once (a pattern per digest missed re's cache
and cost a compile, 0.1 ms, per manifest decoded: a tenth of a GC plan's time)."""


def _verify_checksum(path: str, data: Buffer, digest: str) -> tuple[int, int]:
    """Check the manifest checksum ``digest``; the span of its member in ``data``."""
    # On the caller's buffer, without a copy: a manifest may be tens of megabytes.
    body = memoryview(data)
    wanted = digest.encode()
    fields = (m for m in _CHECKSUM_FIELD.finditer(body) if m.group(1) == wanted)
    found = [m.span() for m, _ in zip(fields, range(2), strict=False)]
    if not SHA256_HEX.fullmatch(digest) or len(found) != 1:
        raise CorruptManifestError(path, "its manifest_sha256 field is damaged")
    start, end = found[0]
    hasher = hashlib.sha256(body[:start])
    hasher.update(_checksum_field(_ZERO_DIGEST))
    hasher.update(body[end:])
    actual = hasher.hexdigest()
    if actual != digest:
        raise CorruptManifestError(path, f"manifest checksum mismatch: {actual} != {digest}")
    return start, end


def _verify_signature(
    path: str,
    data: Buffer,
    signature: ManifestSignature | None,
    checksum: tuple[int, int] | None,
    keys: SigningKeys,
) -> None:
    """Raise :class:`SignatureError` unless ``signature`` is one of ``keys``' over ``data``.

    What was signed is ``data`` with the signature's value emptied and the checksum
    zeroed: the signature member must be exactly as cairn spells it (top-level, once),
    and before the checksum, which cairn always writes with it.
    """
    held = ", ".join(keys.key_ids)
    if signature is None:
        raise SignatureError(
            path, f"it is not signed; this reader requires a signature by one of its keys ({held})"
        )
    if checksum is None or not well_formed(signature):
        raise SignatureError(path, "its signature member is not one cairn writes")
    signer = keys.find(signature)
    if signer is None:
        raise SignatureError(
            path,
            f"it is signed by key {signature.key_id!r} ({signature.alg}), which is not one "
            f"of this reader's ({held})",
        )
    body = bytes(data)  # the signer takes bytes: one copy, whatever the buffer
    field = signature_field(signature)
    start = body.find(field)
    end = start + len(field)
    if start < 0 or body.find(field, start + 1) >= 0 or end > checksum[0]:
        raise SignatureError(path, "its signature member is not one cairn writes")
    signed = b"".join(
        (
            body[:start],
            signature_field(msgspec.structs.replace(signature, value="")),
            body[end : checksum[0]],
            _checksum_field(_ZERO_DIGEST),
            body[checksum[1] :],
        )
    )
    if not signer.verify(signed, bytes.fromhex(signature.value)):
        raise SignatureError(
            path,
            f"its signature by key {signature.key_id!r} does not verify: it was not written "
            "by a holder of that key, or was changed since",
        )
