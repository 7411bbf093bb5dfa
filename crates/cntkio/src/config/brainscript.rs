//! A tolerant parser for the *config* language of CNTK's `.cntk` files (the legacy `ConfigParameters`
//! syntax that BrainScript configs are written in), and `$name$` variable resolution.
//!
//! This is not the full BrainScript language. It reads the structure every `.cntk` file shares:
//!
//! * records `name = value`, separated by newlines, `;` or `,` (CNTK also splits on `,`);
//!   a record `name` alone means `name = true`, and `name [ … ]` (no `=`) is accepted as CNTK does;
//! * values: bare words (`true`, `1e-3`, `train:test`, `C:\data\x.txt`), quoted strings `"…"` or `'…'`
//!   (no escapes, one line), blocks `[ … ]` or `{ … }` (dictionaries), arrays `( a : b : c )` whose elements
//!   are separated by `:`, `,` or newlines;
//! * `#` comments to the end of the line, when the `#` starts a token or follows whitespace (CNTK's rule:
//!   `a=b#c` is the value `b#c`), never inside quotes;
//! * keys compared case-insensitively; a key given twice replaces the earlier value, except that two blocks
//!   are merged (CNTK appends a second `[ … ]` to the first).
//!
//! Anything else — BrainScript expressions such as `Sequential (DenseLayer {10} : LinearLayer {2})` or
//! `x => x + 1` — is kept as an opaque [`Expr`] as long as its brackets balance, so sections nobody looks at
//! never stop a reader section from loading. A record that cannot be read at all (a missing `=`, say) is
//! recorded as a [`Problem`] of its block and skipped; whoever uses the block decides whether that is an
//! error. Only unbalanced brackets and unterminated strings fail the whole parse, because after them the
//! structure of the rest of the file is unknown, and blocks and arrays nested deeper than [`MAX_NESTING`].
//!
//! Variables are resolved lazily, when a value is used, by a [`Scope`]: see [`Scope::resolve`].

use cntkio_core::error::{Error, ErrorKind, Position};
use std::fmt;

/// Where a piece of config text comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Origin {
    /// The config file (or text) itself.
    Config,
    /// The command-line override with this 0-based index.
    Override(usize),
}

/// A position in config text: 1-based line and column (in bytes), 0-based byte offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pos {
    /// The text this position is in.
    pub origin: Origin,
    /// Byte offset from the start of the text.
    pub byte: usize,
    /// 1-based line.
    pub line: u32,
    /// 1-based column, in bytes.
    pub column: u32,
}

impl Pos {
    /// This position as an error [`Position`]. Positions in command-line overrides get the path
    /// `<override N>` (1-based); positions in the config text get no path (the caller knows the file).
    pub fn position(&self) -> Position {
        Position {
            path: match self.origin {
                Origin::Config => None,
                Origin::Override(i) => Some(format!("<override {}>", i + 1)),
            },
            byte: Some(self.byte as u64),
            line: Some(u64::from(self.line)),
            column: Some(u64::from(self.column)),
            sequence_id: None,
        }
    }

    /// A configuration error (`E1005`) at this position.
    pub fn error(&self, message: impl Into<String>) -> Error {
        let mut e = Error::config(message);
        *e.position_mut() = self.position();
        e
    }

    /// An invalid value of the config key `key` (its dotted path) at this position.
    pub fn key_error(&self, key: impl Into<String>, problem: impl Into<String>) -> Error {
        let mut e = Error::option(key, problem);
        *e.position_mut() = self.position();
        e
    }

    /// The position `n` bytes further on the same line.
    pub fn offset(self, n: usize) -> Pos {
        Pos { byte: self.byte + n, column: self.column + n as u32, ..self }
    }
}

impl fmt::Display for Pos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// A value as written: a scalar, a block, an array, or an expression this parser does not interpret.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A bare word or a quoted string.
    Scalar(Scalar),
    /// `[ … ]` or `{ … }`.
    Block(Block),
    /// `( a : b : … )`.
    Array(Array),
    /// Anything else with balanced brackets, e.g. `Sequential (…)` or `"a" + "b"`.
    Expr(Expr),
}

impl Value {
    /// Where the value starts.
    pub fn pos(&self) -> Pos {
        match self {
            Value::Scalar(s) => s.pos,
            Value::Block(b) => b.pos,
            Value::Array(a) => a.pos,
            Value::Expr(e) => e.pos,
        }
    }

    /// "a value", "a block", "an array" or "an expression", for messages.
    pub fn describe(&self) -> &'static str {
        match self {
            Value::Scalar(_) => "a value",
            Value::Block(_) => "a block",
            Value::Array(_) => "an array",
            Value::Expr(_) => "an expression",
        }
    }

    fn first_problem(&self) -> Option<&Problem> {
        match self {
            Value::Block(b) => b.first_problem(),
            Value::Array(a) => a.items.iter().find_map(Value::first_problem),
            Value::Scalar(_) | Value::Expr(_) => None,
        }
    }
}

