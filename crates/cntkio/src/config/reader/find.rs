//! Finding the reader section of a parsed config: a named section, a dotted path, or the only one.

use super::reader_sections;
use crate::config::brainscript::{Block, Resolved, Scope};
use cntkio_core::error::Error;

fn is_reader_block(b: &Block) -> bool {
    ["readerType", "deserializers", "file", "input"].iter().any(|k| b.contains(k))
}

fn candidates_text(root: &Block) -> String {
    let c = reader_sections(root);
    if c.is_empty() {
        "the config has no block with a \"reader\" key".to_string()
    } else {
        format!("sections with a reader: {}", c.join(", "))
    }
}

/// The section `section` names (see [`super::load_reader_config`]): its path as written and its scope.
pub(super) fn find_reader<'a>(root: &'a Block, section: Option<&str>) -> Result<(String, Scope<'a>), Error> {
    let top = Scope::new(root);
    let Some(section) = section else {
        let c = reader_sections(root);
        return match c.len() {
            1 => find_reader(root, Some(&c[0])),
            0 => Err(Error::config("no reader section found: the config has no block with a \"reader\" key")),
            _ => Err(Error::config(format!(
                "the config has several reader sections ({}); choose one with --section",
                c.join(", ")
            ))),
        };
    };
    // The whole name first (keys may contain dots), then a dotted path.
    let mut path: Vec<&str> = vec![section];
    if root.get(section).is_none() && section.contains('.') {
        path = section.split('.').collect();
    }
    let mut scope = top;
    let mut shown = Vec::new();
    for (i, part) in path.iter().enumerate() {
        let Some(entry) = scope.block().get(part) else {
            return Err(if i == 0 {
                Error::config(format!("no section \"{section}\" in the config; {}", candidates_text(root)))
            } else {
                scope.block().pos.error(format!("no \"{part}\" in {}", shown.join(".")))
            });
        };
        shown.push(entry.key.clone());
        let block = match scope.resolve(&entry.value)? {
            Resolved::Block(b) => b,
            other => {
                return Err(other.pos().error(format!(
                    "\"{}\" must be a block [ … ], found {}",
                    shown.join("."),
                    other.describe()
                )))
            }
        };
        scope = scope.with(block);
    }
    let block = scope.block();
    if let Some(r) = block.get("reader") {
        if !block.contains("readerType") && !block.contains("deserializers") {
            let reader = match scope.resolve(&r.value)? {
                Resolved::Block(b) => b,
                other => {
                    return Err(other.pos().error(format!(
                        "{}.reader must be a block [ … ], found {}",
                        shown.join("."),
                        other.describe()
                    )))
                }
            };
            shown.push(r.key.clone());
            return Ok((shown.join("."), scope.with(reader)));
        }
    }
    if is_reader_block(block) {
        return Ok((shown.join("."), scope));
    }
    Err(block.pos.error(format!("section \"{}\" has no reader block; {}", shown.join("."), candidates_text(root))))
}
