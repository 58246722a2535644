//! `fairlock inspect NAME`: one read-only snapshot of a lock.

use fairlock::LockClient;

use crate::exit::Failure;
use crate::output::emit;
use crate::snapshot::LockView;

/// Prints the holder, token, lease and first `limit` waiters of `name`.
pub async fn inspect(
    client: &LockClient,
    name: &[u8],
    limit: u64,
    json: bool,
) -> Result<(), Failure> {
    let view = LockView::new(name, client.inspect_queue(name, limit).await?);
    emit(json, &view, || view.human())
}