/// A bare word or a quoted string. CNTK keeps every value as text and converts it where it is used, so
/// numbers and booleans are scalars too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scalar {
    /// The text, without quotes, before `$name$` substitution.
    pub text: String,
    /// True if the value was quoted.
    pub quoted: bool,
    /// Where the value starts (the opening quote, for a quoted value).
    pub pos: Pos,
}

/// An expression kept as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expr {
    /// The raw text, trimmed.
    pub text: String,
    /// Where it starts.
    pub pos: Pos,
}

/// `( a : b : … )`.
#[derive(Debug, Clone, PartialEq)]
pub struct Array {
    /// The elements, in order (empty elements are dropped, as CNTK does).
    pub items: Vec<Value>,
    /// Position of the `(`.
    pub pos: Pos,
}

/// A record that could not be read, kept so that users of the block can report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Where.
    pub pos: Pos,
    /// What is wrong.
    pub message: String,
}

/// One `key = value` record.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// The key as first written (keys compare case-insensitively).
    pub key: String,
    /// Where the key is (of its latest definition).
    pub key_pos: Pos,
    /// The value (of its latest definition).
    pub value: Value,
}

/// A dictionary: the whole file, or a `[ … ]` / `{ … }` block.
#[derive(Debug, Clone, PartialEq)]
pub struct Block {
    /// The records, in order of first definition; keys are unique (case-insensitively).
    pub entries: Vec<Entry>,
    /// Values written without a key (`[ [ a = 1 ] [ b = 2 ] ]`); CNTK ignores them in dictionaries, but
    /// accepts them as the elements of an array-valued key such as `deserializers`.
    pub items: Vec<Value>,
    /// Records of this block that could not be read.
    pub problems: Vec<Problem>,
    /// Position of the opening bracket (the start of the text for the top level).
    pub pos: Pos,
}

impl Block {
    fn new(pos: Pos) -> Block {
        Block { entries: Vec::new(), items: Vec::new(), problems: Vec::new(), pos }
    }

    /// The entry with this key (case-insensitive).
    pub fn get(&self, key: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.key.eq_ignore_ascii_case(key))
    }

    /// True if this block (not an enclosing one) has the key.
    pub fn contains(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// Adds an entry with CNTK's rules for repeated keys: a block given again is merged into the earlier
    /// block, anything else replaces the earlier value (the position of the first definition is kept for
    /// the order of entries).
    pub fn insert(&mut self, entry: Entry) {
        let Some(old) = self.entries.iter_mut().find(|e| e.key.eq_ignore_ascii_case(&entry.key)) else {
            self.entries.push(entry);
            return;
        };
        let both_blocks = matches!((&old.value, &entry.value), (Value::Block(_), Value::Block(_)));
        if both_blocks {
            if let (Value::Block(a), Value::Block(b)) = (&mut old.value, entry.value) {
                a.merge(b);
            }
        } else {
            old.value = entry.value;
            old.key_pos = entry.key_pos;
        }
    }

    /// Inserts every entry of `other` (see [`Block::insert`]), and keeps its items and problems.
    pub fn merge(&mut self, other: Block) {
        for e in other.entries {
            self.insert(e);
        }
        self.items.extend(other.items);
        self.problems.extend(other.problems);
    }

    /// The first problem in this block or any block nested in it.
    pub fn first_problem(&self) -> Option<&Problem> {
        self.problems
            .first()
            .or_else(|| self.entries.iter().find_map(|e| e.value.first_problem()))
            .or_else(|| self.items.iter().find_map(Value::first_problem))
    }
}

/// Parses config text (a whole `.cntk` file). Fails only on unbalanced brackets or unterminated strings;
/// other unreadable records become [`Block::problems`].
pub fn parse(text: &str) -> Result<Block, Error> {
    parse_origin(text, Origin::Config)
}

/// Parses config text whose positions are reported as coming from `origin`.
pub fn parse_origin(text: &str, origin: Origin) -> Result<Block, Error> {
    let mut line_starts = vec![0];
    line_starts.extend(text.bytes().enumerate().filter(|&(_, b)| b == b'\n').map(|(i, _)| i + 1));
    let start = if text.starts_with('\u{feff}') { 3 } else { 0 };
    let mut p = Parser { s: text.as_bytes(), text, i: start, origin, line_starts, depth: 0 };
    let mut root = p.block_body(None)?;
    root.pos = p.pos_at(0);
    Ok(root)
}

/// Splits a command-line argument `name=value` (CNTK's extra config arguments, e.g. `defMBSize=true`).
pub fn split_override(arg: &str) -> Result<(String, String), Error> {
    match arg.split_once('=') {
        Some((name, value)) if !name.trim().is_empty() => Ok((name.trim().to_string(), value.trim().to_string())),
        _ => Err(Error::option_value("config override", arg, "must have the form name=value")),
    }
}

