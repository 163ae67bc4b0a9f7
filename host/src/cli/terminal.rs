//! Text for the user's terminal.

/// Plugin-controlled text as it may be printed on a terminal: control characters (escape codes,
/// newlines, carriage returns) escaped, so a plugin cannot draw on the user's screen.
pub(super) fn terminal_safe(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let escaped: Vec<char> = if c.is_control() {
                c.escape_default().collect()
            } else {
                vec![c]
            };
            escaped
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::terminal_safe;

    #[test]
    fn control_characters_in_plugin_text_are_escaped() {
        assert_eq!(
            terminal_safe("evil\x1b[2J\nname\r"),
            "evil\\u{1b}[2J\\nname\\r"
        );
        assert_eq!(terminal_safe("tic-tac-toe é"), "tic-tac-toe é");
    }
}
