"""Compressed input through the Python API: gzip (one member, several, BGZF-like blocks) and zstd (one frame
of recorded size, several frames) files read exactly as the plain file, told by their first bytes."""

from __future__ import annotations

import gzip
import io

import numpy as np
import pytest
import zstandard

import cntkio
from cntkio import CBFDeserializer, CTFDeserializer, MinibatchSource, StreamDef, StreamDefs

STREAMS = StreamDefs(
    query=StreamDef(field="word", shape=13, is_sparse=True, defines_mb_size=True),
    intent=StreamDef(field="intent", shape=5, is_sparse=True),
    slots=StreamDef(field="slot", shape=12, is_sparse=True),
)


def gzip_members(data: bytes, size: int) -> bytes:
    """`data` as gzip members of `size` bytes each (one member when `size` >= len)."""
    return b"".join(gzip.compress(data[i : i + size]) for i in range(0, len(data), size))


def zstd_frames(data: bytes, size: int) -> bytes:
    """`data` as zstd frames of `size` bytes each, every frame recording its size."""
    c = zstandard.ZstdCompressor(write_content_size=True)
    return b"".join(c.compress(data[i : i + size]) for i in range(0, len(data), size))


def zstd_stream(data: bytes) -> bytes:
    """`data` as one zstd frame written from a stream (its size not recorded)."""
    out = io.BytesIO()
    with zstandard.ZstdCompressor().stream_writer(out, closefd=False) as w:
        w.write(data)
    return out.getvalue()


ENCODINGS = {
    "gzip": lambda d: gzip.compress(d),
    "gzip members": lambda d: gzip_members(d, 1000),
    "zstd": lambda d: zstd_frames(d, len(d)),
    "zstd frames": lambda d: zstd_frames(d, 1500),
    "zstd stream": zstd_stream,
}


def arrays(data: cntkio.Data) -> dict:
    out = {"keys": data.sequence_keys.tolist(), "lengths": data.sequence_lengths.tolist()}
    for name in data:
        values, indices, indptr = (np.asarray(a) for a in data[name].raw())
        out[name] = (values.tolist(), indices.tolist(), indptr.tolist())
    return out


def batches(deserializer) -> list:
    src = MinibatchSource(deserializer, randomize=True, randomization_seed=7, max_sweeps=2, randomization_window_in_chunks=2)
    out = []
    while True:
        mb = src.next_minibatch(40)
        if not mb:
            return out
        out.append([(s.name, mb[s].keys.tolist(), mb[s].num_samples) for s in src.streams.values()])


@pytest.mark.parametrize("encoding", list(ENCODINGS))
def test_compressed_ctf_reads_as_the_plain_file(examples, tmp_path, encoding):
    plain = examples / "slots.ctf"
    packed = tmp_path / "slots.ctf.packed"  # the name says nothing: the first bytes do
    packed.write_bytes(ENCODINGS[encoding](plain.read_bytes()))
    assert cntkio.detect_format(packed) == "ctf"
    options = {"chunk_size": 2000}  # several chunks, so that randomization deals them
    ref = CTFDeserializer(plain, STREAMS, **options)
    got = CTFDeserializer(packed, STREAMS, **options)
    assert arrays(got.read()) == arrays(ref.read())
    expected = batches(ref)
    assert len(expected) > 10 and batches(got) == expected
    r = cntkio.validate(packed, STREAMS)
    assert (r.valid, r.sequences, r.samples) == (True, 60, 354)


@pytest.mark.parametrize("encoding", ["gzip", "zstd frames"])
def test_compressed_cbf_reads_as_the_plain_file(examples, tmp_path, encoding):
    cbf = tmp_path / "slots.cbf"
    cntkio.convert(CTFDeserializer(examples / "slots.ctf", STREAMS, chunk_size=2000), cbf)
    packed = tmp_path / "slots.bin"
    packed.write_bytes(ENCODINGS[encoding](cbf.read_bytes()))
    assert cntkio.detect_format(packed) == "cbf"
    assert arrays(CBFDeserializer(packed).read()) == arrays(CBFDeserializer(cbf).read())
    expected = batches(CBFDeserializer(cbf))
    assert len(expected) > 10 and batches(CBFDeserializer(packed)) == expected


def test_damaged_compressed_data_is_a_format_error_naming_the_file(examples, tmp_path):
    packed = tmp_path / "cut.ctf.gz"
    packed.write_bytes(gzip.compress((examples / "slots.ctf").read_bytes())[:-200])
    with pytest.raises(cntkio.FormatError) as e:
        CTFDeserializer(packed, STREAMS).read()
    assert e.value.code == "E0101" and str(packed) in str(e.value)


@pytest.mark.parametrize("name", ["out.ctf.zst", "out.ctf.gz"])
def test_ctf_written_compressed_reads_back_as_the_plain_text(examples, tmp_path, name):
    cbf = tmp_path / "slots.cbf"
    cntkio.convert(CTFDeserializer(examples / "slots.ctf", STREAMS, chunk_size=2000), cbf)
    plain, packed = tmp_path / "out.ctf", tmp_path / name
    cntkio.convert(cbf, plain)
    cntkio.convert(cbf, packed)
    raw = packed.read_bytes()
    if name.endswith(".gz"):
        text = gzip.decompress(raw)
    else:
        text = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw), read_across_frames=True).read()
    assert text == plain.read_bytes()
    # CBF keeps the stream names, which the text then uses as its input names.
    streams = StreamDefs(
        query=StreamDef(shape=13, is_sparse=True, defines_mb_size=True),
        intent=StreamDef(shape=5, is_sparse=True),
        slots=StreamDef(shape=12, is_sparse=True),
    )
    assert arrays(CTFDeserializer(packed, streams).read()) == arrays(CTFDeserializer(plain, streams).read())