/// Applies command-line overrides to a parsed config: each `(name, value)` is parsed as the record
/// `name=value` appended to the top level, as CNTK appends its extra arguments to the config text. So an
/// override replaces a top-level value of the same name (case-insensitively), and a block value such as
/// `train=[reader=[randomize=false]]` is merged into the existing block.
pub fn apply_overrides(root: &mut Block, overrides: &[(String, String)]) -> Result<(), Error> {
    for (i, (name, value)) in overrides.iter().enumerate() {
        let text = format!("{name}={value}");
        let block = parse_origin(&text, Origin::Override(i))?;
        if let Some(p) = block.first_problem() {
            return Err(p.pos.error(format!("in the override {text:?}: {}", p.message)));
        }
        if block.entries.is_empty() {
            return Err(Origin::Override(i).start().error(format!("the override {text:?} defines nothing")));
        }
        root.merge(block);
    }
    Ok(())
}

impl Origin {
    fn start(self) -> Pos {
        Pos { origin: self, byte: 0, line: 1, column: 1 }
    }
}

// ---- the parser ------------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq)]
enum Ctx {
    Block,
    Array,
}

fn closing(open: u8) -> u8 {
    match open {
        b'[' => b']',
        b'{' => b'}',
        _ => b')',
    }
}

fn is_key_end(c: u8) -> bool {
    matches!(
        c,
        b' ' | b'\t' | b'\r' | b'\n' | b'=' | b'[' | b'{' | b'(' | b']' | b'}' | b')' | b'"' | b'\'' | b';' | b','
    )
}

/// How deep blocks and arrays may nest. The parser recurses once a level, so a deeper file (none is written
/// by hand) would overflow the stack instead of failing with an error.
pub const MAX_NESTING: u32 = 128;

struct Parser<'a> {
    s: &'a [u8],
    text: &'a str,
    i: usize,
    origin: Origin,
    line_starts: Vec<usize>,
    /// Blocks and arrays open around the position.
    depth: u32,
}

