//! Byte offsets ↔ LSP positions (line, UTF-16 code unit), the protocol's
//! default encoding.

use lsp_types::Position;

/// The position of byte `offset` in `text` (clamped to the text; an offset
/// inside a character counts as that character's start).
pub fn position(text: &str, offset: usize) -> Position {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count();
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let character: usize = text[line_start..offset].chars().map(char::len_utf16).sum();
    Position { line: line as u32, character: character as u32 }
}

/// The byte offset of `pos` in `text`: a line past the end is the end of the
/// text, a character past the line's end is the line's end.
pub fn offset(text: &str, pos: Position) -> usize {
    let mut line_start = 0;
    for _ in 0..pos.line {
        match text[line_start..].find('\n') {
            Some(i) => line_start += i + 1,
            None => return text.len(),
        }
    }
    let line_end = text[line_start..].find('\n').map_or(text.len(), |i| line_start + i);
    let mut units = 0;
    for (i, c) in text[line_start..line_end].char_indices() {
        if units >= pos.character as usize {
            return line_start + i;
        }
        units += c.len_utf16();
    }
    line_end
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_char_boundary_of_mixed_text() {
        let text = "a(x) :- b(x).\n// 𝄞 é ✓\r\nlast";
        for (i, _) in text.char_indices().chain([(text.len(), ' ')]) {
            assert_eq!(offset(text, position(text, i)), i, "offset {i}");
        }
    }

    #[test]
    fn counts_utf16_units_for_astral_chars() {
        let text = "//𝄞x";
        assert_eq!(position(text, text.find('x').unwrap()), Position { line: 0, character: 4 });
    }

    #[test]
    fn positions_past_the_end_clamp() {
        let text = "ab\ncd";
        assert_eq!(offset(text, Position { line: 9, character: 0 }), text.len());
        assert_eq!(offset(text, Position { line: 0, character: 99 }), 2);
    }
}
