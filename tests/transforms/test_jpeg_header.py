"""read_jpeg_header: the frame size without decoding, for every JPEG flavour Pillow writes."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from pipeline_opt.transforms.jpeg_header import read_jpeg_header


def _jpeg(mode: str = "RGB", size=(53, 37), **save) -> bytes:
    arr = np.random.default_rng(0).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).convert(mode).save(buf, "JPEG", **save)
    return buf.getvalue()


@pytest.mark.parametrize("mode, save, components, progressive", [
    ("RGB", {}, 3, False),
    ("RGB", {"progressive": True}, 3, True),
    ("L", {}, 1, False),
    ("CMYK", {}, 4, False),
    ("RGB", {"exif": Image.Exif().tobytes(), "icc_profile": b"\0" * 5000}, 3, False),
], ids=["baseline", "progressive", "grey", "cmyk", "exif+icc"])
def test_header_matches_pillow(mode, save, components, progressive):
    data = _jpeg(mode, **save)
    header = read_jpeg_header(data)
    assert (header.width, header.height) == Image.open(io.BytesIO(data)).size == (53, 37)
    assert header.components == components and header.progressive == progressive
    assert read_jpeg_header(torch.frombuffer(bytearray(data), dtype=torch.uint8)) == header
    assert read_jpeg_header(np.frombuffer(data, dtype=np.uint8)) == header


def test_path_with_segments_beyond_the_first_read(tmp_path):
    data = _jpeg(icc_profile=b"\1" * 60000, exif=Image.Exif().tobytes(), size=(640, 480))
    path = tmp_path / "big_header.jpg"
    path.write_bytes(data[:2] + b"\xff\xe5" + (20000).to_bytes(2, "big") + b"\0" * 19998 + data[2:])
    header = read_jpeg_header(path)
    assert (header.height, header.width) == (480, 640)


def test_errors_name_the_file(tmp_path):
    png = tmp_path / "image.jpg"
    Image.new("RGB", (8, 8)).save(png, "PNG")
    with pytest.raises(ValueError, match="image.jpg.*not a JPEG"):
        read_jpeg_header(png)
    with pytest.raises(ValueError, match="no JPEG frame header"):
        read_jpeg_header(_jpeg()[:40])
