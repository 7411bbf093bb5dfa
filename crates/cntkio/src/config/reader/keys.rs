//! Typed lookups of config keys, with CNTK's conversions of scalars.

use crate::config::brainscript::{Block, Entry, Pos, Resolved, Scope};
use cntkio_core::error::Error;

/// How CNTK converts a value to a boolean (`ConfigValue::operator bool`).
pub(super) fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "t" | "true" | "T" | "True" | "TRUE" | "1" => Some(true),
        "f" | "false" | "F" | "False" | "FALSE" | "0" | "" => Some(false),
        _ => None,
    }
}

/// An unsigned decimal integer (CNTK uses `strtoull`, base 10, and requires the whole string).
fn parse_u64(s: &str) -> Option<u64> {
    let d = s.strip_prefix('+').unwrap_or(s);
    if d.is_empty() || !d.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    d.parse().ok()
}

fn parse_i64(s: &str) -> Option<i64> {
    let (neg, d) = match s.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if d.is_empty() || !d.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let v: i64 = d.parse().ok()?;
    Some(if neg { -v } else { v })
}

/// Looks keys up in a block, and (with `fallback`) in the enclosing blocks, as CNTK's `config(key, default)`
/// does. A value `default` means "not given".
pub(super) struct Keys<'a> {
    pub(super) scope: Scope<'a>,
    pub(super) fallback: bool,
    pub(super) path: String,
}

impl<'a> Keys<'a> {
    pub(super) fn block(&self) -> &'a Block {
        self.scope.block()
    }

    pub(super) fn entry(&self, key: &str) -> Option<(Scope<'a>, &'a Entry)> {
        if self.fallback {
            self.scope.lookup(key)
        } else {
            self.block().get(key).map(|e| (self.scope.clone(), e))
        }
    }

    /// The resolved value and the key as written.
    pub(super) fn get(&self, key: &str) -> Result<Option<(Resolved<'a>, &'a str)>, Error> {
        let Some((scope, e)) = self.entry(key) else {
            return Ok(None);
        };
        let v = scope.resolve(&e.value)?;
        if matches!(&v, Resolved::Text { text, .. } if text == "default") {
            return Ok(None);
        }
        Ok(Some((v, &e.key)))
    }

    pub(super) fn err(&self, pos: Pos, key: &str, message: impl std::fmt::Display) -> Error {
        pos.key_error(format!("{}.{key}", self.path), message.to_string())
    }

    pub(super) fn text(&self, key: &str) -> Result<Option<(String, Pos)>, Error> {
        Ok(self.text_key(key)?.map(|(t, pos, _)| (t, pos)))
    }

    /// A scalar value, where it is, and the key as written.
    pub(super) fn text_key(&self, key: &str) -> Result<Option<(String, Pos, &'a str)>, Error> {
        match self.get(key)? {
            None => Ok(None),
            Some((Resolved::Text { text, pos }, written)) => Ok(Some((text, pos, written))),
            Some((other, written)) => {
                Err(self.err(other.pos(), written, format_args!("expected a single value, found {}", other.describe())))
            }
        }
    }

    pub(super) fn bool(&self, key: &str) -> Result<Option<(bool, Pos)>, Error> {
        let Some((t, pos, key)) = self.text_key(key)? else {
            return Ok(None);
        };
        match parse_bool(&t) {
            Some(b) => Ok(Some((b, pos))),
            None => Err(self.err(
                pos,
                key,
                format_args!("expected a boolean (true, false, T, F, 1, 0, True, False, TRUE, FALSE), found {t:?}"),
            )),
        }
    }

    pub(super) fn bool_or(&self, key: &str, default: bool) -> Result<bool, Error> {
        Ok(self.bool(key)?.map_or(default, |(b, _)| b))
    }

    pub(super) fn u64(&self, key: &str) -> Result<Option<(u64, Pos)>, Error> {
        let Some((t, pos, key)) = self.text_key(key)? else {
            return Ok(None);
        };
        match parse_u64(&t) {
            Some(v) => Ok(Some((v, pos))),
            None => Err(self.err(pos, key, format_args!("expected a non-negative integer, found {t:?}"))),
        }
    }

    pub(super) fn u64_or(&self, key: &str, default: u64) -> Result<u64, Error> {
        Ok(self.u64(key)?.map_or(default, |(v, _)| v))
    }

    pub(super) fn i64(&self, key: &str) -> Result<Option<(i64, Pos)>, Error> {
        let Some((t, pos, key)) = self.text_key(key)? else {
            return Ok(None);
        };
        match parse_i64(&t) {
            Some(v) => Ok(Some((v, pos))),
            None => Err(self.err(pos, key, format_args!("expected an integer, found {t:?}"))),
        }
    }

    /// `traceLevel`: CNTK compares it with `>=`, so a negative level behaves as 0.
    pub(super) fn trace_level(&self) -> Result<Option<u32>, Error> {
        Ok(self.i64("traceLevel")?.map(|(v, _)| v.clamp(0, i64::from(u32::MAX)) as u32))
    }

    /// A block-valued key of this block (no fallback), with the scope to read it in.
    pub(super) fn sub_block(&self, key: &str) -> Result<Option<(&'a Entry, Keys<'a>)>, Error> {
        let Some(e) = self.block().get(key) else {
            return Ok(None);
        };
        match self.scope.resolve(&e.value)? {
            Resolved::Block(b) => Ok(Some((
                e,
                Keys { scope: self.scope.with(b), fallback: false, path: format!("{}.{}", self.path, e.key) },
            ))),
            other => {
                Err(self.err(other.pos(), &e.key, format_args!("expected a block [ … ], found {}", other.describe())))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cntk_scalars() {
        for t in ["t", "true", "T", "True", "TRUE", "1"] {
            assert_eq!(parse_bool(t), Some(true), "{t}");
        }
        for f in ["f", "false", "F", "False", "FALSE", "0", ""] {
            assert_eq!(parse_bool(f), Some(false), "{f}");
        }
        assert_eq!(parse_bool("tRue"), None);
        assert_eq!(parse_bool("yes"), None);
        assert_eq!(parse_u64("+12"), Some(12));
        assert_eq!(parse_u64("-1"), None);
        assert_eq!(parse_u64("1e3"), None);
        assert_eq!(parse_u64("99999999999999999999"), None);
        assert_eq!(parse_i64("-3"), Some(-3));
    }
}
