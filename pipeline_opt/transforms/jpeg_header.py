"""The size of a JPEG read from its header, without decoding it.

The random-augmentation replay (:mod:`pipeline_opt.transforms.replay`) draws crop boxes in the
workers from the image size alone; the pixels are decoded later, on the device. The size is in the
frame header (an ``SOFn`` marker), which :func:`read_jpeg_header` finds by walking the marker
segments from the start of the file: a few dozen bytes for most files, the EXIF / ICC segments
are skipped by their lengths.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

__all__ = ["JPEG_SUFFIXES", "JpegHeader", "read_jpeg_header"]

JPEG_SUFFIXES = (".jpg", ".jpeg", ".jpe", ".jfif")  # lower-case file suffixes taken for JPEG files

# Start-of-frame markers (C0..CF except DHT C4, JPG C8 and DAC CC); progressive ones separately.
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_PROGRESSIVE = frozenset({0xC2, 0xC6, 0xCA, 0xCE})
_NO_LENGTH = frozenset({0x01, *range(0xD0, 0xD8)})  # TEM and RSTn carry no length field


@dataclass(frozen=True)
class JpegHeader:
    """What the frame header says: size, number of colour components, coding process."""

    height: int
    width: int
    components: int  # 1 grey, 3 YCbCr/RGB, 4 CMYK/YCCK
    progressive: bool
    marker: int  # the SOFn marker byte (0xC0 baseline, 0xC1 extended, 0xC2 progressive...)


def _where(source: Any) -> str:
    return repr(os.fspath(source)) if isinstance(source, (str, os.PathLike)) else "the given bytes"


def read_jpeg_header(source: bytes | bytearray | memoryview | Any) -> JpegHeader:
    """The :class:`JpegHeader` of a JPEG given as bytes (or a 1-D uint8 tensor / array) or a path.

    Raises ``ValueError`` naming the file when it is not a JPEG or its header is cut short.
    """
    where = _where(source)
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as f:
            data = f.read(1 << 16)  # frame headers sit after EXIF/ICC segments; 64 KiB covers them nearly always
            header = _parse(memoryview(data), where, complete=False)
            if header is None:
                f.seek(0)
                header = _parse(memoryview(f.read()), where, complete=True)
        return header
    if hasattr(source, "numpy"):  # a torch tensor
        source = source.numpy()
    view = memoryview(source).cast("B") if not isinstance(source, memoryview) else source.cast("B")
    header = _parse(view, where, complete=True)
    assert header is not None
    return header


def _parse(buf: memoryview, where: str, complete: bool) -> JpegHeader | None:
    """Walk the marker segments; ``None`` when ``buf`` ends before the frame header and is not
    the whole file (``complete=False``)."""
    n = len(buf)
    if n < 4 or buf[0] != 0xFF or buf[1] != 0xD8:
        raise ValueError(f"{where} is not a JPEG (it does not start with the SOI marker FF D8); the GPU "
                         "decode path reads JPEG files only: convert the images or keep CPU decoding")
    pos = 2
    while True:
        while pos < n and buf[pos] != 0xFF:  # tolerate garbage between segments, as libjpeg does
            pos += 1
        while pos < n and buf[pos] == 0xFF:  # fill bytes
            pos += 1
        if pos >= n:
            break
        marker = buf[pos]
        pos += 1
        if marker in _NO_LENGTH:
            continue
        if marker in (0xD9, 0xDA):  # end of image / start of scan before any frame header
            break
        if pos + 2 > n:
            break
        length = (buf[pos] << 8) | buf[pos + 1]
        if marker in _SOF:
            if pos + 8 > n:
                break
            height = (buf[pos + 3] << 8) | buf[pos + 4]
            width = (buf[pos + 5] << 8) | buf[pos + 6]
            components = buf[pos + 7]
            if height == 0 or width == 0:
                raise ValueError(f"{where} declares a {width}x{height} frame (a DNL-marker height is not "
                                 "supported); re-encode the file")
            return JpegHeader(height=height, width=width, components=components,
                              progressive=marker in _PROGRESSIVE, marker=marker)
        if length < 2:
            raise ValueError(f"{where} has a corrupt JPEG segment (marker FF {marker:02X} with length {length})")
        pos += length
    if not complete:
        return None
    raise ValueError(f"{where} has no JPEG frame header (SOFn marker) before its image data; the file is "
                     "truncated or not a JPEG")


def jpeg_folder_problem(dataset: object) -> str:
    """Why ``dataset`` is not an ImageFolder-like set of JPEG files that a GPU decoder may read
    itself ("" when it is): it needs ``.samples`` of (path, label), torchvision's own PIL loader
    (another loader would be skipped) and JPEG files only."""
    from torchvision.datasets.folder import default_loader, pil_loader

    samples = getattr(dataset, "samples", None)
    loader = getattr(dataset, "loader", None)
    if not samples or not callable(loader):
        return f"{type(dataset).__name__} is not an ImageFolder-like dataset (no .samples / .loader)"
    if loader not in (default_loader, pil_loader):
        return f"the dataset reads images with its own loader ({loader!r}), which GPU decoding would skip"
    bad = next((str(p) for p, _ in samples if not str(p).lower().endswith(JPEG_SUFFIXES)), None)
    if bad is not None:
        return f"not every image is a JPEG ({bad.rsplit('/', 1)[-1]})"
    return ""