impl Parser<'_> {
    fn pos_at(&self, byte: usize) -> Pos {
        let line = match self.line_starts.binary_search(&byte) {
            Ok(l) => l,
            Err(l) => l - 1,
        };
        Pos { origin: self.origin, byte, line: line as u32 + 1, column: (byte - self.line_starts[line]) as u32 + 1 }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    /// `#` starts a comment at the start of a token or after whitespace (CNTK strips `#…` only when the
    /// `#` begins the line or follows a space or tab).
    fn comment_at(&self, j: usize) -> bool {
        self.s.get(j) == Some(&b'#')
            && (j == 0 || matches!(self.s[j - 1], b' ' | b'\t' | b'\r' | b'\n' | b'[' | b'{' | b'(' | b';' | b','))
    }

    /// A quote opens a string only where a token starts, so that `it's` or `5"` stay plain text.
    fn quote_at(&self, j: usize) -> bool {
        matches!(self.s.get(j), Some(b'"' | b'\''))
            && (j == 0
                || matches!(
                    self.s[j - 1],
                    b' ' | b'\t' | b'\r' | b'\n' | b'=' | b'[' | b'{' | b'(' | b':' | b';' | b','
                ))
    }

    fn record_end_at(&self, ctx: Ctx, j: usize) -> bool {
        match self.s.get(j) {
            None => true,
            Some(b'\n' | b'\r' | b',' | b']' | b'}' | b')') => true,
            Some(b';') => ctx == Ctx::Block,
            Some(b':') => ctx == Ctx::Array,
            Some(b'#') => self.comment_at(j),
            _ => false,
        }
    }

    fn skip_spaces(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.i += 1;
        }
    }

    fn skip_comment(&mut self) {
        while !matches!(self.peek(), None | Some(b'\n')) {
            self.i += 1;
        }
    }

    fn skip_separators(&mut self, ctx: Ctx) {
        loop {
            match self.peek() {
                Some(b' ' | b'\t' | b'\r' | b'\n' | b',') => self.i += 1,
                Some(b';') if ctx == Ctx::Block => self.i += 1,
                Some(b':') if ctx == Ctx::Array => self.i += 1,
                Some(b'#') if self.comment_at(self.i) => self.skip_comment(),
                _ => return,
            }
        }
    }

    fn unterminated(&self, open: u8, at: usize) -> Error {
        self.pos_at(at).error(format!(
            "unterminated '{}': no matching '{}' before the end of the input",
            open as char,
            closing(open) as char
        ))
    }

    fn mismatched(&self, found: u8, open: Option<(u8, usize)>) -> Error {
        let here = self.pos_at(self.i);
        match open {
            Some((o, at)) => here.error(format!(
                "found '{}' but the '{}' opened at {} is still open (expected '{}')",
                found as char,
                o as char,
                self.pos_at(at),
                closing(o) as char
            )),
            None => here.error(format!("unexpected '{}': no block is open here", found as char)),
        }
    }

    fn block_body(&mut self, open: Option<(u8, usize)>) -> Result<Block, Error> {
        let closer = open.map(|(c, _)| closing(c));
        let mut block = Block::new(self.pos_at(open.map_or(self.i, |(_, at)| at)));
        loop {
            self.skip_separators(Ctx::Block);
            let Some(c) = self.peek() else {
                return match open {
                    None => Ok(block),
                    Some((o, at)) => Err(self.unterminated(o, at)),
                };
            };
            if Some(c) == closer {
                self.i += 1;
                return Ok(block);
            }
            if matches!(c, b']' | b'}' | b')') {
                return Err(self.mismatched(c, open));
            }
            self.record(&mut block)?;
        }
    }

    fn record(&mut self, block: &mut Block) -> Result<(), Error> {
        let start = self.i;
        if matches!(self.s[start], b'[' | b'{' | b'(') || self.quote_at(start) {
            let v = self.value(Ctx::Block, true)?;
            block.items.push(v);
            return Ok(());
        }
        while self.peek().is_some_and(|c| !is_key_end(c)) {
            self.i += 1;
        }
        let key = &self.text[start..self.i];
        let key_pos = self.pos_at(start);
        if key.is_empty() {
            let found = self.s[start] as char;
            block.problems.push(Problem { pos: key_pos, message: format!("expected a name before '{found}'") });
            self.skip_record(Ctx::Block)?;
            if self.i == start {
                self.i += 1;
            }
            return Ok(());
        }
        self.skip_spaces();
        let value = match self.peek() {
            Some(b'=') => {
                self.i += 1;
                self.skip_spaces();
                if self.record_end_at(Ctx::Block, self.i) && !self.block_on_next_line() {
                    block.problems.push(Problem { pos: key_pos, message: format!("no value given for \"{key}\"") });
                    return Ok(());
                }
                self.value(Ctx::Block, false)?
            }
            Some(b'[' | b'{' | b'(' | b'"' | b'\'') => self.value(Ctx::Block, false)?,
            _ if self.record_end_at(Ctx::Block, self.i) => {
                // CNTK: a name alone is a boolean set to true.
                Value::Scalar(Scalar { text: "true".into(), quoted: false, pos: key_pos })
            }
            Some(c) => {
                let here = self.pos_at(self.i);
                block.problems.push(Problem {
                    pos: here,
                    message: format!("expected '=' after \"{key}\", found '{}'", c as char),
                });
                self.skip_record(Ctx::Block)?;
                return Ok(());
            }
            None => unreachable!("the end of the input ends a record"),
        };
        block.insert(Entry { key: key.to_string(), key_pos, value });
        Ok(())
    }

    /// After `key =` at the end of a line: is the value a block that starts on a following line? If so,
    /// move there.
    fn block_on_next_line(&mut self) -> bool {
        let save = self.i;
        loop {
            match self.peek() {
                Some(b' ' | b'\t' | b'\r' | b'\n') => self.i += 1,
                Some(b'#') if self.comment_at(self.i) => self.skip_comment(),
                Some(b'[' | b'{' | b'(') => return true,
                _ => {
                    self.i = save;
                    return false;
                }
            }
        }
    }

    /// A value. With `split` (array elements and values without a key), a bracketed or quoted value
    /// directly followed by another one ends there, as in CNTK: `( [a] [b] )` has two elements.
    fn value(&mut self, ctx: Ctx, split: bool) -> Result<Value, Error> {
        let start = self.i;
        let pos = self.pos_at(start);
        let v = match self.s[start] {
            open @ (b'[' | b'{') => {
                self.i += 1;
                Value::Block(self.nested(pos, |p| p.block_body(Some((open, start))))?)
            }
            b'(' => Value::Array(self.nested(pos, Self::array)?),
            b'"' | b'\'' if self.quote_at(start) => Value::Scalar(Scalar { text: self.quoted()?, quoted: true, pos }),
            _ => return self.bare(ctx, start, false),
        };
        self.skip_spaces();
        let next_value = matches!(self.peek(), Some(b'[' | b'{' | b'(')) || self.quote_at(self.i);
        if self.record_end_at(ctx, self.i) || (split && next_value) {
            Ok(v)
        } else {
            // More follows on the record, e.g. `"a" + "b"` or `(x) * 2`: keep the whole as an expression.
            self.bare(ctx, start, true)
        }
    }

    /// Reads a block or an array (at `pos`) with `read`, one level deeper: a `Limit` error past
    /// [`MAX_NESTING`].
    fn nested<T>(&mut self, pos: Pos, read: impl FnOnce(&mut Self) -> Result<T, Error>) -> Result<T, Error> {
        if self.depth >= MAX_NESTING {
            let what = "nesting depth of config blocks and arrays".to_string();
            let mut e =
                Error::new(ErrorKind::Limit { what, value: u64::from(self.depth) + 1, limit: MAX_NESTING.into() });
            *e.position_mut() = pos.position();
            return Err(e);
        }
        self.depth += 1;
        let r = read(self);
        self.depth -= 1;
        r
    }

    fn bare(&mut self, ctx: Ctx, start: usize, mut structured: bool) -> Result<Value, Error> {
        while !self.record_end_at(ctx, self.i) {
            let c = self.s[self.i];
            if matches!(c, b'[' | b'{' | b'(') {
                self.skip_group()?;
                structured = true;
            } else if self.quote_at(self.i) {
                self.quoted()?;
                structured = true;
            } else {
                self.i += 1;
            }
        }
        let text = self.text[start..self.i].trim_end_matches([' ', '\t']).to_string();
        let pos = self.pos_at(start);
        Ok(if structured {
            Value::Expr(Expr { text, pos })
        } else {
            Value::Scalar(Scalar { text, quoted: false, pos })
        })
    }

    fn skip_record(&mut self, ctx: Ctx) -> Result<(), Error> {
        let start = self.i;
        self.bare(ctx, start, false).map(drop)
    }

    fn skip_group(&mut self) -> Result<(), Error> {
        let mut stack = vec![(self.s[self.i], self.i)];
        self.i += 1;
        while let Some(&(open, at)) = stack.last() {
            match self.peek() {
                None => return Err(self.unterminated(open, at)),
                Some(c @ (b'[' | b'{' | b'(')) => {
                    stack.push((c, self.i));
                    self.i += 1;
                }
                Some(c @ (b']' | b'}' | b')')) => {
                    if c != closing(open) {
                        return Err(self.mismatched(c, Some((open, at))));
                    }
                    stack.pop();
                    self.i += 1;
                }
                Some(b'"' | b'\'') if self.quote_at(self.i) => {
                    self.quoted()?;
                }
                Some(b'#') if self.comment_at(self.i) => self.skip_comment(),
                Some(_) => self.i += 1,
            }
        }
        Ok(())
    }

    fn quoted(&mut self) -> Result<String, Error> {
        let q = self.s[self.i];
        let at = self.i;
        self.i += 1;
        let start = self.i;
        while let Some(c) = self.peek() {
            if c == q {
                let text = self.text[start..self.i].to_string();
                self.i += 1;
                return Ok(text);
            }
            if c == b'\n' {
                break;
            }
            self.i += 1;
        }
        Err(self.pos_at(at).error(format!("unterminated string: no closing {} on this line", q as char)))
    }

    fn array(&mut self) -> Result<Array, Error> {
        let at = self.i;
        let pos = self.pos_at(at);
        self.i += 1;
        let mut items = Vec::new();
        loop {
            self.skip_separators(Ctx::Array);
            match self.peek() {
                None => return Err(self.unterminated(b'(', at)),
                Some(b')') => {
                    self.i += 1;
                    return Ok(Array { items, pos });
                }
                Some(c @ (b']' | b'}')) => return Err(self.mismatched(c, Some((b'(', at)))),
                Some(_) => items.push(self.value(Ctx::Array, true)?),
            }
        }
    }
}

