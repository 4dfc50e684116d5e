//! Reading a matrix file: YAML into [`MatrixSpec`], with every error located.
//!
//! The file is read twice by the same YAML parser (serde-saphyr): once into the typed spec,
//! whose syntax and type errors carry line and column, and once into a tree of located
//! nodes from which we build an index from key paths (`rules[1].exclude.gpus`) to
//! positions. Later semantic checks (unknown axis in a rule, duplicate value...) only know
//! key paths; the index turns them into `file:line:column` with a caret under the source.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;

use super::error::MatrixError;
use super::spec::MatrixSpec;

/// Position of a node: 1-based line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pos {
    pub line: usize,
    pub column: usize,
}

/// The matrix source text with its key-path index.
#[derive(Debug, Clone)]
pub struct Source {
    pub path: PathBuf,
    pub text: String,
    /// Key path -> (position of the key, position of the value). Sequence elements have no
    /// key position.
    index: HashMap<String, (Option<Pos>, Pos)>,
}

impl Source {
    /// Where the key of `path` is written (or its value, for sequence elements).
    pub(crate) fn key_pos(&self, path: &str) -> Option<Pos> {
        self.index.get(path).map(|(k, v)| k.unwrap_or(*v))
    }

    /// Where the value of `path` starts.
    pub(crate) fn value_pos(&self, path: &str) -> Option<Pos> {
        self.index.get(path).map(|(_, v)| *v)
    }

    /// An error at the key of `path` (falling back to the nearest located ancestor).
    pub(crate) fn error_at(&self, path: &str, message: impl Into<String>) -> MatrixError {
        let pos = self.nearest(path, false);
        self.error_pos(Some(path), pos, 1, message)
    }

    /// An error at the value of `path`, `offset` characters in, `len` wide (for carets
    /// inside a `when:` expression).
    pub(crate) fn error_in_value(
        &self,
        path: &str,
        offset: usize,
        len: usize,
        message: impl Into<String>,
    ) -> MatrixError {
        let pos = self.nearest(path, true).map(|p| Pos {
            line: p.line,
            column: p.column + offset + usize::from(self.quoted_at(p)),
        });
        self.error_pos(Some(path), pos, len, message)
    }

    fn quoted_at(&self, p: Pos) -> bool {
        self.text
            .lines()
            .nth(p.line.saturating_sub(1))
            .and_then(|l| l.chars().nth(p.column.saturating_sub(1)))
            .is_some_and(|c| c == '"' || c == '\'')
    }

    fn nearest(&self, path: &str, value: bool) -> Option<Pos> {
        let mut p = path.to_string();
        loop {
            let found = if value {
                self.value_pos(&p)
            } else {
                self.key_pos(&p)
            };
            if found.is_some() {
                return found;
            }
            // Strip the last segment: `a.b[2]` -> `a.b` -> `a`.
            let cut = p.rfind(['.', '[']);
            match cut {
                Some(i) => p.truncate(i),
                None => return None,
            }
        }
    }

    pub(crate) fn error_pos(
        &self,
        key_path: Option<&str>,
        pos: Option<Pos>,
        len: usize,
        message: impl Into<String>,
    ) -> MatrixError {
        let snippet = pos.and_then(|p| self.snippet(p, len));
        MatrixError::Invalid(Box::new(super::error::Located {
            path: self.path.clone(),
            line: pos.map(|p| p.line),
            column: pos.map(|p| p.column),
            key_path: key_path.map(str::to_string),
            message: message.into(),
            snippet,
        }))
    }

    /// The source line of `p` with a caret under column `p.column`.
    fn snippet(&self, p: Pos, len: usize) -> Option<String> {
        let line = self.text.lines().nth(p.line.checked_sub(1)?)?;
        let gutter = format!("{:>4} | ", p.line);
        Some(format!(
            "{gutter}{line}\n{}{}",
            " ".repeat(gutter.len() + p.column.saturating_sub(1)),
            "^".repeat(len.max(1))
        ))
    }
}

