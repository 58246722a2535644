//! Lock names as the command line shows them.
//!
//! A name is bytes and need not be UTF-8. A UTF-8 name is shown as is; any
//! other is shown as a Rust byte string, `b"..."` with its bytes escaped as
//! [`<[u8]>::escape_ascii`] does (`\xff`, `\\`, `\"`, `\n`, ...), so two
//! names never look alike and the escapes inside the quotes can be pasted
//! into a shell's `$'...'` to give the bytes back (the subcommands that
//! take a name take the raw bytes of their argument). `--json` adds the exact
//! bytes as hex (`name_hex`) for a name that is not UTF-8.

/// `name` for people: itself if UTF-8, else `b"<escaped bytes>"`.
pub fn shown(name: &[u8]) -> String {
    match std::str::from_utf8(name) {
        Ok(text) => text.to_owned(),
        Err(_) => format!("b\"{}\"", name.escape_ascii()),
    }
}

/// `name` in messages: `"text"` (quoted as Rust's `{:?}` does) if UTF-8,
/// else `b"<escaped bytes>"`.
pub fn quoted(name: &[u8]) -> String {
    match std::str::from_utf8(name) {
        Ok(text) => format!("{text:?}"),
        Err(_) => shown(name),
    }
}

/// The exact bytes of `name` as lowercase hex, `None` if it is UTF-8 (then
/// [`shown`] is exact).
pub fn hex_if_binary(name: &[u8]) -> Option<String> {
    if std::str::from_utf8(name).is_ok() {
        return None;
    }
    Some(name.iter().map(|byte| format!("{byte:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_names_are_shown_as_is_and_others_escaped() {
        assert_eq!(shown(b"orders:42"), "orders:42");
        assert_eq!(shown("job\u{fffd}".as_bytes()), "job\u{fffd}");
        assert_eq!(hex_if_binary(b"orders:42"), None);
        assert_eq!(quoted(b"orders:42"), "\"orders:42\"");
        assert_eq!(quoted(b"job\xff"), "b\"job\\xff\"");
        assert_eq!(shown(b"job\xff"), "b\"job\\xff\"");
        assert_eq!(hex_if_binary(b"job\xff").as_deref(), Some("6a6f62ff"));
        assert_eq!(
            shown(b"a\"\\\n\xc3\xa9\xff"),
            "b\"a\\\"\\\\\\n\\xc3\\xa9\\xff\""
        );
    }
}