// ---- variables -------------------------------------------------------------------------------------

/// Characters that end a variable name (CNTK's `forbiddenCharactersInVarName`, plus `\r`).
const FORBIDDEN_IN_VAR: &[u8] = b",/<>?;':\"[]{}\\|!@#%^&*()+=~` \t\r\n";

/// How deep `$a$ → $b$ → …` may go before it is taken for a cycle.
const MAX_VAR_DEPTH: u32 = 64;

/// The name `x` if `text` is exactly one reference `$x$`.
fn whole_var(text: &str) -> Option<&str> {
    let inner = text.strip_prefix('$')?.strip_suffix('$')?;
    let first = *inner.as_bytes().first()?;
    let ok = (first.is_ascii_alphabetic() || first == b'_')
        && inner.bytes().all(|b| b != b'$' && !FORBIDDEN_IN_VAR.contains(&b));
    ok.then_some(inner)
}

/// A value after `$name$` resolution.
#[derive(Debug, Clone)]
pub enum Resolved<'a> {
    /// Text (a scalar, with every `$name$` replaced).
    Text {
        /// The text.
        text: String,
        /// Where the value is written (where it is used, for a value taken from a variable).
        pos: Pos,
    },
    /// A block.
    Block(&'a Block),
    /// An array.
    Array(&'a Array),
    /// An expression.
    Expr(&'a Expr),
}

impl Resolved<'_> {
    /// Where the value is written.
    pub fn pos(&self) -> Pos {
        match self {
            Resolved::Text { pos, .. } => *pos,
            Resolved::Block(b) => b.pos,
            Resolved::Array(a) => a.pos,
            Resolved::Expr(e) => e.pos,
        }
    }

    /// "a value", "a block", "an array" or "an expression", for messages.
    pub fn describe(&self) -> &'static str {
        match self {
            Resolved::Text { .. } => "a value",
            Resolved::Block(_) => "a block",
            Resolved::Array(_) => "an array",
            Resolved::Expr(_) => "an expression",
        }
    }
}