/// The largest matrix file bench reads. Matrices are a few kilobytes (the nightly's is
/// 2 KB); a file past this is not one, and reading it whole would only spend memory.
pub const MAX_MATRIX_BYTES: u64 = 4 << 20;

/// Reads and parses a matrix file.
pub(crate) fn parse_file(path: &Path) -> Result<(MatrixSpec, Source), MatrixError> {
    let text = read_matrix(path).map_err(|source| MatrixError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse_str(path, text)
}

/// The text of a matrix file: a regular file (not a device such as `/dev/zero`, a FIFO or
/// a folder, which could be read forever or block) of at most [`MAX_MATRIX_BYTES`], checked
/// before and while reading (a file can grow, and `/proc` files say they are empty).
fn read_matrix(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let refuse = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, why);
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        let what = if meta.is_dir() {
            "a folder"
        } else {
            "not a regular file (a device, FIFO or socket)"
        };
        return Err(refuse(format!("{what}; a matrix is a YAML file")));
    }
    let too_big = || {
        refuse(format!(
            "more than {MAX_MATRIX_BYTES} bytes (4 MiB), the most a matrix file may have"
        ))
    };
    if meta.len() > MAX_MATRIX_BYTES {
        return Err(too_big());
    }
    let mut bytes = Vec::new();
    // Opened without blocking and checked again on the open file: the path may have been
    // swapped for a FIFO since the look above.
    crate::files::open_regular(path)?
        .take(MAX_MATRIX_BYTES + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_MATRIX_BYTES {
        return Err(too_big());
    }
    String::from_utf8(bytes).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not UTF-8 text (byte {})", e.utf8_error().valid_up_to()),
        )
    })
}

/// Parses matrix text (`path` is only used in messages).
pub fn parse_str(path: &Path, text: String) -> Result<(MatrixSpec, Source), MatrixError> {
    let mut src = Source {
        path: path.to_path_buf(),
        text,
        index: HashMap::new(),
    };
    let tree: Result<Spanned<Node>, _> =
        serde_saphyr::from_str_with_options(&src.text, yaml_options());
    match tree {
        Ok(root) => index_node(&root, String::new(), &mut src.index),
        Err(e) => return Err(yaml_error(&src, &e)),
    }
    if src.text.trim().is_empty() {
        return Err(src.error_pos(
            None,
            None,
            1,
            "the file is empty; a matrix needs at least `axes:` (see docs/matrix.md)",
        ));
    }
    let spec: MatrixSpec = serde_saphyr::from_str_with_options(&src.text, yaml_options())
        .map_err(|e| yaml_error(&src, &e))?;
    Ok((spec, src))
}

/// How deep YAML collections may nest in a matrix file. A matrix nests about 6 deep
/// (`overrides.model.a.workload.env`); 24 leaves room for nested `extra` values. Each level
/// costs the deserializer tens of KiB of stack in a debug build: serde-saphyr's default of
/// 64 overflowed a 2 MiB thread's stack (found by tests/fuzz.rs).
pub(crate) const MAX_YAML_DEPTH: usize = 24;

/// YAML 1.2 booleans only: a value such as `y`, `on` or `no` (a plausible model or axis
/// value) stays a string instead of silently becoming a boolean, as YAML 1.1 would have it.
/// Duplicate keys are errors (serde-saphyr's default). Nesting is bounded by
/// [`MAX_YAML_DEPTH`].
fn yaml_options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        strict_booleans: true,
        budget: serde_saphyr::budget! { max_depth: MAX_YAML_DEPTH },
    }
}

fn yaml_error(src: &Source, e: &serde_saphyr::Error) -> MatrixError {
    let pos = e.location().and_then(|l| {
        let (line, column) = (l.line() as usize, l.column() as usize);
        (line > 0).then_some(Pos { line, column })
    });
    let mut message = e.without_snippet().to_string();
    // serde-saphyr appends its own position; we print ours in front instead.
    if let Some(i) = message.find(" at line ") {
        message.truncate(i);
    }
    if message.starts_with("budget breached: Depth") {
        message = format!(
            "collections nest deeper than {MAX_YAML_DEPTH} levels here (a matrix needs about 6)"
        );
    }
    src.error_pos(None, pos, 1, message)
}

