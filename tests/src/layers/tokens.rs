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

impl Token {
    /// `(`, `[` or `{`.
    pub(super) fn opens(&self) -> bool {
        matches!(self.tok, Tok::Punct('(' | '[' | '{'))
    }

    /// `)`, `]` or `}`.
    pub(super) fn closes(&self) -> bool {
        matches!(self.tok, Tok::Punct(')' | ']' | '}'))
    }
}

/// Rust tokens without comments and whitespace; literals as one token.
pub(super) fn tokenize(src: &str) -> Vec<Token> {
    let mut lexer = Lexer {
        c: src.chars().collect(),
        i: 0,
        line: 1,
        out: Vec::new(),
    };
    while lexer.i < lexer.c.len() {
        lexer.next_token();
    }
    lexer.out
}

fn is_ident_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

fn is_ident_continue(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

/// The source as characters, where the next token starts (`i`) and on
/// which line, and the tokens so far.
struct Lexer {
    c: Vec<char>,
    i: usize,
    line: usize,
    out: Vec<Token>,
}

impl Lexer {
    fn at(&self, k: usize) -> char {
        self.c.get(k).copied().unwrap_or('\0')
    }

    /// A token that starts on the current line.
    fn push(&mut self, tok: Tok) {
        self.out.push(Token {
            tok,
            line: self.line,
        });
    }

    /// Moves past `c[i]`, counting a newline.
    fn advance(&mut self) {
        if self.c[self.i] == '\n' {
            self.line += 1;
        }
        self.i += 1;
    }

    /// Moves on while `c[i]` satisfies `f`.
    fn skip_while(&mut self, f: impl Fn(char) -> bool) {
        while self.i < self.c.len() && f(self.c[self.i]) {
            self.advance();
        }
    }

    fn text(&self, from: usize, to: usize) -> String {
        self.c[from..to.min(self.c.len())].iter().collect()
    }

    /// Reads the token (or comment, whitespace) that starts at `c[i]`.
    fn next_token(&mut self) {
        let (ch, next) = (self.c[self.i], self.at(self.i + 1));
        if ch.is_whitespace() {
            self.advance();
        } else if ch == '/' && next == '/' {
            self.skip_while(|c| c != '\n');
        } else if ch == '/' && next == '*' {
            self.block_comment();
        } else if is_ident_start(ch) {
            self.word();
        } else if ch == '"' {
            self.quoted(self.i);
        } else if ch == '\'' {
            if next == '\\' || (self.at(self.i + 2) == '\'' && next != '\n') {
                self.quoted(self.i);
            } else {
                // A lifetime or label: 'a, 'static.
                self.i += 1;
                self.skip_while(is_ident_continue);
            }
        } else if ch.is_ascii_digit() {
            let start = self.i;
            while self.i < self.c.len()
                && (is_ident_continue(self.c[self.i])
                    || (self.c[self.i] == '.' && self.at(self.i + 1).is_ascii_digit()))
            {
                self.i += 1;
            }
            self.push(Tok::Lit(self.text(start, self.i)));
        } else if ch == ':' && next == ':' {
            self.push(Tok::PathSep);
            self.i += 2;
        } else {
            self.push(Tok::Punct(ch));
            self.i += 1;
        }
    }

    /// A block comment; they nest.
    fn block_comment(&mut self) {
        let mut depth = 0;
        while self.i < self.c.len() {
            if self.c[self.i] == '/' && self.at(self.i + 1) == '*' {
                depth += 1;
                self.i += 2;
            } else if self.c[self.i] == '*' && self.at(self.i + 1) == '/' {
                depth -= 1;
                self.i += 2;
                if depth == 0 {
                    break;
                }
            } else {
                self.advance();
            }
        }
    }

    /// An identifier (`r#raw` or not), or a literal with a prefix:
    /// `b"…"`, `c"…"`, `b'…'`, `r"…"`, `r#"…"#`, `br"…"`, `cr#"…"#`.
    fn word(&mut self) {
        let i = self.i;
        let mut j = i;
        while j < self.c.len() && j - i < 2 && matches!(self.c[j], 'b' | 'c' | 'r') {
            j += 1;
        }
        let prefix = self.text(i, j);
        let is_prefix = matches!(prefix.as_str(), "b" | "c" | "r" | "br" | "cr");
        let raw = prefix.contains('r');
        let mut hashes = 0;
        while raw && self.at(j + hashes) == '#' {
            hashes += 1;
        }
        if is_prefix && raw && self.at(j + hashes) == '"' {
            let body = j + hashes + 1;
            let start_line = self.line;
            self.i = body;
            while self.i < self.c.len()
                && !(self.c[self.i] == '"' && (1..=hashes).all(|h| self.at(self.i + h) == '#'))
            {
                self.advance();
            }
            self.out.push(Token {
                tok: Tok::Lit(self.text(body, self.i)),
                line: start_line,
            });
            self.i += 1 + hashes;
        } else if (is_prefix && !raw && self.at(j) == '"') || (prefix == "b" && self.at(j) == '\'')
        {
            self.quoted(j);
        } else {
            if self.c[i] == 'r' && self.at(i + 1) == '#' && is_ident_start(self.at(i + 2)) {
                self.i = i + 2;
            }
            let start = self.i;
            self.skip_while(is_ident_continue);
            self.push(Tok::Ident(self.text(start, self.i)));
        }
    }

    /// A literal quoted with `c[open]` (`"` or `'`), backslash escapes
    /// allowed, pushed with its text.
    fn quoted(&mut self, open: usize) {
        let quote = self.c[open];
        let start_line = self.line;
        let mut text = String::new();
        self.i = open + 1;
        while self.i < self.c.len() && self.c[self.i] != quote {
            if self.c[self.i] == '\\' {
                text.push('\\');
                self.i += 1;
            }
            if self.i < self.c.len() {
                text.push(self.c[self.i]);
                self.advance();
            }
        }
        self.out.push(Token {
            tok: Tok::Lit(text),
            line: start_line,
        });
        self.i += 1;
    }
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
        if token.opens() {
            depth += 1;
        } else if token.closes() {
            depth = depth.saturating_sub(1);
            if depth == 0 {
                return k;
            }
        }
    }
    t.len()
}

/// Splits tokens at the commas outside brackets.
pub(super) fn split_commas(t: &[Token]) -> Vec<&[Token]> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (k, token) in t.iter().enumerate() {
        if token.opens() {
            depth += 1;
        } else if token.closes() {
            depth = depth.saturating_sub(1);
        } else if depth == 0 && token.tok == Tok::Punct(',') {
            parts.push(&t[start..k]);
            start = k + 1;
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
