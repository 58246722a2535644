//! Printing: human text by default, one JSON document per line with
//! `--json`, so `watch --json` is a stream a script can read line by line.

use std::io::Write as _;

use serde::Serialize;

use crate::exit::{Failure, FAILURE};

/// Prints `value` as one JSON line, or `human` as is.
pub fn emit<T: Serialize>(
    json: bool,
    value: &T,
    human: impl FnOnce() -> String,
) -> Result<(), Failure> {
    let text = if json {
        let mut line = serde_json::to_string(value)
            .map_err(|e| Failure::new(FAILURE, format!("cannot encode JSON: {e}")))?;
        line.push('\n');
        line
    } else {
        human()
    };
    let mut stdout = std::io::stdout().lock();
    // A closed pipe (`fairlock watch | head`) is not worth a panic.
    let _ = stdout.write_all(text.as_bytes());
    let _ = stdout.flush();
    Ok(())
}
