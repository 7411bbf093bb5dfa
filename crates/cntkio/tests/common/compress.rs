//! Compressed forms of test data, made with the crates cntkio reads them with: gzip, multi-member gzip,
//! BGZF, zstd streamed (no declared size), one zstd frame, several, seekable zstd. Used by the tests of
//! `cntkio` and (`#[path]`) of `cntkio-cli`.
#![allow(dead_code)]

use cntkio::Compression;
use std::io::Write;

pub fn gzip(data: &[u8]) -> Vec<u8> {
    gzip_level(data, 6)
}

/// gzip at compression `level` (0–9).
pub fn gzip_level(data: &[u8], level: u32) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(level));
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// BGZF: one gzip member per `block` input bytes with the `BC` extra field giving the member's size,
/// then the empty end-of-file block.
pub fn bgzf(data: &[u8], block: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for piece in data.chunks(block).chain([&[][..]]) {
        let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(piece).unwrap();
        let deflated = e.finish().unwrap();
        let bsize = 18 + deflated.len() + 8;
        out.extend_from_slice(&[0x1f, 0x8b, 8, 4, 0, 0, 0, 0, 0, 0xff, 6, 0, b'B', b'C', 2, 0]);
        out.extend_from_slice(&u16::try_from(bsize - 1).unwrap().to_le_bytes());
        out.extend_from_slice(&deflated);
        out.extend_from_slice(&crc32fast::hash(piece).to_le_bytes());
        out.extend_from_slice(&(piece.len() as u32).to_le_bytes());
    }
    out
}

/// zstd frames of `frame` input bytes each, declaring their sizes, with checksums (as the `zstd` tool
/// writes them); with a seek table when `seekable`.
pub fn zstd_frames(data: &[u8], frame: usize, seekable: bool) -> Vec<u8> {
    let mut out = Vec::new();
    let mut table = Vec::new();
    for piece in data.chunks(frame.max(1)) {
        let mut c = zstd::bulk::Compressor::new(3).unwrap();
        c.include_checksum(true).unwrap();
        let z = c.compress(piece).unwrap();
        table.extend_from_slice(&(z.len() as u32).to_le_bytes());
        table.extend_from_slice(&(piece.len() as u32).to_le_bytes());
        out.extend_from_slice(&z);
    }
    if seekable {
        let n = (table.len() / 8) as u32;
        out.extend_from_slice(&0x184D_2A5Eu32.to_le_bytes());
        out.extend_from_slice(&(table.len() as u32 + 9).to_le_bytes());
        out.extend_from_slice(&table);
        out.extend_from_slice(&n.to_le_bytes());
        out.push(0);
        out.extend_from_slice(&0x8F92_EAB1u32.to_le_bytes());
    }
    out
}

/// One zstd frame written as a stream: no declared size, so it is read through the spool.
pub fn zstd_streamed(data: &[u8]) -> Vec<u8> {
    let mut e = zstd::stream::Encoder::new(Vec::new(), 3).unwrap();
    e.include_checksum(true).unwrap();
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// Every compressed form of `data` made here: (name, bytes, the compression cntkio must see).
pub fn compressed_forms(data: &[u8]) -> Vec<(&'static str, Vec<u8>, Compression)> {
    let third = data.len().div_ceil(3).max(1);
    let multi: Vec<u8> = data.chunks(third).flat_map(gzip).collect();
    vec![
        ("gzip", gzip(data), Compression::Gzip),
        ("multi-member gzip", if data.is_empty() { gzip(data) } else { multi }, Compression::Gzip),
        ("BGZF", bgzf(data, 1000), Compression::Bgzf),
        ("zstd streamed", zstd_streamed(data), Compression::Zstd),
        ("one zstd frame", zstd_frames(data, data.len(), false), Compression::Zstd),
        ("zstd frames", zstd_frames(data, third, false), Compression::Zstd),
        ("seekable zstd", zstd_frames(data, 1000, true), Compression::SeekableZstd),
    ]
}
