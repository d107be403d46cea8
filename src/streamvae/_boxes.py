"""MP4 boxes (ISO/IEC 14496-12 4.2): the one reader of their headers, for every module that walks them.

A box starts with its 32-bit size and its 4-character type; a size of 1 means a 64-bit size follows the
type, and a size of 0 a box that runs to the end of the file. :func:`box_header` reads one header;
:func:`box_children` lists the boxes of a span of bytes (a box's body, or a whole piece); :func:`file_boxes`
lists the top-level boxes of a seekable file without reading their bodies.
"""

from __future__ import annotations

import io
import struct
from typing import BinaryIO

__all__ = ["HEADER", "box_children", "box_header", "file_boxes"]

#: a box's compact header: its 32-bit size and its type
HEADER = struct.Struct(">I4s")
_LARGE_SIZE = struct.Struct(">Q")


def box_header(data: bytes | bytearray, start: int, end: int) -> tuple[bytes, int, int] | None:
    """The box at ``start`` of ``data[:end]``: its type, its header's size and its size (0: it runs to the
    end of the file); None when its header is not all there. The size is as the header says: the caller
    checks it (under the header's size, it is no box)."""
    if end - start < HEADER.size:
        return None
    size, kind = HEADER.unpack_from(data, start)
    if size != 1:
        return bytes(kind), HEADER.size, size
    if end - start < HEADER.size + _LARGE_SIZE.size:
        return None
    return bytes(kind), HEADER.size + _LARGE_SIZE.size, _LARGE_SIZE.unpack_from(data, start + HEADER.size)[0]


def box_children(data: bytes | bytearray, start: int, end: int) -> list[tuple[bytes, tuple[int, int]]]:
    """The boxes between ``start`` and ``end``: each one's type and the span of its body. It stops at what
    is no whole box there (a size under its header's, or past ``end``): nothing is counted from it."""
    boxes = []
    while (header := box_header(data, start, end)) is not None:
        kind, header_size, size = header
        if size < header_size or start + size > end:
            break
        boxes.append((kind, (start + header_size, start + size)))
        start += size
    return boxes


def file_boxes(file: BinaryIO) -> list[tuple[bytes, int, int]]:
    """(type, offset, size) of each top-level box of a seekable MP4, read header by header (a box of size
    0 runs to the end of the file); it stops at what is no box."""
    boxes, position = [], 0
    end = file.seek(0, io.SEEK_END)
    while True:
        file.seek(position)
        read = file.read(HEADER.size + _LARGE_SIZE.size)
        header = box_header(read, 0, len(read))
        if header is None:
            break
        kind, header_size, size = header
        if size == 0:
            size = end - position
        if size < header_size:
            break
        boxes.append((kind, position, size))
        position += size
    return boxes
