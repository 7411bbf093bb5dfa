//! Random CTF files with noise, from a small grammar (proptest strategies).
//!
//! A [`Case`] is a file plus a configuration: streams (1–3, dense/sparse, dims 0–10, f32/f64, at most one
//! `definesMBSize`), `skipSequenceIds`, `chunkSizeInBytes` (0 B to `u64::MAX`) and `maxErrors`. Files mix
//! id mode and line mode, repeated/absent/leading-zero/overflowing ids, BOMs, leading blank lines, CRLF,
//! tabs, comments, unknown and over-long names, every accepted and rejected number form, too many / too
//! few dense values, good and bad sparse entries, empty samples, duplicate inputs, blank rows, control
//! bytes and bytes ≥ 0x80, and a missing final newline.

use super::{Elem, StreamCfg};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use std::fmt;

/// A generated file and configuration.
#[derive(Clone)]
pub struct Case {
    /// The file.
    pub data: Vec<u8>,
    /// The configured streams.
    pub streams: Vec<StreamCfg>,
    /// `skipSequenceIds`.
    pub skip_ids: bool,
    /// `chunkSizeInBytes`.
    pub chunk_size: u64,
    /// `maxErrors`.
    pub max_errors: u64,
    /// `precision`.
    pub elem: Elem,
    /// How malformed the file was made (0: only harmless noise; 3: most).
    pub noise: u8,
}

impl Case {
    /// The alias of the `definesMBSize` stream.
    pub fn main(&self) -> Option<&str> {
        self.streams.iter().find(|s| s.defines).map(|s| s.alias.as_str())
    }
}

impl fmt::Debug for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "Case {{")?;
        writeln!(f, "  data: b\"{}\",", self.data.escape_ascii())?;
        for s in &self.streams {
            writeln!(
                f,
                "  stream {} alias={:?} {} dim={}{}",
                s.name,
                s.alias,
                if s.dense { "dense" } else { "sparse" },
                s.dim,
                if s.defines { " definesMBSize" } else { "" }
            )?;
        }
        writeln!(
            f,
            "  skip_ids={} chunk_size={} max_errors={} elem={:?} noise={}\n}}",
            self.skip_ids, self.chunk_size, self.max_errors, self.elem, self.noise
        )
    }
}

/// Aliases configured streams may get.
const ALIASES: &[&str] = &["a", "b", "ab", "F0", "S1", "x", "labels", "features"];
/// Names in files that are (usually) not configured.
const OTHER_NAMES: &[&str] = &["c", "zz", "a1", "A", "ab", "F", "this_is_a_long_input_name"];
/// Sequence ids (index 255 of the selector gives an overflowing id instead).
const IDS: &[&str] = &["0", "1", "2", "3", "7", "10", "42", "18446744073709551615"];

#[derive(Debug, Clone)]
struct Entry {
    idx: u8,
    form: u8,
    val: Tok,
}

/// A value: a valid number, and what is written instead when the file is noisy.
#[derive(Debug, Clone)]
struct Tok {
    sel: u8,
    good: String,
    any: String,
}

