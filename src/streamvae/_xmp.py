"""The unsigned mark of a stream: XMP that says the video was generated, in its init segment.

Bytes already sent cannot be signed after the fact, and no released C2PA library signs live fragments, so
a fragmented MP4 with ``provenance=`` carries, in its init segment, the IPTC digital source type
``trainedAlgorithmicMedia`` as XMP: machine-readable, unsigned. It is a top-level XMP ``uuid`` box right
after the ``moov`` — where FFmpeg reads it (``export_xmp``; not from a box before the ``moov``) — so the
``moov`` and the fragments are left as the muxer wrote them. Everything after it moves by the box's size:
only the ``mfra``'s fragment index holds absolute offsets (the fragments' ``default_base_moof`` offsets are
relative), and :func:`shift_fragment_index` moves them.
"""

from __future__ import annotations

import struct

from streamvae._boxes import HEADER, box_children

__all__ = ["DIGITAL_SOURCE_TYPE", "XMP_UUID", "shift_fragment_index", "streamvae_version", "xmp_mark"]

#: IPTC's digital source type of media a trained model made: what every output's ``c2pa.created``
#: action (:mod:`streamvae._provenance`) and every stream's XMP mark say
DIGITAL_SOURCE_TYPE = "http://cv.iptc.org/newscodes/digitalsourcetype/trainedAlgorithmicMedia"
#: The ``uuid`` of an XMP box (Adobe XMP Specification Part 3, 1.1.4)
XMP_UUID = bytes.fromhex("BE7ACFCB97A942E89C71999491E3AFAC")


def streamvae_version() -> str:
    """streamvae's version, as a manifest's software agent and the XMP mark name it."""
    import streamvae

    return streamvae.__version__


def xmp_mark() -> bytes:
    """The XMP ``uuid`` box: the IPTC digital source type of generated media, and streamvae as its tool."""
    packet = (
        '<?xpacket begin="\ufeff" id="W5M0MpCehiHzreSzNTczkc9d"?>'
        '<x:xmpmeta xmlns:x="adobe:ns:meta/">'
        '<rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
        '<rdf:Description rdf:about="" xmlns:Iptc4xmpExt="http://iptc.org/std/Iptc4xmpExt/2008-02-29/" '
        'xmlns:xmp="http://ns.adobe.com/xap/1.0/">'
        f"<Iptc4xmpExt:DigitalSourceType>{DIGITAL_SOURCE_TYPE}</Iptc4xmpExt:DigitalSourceType>"
        f"<xmp:CreatorTool>streamvae {streamvae_version()}</xmp:CreatorTool>"
        "</rdf:Description></rdf:RDF></x:xmpmeta>"
        '<?xpacket end="r"?>'
    ).encode()
    body = XMP_UUID + packet
    return HEADER.pack(HEADER.size + len(body), b"uuid") + body


def shift_fragment_index(data: bytes, shift: int) -> bytes:
    """``data`` (whole top-level boxes: what follows the last fragment) with every ``moof`` offset of its
    ``mfra``'s ``tfra`` boxes moved by ``shift`` bytes (ISO/IEC 14496-12 8.8.10); other boxes unchanged."""
    out = bytearray(data)
    for kind, (body, end) in box_children(out, 0, len(out)):
        if kind == b"mfra":
            for child, (child_body, _) in box_children(out, body, end):
                if child == b"tfra":
                    _shift_tfra(out, child_body, shift)
    return bytes(out)


def _shift_tfra(out: bytearray, body: int, shift: int) -> None:
    """Move each entry's ``moof_offset`` of the ``tfra`` whose body starts at ``body``."""
    version = out[body]
    lengths = struct.unpack_from(">I", out, body + 8)[0]
    count = struct.unpack_from(">I", out, body + 12)[0]
    # traf, trun and sample numbers: (length_size + 1) bytes each
    numbers = sum(((lengths >> bits) & 0x3) + 1 for bits in (4, 2, 0))
    wide = 8 if version == 1 else 4
    offset_format = ">Q" if version == 1 else ">I"
    position = body + 16
    for _ in range(count):
        at = position + wide  # after the entry's time
        (offset,) = struct.unpack_from(offset_format, out, at)
        struct.pack_into(offset_format, out, at, offset + shift)
        position += 2 * wide + numbers