/// A located YAML node, only used to build the key-path index.
#[derive(Debug)]
enum Node {
    Map(Vec<(Spanned<KeyText>, Spanned<Node>)>),
    Seq(Vec<Spanned<Node>>),
    Scalar,
}

/// A mapping key rendered as text (keys may be numbers, e.g. `gpus` overrides `8:`).
#[derive(Debug)]
struct KeyText(String);

impl<'de> Deserialize<'de> for KeyText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = KeyText;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a scalar key")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<KeyText, E> {
                Ok(KeyText(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<KeyText, E> {
                Ok(KeyText(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<KeyText, E> {
                Ok(KeyText(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<KeyText, E> {
                Ok(KeyText(v.to_string()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<KeyText, E> {
                Ok(KeyText(v.to_string()))
            }
            fn visit_unit<E: de::Error>(self) -> Result<KeyText, E> {
                Ok(KeyText("~".to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Node;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any YAML node")
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_i128<E: de::Error>(self, _: i128) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_u128<E: de::Error>(self, _: u128) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_bytes<E: de::Error>(self, _: &[u8]) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_none<E: de::Error>(self) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
                Node::deserialize(d)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Node, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = a.next_element()? {
                    v.push(x);
                }
                Ok(Node::Seq(v))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Node, A::Error> {
                let mut v = Vec::new();
                while let Some(entry) = a.next_entry()? {
                    v.push(entry);
                }
                Ok(Node::Map(v))
            }
        }
        d.deserialize_any(V)
    }
}

fn pos_of<T>(s: &Spanned<T>) -> Pos {
    Pos {
        line: s.referenced.line() as usize,
        column: s.referenced.column() as usize,
    }
}

fn index_node(node: &Spanned<Node>, path: String, index: &mut HashMap<String, (Option<Pos>, Pos)>) {
    index.entry(path.clone()).or_insert((None, pos_of(node)));
    match &node.value {
        Node::Map(entries) => {
            for (k, v) in entries {
                let child = if path.is_empty() {
                    k.value.0.clone()
                } else {
                    format!("{path}.{}", k.value.0)
                };
                index.insert(child.clone(), (Some(pos_of(k)), pos_of(v)));
                index_node(v, child, index);
            }
        }
        Node::Seq(items) => {
            for (i, v) in items.iter().enumerate() {
                index_node(v, format!("{path}[{i}]"), index);
            }
        }
        Node::Scalar => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<(MatrixSpec, Source), MatrixError> {
        parse_str(Path::new("m.yaml"), text.to_string())
    }

    #[test]
    fn index_locates_keys_and_elements() {
        let (_, src) = parse("axes:\n  model: [a, b]\n  gpus:\n    - 1\n    - 8\n").unwrap();
        assert_eq!(src.key_pos("axes.gpus"), Some(Pos { line: 3, column: 3 }));
        assert_eq!(
            src.value_pos("axes.gpus[1]"),
            Some(Pos { line: 5, column: 7 })
        );
        assert_eq!(
            src.value_pos("axes.model[1]"),
            Some(Pos {
                line: 2,
                column: 14
            })
        );
    }

    #[test]
    fn unknown_key_is_located() {
        let e = parse("axes:\n  model: [a]\nrulez: []\n").unwrap_err();
        let s = e.to_string();
        assert!(s.starts_with("m.yaml:3:1:"), "{s}");
        assert!(s.contains("rulez"), "{s}");
    }

    #[test]
    fn wrong_type_is_located() {
        let e = parse("axes:\n  model: [a]\ndefaults:\n  steps: many\n").unwrap_err();
        let s = e.to_string();
        assert!(s.starts_with("m.yaml:4:"), "{s}");
    }

    #[test]
    fn syntax_error_is_located() {
        let e = parse("axes:\n  model: [a, b\n").unwrap_err();
        assert!(e.to_string().starts_with("m.yaml:"), "{e}");
    }
}
