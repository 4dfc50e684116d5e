//! The filter language's lexer: words, quoted strings, `/regex/`s and operators, each
//! with its byte offset and length for error carets.

use super::ast::Op;
use super::error::FilterError;

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Tok {
    Word(String),
    Quoted(String),
    Regex(String),
    Op(Op),
    LParen,
    RParen,
    Not,
    And,
    Or,
}

pub(super) struct Lexer<'a> {
    pub(super) src: &'a str,
    pub(super) pos: usize,
}

pub(super) fn is_word_char(c: char) -> bool {
    !(c.is_whitespace() || "=!~<>()/\"'&|".contains(c))
}

impl<'a> Lexer<'a> {
    pub(super) fn err(&self, offset: usize, len: usize, message: impl Into<String>) -> FilterError {
        FilterError::at(self.src, offset, len, message)
    }

    pub(super) fn tokens(mut self) -> Result<Vec<(usize, usize, Tok)>, FilterError> {
        let mut out = Vec::new();
        let bytes = self.src;
        while self.pos < bytes.len() {
            let rest = &bytes[self.pos..];
            let c = rest.chars().next().unwrap_or(' ');
            if c.is_whitespace() {
                self.pos += c.len_utf8();
                continue;
            }
            let start = self.pos;
            let two = rest.get(..2).unwrap_or("");
            let (tok, len) = match (two, c) {
                ("==", _) => (Tok::Op(Op::Eq), 2),
                ("!=", _) => (Tok::Op(Op::Ne), 2),
                (">=", _) => (Tok::Op(Op::Ge), 2),
                ("<=", _) => (Tok::Op(Op::Le), 2),
                ("&&", _) => (Tok::And, 2),
                ("||", _) => (Tok::Or, 2),
                (_, '=') => (Tok::Op(Op::Eq), 1),
                (_, '~') => (Tok::Op(Op::Contains), 1),
                (_, '>') => (Tok::Op(Op::Gt), 1),
                (_, '<') => (Tok::Op(Op::Lt), 1),
                (_, '!') => (Tok::Not, 1),
                (_, '(') => (Tok::LParen, 1),
                (_, ')') => (Tok::RParen, 1),
                (_, '&') | (_, '|') => {
                    return Err(self.err(start, 1, format!("`{c}` must be doubled (`{c}{c}`)")))
                }
                (_, '"') | (_, '\'') | (_, '/') => {
                    let body = &rest[1..];
                    match body.find(c) {
                        Some(end) => {
                            let text = body[..end].to_string();
                            let tok = if c == '/' {
                                Tok::Regex(text)
                            } else {
                                Tok::Quoted(text)
                            };
                            (tok, end + 2)
                        }
                        None => {
                            return Err(self.err(
                                start,
                                rest.len(),
                                format!("unterminated `{c}`: add a closing `{c}`"),
                            ))
                        }
                    }
                }
                _ => {
                    let len: usize = rest
                        .chars()
                        .take_while(|c| is_word_char(*c))
                        .map(char::len_utf8)
                        .sum();
                    let w = &rest[..len];
                    let tok = match w.to_ascii_lowercase().as_str() {
                        "and" => Tok::And,
                        "or" => Tok::Or,
                        "not" => Tok::Not,
                        _ => Tok::Word(w.to_string()),
                    };
                    (tok, len)
                }
            };
            out.push((start, len, tok));
            self.pos += len;
        }
        Ok(out)
    }
}
