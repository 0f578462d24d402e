//! Rust source as tokens for the scanner: identifiers, `::`, punctuation
//! and literals, each with its line, comments and whitespace dropped; and
//! the questions the scanner asks of a token slice (what is at an index,
//! which bracket closes another, the parts between commas).

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Tok {
    Ident(String),
    /// `::`
    PathSep,
    Punct(char),
    /// A string, char or number literal; strings keep their (raw) text.
    Lit(String),
}

#[derive(Clone, Debug)]
pub(super) struct Token {
    pub(super) tok: Tok,
    pub(super) line: usize,
}

fn is_ident_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

fn is_ident_continue(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

/// Rust tokens without comments and whitespace; literals as one token.
pub(super) fn tokenize(src: &str) -> Vec<Token> {
    let c: Vec<char> = src.chars().collect();
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    let mut out = Vec::new();
    let mut i = 0;
    let mut line = 1;
    while i < c.len() {
        let ch = c[i];
        let start_line = line;
        let mut push = |tok: Tok| {
            out.push(Token {
                tok,
                line: start_line,
            })
        };
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && at(i + 1) == '*' {
            // Block comments nest.
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if c[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if is_ident_start(ch) {
            let mut j = i;
            while j < c.len() && j - i < 2 && matches!(c[j], 'b' | 'c' | 'r') {
                j += 1;
            }
            let prefix: String = c[i..j].iter().collect();
            let is_prefix = matches!(prefix.as_str(), "b" | "c" | "r" | "br" | "cr");
            let raw = prefix.contains('r');
            let mut hashes = 0;
            while raw && at(j + hashes) == '#' {
                hashes += 1;
            }
            if is_prefix && raw && at(j + hashes) == '"' {
                // r"…", r#"…"#, br"…", cr#"…"#
                let body = j + hashes + 1;
                let mut k = body;
                loop {
                    if k >= c.len() {
                        break;
                    }
                    if c[k] == '"' && (1..=hashes).all(|h| at(k + h) == '#') {
                        break;
                    }
                    if c[k] == '\n' {
                        line += 1;
                    }
                    k += 1;
                }
                push(Tok::Lit(c[body..k.min(c.len())].iter().collect()));
                i = k + 1 + hashes;
            } else if (is_prefix && !raw && at(j) == '"') || (prefix == "b" && at(j) == '\'') {
                // "…" after b or c; b'…'.
                let (text, end, lines) = quoted(&c, j);
                push(Tok::Lit(text));
                line += lines;
                i = end;
            } else {
                // An identifier, r#raw or not.
                let mut s = i;
                if ch == 'r' && at(i + 1) == '#' && is_ident_start(at(i + 2)) {
                    s = i + 2;
                }
                let mut k = s;
                while k < c.len() && is_ident_continue(c[k]) {
                    k += 1;
                }
                push(Tok::Ident(c[s..k].iter().collect()));
                i = k;
            }
        } else if ch == '"' {
            let (text, end, lines) = quoted(&c, i);
            push(Tok::Lit(text));
            line += lines;
            i = end;
        } else if ch == '\'' {
            if at(i + 1) == '\\' || (at(i + 2) == '\'' && at(i + 1) != '\n') {
                let (text, end, lines) = quoted(&c, i);
                push(Tok::Lit(text));
                line += lines;
                i = end;
            } else {
                // A lifetime or label: 'a, 'static.
                i += 1;
                while i < c.len() && is_ident_continue(c[i]) {
                    i += 1;
                }
            }
        } else if ch.is_ascii_digit() {
            let s = i;
            while i < c.len()
                && (is_ident_continue(c[i]) || (c[i] == '.' && at(i + 1).is_ascii_digit()))
            {
                i += 1;
            }
            push(Tok::Lit(c[s..i].iter().collect()));
        } else if ch == ':' && at(i + 1) == ':' {
            push(Tok::PathSep);
            i += 2;
        } else {
            push(Tok::Punct(ch));
            i += 1;
        }
    }
    out
}

/// A literal quoted with `c[open]` (`"` or `'`), backslash escapes allowed:
/// its text, the index after it and the newlines in it.
fn quoted(c: &[char], open: usize) -> (String, usize, usize) {
    let quote = c[open];
    let mut k = open + 1;
    let mut lines = 0;
    let mut text = String::new();
    while k < c.len() && c[k] != quote {
        if c[k] == '\\' {
            text.push(c[k]);
            k += 1;
        }
        if k < c.len() {
            if c[k] == '\n' {
                lines += 1;
            }
            text.push(c[k]);
        }
        k += 1;
    }
    (text, k + 1, lines)
}

// ===========================================================================
// Questions about a token slice

pub(super) fn ident(t: &[Token], i: usize) -> Option<&str> {
    match t.get(i).map(|t| &t.tok) {
        Some(Tok::Ident(s)) => Some(s),
        _ => None,
    }
}

pub(super) fn punct(t: &[Token], i: usize, p: char) -> bool {
    matches!(t.get(i).map(|t| &t.tok), Some(Tok::Punct(c)) if *c == p)
}

pub(super) fn path_sep(t: &[Token], i: usize) -> bool {
    matches!(t.get(i).map(|t| &t.tok), Some(Tok::PathSep))
}

/// Index of the bracket closing the one at `open` (or the end).
pub(super) fn closing(t: &[Token], open: usize) -> usize {
    let mut depth = 0usize;
    for (k, token) in t.iter().enumerate().skip(open) {
        match token.tok {
            Tok::Punct('(' | '[' | '{') => depth += 1,
            Tok::Punct(')' | ']' | '}') => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return k;
                }
            }
            _ => {}
        }
    }
    t.len()
}

/// Splits tokens at the commas outside brackets.
pub(super) fn split_commas(t: &[Token]) -> Vec<&[Token]> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (k, token) in t.iter().enumerate() {
        match token.tok {
            Tok::Punct('(' | '[' | '{') => depth += 1,
            Tok::Punct(')' | ']' | '}') => depth = depth.saturating_sub(1),
            Tok::Punct(',') if depth == 0 => {
                parts.push(&t[start..k]);
                start = k + 1;
            }
            _ => {}
        }
    }
    if start < t.len() {
        parts.push(&t[start..]);
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizer_keeps_lines_and_skips_literals() {
        let t = tokenize("a::b // c::d\n/* e\n f */ \"g::h\n\" r#\"i\"# 'j' 'k x\n");
        let toks: Vec<(Tok, usize)> = t.into_iter().map(|t| (t.tok, t.line)).collect();
        assert_eq!(
            toks,
            [
                (Tok::Ident("a".into()), 1),
                (Tok::PathSep, 1),
                (Tok::Ident("b".into()), 1),
                (Tok::Lit("g::h\n".into()), 3),
                (Tok::Lit("i".into()), 4),
                (Tok::Lit("j".into()), 4),
                (Tok::Ident("x".into()), 4),
            ]
        );
    }
}
