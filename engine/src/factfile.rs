//! Facts files: one `KEY = VALUE` a line, `#` comments, blank lines ignored; a
//! value that starts with `"` is a JSON string (for spaces, `#` or newlines).

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{file}:{line}: {message}")]
pub struct FactFileError {
    pub file: String,
    pub line: usize,
    pub message: String,
}

/// A fact and the line it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FactLine {
    pub key: String,
    pub value: String,
    pub line: usize,
}

pub fn parse(file: &str, text: &str) -> Result<Vec<FactLine>, FactFileError> {
    let mut out: Vec<FactLine> = Vec::new();
    let mut seen = std::collections::HashMap::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let err = |message: String| FactFileError { file: file.to_string(), line, message };
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let Some((key, value)) = trimmed.split_once('=') else {
            return Err(err(format!("expected `KEY = VALUE`, found `{trimmed}`")));
        };
        let key = key.trim();
        if key.is_empty() || key.contains(char::is_whitespace) {
            return Err(err(format!("`{key}` is not a key: keys are non-empty and have no spaces")));
        }
        let value = value.trim();
        let value = if value.starts_with('"') {
            serde_json::from_str::<String>(value).map_err(|e| err(format!("value is not a valid JSON string: {e}")))?
        } else {
            value.to_string()
        };
        if let Some(first) = seen.insert(key.to_string(), line) {
            return Err(err(format!("key `{key}` is given twice (first on line {first})")));
        }
        out.push(FactLine { key: key.to_string(), value, line });
    }
    Ok(out)
}

/// Formats a value for a facts file, quoting it when it would not read back as is.
pub fn format_value(v: &str) -> String {
    let plain = !v.starts_with('"') && v.trim() == v && !v.contains(['\n', '#']);
    if plain {
        v.to_string()
    } else {
        serde_json::to_string(v).expect("strings serialise")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        let f = parse("f", "# c\n\na/b = 3\nsecret = \n q = \"x # y\"\n").unwrap();
        assert_eq!(f.len(), 3);
        assert_eq!(f[1].value, "");
        assert_eq!(f[2].value, "x # y");
        assert_eq!(parse("f", "nokey\n").unwrap_err().line, 1);
        assert!(parse("f", "a = 1\na = 2\n").unwrap_err().message.contains("twice"));
        assert!(parse("f", "a = \"unterminated\n").is_err());
        for v in ["plain", "", " padded", "has # hash", "\"quoted\"", "line\nbreak"] {
            let text = format!("k = {}\n", format_value(v));
            assert_eq!(parse("f", &text).unwrap()[0].value, v);
        }
    }
}