/// One configured stream's sample on a row.
#[derive(Debug, Clone)]
struct Base {
    /// Left out of the row when noisy (e.g. a label only on some rows).
    present: u8,
    name_sep: &'static str,
    /// Number of dense values relative to `dim` (noisy: too few / too many).
    count: u8,
    dense: Vec<(&'static str, Tok)>,
    sparse: Vec<(&'static str, Entry)>,
}

#[derive(Debug, Clone)]
enum Item {
    /// A sample of a configured (sel % 8 < 6) or unknown stream, with random values.
    Sample {
        sel: u8,
        sep: &'static str,
        dense: Vec<(&'static str, String)>,
        sparse: Vec<(&'static str, Entry)>,
    },
    Comment(String),
    Junk(String),
    EmptyName(&'static str),
    Raw(&'static [u8]),
}

impl Item {
    /// Items that never cost an error: comments, unknown names, bytes skipped between samples.
    fn harmless(&self, n_streams: usize) -> bool {
        match self {
            Item::Comment(body) => !body.contains('|'),
            Item::Raw(_) => true,
            Item::Sample { sel, sep, .. } => sel % 8 >= 6 && n_streams > 0 && (*sep == " " || *sep == "\t"),
            _ => false,
        }
    }
}

#[derive(Debug, Clone)]
struct Row {
    id_kind: u8,
    id_sel: u8,
    zeros: u8,
    id_sep: &'static str,
    order: u8,
    base: Vec<(&'static str, Base)>,
    extra: Vec<(u8, &'static str, Item)>,
    end: &'static str,
}

#[derive(Debug, Clone)]
struct FileSpec {
    special: u8,
    /// 0: clean (only harmless noise), 1–3: more and more malformed content.
    noise: u8,
    prefix: &'static [u8],
    mode: u8,
    rows: Vec<Row>,
    last_end: &'static str,
}

/// A valid number in the forms real files use, plus long and extreme ones.
fn good_number() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => "[0-9]{1,3}",
        4 => "-?[0-9]{1,2}\\.[0-9]{1,6}",
        3 => "[+-]?[0-9]{1,2}(\\.[0-9]{1,3})?[eE][+-]?[0-9]{1,2}",
        1 => "[0-9]{15,20}",
        1 => "[0-9]\\.[0-9]{20,25}",
        1 => "[0-9]{1,25}\\.[0-9]{1,25}(e-?[0-9]{1,3})?",
        1 => "[0-9]{1,3}e[+-]?[0-9]{3,4}",
        2 => prop::sample::select(vec![
            "5.", "1E-3", "1e400", "-1e400", "0e400", "-0e400", "1e-400", "3.5e38", "-0", "+2.5", "007",
            "1e0000000000000000000001", "123456789012345678901234567890", "3.4028235e38", "3.40282357e38",
            "1.401298464e-45", "7e-46", "16777217", "1.00000005960464477539", "0.1", "9.10e-11", "45.", "1e308",
            "1.7976931348623157e308", "2.2250738585072014e-308", "4.9e-324", "0.000000000000000000001e-300",
        ])
        .prop_map(str::to_string),
    ]
}

/// Any number token: valid ones and every rejected form of CTF.md §5.3.
fn number() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => good_number(),
        1 => prop::sample::select(vec![
            ".5", "-.25", "1e", "1e+", "nan", "inf", "0x1", "--1", "+-1", "1e5e5", "1.5.5", "1.e5", "2,5",
            "12abc", "1:2", "-", "+", "e5", "1e-", "x", "1-2", "1+2", "1.5-2.5e1",
        ])
        .prop_map(str::to_string),
    ]
}

fn tok() -> impl Strategy<Value = Tok> {
    (any::<u8>(), good_number(), number()).prop_map(|(sel, good, any)| Tok { sel, good, any })
}

/// Separators between values: mostly one space, sometimes tabs, several spaces or nothing.
fn value_sep() -> impl Strategy<Value = &'static str> {
    prop_oneof![8 => Just(" "), 2 => Just("\t"), 1 => Just("  "), 1 => Just(" \t"), 1 => Just("")]
}

fn entry() -> impl Strategy<Value = Entry> {
    (any::<u8>(), any::<u8>(), tok()).prop_map(|(idx, form, val)| Entry { idx, form, val })
}

fn base() -> impl Strategy<Value = Base> {
    (
        any::<u8>(),
        prop_oneof![
            20 => Just(" "), 4 => Just("\t"), 1 => Just(""), 1 => Just("\x0b"), 1 => Just("\x00"),
            1 => Just("\r"), 1 => Just("  "), 1 => Just("|"),
        ],
        any::<u8>(),
        prop::collection::vec((value_sep(), tok()), 12),
        prop::collection::vec((value_sep(), entry()), 0..5),
    )
        .prop_map(|(present, name_sep, count, dense, sparse)| Base { present, name_sep, count, dense, sparse })
}

fn item() -> impl Strategy<Value = Item> {
    prop_oneof![
        8 => (
            any::<u8>(),
            prop_oneof![10 => Just(" "), 2 => Just("\t"), 1 => Just(""), 1 => Just("\x0b"), 1 => Just("|")],
            prop::collection::vec((value_sep(), number()), 0..6),
            prop::collection::vec((value_sep(), entry()), 0..5),
        )
            .prop_map(|(sel, sep, dense, sparse)| Item::Sample { sel, sep, dense, sparse }),
        4 => "[ a-z0-9:#.|]{0,8}".prop_map(Item::Comment),
        1 => "[a-z0-9:.#+-]".prop_map(Item::Junk),
        1 => prop::sample::select(vec![" ", "\t", "|", "\r", "\x0b"]).prop_map(Item::EmptyName),
        2 => prop::sample::select(vec![
            &b"\x0b"[..], b"\x0c", b"\x00", b"\x80", b"\xc3\xa9", b"\xff", b"\r", b"\xef\xbb\xbf", b"\x1f",
        ])
        .prop_map(Item::Raw),
    ]
}

fn item_sep() -> impl Strategy<Value = &'static str> {
    prop_oneof![8 => Just(" "), 3 => Just("\t"), 2 => Just(""), 1 => Just(" \t "), 1 => Just("\t\t")]
}

fn row() -> impl Strategy<Value = Row> {
    (
        (any::<u8>(), any::<u8>(), prop_oneof![6 => Just(0u8), 1 => 1u8..3]),
        prop_oneof![6 => Just(" "), 3 => Just("\t"), 2 => Just(""), 1 => Just("  ")],
        any::<u8>(),
        prop::collection::vec((item_sep(), base()), 3),
        prop::collection::vec((any::<u8>(), item_sep(), item()), 0..4),
        prop_oneof![20 => Just("\n"), 4 => Just("\r\n"), 1 => Just("\r"), 1 => Just(" \n")],
    )
        .prop_map(|((id_kind, id_sel, zeros), id_sep, order, base, extra, end)| Row {
            id_kind,
            id_sel,
            zeros,
            id_sep,
            order,
            base,
            extra,
            end,
        })
}

fn file_spec() -> impl Strategy<Value = FileSpec> {
    (
        prop_oneof![80 => Just(0u8), 1 => 1u8..4],
        prop_oneof![3 => Just(0u8), 2 => Just(1u8), 1 => Just(2u8), 1 => Just(3u8)],
        prop_oneof![
            12 => Just(&b""[..]),
            2 => Just(&b"\xef\xbb\xbf"[..]),
            1 => Just(&b"\xef\xbb"[..]),
            2 => Just(&b"\n\n"[..]),
            1 => Just(&b" \t\n"[..]),
            1 => Just(&b"\r\n"[..]),
            1 => Just(&b"\xef\xbb\xbf\n \x0b\x0c"[..]),
            1 => Just(&b"\xfe\xff"[..]),
        ],
        0u8..3,
        prop::collection::vec(row(), 1..12),
        prop_oneof![6 => Just("\n"), 1 => Just(""), 1 => Just("\r\n")],
    )
        .prop_map(|(special, noise, prefix, mode, rows, last_end)| FileSpec {
            special,
            noise,
            prefix,
            mode,
            rows,
            last_end,
        })
}

/// Streams: 1–3 distinct aliases, dense or sparse, small dims, at most one `definesMBSize`.
fn streams() -> impl Strategy<Value = Vec<StreamCfg>> {
    (
        Just(ALIASES.to_vec()).prop_shuffle(),
        prop::collection::vec(
            (any::<bool>(), prop_oneof![1 => Just(0usize), 30 => 1usize..5, 3 => Just(10usize)]),
            1..4,
        ),
        prop_oneof![2 => Just(None), 1 => (0usize..3).prop_map(Some)],
    )
        .prop_map(|(aliases, specs, main)| {
            let n = specs.len();
            specs
                .into_iter()
                .enumerate()
                .map(|(i, (dense, dim))| StreamCfg {
                    name: format!("s{i}"),
                    alias: aliases[i].to_string(),
                    dense,
                    dim,
                    defines: main.map(|m| m % n) == Some(i),
                })
                .collect()
        })
}

/// The strategy of whole cases.
pub fn case() -> impl Strategy<Value = Case> {
    (
        streams(),
        file_spec(),
        prop_oneof![3 => Just(false), 1 => Just(true)],
        prop::sample::select(vec![0u64, 1, 2, 16, 40, 64, 100, 200, 1024, 1 << 20, 32 << 20, u64::MAX]),
        prop::sample::select(vec![0u64, 0, 0, 1, 2, 3, 5, 10, 100, 1_000_000]),
        any::<bool>(),
    )
        .prop_map(|(streams, spec, skip_ids, chunk_size, max_errors, f64)| {
            let data = render(&spec, &streams);
            let elem = if f64 { Elem::F64 } else { Elem::F32 };
            Case { data, streams, skip_ids, chunk_size, max_errors, elem, noise: spec.noise }
        })
}

/// `count` cases from a fixed seed (for batch runs against the Python model).
pub fn cases_from_seed(seed: u8, count: usize) -> Vec<Case> {
    let mut runner = TestRunner::new_with_rng(Config::default(), TestRng::from_seed(RngAlgorithm::ChaCha, &[seed; 32]));
    let s = case();
    (0..count).map(|_| s.new_tree(&mut runner).expect("a case").current()).collect()
}

fn render_entry(out: &mut Vec<u8>, e: &Entry, dim: usize, noise: u8) {
    let noisy = noise > 0 && e.form % 8 < noise;
    let v = if noise > 0 && e.val.sel % 16 < noise { &e.val.any } else { &e.val.good };
    if !noisy {
        let i = u64::from(e.idx) % (dim.max(1) as u64);
        out.extend_from_slice(format!("{i}:{v}").as_bytes());
        return;
    }
    let i = u64::from(e.idx) % (dim as u64 + 2);
    let s = match e.form / 8 % 16 {
        0 => format!("{i}: {v}"),
        1 => format!("{i} {v}"),
        2 => format!("+{i}:{v}"),
        3 => format!("99999999999999999999:{v}"),
        4 => format!("30000000000000000000:{v}"),
        5 => format!("0{i}:{v}"),
        6 => format!("{i}:"),
        7 => format!("{i}::{v}"),
        8 => format!(":{v}"),
        9 => format!("{i}:x{v}"),
        10 => format!("-{i}:{v}"),
        11 => format!("{i}:{v}:{v}"),
        12 => format!("18446744073709551616:{v}"),
        _ => format!("{i}:{v}"),
    };
    out.extend_from_slice(s.as_bytes());
}

fn render(spec: &FileSpec, streams: &[StreamCfg]) -> Vec<u8> {
    match spec.special {
        1 => return Vec::new(),
        2 => return b" \n\t\x0b\x0c\r\n".to_vec(),
        3 => return b"\xff\xfe|a 1\n".to_vec(),
        _ => {}
    }
    let noise = spec.noise;
    let others: Vec<&str> = OTHER_NAMES.iter().copied().filter(|n| !streams.iter().any(|s| s.alias == *n)).collect();
    let mut out = spec.prefix.to_vec();
    let mut prev: Option<String> = None;
    let nrows = spec.rows.len();
    for (r, row) in spec.rows.iter().enumerate() {
        // The id prefix: mode 0 = id mode (first row always has an id), 1 = no ids, 2 = mixed.
        let fresh = |sel: u8| {
            if sel == 255 && noise > 0 {
                "99999999999999999999".to_string()
            } else {
                IDS[sel as usize % IDS.len()].to_string()
            }
        };
        let id: Option<(bool, String)> = match spec.mode {
            0 => match (row.id_kind % 8, &prev) {
                (_, None) => Some((false, fresh(row.id_sel))),
                (0..=3, Some(p)) => Some((false, p.clone())),
                (4..=5, _) => Some((false, fresh(row.id_sel))),
                (6, _) => None,
                _ => Some((noise > 0, fresh(row.id_sel))),
            },
            1 => None,
            _ => match row.id_kind % 3 {
                0 => Some((false, fresh(row.id_sel))),
                1 => None,
                _ => Some((false, prev.clone().unwrap_or_else(|| fresh(row.id_sel)))),
            },
        };
        if let Some((space, id)) = id {
            if space {
                out.push(b' ');
            }
            out.resize(out.len() + usize::from(row.zeros), b'0');
            out.extend_from_slice(id.as_bytes());
            out.extend_from_slice(row.id_sep.as_bytes());
            prev = Some(id);
        }
        // The row: one sample per configured stream (in a rotated order), with extra items between.
        let mut pieces: Vec<Vec<u8>> = Vec::new();
        let n = streams.len();
        for k in 0..n {
            let (sep, b) = &row.base[k];
            let s = &streams[(k + row.order as usize) % n];
            if noise > 0 && b.present % 8 < noise {
                continue;
            }
            let mut p = sep.as_bytes().to_vec();
            p.push(b'|');
            p.extend_from_slice(s.alias.as_bytes());
            let name_sep = if noise > 0 && b.present % 16 < 2 * noise { b.name_sep } else { " " };
            p.extend_from_slice(name_sep.as_bytes());
            if s.dense {
                let cnt = if noise > 0 && b.count % 8 < noise { b.count as usize / 8 % (s.dim + 3) } else { s.dim };
                for (j, (vsep, v)) in b.dense.iter().take(cnt).enumerate() {
                    if j > 0 {
                        p.extend_from_slice(if noise == 0 && vsep.is_empty() { b" " } else { vsep.as_bytes() });
                    }
                    let v = if noise > 0 && v.sel % 16 < noise { &v.any } else { &v.good };
                    p.extend_from_slice(v.as_bytes());
                }
            } else {
                let entries = if noise == 0 && s.dim == 0 { &[][..] } else { &b.sparse[..] };
                for (j, (vsep, e)) in entries.iter().enumerate() {
                    if j > 0 {
                        p.extend_from_slice(if noise == 0 && vsep.is_empty() { b" " } else { vsep.as_bytes() });
                    }
                    render_entry(&mut p, e, s.dim, noise);
                }
            }
            pieces.push(p);
        }
        for (pos, sep, it) in &row.extra {
            if !(it.harmless(n) || pos % 4 < noise) {
                continue;
            }
            let mut p = sep.as_bytes().to_vec();
            match it {
                Item::Sample { sel, sep, dense, sparse } => {
                    let known = sel % 8 < 6 || others.is_empty();
                    let (name, is_dense, dim) = if known {
                        let s = &streams[*sel as usize % streams.len()];
                        (s.alias.as_str(), s.dense, s.dim)
                    } else {
                        (others[*sel as usize % others.len()], sel % 2 == 0, 3)
                    };
                    p.push(b'|');
                    p.extend_from_slice(name.as_bytes());
                    p.extend_from_slice(sep.as_bytes());
                    if is_dense {
                        for (j, (vsep, v)) in dense.iter().enumerate() {
                            if j > 0 {
                                p.extend_from_slice(vsep.as_bytes());
                            }
                            p.extend_from_slice(v.as_bytes());
                        }
                    } else {
                        for (j, (vsep, e)) in sparse.iter().enumerate() {
                            if j > 0 {
                                p.extend_from_slice(vsep.as_bytes());
                            }
                            render_entry(&mut p, e, dim, 3);
                        }
                    }
                }
                Item::Comment(body) => {
                    p.extend_from_slice(b"|#");
                    p.extend_from_slice(body.as_bytes());
                }
                Item::Junk(j) => p.extend_from_slice(j.as_bytes()),
                Item::EmptyName(after) => {
                    p.push(b'|');
                    p.extend_from_slice(after.as_bytes());
                }
                Item::Raw(b) => p.extend_from_slice(b),
            }
            let at = *pos as usize % (pieces.len() + 1);
            pieces.insert(at, p);
        }
        for p in pieces {
            out.extend_from_slice(&p);
        }
        let end = if r + 1 == nrows {
            spec.last_end
        } else if noise == 0 && row.end == "\r" {
            "\n"
        } else {
            row.end
        };
        out.extend_from_slice(end.as_bytes());
    }
    out
}
