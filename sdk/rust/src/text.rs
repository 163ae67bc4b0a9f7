//! Helpers for reading answers out of model text.

/// The last number in `text`: an optional minus sign, digits with optional thousands commas,
/// and an optional decimal part (`-1,234.5`). A trailing full stop is not a decimal point.
pub fn last_number(text: &str) -> Option<f64> {
    let bytes = text.as_bytes();
    let mut last = None;
    let mut i = 0;
    while i < bytes.len() {
        if !bytes[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        let negative = i > 0 && bytes[i - 1] == b'-';
        let mut digits = String::new();
        while i < bytes.len() {
            let b = bytes[i];
            let next_is_digit = bytes.get(i + 1).is_some_and(u8::is_ascii_digit);
            if b.is_ascii_digit() {
                digits.push(b as char);
            } else if b == b',' && next_is_digit && !digits.contains('.') {
                // A thousands separator: skip it.
            } else if b == b'.' && next_is_digit && !digits.contains('.') {
                digits.push('.');
            } else {
                break;
            }
            i += 1;
        }
        last = digits
            .parse::<f64>()
            .ok()
            .map(|v| if negative { -v } else { v });
    }
    last
}

#[cfg(test)]
mod tests {
    use super::last_number;

    #[test]
    fn finds_the_last_number_in_its_forms() {
        assert_eq!(last_number("it is 1,234."), Some(1234.0));
        assert_eq!(last_number("x = -7"), Some(-7.0));
        assert_eq!(last_number("about 2.5 or 3.75"), Some(3.75));
        assert_eq!(last_number("3, 4"), Some(4.0));
        assert_eq!(last_number("no number"), None);
        assert_eq!(last_number("\\boxed{12}"), Some(12.0));
    }
}
