//! `fairlock watch NAME`: the snapshot of `inspect`, redrawn every interval
//! until Ctrl-C (or `--count` snapshots).
//!
//! It polls on purpose: a watcher must not take part in the lock protocol
//! (no subscription to the lock's channels, no queue entry), and one
//! read-only script call per interval costs Redis next to nothing.

use std::io::IsTerminal as _;
use std::time::Duration;

use fairlock::LockClient;

use crate::exit::Failure;
use crate::output::emit;
use crate::snapshot::LockView;

/// Clears the terminal and moves the cursor home.
const CLEAR: &str = "\x1b[2J\x1b[H";

/// Redraws the snapshot of `name` every `interval`. `true` if Ctrl-C
/// ended it (perhaps with a call still in flight).
pub async fn watch(
    client: &LockClient,
    name: &[u8],
    interval: Duration,
    limit: u64,
    count: Option<u64>,
    json: bool,
) -> Result<bool, Failure> {
    // Redraw in place only on a terminal; in a pipe or a file, snapshots
    // follow each other, separated by a blank line.
    let redraw = !json && std::io::stdout().is_terminal();
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut shown = 0u64;
    // One listener for the whole watch, also while a snapshot's call is in
    // flight: a Ctrl-C that came while nothing listened would be lost.
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    while count.is_none_or(|count| shown < count) {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = &mut interrupted => return Ok(true),
        }
        let snapshot = tokio::select! {
            snapshot = client.inspect_queue(name, limit) => snapshot?,
            _ = &mut interrupted => return Ok(true),
        };
        let view = LockView::new(name, snapshot);
        emit(json, &view, || {
            let mut text = if redraw {
                CLEAR.to_owned()
            } else if shown > 0 {
                "\n".to_owned()
            } else {
                String::new()
            };
            text.push_str(&view.human());
            text
        })?;
        shown += 1;
    }
    Ok(false)
}