/// A chain of nested blocks, outermost (the top level) first: where values are looked up and where
/// `$name$` references are resolved.
///
/// A reference `$name$` is looked up in the block holding the value, then in each enclosing block outward,
/// up to the top level (which includes the command-line overrides, see [`apply_overrides`]). The value found
/// is itself resolved where it is defined. Names are case-insensitive; a `$` not followed by a letter or
/// `_`, or with no closing `$` before a character that cannot be part of a name, is a plain `$`
/// (CNTK's rules). A value that is exactly one reference may name a block or an array, which then stands
/// for the value; inside text, a reference must name a scalar.
#[derive(Debug, Clone)]
pub struct Scope<'a> {
    chain: Vec<&'a Block>,
}

impl<'a> Scope<'a> {
    /// The scope of the top level.
    pub fn new(root: &'a Block) -> Scope<'a> {
        Scope { chain: vec![root] }
    }

    /// The scope of a block nested in this scope's innermost block.
    pub fn with(&self, block: &'a Block) -> Scope<'a> {
        let mut chain = self.chain.clone();
        chain.push(block);
        Scope { chain }
    }

    /// The innermost block.
    pub fn block(&self) -> &'a Block {
        self.chain[self.chain.len() - 1]
    }

    /// The blocks, outermost first.
    pub fn blocks(&self) -> &[&'a Block] {
        &self.chain
    }

    /// Finds `key` in the innermost block, then outward; returns the scope of the block that has it.
    pub fn lookup(&self, key: &str) -> Option<(Scope<'a>, &'a Entry)> {
        (0..self.chain.len())
            .rev()
            .find_map(|d| self.chain[d].get(key).map(|e| (Scope { chain: self.chain[..=d].to_vec() }, e)))
    }

    /// Resolves the `$name$` references of a value written in this scope's innermost block.
    pub fn resolve(&self, value: &'a Value) -> Result<Resolved<'a>, Error> {
        self.resolve_depth(value, 0)
    }

    fn resolve_depth(&self, value: &'a Value, depth: u32) -> Result<Resolved<'a>, Error> {
        Ok(match value {
            Value::Scalar(s) => match whole_var(&s.text) {
                Some(name) => {
                    let at = s.pos.offset(usize::from(s.quoted));
                    match self.variable(name, at, depth)? {
                        Resolved::Text { text, .. } => Resolved::Text { text, pos: s.pos },
                        other => other,
                    }
                }
                None => Resolved::Text { text: self.substitute(s, depth)?, pos: s.pos },
            },
            Value::Block(b) => Resolved::Block(b),
            Value::Array(a) => Resolved::Array(a),
            Value::Expr(e) => Resolved::Expr(e),
        })
    }

    fn variable(&self, name: &str, at: Pos, depth: u32) -> Result<Resolved<'a>, Error> {
        if depth >= MAX_VAR_DEPTH {
            return Err(at.error(format!(
                "variable ${name}$ is defined in terms of itself (or references nest more than {MAX_VAR_DEPTH} deep)"
            )));
        }
        let Some((scope, entry)) = self.lookup(name) else {
            return Err(at.error(format!(
                "undefined variable ${name}$: \"{name}\" is defined neither in the enclosing blocks, nor at the top level, nor on the command line"
            )));
        };
        scope.resolve_depth(&entry.value, depth + 1)
    }

    fn substitute(&self, s: &Scalar, depth: u32) -> Result<String, Error> {
        let text = s.text.as_str();
        let b = text.as_bytes();
        let mut out = String::new();
        let mut last = 0;
        let mut i = 0;
        while let Some(off) = b.get(i..).and_then(|rest| rest.iter().position(|&c| c == b'$')) {
            let start = i + off;
            if !b.get(start + 1).is_some_and(|c| c.is_ascii_alphabetic() || *c == b'_') {
                i = start + 2; // CNTK skips the character after a `$` that cannot start a name
                continue;
            }
            let mut j = start + 1;
            while j < b.len() && b[j] != b'$' && !FORBIDDEN_IN_VAR.contains(&b[j]) {
                j += 1;
            }
            if b.get(j) != Some(&b'$') {
                i = start + 1;
                continue;
            }
            let name = &text[start + 1..j];
            let at = s.pos.offset(start + usize::from(s.quoted));
            match self.variable(name, at, depth)? {
                Resolved::Text { text: value, .. } => {
                    out.push_str(&text[last..start]);
                    out.push_str(&value);
                }
                other => {
                    return Err(
                        at.error(format!("variable ${name}$ is {} and cannot be used inside text", other.describe()))
                    )
                }
            }
            last = j + 1;
            i = j + 1;
        }
        out.push_str(&text[last..]);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scalar<'a>(b: &'a Block, key: &str) -> &'a str {
        match &b.get(key).unwrap_or_else(|| panic!("no key {key}")).value {
            Value::Scalar(s) => &s.text,
            v => panic!("{key} is {v:?}"),
        }
    }

    fn block<'a>(b: &'a Block, key: &str) -> &'a Block {
        match &b.get(key).unwrap().value {
            Value::Block(b) => b,
            v => panic!("{key} is {v:?}"),
        }
    }

    #[test]
    fn records_separators_and_comments() {
        let b = parse("# a comment\na = 1; b = two # trailing\nc=x#y\n  d = \"q\" ; e\nf = 1, g = 2\n").unwrap();
        assert_eq!(scalar(&b, "a"), "1");
        assert_eq!(scalar(&b, "B"), "two");
        assert_eq!(scalar(&b, "c"), "x#y");
        assert_eq!(scalar(&b, "d"), "q");
        assert_eq!(scalar(&b, "e"), "true");
        assert_eq!(scalar(&b, "f"), "1");
        assert_eq!(scalar(&b, "g"), "2");
        assert!(b.problems.is_empty(), "{:?}", b.problems);
    }

    #[test]
    fn quotes_hide_comment_marks_and_brackets() {
        let b = parse("r = [ file = \"a # b].txt\" ; alias = 'x;y]' # c ]\n ]\n").unwrap();
        let r = block(&b, "r");
        assert_eq!(scalar(r, "file"), "a # b].txt");
        assert_eq!(scalar(r, "alias"), "x;y]");
        assert_eq!(r.entries.len(), 2);
    }

    /// Found by fuzzing (config_parse): a config of a few thousand `[` overflowed the stack of a 2 MiB
    /// thread (the parser recurses once a level) and aborted the process.
    #[test]
    fn nesting_deeper_than_the_limit_is_an_error_not_a_stack_overflow() {
        let n = MAX_NESTING as usize;
        let at_limit = format!("a = {}{}", "[".repeat(n), "]".repeat(n));
        assert!(parse(&at_limit).is_ok());
        let over = format!("a = ({}{})", "[".repeat(n), "]".repeat(n));
        let e = parse(&over).unwrap_err();
        assert!(matches!(e.kind(), ErrorKind::Limit { value: 129, limit: 128, .. }), "{e:?}");
        assert_eq!((e.position().line, e.position().column), (Some(1), Some(5 + n as u64)));
        let deep = "[".repeat(100_000);
        assert!(matches!(parse(&deep).unwrap_err().kind(), ErrorKind::Limit { .. }));
    }

    #[test]
    fn nested_blocks_positions_and_case() {
        let text = "Top = [\n  Inner = [ X = 5 ]\n  inner = { y = 6 }\n]\n";
        let b = parse(text).unwrap();
        let top = block(&b, "top");
        let inner = block(top, "INNER");
        assert_eq!(scalar(inner, "x"), "5");
        assert_eq!(scalar(inner, "Y"), "6"); // merged
        let e = inner.get("x").unwrap();
        assert_eq!((e.key_pos.line, e.key_pos.column), (2, 13));
        assert_eq!((top.pos.line, top.pos.column), (1, 7));
    }

    #[test]
    fn arrays() {
        let b = parse("d = (\n [ t = 1 ]\n :\n [ t = 2 ] : [t=3]\n)\nw = (a:b , c)\ns = 1:2:3\nk [ z = 1 ]\n").unwrap();
        let Value::Array(a) = &b.get("d").unwrap().value else { panic!() };
        assert_eq!(a.items.len(), 3);
        let Value::Block(x) = &a.items[2] else { panic!() };
        assert_eq!(scalar(x, "t"), "3");
        let Value::Array(w) = &b.get("w").unwrap().value else { panic!() };
        let texts: Vec<_> =
            w.items.iter().map(|v| if let Value::Scalar(s) = v { s.text.as_str() } else { "?" }).collect();
        assert_eq!(texts, ["a", "b", "c"]);
        assert_eq!(scalar(&b, "s"), "1:2:3");
        assert_eq!(scalar(block(&b, "k"), "z"), "1");
    }

    #[test]
    fn expressions_are_tolerated() {
        let text = "net = {\n  model = Sequential (\n    DenseLayer {10, activation=ReLU} :\n    LinearLayer {2}\n  )\n  f = x => x + 1\n  z = model (features)\n  p = (a) * 2\n}\nafter = 1\n";
        let b = parse(text).unwrap();
        let net = block(&b, "net");
        assert!(matches!(net.get("model").unwrap().value, Value::Expr(_)));
        assert!(matches!(net.get("p").unwrap().value, Value::Expr(_)));
        assert_eq!(scalar(net, "f"), "x => x + 1");
        assert_eq!(scalar(&b, "after"), "1");
    }

    #[test]
    fn unreadable_records_become_problems() {
        let b = parse("s = [ good = 1\n bad 7\n also = 2 ]\nx = 3\n").unwrap();
        let s = block(&b, "s");
        assert_eq!(scalar(s, "also"), "2");
        let p = s.first_problem().unwrap();
        assert_eq!((p.pos.line, p.pos.column), (2, 6));
        assert!(p.message.contains("expected '='"), "{}", p.message);
        assert!(b.problems.is_empty());
        assert!(b.first_problem().is_some());
    }

    #[test]
    fn structural_errors_have_positions() {
        let e = parse("a = 1\nb = [ c = 2\n").unwrap_err();
        assert_eq!((e.position().line, e.position().column), (Some(2), Some(5)));
        assert!(e.to_string().contains("unterminated '['"), "{e}");
        let e = parse("a = [ b = (1 ] ]").unwrap_err();
        assert!(e.to_string().contains("found ']' but the '(' opened at 1:11"), "{e}");
        let e = parse("x = \"abc\ny = 1").unwrap_err();
        assert!(e.to_string().contains("unterminated string"), "{e}");
        let e = parse("x = 1 ]").unwrap_err();
        assert!(e.to_string().contains("no block is open"), "{e}");
    }

    #[test]
    fn repeated_keys_replace_or_merge() {
        let b = parse("a = 1\nA = 2\nb = [ x = 1; y = 1 ]\nB = [ y = 2 ]\n").unwrap();
        assert_eq!(scalar(&b, "a"), "2");
        let bb = block(&b, "b");
        assert_eq!((scalar(bb, "x"), scalar(bb, "y")), ("1", "2"));
    }

    #[test]
    fn variables_resolve_outward_and_overrides_win() {
        let mut b = parse(
            "root = /data\ndir = \"$root$/x\"\ndefMbSize = false\ns = [ v = 1\n r = [ f = $dir$/a.txt ; m = $defMBSize$ ; w = $V$ ; c = $$x ; d = a$b ] ]\n",
        )
        .unwrap();
        apply_overrides(&mut b, &[("defMBSize".into(), "true".into())]).unwrap();
        let s = block(&b, "s");
        let r = block(s, "r");
        let scope = Scope::new(&b).with(s).with(r);
        let text = |k: &str| match scope.resolve(&r.get(k).unwrap().value).unwrap() {
            Resolved::Text { text, .. } => text,
            other => panic!("{other:?}"),
        };
        assert_eq!(text("f"), "/data/x/a.txt");
        assert_eq!(text("m"), "true");
        assert_eq!(text("w"), "1");
        assert_eq!(text("c"), "$$x");
        assert_eq!(text("d"), "a$b");
    }

    #[test]
    fn variable_errors() {
        let b = parse("a = $a$\nb = x$nope$y\nc = [ k = 1 ]\nd = \"$c$/x\"\ne = $c$\n").unwrap();
        let scope = Scope::new(&b);
        let get = |k: &str| scope.resolve(&b.get(k).unwrap().value);
        assert!(get("a").unwrap_err().to_string().contains("in terms of itself"));
        let e = get("b").unwrap_err();
        assert!(e.to_string().contains("undefined variable $nope$"), "{e}");
        assert_eq!((e.position().line, e.position().column), (Some(2), Some(6)));
        assert!(get("d").unwrap_err().to_string().contains("is a block"));
        assert!(matches!(get("e").unwrap(), Resolved::Block(_)));
    }

    #[test]
    fn override_positions_and_syntax() {
        let mut b = parse("a = 1\n").unwrap();
        let e = apply_overrides(&mut b, &[("x".into(), "[ y = ".into())]).unwrap_err();
        assert_eq!(e.position().path.as_deref(), Some("<override 1>"));
        assert_eq!(split_override("defMBSize=true").unwrap(), ("defMBSize".into(), "true".into()));
        assert!(split_override("nothing").is_err());
        apply_overrides(&mut b, &[("t".into(), "[r=[q=1]]".into()), ("t".into(), "[r=[z=2]]".into())]).unwrap();
        let r = block(block(&b, "t"), "r");
        assert_eq!((scalar(r, "q"), scalar(r, "z")), ("1", "2"));
    }

    #[test]
    fn positional_blocks_and_bom() {
        let b = parse("\u{feff}d = [ [ a = 1 ] [ b = 2 ] ]\n").unwrap();
        assert_eq!(block(&b, "d").items.len(), 2);
        let b = parse("key =\n  [ x = 1 ]\n").unwrap();
        assert_eq!(scalar(block(&b, "key"), "x"), "1");
        let b = parse("key =\nother = 2\n").unwrap();
        assert!(b.problems[0].message.contains("no value given"));
        assert_eq!(scalar(&b, "other"), "2");
    }
}
