//! Errors rendered the way rustc does: `path:line:col: error[E0005]: message`, the offending line with
//! the bad bytes underlined, and a `help:` line.

use cntkio::Error;

/// How many bytes of a line are shown at most.
const SHOWN: usize = 100;

/// Renders an error (with a source snippet when the position names a file, line and column).
pub fn render(e: &Error) -> String {
    let mut s = format!("{e}\n");
    if let Some(snip) = snippet(e) {
        s.push_str(&snip);
    }
    let mut inner = e;
    while let cntkio::ErrorKind::MaxErrorsReached { last, .. } = inner.kind() {
        inner = last;
    }
    if let Some(h) = inner.kind().help() {
        s.push_str(&format!("  = help: {h}\n"));
    }
    s
}

/// The offending line with a caret under the bad bytes.
pub fn snippet(e: &Error) -> Option<String> {
    let p = e.position();
    let (path, byte, line, col) = (p.path.as_ref()?, p.byte?, p.line?, p.column?);
    let line_start = byte.checked_sub(col - 1)?;
    // Show a window of the line around the column.
    let rel = (col - 1) as usize;
    let from = rel.saturating_sub(SHOWN / 2);
    // Through the decompressed view for a compressed file (positions are those of the decompressed data).
    let f = cntkio::InputFile::open(std::path::Path::new(path), cntkio::Access::Read).ok()?;
    let mut buf = vec![0u8; SHOWN * 2];
    let n = f.read_some(line_start + from as u64, &mut buf).ok()?;
    buf.truncate(n);
    let nl = buf.iter().position(|&c| c == b'\n');
    let end = nl.unwrap_or(buf.len()).min(SHOWN);
    let truncated = match nl {
        Some(k) => k > SHOWN,
        None => buf.len() > SHOWN,
    };
    // A CRLF line's '\r' is part of the line ending, not of the text.
    let end = if end > 0 && buf[end - 1] == b'\r' && nl == Some(end) { end - 1 } else { end };
    let shown = &buf[..end];
    let caret_at = rel - from;
    let mut caret_len = shown
        .get(caret_at..)
        .map(|t| {
            // The bad token: up to whitespace or '|' (and ':' after the first byte, to mark a sparse index).
            1 + t.iter().skip(1).take_while(|&&c| !matches!(c, b' ' | b'\t' | b'|' | b'\n' | b'\r' | b':')).count()
        })
        .unwrap_or(0)
        .clamp(1, 40);
    if caret_at >= shown.len() {
        caret_len = 1;
    }
    let text: String = shown
        .iter()
        .map(|&c| match c {
            b'\t' => ' ',
            0x20..=0x7e => c as char,
            _ => '·',
        })
        .collect();
    let prefix = if from > 0 { "…" } else { "" };
    let suffix = if truncated { "…" } else { "" };
    let gutter = line.to_string();
    let pad = " ".repeat(gutter.len());
    Some(format!(
        "{pad} |\n{gutter} | {prefix}{text}{suffix}\n{pad} | {}{}{}\n",
        " ".repeat(prefix.chars().count()),
        " ".repeat(caret_at),
        "^".repeat(caret_len)
    ))
}
