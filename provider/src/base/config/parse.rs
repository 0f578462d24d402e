//! The syntax of values and of the configuration file: a tunable's text
//! parsed to its type and checked against its range, and shown back (in
//! help texts, `fi_info -e`, `fi_info.conf` and log lines).

use std::fmt;

use super::{Kind, Tunable, Value};

pub(super) const KIB: u64 = 1 << 10;
pub(super) const MIB: u64 = 1 << 20;
pub(super) const GIB: u64 = 1 << 30;
pub(super) const TIB: u64 = 1 << 40;

impl Tunable {
    /// Parse `text` as this tunable's type, checking the range.
    pub fn parse(&self, text: &str) -> Result<Value, String> {
        let text = text.trim();
        match self.kind {
            Kind::Bool => parse_bool(text).map(Value::Bool).ok_or_else(|| {
                format!("'{text}' is not a boolean (true/false, 1/0, yes/no, on/off)")
            }),
            Kind::Int { min, max } => {
                let v: i64 = text
                    .parse()
                    .map_err(|_| format!("'{text}' is not an integer"))?;
                in_range(v, min, max).map(Value::Int)
            }
            Kind::Size { min, max } => {
                let v = parse_size(text).ok_or_else(|| {
                    format!("'{text}' is not a size (a number with optional suffix k, m, g or t)")
                })?;
                in_range(v, min, max).map(Value::Size)
            }
            Kind::OptName => {
                let ok = text.len() <= 64
                    && text
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"._;-".contains(&b));
                if ok {
                    Ok(Value::Str(text.to_owned()))
                } else {
                    Err(format!(
                        "'{text}' is not a name of up to 64 characters from [A-Za-z0-9._;-]"
                    ))
                }
            }
            Kind::Str => {
                let ok = !text.is_empty()
                    && text.len() <= 64
                    && text
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
                if ok {
                    Ok(Value::Str(text.to_owned()))
                } else {
                    Err(format!(
                        "'{text}' is not a name of 1-64 characters from [A-Za-z0-9._-]"
                    ))
                }
            }
            Kind::Enum(words) => words
                .iter()
                .find(|w| w.eq_ignore_ascii_case(text))
                .map(|w| Value::Enum(w))
                .ok_or_else(|| format!("'{text}' is not one of {}", words.join("|"))),
        }
    }

    /// The built-in default, parsed.
    pub fn default_value(&self) -> Value {
        self.parse(self.default)
            .unwrap_or_else(|e| panic!("bad built-in default for {}: {e}", self.name))
    }

    /// Type name used in help texts, with the accepted range.
    pub fn type_name(&self) -> String {
        match self.kind {
            Kind::Bool => "bool".into(),
            Kind::Int { .. } => "int".into(),
            Kind::Size { .. } => "size, suffix k/m/g/t".into(),
            Kind::Str | Kind::OptName => "string".into(),
            Kind::Enum(words) => words.join("|"),
        }
    }

    /// The accepted range as `fi_info.conf` and `fi_info -e` show it
    /// (`range: 64k..1g`), for numbers.
    pub fn range_text(&self) -> Option<String> {
        match self.kind {
            Kind::Int { min, max } => Some(format!("range: {min}..{max}")),
            Kind::Size { min, max: u64::MAX } => Some(format!("range: {} or more", show_size(min))),
            Kind::Size { min, max } => {
                Some(format!("range: {}..{}", show_size(min), show_size(max)))
            }
            _ => None,
        }
    }

    /// Help as shown by `fi_info -e`.
    pub fn param_help(&self) -> String {
        match self.range_text() {
            Some(range) => format!(
                "{} ({}, {range}, default {}; outside the range: a warning and the default)",
                self.help,
                self.type_name(),
                self.default
            ),
            None => format!(
                "{} ({}, default {})",
                self.help,
                self.type_name(),
                self.default
            ),
        }
    }
}

/// A byte count in the largest unit that divides it: `65536` → `64k`.
pub fn show_size(v: u64) -> String {
    for (unit, suffix) in [(TIB, "t"), (GIB, "g"), (MIB, "m"), (KIB, "k")] {
        if v >= unit && v.is_multiple_of(unit) {
            return format!("{}{suffix}", v / unit);
        }
    }
    v.to_string()
}

fn in_range<T: PartialOrd + fmt::Display>(v: T, min: T, max: T) -> Result<T, String> {
    if v < min || v > max {
        Err(format!("{v} is outside {min}..={max}"))
    } else {
        Ok(v)
    }
}

fn parse_bool(s: &str) -> Option<bool> {
    match s.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// `"64m"` → 64 MiB. Suffix k/m/g/t (case-insensitive), optionally followed
/// by `b` or `ib`.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return None;
    }
    let (num, suffix) = s.split_at(digits);
    let num: u64 = num.parse().ok()?;
    let suffix = suffix.trim().to_ascii_lowercase();
    let unit_part = suffix
        .strip_suffix("ib")
        .or_else(|| suffix.strip_suffix('b'))
        .unwrap_or(&suffix);
    let mult = match unit_part {
        "" => 1,
        "k" => KIB,
        "m" => MIB,
        "g" => GIB,
        "t" => TIB,
        _ => return None,
    };
    // A bare "b" suffix (bytes) is fine; "ib" needs a unit.
    if unit_part.is_empty() && suffix == "ib" {
        return None;
    }
    num.checked_mul(mult)
}

/// One `name = value` line of a configuration file.
#[derive(Debug, PartialEq, Eq)]
pub struct FileEntry {
    pub line: usize,
    pub name: String,
    pub value: String,
}

/// Parse configuration-file text: `# comment` lines, blank lines and
/// `name = value` lines (a trailing `# comment` and surrounding double quotes
/// are allowed). Returns the entries and (line, message) for malformed lines.
pub fn parse_file(text: &str) -> (Vec<FileEntry>, Vec<(usize, String)>) {
    let mut entries = Vec::new();
    let mut errors = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let content = raw.split('#').next().unwrap_or("").trim();
        if content.is_empty() {
            continue;
        }
        let Some((name, value)) = content.split_once('=') else {
            errors.push((line, format!("expected 'name = value', found '{content}'")));
            continue;
        };
        let name = name.trim();
        let value = value.trim();
        let value = value
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(value);
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            errors.push((line, format!("'{name}' is not a tunable name")));
            continue;
        }
        entries.push(FileEntry {
            line,
            name: name.to_owned(),
            value: value.to_owned(),
        });
    }
    (entries, errors)
}

pub(super) fn show(v: &Value) -> String {
    match v {
        Value::Bool(b) => b.to_string(),
        Value::Int(i) => i.to_string(),
        Value::Size(s) => s.to_string(),
        Value::Str(s) => s.clone(),
        Value::Enum(s) => (*s).to_owned(),
    }
}
